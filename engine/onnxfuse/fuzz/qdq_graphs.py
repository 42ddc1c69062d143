"""Hypothesis strategies for whole QDQ models, as onnxruntime's quantizer writes them.

A float model is built from the ops QDQ models are made of (Conv, MatMul, Gemm,
Add, Mul, Sigmoid, LeakyRelu, Softmax, pools, Concat, Relu and Clip, and the
data-movement ops between units: Reshape, Transpose, Squeeze, Unsqueeze,
Flatten, Slice, Split, Gather, MaxPool, Resize-nearest), then quantized with
``onnxruntime.quantization.quantize_static`` in QDQ format, calibrated on the
feeds the oracle runs it with: every float op between DequantizeLinear and
QuantizeLinear nodes, int32 bias DQs, weights per tensor or per channel, and
the drawn activation and weight types, symmetry and kept activations. The
quantizer, not this module, decides what a unit looks like, so the models are
the ones users get.
"""

from __future__ import annotations

import contextlib
import io
import logging
import math
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from hypothesis import strategies as st

from onnxfuse.fuzz.graphs import (
    F32,
    MAX_ELEMENTS,
    Builder,
    ConvSpec,
    GraphCase,
    Val,
    assemble,
    conv_out_shape,
    factor_shape,
    make_conv,
    permutation,
    random_axes,
    reshape,
    squeeze,
    transpose,
    unsqueeze,
)

# Opsets of the float models (per-channel weights need 13; the steps write opset-13 forms).
QDQ_OPSETS = ((13, 7), (17, 8), (21, 10))
_CALIBRATION_SETS = 3


@dataclass(frozen=True)
class QuantForm:
    """How the float model is quantized: quantize_static's arguments."""

    activation: str  # "uint8" or "int8"
    weight: str
    per_channel: bool
    reduce_range: bool
    activation_symmetric: bool
    weight_symmetric: bool
    keep_activations: bool  # QDQKeepRemovableActivations: a Relu/Clip stays before its Q

    def describe(self) -> str:
        parts = [f"{self.activation[0].upper()}8{self.weight[0].upper()}8"]
        parts.append("per-channel" if self.per_channel else "per-tensor")
        parts += [
            name
            for name, on in (
                ("reduce-range", self.reduce_range),
                ("symmetric-activations", self.activation_symmetric),
                ("symmetric-weights", self.weight_symmetric),
                ("kept-relu", self.keep_activations),
            )
            if on
        ]
        return ",".join(parts)


class _QdqBuilder(Builder):
    """Weights are initializers: the quantizer quantizes only those as weights."""

    def const(self, array, *, override_ok: bool = True, as_node_ok: bool = True) -> Val:
        return super().const(array, override_ok=False, as_node_ok=False)


def _image(b: Builder) -> Val:
    return b.new_input(F32, (1, b.int(1, 4), b.int(3, 8), b.int(3, 8)))


def _last(b: Builder, pred=lambda v: True) -> Val | None:
    """A recent float value (the latest most often), or None."""
    candidates = [v for v in b.pool if v.dtype == F32 and v.numel <= MAX_ELEMENTS and pred(v)]
    if not candidates:
        return None
    return candidates[-1 - b.int(0, min(2, len(candidates) - 1))]


def _rank4(b: Builder) -> Val:
    x = _last(b, lambda v: v.rank == 4 and v.shape[1] <= 8 and min(v.shape[2:]) >= 2)
    return x if x is not None and not b.flag(0.1) else _image(b)


def _any(b: Builder) -> Val:
    x = _last(b, lambda v: v.rank >= 1)
    return x if x is not None else _image(b)


def q_conv(b: Builder) -> Val:
    y, _ = make_conv(b, _rank4(b))
    return y


def q_matmul(b: Builder) -> Val:
    x = _last(b, lambda v: 2 <= v.rank <= 4 and v.shape[-1] <= 32)
    if x is None:
        x = b.new_input(F32, (b.int(1, 4), b.int(2, 16)))
    n = b.int(1, 8)
    w = b.const(b.weights((x.shape[-1], n)))
    return b.op("MatMul", [x, w], F32, (*x.shape[:-1], n))


def _matrix(b: Builder) -> Val:
    x = _last(b, lambda v: v.rank >= 2 and math.prod(v.shape[1:]) <= 64)
    if x is None:
        return b.new_input(F32, (b.int(1, 3), b.int(2, 16)))
    if x.rank == 2:
        return x
    return b.op("Flatten", [x], F32, (x.shape[0], math.prod(x.shape[1:])), axis=1)


def q_gemm(b: Builder) -> Val:
    x = _matrix(b)
    k, n = x.shape[1], b.int(1, 8)
    trans_b = b.flag(0.6)
    w = b.const(b.weights((n, k) if trans_b else (k, n)))
    inputs = [x, w]
    if b.flag(0.7):
        inputs.append(b.const(b.weights((n,), scale=0.5)))
    attrs: dict = {"transB": 1} if trans_b else {}
    if b.flag(0.2):
        attrs["alpha"] = 0.5
    return b.op("Gemm", inputs, F32, (x.shape[0], n), **attrs)


def q_binary(b: Builder) -> Val:
    """Add or Mul of two activations (a residual) or of an activation and a constant."""
    x = _any(b)
    op = b.choice(["Add", "Mul"])
    partner = _last(b, lambda v: v.shape == x.shape and v.name != x.name)
    if partner is None or b.flag(0.3):
        shape = x.shape if b.flag(0.5) else (1,) * (x.rank - 1) + (x.shape[-1],)
        partner = b.const(b.weights(shape, scale=1.0))
    order = [x, partner] if b.flag(0.6) else [partner, x]
    return b.op(op, order, F32, x.shape)


def q_unary(b: Builder) -> Val:
    x = _any(b)
    op = b.choice(["Sigmoid", "LeakyRelu", "Relu", "Clip", "Softmax"])
    if op == "LeakyRelu":
        return b.op(op, [x], F32, x.shape, alpha=b.choice([0.01, 0.1, 0.3]))
    if op == "Clip":
        lo, hi = b.choice([(0.0, 6.0), (-1.0, 1.0), (0.0, 0.5)])
        bounds = [b.const(np.asarray(lo, F32)), b.const(np.asarray(hi, F32))]
        return b.op(op, [x, *bounds], F32, x.shape)
    if op == "Softmax":
        return b.op(op, [x], F32, x.shape, axis=b.int(-1, x.rank - 1))
    return b.op(op, [x], F32, x.shape)


def q_pool(b: Builder) -> Val:
    x = _rank4(b)
    op = b.choice(["MaxPool", "AveragePool", "GlobalAveragePool"])
    if op == "GlobalAveragePool":
        return b.op(op, [x], F32, (*x.shape[:2], 1, 1))
    kernel = [b.int(1, min(3, d)) for d in x.shape[2:]]
    strides = [b.choice([1, 2]) for _ in range(2)]
    pads = [b.int(0, kernel[i % 2] - 1) if b.flag(0.3) else 0 for i in range(4)]
    spec = ConvSpec(kernel, strides, [1, 1], pads, "NOTSET", 1, x.shape[1])
    attrs: dict = {"kernel_shape": kernel, "strides": strides, "pads": pads}
    if op == "AveragePool" and any(pads) and b.flag(0.5):
        attrs["count_include_pad"] = 1
    return b.op(op, [x], F32, conv_out_shape(x, spec), **attrs)


def q_concat(b: Builder) -> Val:
    x = _any(b)
    axis = b.int(0, x.rank - 1)
    parts = [x]
    for _ in range(b.int(1, 3)):
        other = _last(
            b,
            lambda v: (
                v.rank == x.rank
                and all(d == e for i, (d, e) in enumerate(zip(v.shape, x.shape)) if i != axis)
            ),
        )
        if other is None or b.flag(0.3):
            shape = list(x.shape)
            shape[axis] = b.int(1, 3)
            other = b.const(b.weights(tuple(shape), scale=1.0))
        parts.append(other)
    shape = list(x.shape)
    shape[axis] = sum(p.shape[axis] for p in parts)
    if math.prod(shape) > MAX_ELEMENTS:
        return x
    return b.op("Concat", parts, F32, shape, axis=axis)


def q_move(b: Builder) -> Val:
    """A data-movement op between units (the Q/DQ cleanups' ground)."""
    x = _any(b)
    kind = b.choice(
        [
            "reshape",
            "transpose",
            "squeeze",
            "unsqueeze",
            "flatten",
            "slice",
            "split",
            "gather",
            "resize",
        ]
    )
    if kind == "reshape":
        return reshape(b, x, factor_shape(b, x.numel))
    if kind == "transpose":
        return transpose(b, x, permutation(b, x.rank))
    if kind == "unsqueeze" or (kind == "squeeze" and 1 not in x.shape):
        return unsqueeze(b, x, random_axes(b, x.rank + 1, 1))
    if kind == "squeeze":
        ones = [i for i, d in enumerate(x.shape) if d == 1]
        return squeeze(b, x, [b.choice(ones)])
    if kind == "flatten":
        axis = b.int(0, x.rank)
        flat = (math.prod(x.shape[:axis]), math.prod(x.shape[axis:]))
        return b.op("Flatten", [x], F32, flat, axis=axis)
    if kind == "resize" and x.rank == 4:
        factor = b.choice([1, 2])
        scales = b.const(np.asarray([1, 1, factor, factor], F32))
        resized = (*x.shape[:2], x.shape[2] * factor, x.shape[3] * factor)
        if math.prod(resized) > MAX_ELEMENTS:
            return x
        return b.op("Resize", [x, "", scales], F32, resized, mode="nearest")
    if kind == "gather":
        axis = b.int(0, x.rank - 1)
        count = b.int(1, 3)
        indices = b.ints([b.int(-x.shape[axis], x.shape[axis] - 1) for _ in range(count)])
        shape = [*x.shape[:axis], count, *x.shape[axis + 1 :]]
        return b.op("Gather", [x, indices], F32, shape, axis=axis)
    axes = [i for i, d in enumerate(x.shape) if d >= 2]
    if not axes:
        return x
    axis = b.choice(axes)
    size = x.shape[axis]
    if kind == "split":
        first = b.int(1, size - 1)
        sizes = [first, size - first]
        names = b.node("Split", [x.name, b.ints(sizes).name], 2, axis=axis)
        parts = []
        for name, part in zip(names, sizes):
            shape = list(x.shape)
            shape[axis] = part
            parts.append(b.add(name, F32, shape))
        return parts[b.int(0, 1)]
    start = b.int(0, size - 1)
    end = b.int(start + 1, size)
    shape = list(x.shape)
    shape[axis] = end - start
    inputs = [x, b.ints([start]), b.ints([end]), b.ints([axis])]
    return b.op("Slice", inputs, F32, shape)


QDQ_STEPS = {
    "conv": (q_conv, 4),
    "matmul": (q_matmul, 2),
    "gemm": (q_gemm, 2),
    "binary": (q_binary, 3),
    "unary": (q_unary, 3),
    "pool": (q_pool, 2),
    "concat": (q_concat, 1),
    "move": (q_move, 4),
}
_QDQ_MENU = [name for name, (_, weight) in QDQ_STEPS.items() for _ in range(weight)]


def quant_forms() -> st.SearchStrategy[QuantForm]:
    # int8 activations go with int8 weights only (the quantizer refuses S8U8).
    types = st.sampled_from(
        [("uint8", "int8"), ("uint8", "int8"), ("int8", "int8"), ("uint8", "uint8")]
    )
    return types.flatmap(
        lambda pair: st.builds(
            QuantForm,
            activation=st.just(pair[0]),
            weight=st.just(pair[1]),
            per_channel=st.booleans(),
            reduce_range=st.integers(0, 9).map(lambda i: i == 0),
            activation_symmetric=st.integers(0, 4).map(lambda i: i == 0),
            weight_symmetric=st.integers(0, 2).map(lambda i: i == 0),
            keep_activations=st.integers(0, 3).map(lambda i: i == 0),
        )
    )


def quantize(model: onnx.ModelProto, form: QuantForm, feeds: list[dict]) -> onnx.ModelProto:
    """``model`` in QDQ format by onnxruntime's own quantize_static, calibrated on ``feeds``."""
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    types = {"uint8": QuantType.QUInt8, "int8": QuantType.QInt8}

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.feeds = iter(feeds)

        def get_next(self) -> dict | None:
            return next(self.feeds, None)

    logging.getLogger().setLevel(logging.ERROR)  # its advice to pre-process the model
    with tempfile.TemporaryDirectory() as folder, contextlib.redirect_stdout(io.StringIO()):
        out = Path(folder) / "qdq.onnx"
        quantize_static(
            model,
            out,
            Reader(),
            quant_format=QuantFormat.QDQ,
            per_channel=form.per_channel,
            reduce_range=form.reduce_range,
            activation_type=types[form.activation],
            weight_type=types[form.weight],
            extra_options={
                "ActivationSymmetric": form.activation_symmetric,
                "WeightSymmetric": form.weight_symmetric,
                "QDQKeepRemovableActivations": form.keep_activations,
            },
        )
        return onnx.load(out)


@st.composite
def qdq_graph_cases(draw, max_steps: int = 8) -> GraphCase:
    """A random float model quantized to QDQ form, and how to feed it (plain values only:
    QuantizeLinear of NaN is undefined, and a fused kernel may round it elsewhere)."""
    from onnxfuse.fuzz.oracle import make_feeds

    opset, ir_version = draw(st.sampled_from(QDQ_OPSETS))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    b = _QdqBuilder(draw, opset, ir_version, rng)
    b.symbolic_inputs = False  # the calibration and the oracle feed the same shapes
    b.unnamed_nodes = False  # the oracle follows each unit by its op's name
    b.passthrough_outputs = False  # the quantizer cannot sort a graph input that is an output
    form = draw(quant_forms())
    feed_seed = draw(st.integers(0, 2**16))
    steps: list[str] = [form.describe()]
    error = ""
    try:
        for _ in range(draw(st.integers(1, max_steps))):
            name = draw(st.sampled_from(_QDQ_MENU))
            steps.append(name)
            QDQ_STEPS[name][0](b)
        float_model = assemble(b)
        calibration = [
            make_feeds(float_model, feed_seed + 100 + i, False) for i in range(_CALIBRATION_SETS)
        ]
        model = quantize(float_model, form, calibration)
    except (AssertionError, ValueError, TypeError, IndexError, KeyError, ZeroDivisionError) as exc:
        error = f"{type(exc).__name__} in step {steps[-1]}: {exc}"
        model = onnx.ModelProto()
    except Exception as exc:  # the quantizer refused the float model: a generator limit
        error = f"quantize_static: {type(exc).__name__}: {str(exc)[:200]}"
        model = onnx.ModelProto()
    return GraphCase(
        model=model,
        feed_seed=feed_seed,
        special=False,
        override=False,
        steps=steps,
        error=error[:300],
    )
