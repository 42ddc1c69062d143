"""Hypothesis strategies that build random, valid ONNX models.

A model is built step by step: each step picks an operand from the values
built so far (or makes a new graph input) and appends either a plain op
(elementwise, MatMul/Gemm, Conv, normalizations, shape ops, reductions,
Softmax, Cast, If, ...) or an instance of a rule source of the built-in packs
(Conv+BatchNormalization, Conv+activation, MatMul+Add, Identity/Dropout
chains, Transpose pairs, Pad+Conv, Clip chains, residual Add+Relu, ...),
often with a twist that must block the rule (a distractor: a non-constant
weight, a wrong attribute, a constant of the wrong value or shape) and
sometimes with an intermediate shared outside the pattern (an extra consumer,
or a graph output). Every draw goes through hypothesis, so failing models
shrink: fewer steps, simpler variants, earlier operands.

Shapes are tracked concretely (the builder knows every value's shape); graph
inputs may declare symbolic dimensions. Constants are initializers, Constant
nodes, or (IR >= 4) initializers that are also graph inputs, which a caller
may override and which therefore are not constants.
"""

from __future__ import annotations

import builtins
import functools
import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import onnx
from hypothesis import strategies as st
from onnx import helper, numpy_helper

F32 = np.dtype(np.float32)
F64 = np.dtype(np.float64)
F16 = np.dtype(np.float16)
I64 = np.dtype(np.int64)
I32 = np.dtype(np.int32)
I8 = np.dtype(np.int8)
BOOL = np.dtype(np.bool_)
FLOATS = (F32, F64, F16)

# (opset, IR version) pairs onnxruntime 1.32 loads; IR 3 is added separately.
OPSETS = ((17, 8), (13, 7), (11, 6), (18, 8), (21, 10), (23, 11))

_ORT_TYPE_NAMES = {
    F32: "float",
    F64: "double",
    F16: "float16",
    I64: "int64",
    I32: "int32",
    I8: "int8",
    BOOL: "bool",
}
MAX_ELEMENTS = 2048  # keep tensors small: the fuzzer runs thousands of models


def elem_type(dtype: np.dtype) -> int:
    return helper.np_dtype_to_tensor_dtype(np.dtype(dtype))


@functools.cache
def _ort_types(op: str, opset: int) -> frozenset[str] | None:
    """Element types onnxruntime's CPU provider runs ``op`` with at ``opset``."""
    from onnxfuse.targets.capabilities import load_target

    target = load_target("cpu")
    for support in target.ops.get(("", op), ()):
        if support.covers(opset):
            if not support.types:
                return frozenset(_ORT_TYPE_NAMES.values())
            key = "T" if "T" in support.types else sorted(support.types)[0]
            return frozenset(support.types[key])
    return None


def ort_ok(op: str, dtype: np.dtype, opset: int) -> bool:
    types = _ort_types(op, opset)
    return types is not None and _ORT_TYPE_NAMES.get(np.dtype(dtype)) in types


@dataclass
class Val:
    """A value of the graph under construction."""

    name: str
    dtype: np.dtype
    shape: tuple[int, ...]
    const: np.ndarray | None = None  # the value of a constant (None: computed or overridable)

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass
class GraphCase:
    """A generated model and what its run needs (``error``: the generator failed)."""

    model: onnx.ModelProto
    feed_seed: int
    special: bool  # also run with NaN / inf / -0.0 in the float inputs
    override: bool  # feed other values for initializers that are graph inputs
    overridable: list[str] = field(default_factory=list)
    steps: list[str] = field(default_factory=list)
    error: str = ""

    def __repr__(self) -> str:  # what hypothesis prints for a falsifying example
        graph = self.model.graph
        return (
            f"GraphCase(opset={self.model.opset_import[0].version}, "
            f"ir={self.model.ir_version}, nodes={len(graph.node)}, steps={self.steps}, "
            f"feed_seed={self.feed_seed}, special={self.special}, override={self.override})"
        )


class Builder:
    """Builds one graph (the main graph, or an If branch inside it)."""

    def __init__(self, draw, opset: int, ir_version: int, rng, parent: Builder | None = None):
        self.draw = draw
        self.opset = opset
        self.ir_version = ir_version
        self.rng = rng
        self.parent = parent
        self.root: Builder = parent.root if parent is not None else self
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.pool: list[Val] = []
        if parent is None:
            self.counter = 0
            self.uses: Counter[str] = Counter()
            self.inputs: list[onnx.ValueInfoProto] = []
            self.overridable: list[str] = []
            self.forced_outputs: list[Val] = []
            self.steps: list[str] = []
            self.input_vals: list[Val] = []
            self.domains: dict[str, int] = {}  # opset imports beyond ai.onnx
            self.functions: list[onnx.FunctionProto] = []
            # Naming styles of real exports: path-like names, unnamed nodes.
            self.prefix = ""
            self.unnamed_nodes = False
            self.value_info = False  # declare types of some intermediates
            self.symbolic_inputs = True  # graph inputs may get symbolic dims
            self.passthrough_outputs = True  # a graph input or initializer may be an output
            # Types of intermediates a spliced rule instance declares (ops of other
            # domains that onnx cannot infer, as the property tests' instances have them).
            self.known_types: list[onnx.ValueInfoProto] = []

    # -- drawing ---------------------------------------------------------------

    def int(self, low: int, high: int) -> int:
        return self.draw(st.integers(low, high))

    def flag(self, p: float) -> bool:
        """True with probability ``p``; shrinks to False."""
        return self.draw(st.integers(0, 99)) >= 100 - round(p * 100)

    def choice(self, options):
        return self.draw(st.sampled_from(list(options)))

    # -- names, nodes, values --------------------------------------------------

    def fresh(self, hint: str) -> str:
        self.root.counter += 1
        return f"{self.root.prefix}{hint}{self.root.counter}"

    def child(self) -> Builder:
        """A builder for a subgraph that sees this graph's values."""
        return type(self)(self.draw, self.opset, self.ir_version, self.rng, parent=self)

    def visible(self) -> list[Val]:
        outer = self.parent.visible() if self.parent is not None else []
        return outer + self.pool

    def node(self, op: str, inputs: Sequence[str], n_out: builtins.int = 1, **attrs) -> list[str]:
        outputs = [self.fresh("v") for _ in range(n_out)]
        for name in inputs:
            if name:
                self.root.uses[name] += 1
        attrs = {k: v for k, v in attrs.items() if v is not None}
        name = "" if self.root.unnamed_nodes else self.fresh(f"{op.lower()}_")
        self.nodes.append(helper.make_node(op, inputs, outputs, name=name, **attrs))
        return outputs

    def add(self, name: str, dtype: np.dtype, shape, const: np.ndarray | None = None) -> Val:
        value = Val(name, np.dtype(dtype), tuple(int(d) for d in shape), const)
        self.pool.append(value)
        return value

    def op(self, op: str, inputs: Sequence[Val | str | None], dtype, shape, **attrs) -> Val:
        names = ["" if v is None else v if isinstance(v, str) else v.name for v in inputs]
        (out,) = self.node(op, names, **attrs)
        return self.add(out, dtype, shape)

    def new_input(
        self, dtype: np.dtype, shape, symbolic: dict[builtins.int, str] | None = None
    ) -> Val:
        """A new graph input (always in the main graph; a branch sees it from outside).

        ``symbolic``: dim_params for some axes (each named ``<name>_<size>``, equal names
        for equal sizes); without it, dims are sometimes made symbolic at random."""
        root = self.root
        name = root.fresh("in")
        dims: list[int | str] = list(shape)
        if symbolic:
            for axis, param in symbolic.items():
                dims[axis] = param
        elif dims and root.symbolic_inputs and root.flag(0.25):
            # Symbolic dims; one name per (axis, size) so equal names mean equal sizes.
            for axis in range(len(dims)):
                if axis == 0 or root.flag(0.3):
                    dims[axis] = f"d{axis}_{shape[axis]}"
        root.inputs.append(helper.make_tensor_value_info(name, elem_type(dtype), dims))
        value = Val(name, np.dtype(dtype), tuple(shape))
        root.input_vals.append(value)
        return value

    def const(self, array, *, override_ok: bool = True, as_node_ok: bool = True) -> Val:
        """A constant: an initializer, a Constant node, or an overridable initializer."""
        array = np.asarray(array)
        mode = 0
        if as_node_ok and self.flag(0.2):
            mode = 1
        elif self.parent is not None and self.ir_version < 4:
            mode = 1  # IR 3: initializers must be inputs, and a branch has none
        elif (
            override_ok
            and self.parent is None
            and self.ir_version >= 4
            and array.dtype.kind == "f"
            and self.flag(0.06)
        ):
            mode = 2
        name = self.fresh("c")
        if mode == 1:
            tensor = numpy_helper.from_array(array, name="value")
            self.nodes.append(
                helper.make_node("Constant", [], [name], name=self.fresh("const_"), value=tensor)
            )
            return Val(name, array.dtype, array.shape, array)
        self.inits.append(numpy_helper.from_array(array, name=name))
        if mode == 2:
            self.root.inputs.append(
                helper.make_tensor_value_info(name, elem_type(array.dtype), list(array.shape))
            )
            self.root.overridable.append(name)
            return Val(name, array.dtype, array.shape, None)
        return Val(name, array.dtype, array.shape, array)

    def ints(self, values) -> Val:
        return self.const(np.asarray(values, dtype=np.int64), override_ok=False)

    def scalar(self, value, dtype, rank0: bool = True, override_ok: bool = True) -> Val:
        shape = () if rank0 else (1,)
        return self.const(np.full(shape, value, dtype=dtype), override_ok=override_ok)

    def weights(self, shape, dtype=F32, scale: float | None = None) -> np.ndarray:
        fan_in = max(1, math.prod(shape[1:]))
        scale = 1.0 / math.sqrt(fan_in) if scale is None else scale
        return (self.rng.standard_normal(shape) * scale).astype(dtype)

    def pick(self, pred: Callable[[Val], bool], fallback: Callable[[], Val | None]) -> Val | None:
        candidates = [v for v in self.visible() if v.numel <= MAX_ELEMENTS and pred(v)]
        if candidates and not self.flag(0.08):
            return candidates[-1 - self.int(0, len(candidates) - 1)]
        return fallback()

    def share(self, intermediate: Val) -> None:
        """Sometimes use an intermediate of a pattern outside it: must block the rule."""
        if self.flag(0.1):
            if self.parent is None and self.flag(0.5):
                self.root.forced_outputs.append(intermediate)
            else:
                unary = "Identity" if intermediate.dtype not in (F32, F64) else "Neg"
                self.op(unary, [intermediate], intermediate.dtype, intermediate.shape)


# -- shape helpers ----------------------------------------------------------------


def random_shape(b: Builder, rank: int, low: int = 1, high: int = 5) -> tuple[int, ...]:
    return tuple(b.int(low, high) for _ in range(rank))


def broadcast_partner_shape(b: Builder, shape: tuple[int, ...]) -> tuple[int, ...]:
    """A shape that broadcasts to ``shape`` without growing it."""
    rank = b.int(0, len(shape))
    tail = shape[len(shape) - rank :]
    return tuple(d if b.flag(0.6) else 1 for d in tail)


def broadcast(a: tuple[int, ...], c: tuple[int, ...]) -> tuple[int, ...] | None:
    rank = max(len(a), len(c))
    a = (1,) * (rank - len(a)) + a
    c = (1,) * (rank - len(c)) + c
    out = []
    for x, y in zip(a, c):
        if x != y and 1 not in (x, y):
            return None
        out.append(max(x, y))
    return tuple(out)


def float_input(b: Builder, dtypes=(F32,), rank_range=(1, 4)) -> Val:
    rank = b.int(*rank_range)
    return b.new_input(dtypes[0], random_shape(b, rank))


def cast_to(b: Builder, x: Val, dtype: np.dtype) -> Val:
    if x.dtype == dtype:
        return x
    return b.op("Cast", [x], dtype, x.shape, to=elem_type(dtype))


def operand(
    b: Builder,
    dtypes,
    min_rank: int = 0,
    max_rank: int = 5,
    pred: Callable[[Val], bool] = lambda v: True,
    make: Callable[[], Val] | None = None,
) -> Val:
    """A value of one of ``dtypes``: from the pool, cast from another float, or a new input."""

    def shape_ok(v: Val) -> bool:
        return min_rank <= v.rank <= max_rank and pred(v)

    def fallback() -> Val:
        others = [
            v for v in b.visible() if v.dtype in FLOATS and shape_ok(v) and v.numel <= MAX_ELEMENTS
        ]
        if others and b.flag(0.5):
            return cast_to(b, others[-1 - b.int(0, len(others) - 1)], dtypes[0])
        if make is not None:
            return make()
        return b.new_input(dtypes[0], random_shape(b, b.int(min_rank, min(max_rank, 4))))

    chosen = b.pick(lambda v: v.dtype in dtypes and shape_ok(v), fallback)
    assert chosen is not None
    return chosen


def float_dtypes(b: Builder, op: str, allowed=(F32, F64, F16)) -> tuple[np.dtype, ...]:
    """The float types ``op`` runs with on onnxruntime's CPU provider, main type first."""
    result = [d for d in allowed if ort_ok(op, d, b.opset)]
    return tuple(result) or (F32,)


# -- conv-like ops ----------------------------------------------------------------


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def conv_input(b: Builder, ranks=(3, 4, 5)) -> Val:
    def make() -> Val:
        rank = b.choice([r for r in (4, 3, 5) if r in ranks])
        spatial = tuple(b.int(3, 7 if rank < 5 else 4) for _ in range(rank - 2))
        return b.new_input(F32, (b.int(1, 2), b.int(1, 4), *spatial))

    return operand(
        b,
        (F32,),
        min(ranks),
        max(ranks),
        pred=lambda v: v.shape[1] <= 8 and min(v.shape[2:]) >= 1 and v.numel <= 1024,
        make=make,
    )


@dataclass
class ConvSpec:
    kernel: list[int]
    strides: list[int]
    dilations: list[int]
    pads: list[int]
    auto_pad: str
    group: int
    out_channels: int

    def attrs(self, b: Builder, explicit_pads: bool = True) -> dict:
        n = len(self.kernel)
        attrs: dict = {}
        if b.flag(0.5):
            attrs["kernel_shape"] = self.kernel
        if self.strides != [1] * n or b.flag(0.3):
            attrs["strides"] = self.strides
        if self.dilations != [1] * n or b.flag(0.2):
            attrs["dilations"] = self.dilations
        if self.auto_pad != "NOTSET":
            attrs["auto_pad"] = self.auto_pad
        elif explicit_pads and (any(self.pads) or b.flag(0.3)):
            attrs["pads"] = self.pads
        if self.group != 1 or b.flag(0.2):
            attrs["group"] = self.group
        return attrs


def conv_spec(b: Builder, x: Val, same: bool, transpose: bool = False) -> ConvSpec:
    n = x.rank - 2
    channels = x.shape[1]
    group = b.choice(divisors(channels))
    out_channels = channels if same else group * b.int(1, 3)
    if same:
        kernel = [b.choice([1, 3]) for _ in range(n)]
        if min(x.shape[2:]) < 3:
            kernel = [1] * n
        auto = "NOTSET"
        if not transpose and b.flag(0.2):
            auto = b.choice(["SAME_UPPER", "SAME_LOWER"])
        pads = [k // 2 for k in kernel] * 2
        return ConvSpec(kernel, [1] * n, [1] * n, pads, auto, group, out_channels)
    kernel = [b.int(1, 3) for _ in range(n)]
    strides = [b.choice([1, 2]) if b.flag(0.3) else 1 for _ in range(n)]
    dilations = [b.choice([1, 2]) if b.flag(0.15) else 1 for _ in range(n)]
    pads = [b.int(0, 2) if b.flag(0.4) else 0 for _ in range(2 * n)]
    auto = "NOTSET"
    if b.flag(0.15):
        auto = b.choice(["SAME_UPPER", "SAME_LOWER", "VALID"] if not transpose else ["VALID"])
        pads = [0] * (2 * n)
        if auto != "VALID":  # onnxruntime: no dilations with SAME padding
            dilations = [1] * n
    spec = ConvSpec(kernel, strides, dilations, pads, auto, group, out_channels)
    # Shrink kernels that do not fit the (padded) input.
    for axis in range(n):
        size = x.shape[2 + axis] + pads[axis] + pads[axis + n]
        while dilations[axis] * (kernel[axis] - 1) + 1 > size:
            if kernel[axis] > 1:
                kernel[axis] -= 1
            else:
                dilations[axis] = 1
    return spec


def conv_out_shape(x: Val, spec: ConvSpec) -> tuple[int, ...]:
    n = x.rank - 2
    out = [x.shape[0], spec.out_channels]
    for axis in range(n):
        size = x.shape[2 + axis]
        k, s, d = spec.kernel[axis], spec.strides[axis], spec.dilations[axis]
        if spec.auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            out.append(-(-size // s))
        elif spec.auto_pad == "VALID":
            out.append((size - d * (k - 1) - 1) // s + 1)
        else:
            total = size + spec.pads[axis] + spec.pads[axis + n]
            out.append((total - d * (k - 1) - 1) // s + 1)
    return tuple(out)


def convtranspose_out_shape(x: Val, spec: ConvSpec) -> tuple[int, ...]:
    n = x.rank - 2
    out = [x.shape[0], spec.out_channels]
    for axis in range(n):
        size = x.shape[2 + axis]
        k, s, d = spec.kernel[axis], spec.strides[axis], spec.dilations[axis]
        pads = 0 if spec.auto_pad == "VALID" else spec.pads[axis] + spec.pads[axis + n]
        out.append(s * (size - 1) + d * (k - 1) + 1 - pads)
    return tuple(out)


def make_conv(b: Builder, x: Val, same: bool = False, bias: bool | None = None) -> tuple[Val, dict]:
    """A Conv on ``x``; returns its output and the parts (W, B, spec)."""
    spec = conv_spec(b, x, same)
    in_per_group = x.shape[1] // spec.group
    w_shape = (spec.out_channels, in_per_group, *spec.kernel)
    # Sometimes a distractor: weights computed at run time.
    w = b.new_input(F32, w_shape) if b.flag(0.07) else b.const(b.weights(w_shape))
    with_bias = b.flag(0.7) if bias is None else bias
    inputs: list[Val | None] = [x, w]
    bias_val = None
    if with_bias:
        bias_val = b.const(b.weights((spec.out_channels,), scale=0.5))
        inputs.append(bias_val)
    out_shape = conv_out_shape(x, spec)
    y = b.op("Conv", inputs, F32, out_shape, **spec.attrs(b))
    return y, {"W": w, "B": bias_val, "spec": spec}


def channel_const_shape(b: Builder, rank: int, channels: int) -> tuple[int, ...]:
    """A per-channel constant shape for an [N, C, ...] tensor, or a distractor."""
    options = [
        (channels,) + (1,) * (rank - 2),
        (1, channels) + (1,) * (rank - 2),
        (),
        (1,),
        (1,) * rank,
        (1,) * (rank - 1),
    ]
    shape = b.choice(options)
    return shape


# -- steps: rule sources ----------------------------------------------------------


def s_conv_tail(b: Builder, x: Val | None = None, same: bool = False) -> Val:
    """Conv followed by what the packs fold or fuse into it."""
    x = x or conv_input(b)
    y, _ = make_conv(b, x, same=same)
    tail = b.choice(["bn", "relu", "add", "mul", "residual", "act", "clip", "sum", "none"])
    b.root.steps.append(f"conv+{tail}")
    m = y.shape[1]
    rank = y.rank
    if tail != "none":
        b.share(y)
    if tail == "bn":
        eps = b.choice([1e-5, 1e-3, 0.1, 0.0])
        scale = b.weights((m,), scale=1.0)
        shift = b.weights((m,), scale=1.0)
        mean = b.weights((m,), scale=1.0)
        var = np.abs(b.weights((m,), scale=1.0)) + (0.0 if eps > 0 and b.flag(0.2) else 0.1)
        params = [b.const(a.astype(np.float32)) for a in (scale, shift, mean, var)]
        attrs: dict = {"epsilon": eps if eps != 1e-5 or b.flag(0.5) else None}
        if b.flag(0.2):
            attrs["momentum"] = 0.8
        if b.opset >= 14 and b.flag(0.1):
            attrs["training_mode"] = 0
        return b.op("BatchNormalization", [y, *params], F32, y.shape, **attrs)
    if tail in ("add", "mul"):
        shape = channel_const_shape(b, rank, m)
        if b.flag(0.1):  # distractor: a full-size addend
            shape = (1, *y.shape[1:])
        value = b.const(b.weights(shape, scale=1.0) if shape else np.float32(b.weights((1,))[0]))
        order = [y, value] if not b.flag(0.3) else [value, y]
        out_shape = broadcast(y.shape, value.shape)
        assert out_shape is not None
        return b.op("Add" if tail == "add" else "Mul", order, F32, out_shape)
    if tail in ("residual", "sum"):
        z = b.pick(lambda v: v.dtype == F32 and v.shape == y.shape, lambda: None)
        if z is None or b.flag(0.2):
            if b.flag(0.15):  # distractor: a broadcast residual
                z = b.new_input(F32, (1, m) + (1,) * (rank - 2))
            else:
                z = b.new_input(F32, y.shape)
        order = [y, z] if not b.flag(0.4) else [z, y]
        s = b.op("Add" if tail == "residual" else "Sum", order, F32, broadcast(y.shape, z.shape))
        b.share(s)
        return b.op("Relu", [s], F32, s.shape)
    if tail == "relu":
        return b.op("Relu", [y], F32, y.shape)
    if tail == "act":
        act = b.choice(["Sigmoid", "Tanh", "LeakyRelu", "HardSigmoid"])
        attrs = {}
        if act == "LeakyRelu" and b.flag(0.6):
            attrs["alpha"] = b.choice([0.01, 0.2, 0.0, -1.5])
        if act == "HardSigmoid" and b.flag(0.6):
            attrs["alpha"] = b.choice([0.2, 0.5, 1.0])
            attrs["beta"] = b.choice([0.5, 0.0, 0.3])
        return b.op(act, [y], F32, y.shape, **attrs)
    if tail == "clip":
        return clip(b, y)
    return y


def clip(b: Builder, x: Val, lo=None, hi=None) -> Val:
    """Clip with constant (sometimes absent or non-constant) bounds."""
    bounds = [-6.0, -1.0, -0.5, 0.0, 0.5, 1.0, 6.0, -np.inf, np.inf]
    kind = x.dtype.kind
    if lo is None:
        lo = b.choice(bounds)
    if hi is None:
        hi = b.choice(bounds)
    if kind != "f":
        lo = int(np.clip(lo, -100, 100))
        hi = int(np.clip(hi, -100, 100))
    inputs: list[Val | None] = [x]
    absent = b.choice(["none", "none", "min", "max", "both"]) if b.flag(0.2) else "none"
    rank0 = not b.flag(0.1)
    if b.opset < 11:
        raise AssertionError("opset < 11 is not generated")
    inputs.append(None if absent in ("min", "both") else b.scalar(lo, x.dtype, rank0))
    inputs.append(None if absent in ("max", "both") else b.scalar(hi, x.dtype, rank0))
    while inputs and inputs[-1] is None and len(inputs) > 1:
        inputs.pop()
    return b.op("Clip", inputs, x.dtype, x.shape)


def s_clip_chain(b: Builder, x: Val | None = None, same: bool = True) -> Val:
    dtypes = (*float_dtypes(b, "Clip", (F32, F64, F16)), I32, I64)
    x = x or operand(b, dtypes, 0, 4)
    given = x
    if not ort_ok("Clip", x.dtype, b.opset):
        x = cast_to(b, x, F32)
    kind = b.choice(["clip-clip", "clip-relu", "relu-clip", "relu-relu"])
    if "relu" in kind and not ort_ok("Relu", x.dtype, b.opset):
        kind = "clip-clip"
    b.root.steps.append(kind)
    first, second = kind.split("-")
    y = clip(b, x) if first == "clip" else b.op("Relu", [x], x.dtype, x.shape)
    b.share(y)
    y = clip(b, y) if second == "clip" else b.op("Relu", [y], y.dtype, y.shape)
    return cast_to(b, y, given.dtype)


def s_eliminate(b: Builder, x: Val | None = None, same: bool = True) -> Val:
    """Identity / Dropout / Cast no-ops, often chained."""
    x = x or operand(b, (F32, F64, F16, I64), 0, 5)
    y = x
    for _ in range(b.int(1, 3)):
        kind = b.choice(["identity", "dropout", "cast"])
        b.root.steps.append(kind)
        if kind == "dropout" and y.dtype in (F32, F64):
            y = dropout(b, y)
        elif kind == "cast":
            to = y.dtype if not b.flag(0.2) else b.choice([F32, F64, F16])
            attrs = {}
            if b.opset >= 19 and b.flag(0.2):
                attrs["saturate"] = 1
            if to != y.dtype and y.dtype.kind != "f":
                to = y.dtype
            y = b.op("Cast", [y], to, y.shape, to=elem_type(to), **attrs)
        else:
            y = b.op("Identity", [y], y.dtype, y.shape)
        if y.name != x.name:
            b.share(y)
    return cast_to(b, y, x.dtype) if same else y


def dropout(b: Builder, x: Val) -> Val:
    mask_used = b.flag(0.1)
    n_out = 2 if mask_used or b.flag(0.2) else 1
    attrs: dict = {}
    inputs: list[str] = [x.name]
    if b.opset < 12:
        if b.flag(0.3):
            attrs["ratio"] = b.choice([0.5, 0.1])
    else:
        variant = b.choice(["none", "ratio", "false", "true0"])
        if variant in ("ratio", "false", "true0"):
            ratio = 0.0 if variant == "true0" else b.choice([0.5, 0.1, 0.0])
            ratio_type = x.dtype if b.flag(0.5) else F32
            inputs.append(b.scalar(ratio, ratio_type, override_ok=False).name)
        if variant in ("false", "true0"):
            # training mode with ratio 0 is still the identity (a distractor).
            inputs.append(b.const(np.array(variant == "true0")).name)
    outputs = b.node("Dropout", inputs, n_out, **attrs)
    y = b.add(outputs[0], x.dtype, x.shape)
    if n_out == 2:
        mask = b.add(outputs[1], BOOL, x.shape)
        if mask_used:
            b.op("Cast", [mask], x.dtype, x.shape, to=elem_type(x.dtype))
        else:
            b.pool.remove(mask)
    return y


def permutation(b: Builder, rank: int) -> list[int]:
    perm = list(range(rank))
    for i in range(rank - 1, 0, -1):
        j = b.int(0, i)
        perm[i], perm[j] = perm[j], perm[i]
    return perm


def transpose(b: Builder, x: Val, perm: list[int] | None) -> Val:
    actual = perm if perm is not None else list(range(x.rank - 1, -1, -1))
    shape = tuple(x.shape[p] for p in actual)
    return b.op("Transpose", [x], x.dtype, shape, perm=perm)


def s_transpose_pair(b: Builder, x: Val | None = None, same: bool = False) -> Val:
    x = x or operand(b, (F32, F64, F16, I64), 1, 5)
    b.root.steps.append("transpose-pair")
    p1 = permutation(b, x.rank) if not b.flag(0.15) else None
    y = transpose(b, x, p1)
    b.share(y)
    if same:
        actual = p1 if p1 is not None else list(range(x.rank - 1, -1, -1))
        inverse = [actual.index(i) for i in range(x.rank)]
        p2 = inverse if not (p1 is None and b.flag(0.5)) else None
        if p2 is None and actual != list(range(x.rank - 1, -1, -1)):
            p2 = inverse
        return transpose(b, y, p2)
    p2 = permutation(b, x.rank) if not b.flag(0.15) else None
    z = transpose(b, y, p2)
    if b.flag(0.3):
        z = transpose(b, z, permutation(b, x.rank))
    return z


def factor_shape(b: Builder, numel: int, max_rank: int = 4) -> list[int]:
    """A random shape with ``numel`` elements."""
    dims: list[int] = []
    rest = numel
    for _ in range(b.int(0, max_rank - 1)):
        options = [d for d in divisors(rest) if d <= 8]
        d = b.choice(options)
        dims.append(d)
        rest //= d
    dims.append(rest)
    return dims


def reshape(b: Builder, x: Val, target: list[int], allowzero: int | None = None) -> Val:
    """Reshape to ``target``; writes the shape with -1 and 0 sometimes."""
    written = list(target)
    if written and b.flag(0.3):
        written[b.int(0, len(written) - 1)] = -1
    if not allowzero:
        for axis in range(min(len(written), x.rank)):
            if written[axis] == x.shape[axis] and b.flag(0.2):
                written[axis] = 0
    attrs = {}
    if b.opset >= 14 and allowzero is not None:
        attrs["allowzero"] = allowzero
    return b.op("Reshape", [x, b.ints(written)], x.dtype, target, **attrs)


def s_reshape_pair(b: Builder, x: Val | None = None, same: bool = False) -> Val:
    x = x or operand(b, (F32, F64, F16, I64), 0, 5)
    kind = b.choice(["reshape-reshape", "reshape-noop", "expand-noop", "expand"])
    b.root.steps.append(kind)
    if kind == "reshape-noop":
        return reshape(b, x, list(x.shape))
    if kind in ("expand-noop", "expand"):
        rank = b.int(0, x.rank)
        shape = [d if b.flag(0.5) else 1 for d in x.shape[x.rank - rank :]]
        if kind == "expand" and not same:
            shape = [b.int(1, 3)] + [d if d != 1 or not b.flag(0.5) else 2 for d in x.shape]
        out = broadcast(x.shape, tuple(shape))
        if out is None or math.prod(out) > MAX_ELEMENTS:
            shape, out = [], x.shape
        if not ort_ok("Expand", x.dtype, b.opset):
            x = cast_to(b, x, F32)
        return b.op("Expand", [x, b.ints(shape)], x.dtype, out)
    middle = factor_shape(b, x.numel)
    allow = 1 if b.opset >= 14 and b.flag(0.2) else None
    y = reshape(b, x, middle, allowzero=allow)
    b.share(y)
    final = list(x.shape) if same or b.flag(0.4) else factor_shape(b, x.numel)
    return reshape(b, y, final, allowzero=1 if b.opset >= 14 and b.flag(0.2) else None)


def axes_node(b: Builder, op: str, x: Val, axes: list[int], out_shape) -> Val:
    if b.opset >= 13:
        return b.op(op, [x, b.ints(axes)], x.dtype, out_shape)
    return b.op(op, [x], x.dtype, out_shape, axes=axes)


def unsqueeze(b: Builder, x: Val, axes: list[int]) -> Val:
    rank = x.rank + len(axes)
    norm = sorted(a % rank for a in axes)
    shape = list(x.shape)
    for a in norm:
        shape.insert(a, 1)
    return axes_node(b, "Unsqueeze", x, axes, shape)


def squeeze(b: Builder, x: Val, axes: list[int] | None) -> Val:
    if axes is None:
        shape = [d for d in x.shape if d != 1]
        return b.op("Squeeze", [x], x.dtype, shape)
    norm = {a % x.rank for a in axes}
    shape = [d for i, d in enumerate(x.shape) if i not in norm]
    return axes_node(b, "Squeeze", x, axes, shape)


def random_axes(b: Builder, rank: int, count: int, negative: bool = True) -> list[int]:
    pool = list(range(rank))
    axes = []
    for _ in range(min(count, rank)):
        a = pool.pop(b.int(0, len(pool) - 1))
        axes.append(a - rank if negative and b.flag(0.3) else a)
    return axes


def s_squeeze_pair(b: Builder, x: Val | None = None, same: bool = False) -> Val:
    x = x or operand(b, (F32, F64, F16, I64), 0, 4)
    kind = b.choice(["us", "su", "uu", "ss"])
    b.root.steps.append(f"squeeze:{kind}")
    if kind == "us" or (kind == "su" and 1 not in x.shape):
        count = b.int(1, 2)
        axes = random_axes(b, x.rank + count, count)
        y = unsqueeze(b, x, axes)
        b.share(y)
        back = axes if not b.flag(0.2) else sorted(a % y.rank for a in axes)
        if len(axes) == 1 and b.flag(0.3):
            back = [axes[0] - y.rank if axes[0] >= 0 else axes[0] + y.rank]
        return squeeze(b, y, back)
    if kind == "su":
        units = [i for i, d in enumerate(x.shape) if d == 1]
        axes = [units[b.int(0, len(units) - 1)]]
        if len(units) > 1 and b.flag(0.4):
            axes = units
        y = squeeze(b, x, axes)
        b.share(y)
        return unsqueeze(b, y, axes)
    if same:
        return x
    if kind == "uu":
        count = b.int(1, 2)
        a1 = random_axes(b, x.rank + count, count, negative=False)
        y = unsqueeze(b, x, a1)
        b.share(y)
        a2 = random_axes(b, y.rank + 1, 1, negative=b.flag(0.2))
        return unsqueeze(b, y, a2)
    # ss: needs two unit axes
    if x.shape.count(1) < 2:
        x = unsqueeze(b, x, [0, x.rank + 1])
    units = [i for i, d in enumerate(x.shape) if d == 1]
    first = [units[-1]] if b.flag(0.7) else [units[0]]
    y = squeeze(b, x, first)
    b.share(y)
    units = [i for i, d in enumerate(y.shape) if d == 1]
    if not units:
        return y
    return squeeze(b, y, [units[b.int(0, len(units) - 1)]])


def pad_input(
    b: Builder, x: Val, spatial_pads: list[int], value: str, mode: str, same: bool = False
) -> Val:
    n = x.rank - 2
    begin = [0, 0, *spatial_pads[:n]]
    end = [0, 0, *spatial_pads[n:]]
    if not same and mode == "constant" and b.flag(0.05):  # distractor: a channel pad
        begin[1] = 1
    pads = b.ints(begin + end)
    inputs: list[Val | None] = [x, pads]
    if value == "zero":
        inputs.append(b.scalar(0.0, F32, rank0=not b.flag(0.2)))
    elif value == "nonzero":
        inputs.append(b.scalar(0.5, F32))
    elif value == "input":
        inputs.append(b.new_input(F32, ()))
    if b.opset >= 18 and b.flag(0.1):
        while len(inputs) < 3:
            inputs.append(None)
        inputs.append(b.ints(list(range(x.rank))))
    shape = tuple(d + p + q for d, p, q in zip(x.shape, begin, end))
    attrs = {"mode": mode} if mode != "constant" or b.flag(0.3) else {}
    return b.op("Pad", inputs, F32, shape, **attrs)


def s_pad_fold(b: Builder, x: Val | None = None, same: bool = False) -> Val:
    x = x or conv_input(b, (3, 4) if not same else (3, 4, 5))
    n = x.rank - 2
    into = b.choice(["conv", "avgpool", "maxpool"])
    b.root.steps.append(f"pad+{into}")
    value = b.choice(["absent", "zero", "nonzero", "input"]) if b.flag(0.5) else "absent"
    mode = "constant" if not b.flag(0.08) else b.choice(["reflect", "edge"])
    if same:
        p = [b.int(0, 1) for _ in range(n)]
        spatial = p + p
        if mode == "reflect" and min(x.shape[2:]) < 2:
            mode = "constant"
    else:
        spatial = [b.int(0, 2) for _ in range(2 * n)]
        if mode == "reflect":
            spatial = [min(s, min(x.shape[2:]) - 1) for s in spatial]
        elif b.flag(0.06) and max(x.shape[2:]) >= 3:  # distractor: a crop (negative pad)
            axis = x.shape[2:].index(max(x.shape[2:]))
            spatial[axis + b.choice([0, n])] = -1
    padded = pad_input(b, x, spatial, value, mode, same)
    b.share(padded)
    if into == "conv":
        if same:
            spec = ConvSpec(
                [2 * q + 1 for q in spatial[:n]],
                [1] * n,
                [1] * n,
                [0] * (2 * n),
                "NOTSET",
                b.choice(divisors(padded.shape[1])),
                padded.shape[1],
            )
            if padded.shape[1] != x.shape[1]:
                spec.out_channels = x.shape[1]
                spec.group = 1
        else:
            spec = conv_spec(b, padded, same=False)
        w = b.const(b.weights((spec.out_channels, padded.shape[1] // spec.group, *spec.kernel)))
        inputs = [padded, w]
        if b.flag(0.5):
            inputs.append(b.const(b.weights((spec.out_channels,))))
        return b.op("Conv", inputs, F32, conv_out_shape(padded, spec), **spec.attrs(b))
    # pooling
    if same:
        kernel = [2 * q + 1 for q in spatial[:n]]
        strides, pool_pads = [1] * n, [0] * (2 * n)
    else:
        kernel = [b.int(1, min(3, padded.shape[2 + i])) for i in range(n)]
        strides = [b.choice([1, 2]) for _ in range(n)]
        pool_pads = [b.int(0, kernel[i % n] - 1) if b.flag(0.3) else 0 for i in range(2 * n)]
    attrs: dict = {"kernel_shape": kernel}
    if strides != [1] * n or b.flag(0.2):
        attrs["strides"] = strides
    if any(pool_pads) or b.flag(0.2):
        attrs["pads"] = pool_pads
    if into == "avgpool" and b.flag(0.5):
        attrs["count_include_pad"] = b.int(0, 1)
    dilations = [1] * n
    if into == "avgpool" and not same and b.opset >= 19 and b.flag(0.1):
        dilations = [2 if 2 * (k - 1) + 1 <= d else 1 for k, d in zip(kernel, padded.shape[2:])]
        attrs["dilations"] = dilations
    spec = ConvSpec(kernel, strides, dilations, pool_pads, "NOTSET", 1, padded.shape[1])
    out = list(conv_out_shape(padded, spec))
    if not same and b.flag(0.1) and dilations == [1] * n:  # distractor: ceil mode
        ceil = []
        for axis in range(n):
            size, k, step = padded.shape[2 + axis], kernel[axis], strides[axis]
            total = size + pool_pads[axis] + pool_pads[axis + n]
            ceil.append(-(-(total - k) // step) + 1)
            # Where the last window would start in the right pad, runtimes and shape
            # inference disagree on the size: no ceil mode there.
            if (ceil[-1] - 1) * step >= size + pool_pads[axis]:
                ceil = []
                break
        if ceil:
            attrs["ceil_mode"] = 1
            out[2:] = ceil
    op = "AveragePool" if into == "avgpool" else "MaxPool"
    return b.op(op, [padded], F32, out, **attrs)


def s_matmul_add(b: Builder, x: Val | None = None, same: bool = False) -> Val:
    """MatMul + Add (-> Gemm) and Gemm + Relu (-> FusedGemm)."""
    dtypes = (F32, F64)
    x = x or operand(b, dtypes, 2, 3 if not same else 2, pred=lambda v: v.shape[-1] <= 16)
    kind = b.choice(["matmul-add", "gemm-relu", "matmul-add", "gemm"])
    b.root.steps.append(kind)
    k = x.shape[-1]
    n = k if same else b.int(1, 6)
    if kind == "matmul-add" or x.rank != 2:
        w = b.new_input(x.dtype, (k, n)) if b.flag(0.1) else b.const(b.weights((k, n), x.dtype))
        p = b.op("MatMul", [x, w], x.dtype, (*x.shape[:-1], n))
        b.share(p)
        m = x.shape[-2]
        bias_shape = b.choice([(n,), (1, n), (m, n), (), (1,), (m, 1), (1, 1)])
        if b.flag(0.05):
            bias_shape = (1, m, n)  # distractor: a bias of rank 3
        if b.flag(0.1):
            c = b.new_input(x.dtype, bias_shape)
        else:
            c = b.const(b.weights(bias_shape, x.dtype, scale=1.0))
        order = [p, c] if not b.flag(0.3) else [c, p]
        out = b.op("Add", order, x.dtype, broadcast(p.shape, c.shape))
        if same and out.shape != x.shape:
            return reduce_to(b, out, x.shape)
        return out
    # Gemm (+ Relu)
    trans_a, trans_b = b.flag(0.2), b.flag(0.3)
    a = transpose(b, x, [1, 0]) if trans_a else x
    m = x.shape[0]
    w_shape = (n, k) if trans_b else (k, n)
    w = b.const(b.weights(w_shape, x.dtype))
    inputs: list[Val | None] = [a, w]
    if b.flag(0.75):
        inputs.append(b.const(b.weights(b.choice([(n,), (1, n), (m, n), ()]), x.dtype, 1.0)))
    attrs: dict = {}
    if trans_a:
        attrs["transA"] = 1
    if trans_b:
        attrs["transB"] = 1
    if b.flag(0.2):
        attrs["alpha"] = b.choice([0.5, 2.0])
    if b.flag(0.2):
        attrs["beta"] = b.choice([0.5, 0.0])
    g = b.op("Gemm", inputs, x.dtype, (m, n), **attrs)
    if kind == "gemm-relu":
        b.share(g)
        return b.op("Relu", [g], x.dtype, g.shape)
    return g


def reduce_to(b: Builder, x: Val, shape: tuple[int, ...]) -> Val:
    """ReduceSum ``x`` down to ``shape`` (a broadcast source of it)."""
    lead = x.rank - len(shape)
    axes = list(range(lead)) + [
        lead + i for i, d in enumerate(shape) if d == 1 and x.shape[lead + i] != 1
    ]
    if not axes:
        return x
    y = reduction(b, "ReduceSum", x, axes, keepdims=1)
    return reshape(b, y, list(shape)) if y.shape != shape else y


def s_convtranspose_bn(b: Builder, x: Val | None = None, same: bool = False) -> Val:
    x = x or conv_input(b, (3, 4))
    b.root.steps.append("convtranspose+bn")
    spec = conv_spec(b, x, same, transpose=True)
    if not same:
        spec.auto_pad = "NOTSET" if not b.flag(0.1) else "VALID"
        spec.pads = [b.int(0, 1) if b.flag(0.3) else 0 for _ in spec.pads]
        for axis in range(len(spec.kernel)):  # keep the output non-empty
            size = x.shape[2 + axis]
            if (
                spec.strides[axis] * (size - 1)
                + spec.dilations[axis] * (spec.kernel[axis] - 1)
                + 1
                - spec.pads[axis]
                - spec.pads[axis + len(spec.kernel)]
                < 1
            ):
                spec.pads = [0] * len(spec.pads)
    w = b.const(b.weights((x.shape[1], spec.out_channels // spec.group, *spec.kernel)))
    inputs = [x, w]
    if b.flag(0.6):
        inputs.append(b.const(b.weights((spec.out_channels,), scale=0.5)))
    attrs = spec.attrs(b)
    attrs.pop("auto_pad", None)
    if spec.auto_pad == "VALID":
        attrs["auto_pad"] = "VALID"
        attrs.pop("pads", None)
    y = b.op("ConvTranspose", inputs, F32, convtranspose_out_shape(x, spec), **attrs)
    b.share(y)
    m = y.shape[1]
    var = (np.abs(b.weights((m,), scale=1.0)) + 0.1).astype(np.float32)
    params = [b.const(b.weights((m,), scale=1.0)) for _ in range(3)]
    params.append(b.const(var))
    return b.op("BatchNormalization", [y, *params], F32, y.shape)


# -- steps: transformer rule sources ------------------------------------------------


def mul(b: Builder, x: Val, y: Val, swap: bool | None = None) -> Val:
    """Mul in either operand order (the engine treats Mul as commutative)."""
    swap = b.flag(0.4) if swap is None else swap
    shape = broadcast(x.shape, y.shape)
    assert shape is not None
    return b.op("Mul", [y, x] if swap else [x, y], x.dtype, shape)


def add(b: Builder, x: Val, y: Val) -> Val:
    shape = broadcast(x.shape, y.shape)
    assert shape is not None
    return b.op("Add", [y, x] if b.flag(0.4) else [x, y], x.dtype, shape)


def near(b: Builder, value: float) -> float:
    """The constant a rule expects; rarely rounded to 4 places (as some exporters write it,
    which rules with a declared tolerance accept) or wrong (a distractor)."""
    if b.flag(0.05):
        return value * 1.01  # outside every rule's tolerance
    if b.flag(0.03):
        return round(value, 4)
    return value


def fconst(b: Builder, value: float, dtype=F32) -> Val:
    return b.scalar(value, dtype, rank0=not b.flag(0.2))


def transformer_input(b: Builder, min_rank: int = 1, max_rank: int = 3, dtypes=(F32,)) -> Val:
    return operand(
        b,
        dtypes,
        min_rank,
        max_rank,
        pred=lambda v: v.shape[-1] <= 16 if v.rank else True,
        make=lambda: b.new_input(dtypes[0], random_shape(b, b.int(min_rank, max_rank), 1, 4)),
    )


def s_gelu(b: Builder, x: Val | None = None, same: bool = True) -> Val:
    """Decomposed Gelu (erf / tanh forms), with a bias Add before it sometimes."""
    x = x or transformer_input(b, 1, 4)
    if b.flag(0.3) and x.rank:  # BiasGelu: a 1-D bias over the last axis first
        bias = b.const(b.weights((x.shape[-1],), scale=1.0)) if not b.flag(0.2) else None
        bias = bias or b.new_input(F32, (x.shape[-1],))
        x = add(b, x, bias)
        b.share(x)
    form = b.choice(["erf", "tanh", "op", "ms"])
    if form == "op" and b.opset < 20:
        form = "ms"
    b.root.steps.append(f"gelu-{form}")
    if form == "op":
        approximate = b.choice([None, "none", "tanh"])
        return b.op("Gelu", [x], F32, x.shape, approximate=approximate)
    if form == "ms":  # onnxruntime's own Gelu / FastGelu, as exporters write them
        b.root.domains["com.microsoft"] = 1
        op = b.choice(["Gelu", "FastGelu"])
        (out,) = b.node(op, [x.name], domain="com.microsoft")
        return b.add(out, F32, x.shape)
    if form == "erf":
        if b.flag(0.5):
            s = b.op("Div", [x, fconst(b, near(b, 1.4142135))], F32, x.shape)
        else:
            s = mul(b, x, fconst(b, near(b, 0.70710677)))
        inner = b.op("Erf", [s], F32, x.shape)
    else:
        k = fconst(b, near(b, 0.044715))
        c = fconst(b, near(b, 0.7978845608))
        variant = b.choice(["pow", "cube", "factored", "factored_sq"])
        if variant in ("pow", "cube"):
            if variant == "pow":
                x3 = b.op("Pow", [x, fconst(b, 3.0)], F32, x.shape)
            else:
                x3 = mul(b, mul(b, x, x, swap=False), x)
            t0 = mul(b, add(b, x, mul(b, x3, k)), c)
        else:
            if variant == "factored":
                kx2 = mul(b, x, mul(b, x, k))
            else:
                kx2 = mul(b, mul(b, x, x, swap=False), k)
            p = add(b, kx2, fconst(b, 1.0))
            t0 = mul(b, mul(b, x, c), p)
        inner = b.op("Tanh", [t0], F32, x.shape)
    a = add(b, inner, fconst(b, 1.0))
    b.share(a)
    half = fconst(b, near(b, 0.5))
    where = b.choice(["first", "inner", "last"])
    if where == "first":
        return mul(b, mul(b, x, half), a)
    if where == "inner":
        return mul(b, x, mul(b, a, half))
    return mul(b, mul(b, x, a), half)


def s_quick_gelu(b: Builder, x: Val | None = None, same: bool = True) -> Val:
    """x * Sigmoid(alpha * x) (QuickGelu) and x * Sigmoid(x) (SiLU)."""
    x = x or transformer_input(b, 0, 4)
    if b.flag(0.5):
        b.root.steps.append("silu")
        g = b.op("Sigmoid", [x], F32, x.shape)
    else:
        b.root.steps.append("quick-gelu")
        alpha = b.choice([1.702, 1.0, -0.5, 2.0])
        if b.flag(0.05):
            alpha = b.choice([np.inf, np.nan])  # distractor: not finite
        shape = () if x.rank == 0 or not b.flag(0.3) else (1,)
        if b.flag(0.05) and x.rank >= 1:
            shape = (x.shape[-1],)  # distractor: a per-channel alpha
        a = b.const(np.full(shape, alpha, dtype=np.float32))
        g = b.op("Sigmoid", [mul(b, x, a)], F32, broadcast(x.shape, shape))
    b.share(g)
    return mul(b, x, g)


def square(b: Builder, x: Val, by_pow: bool) -> Val:
    if by_pow:
        return b.op("Pow", [x, fconst(b, 2.0, x.dtype)], x.dtype, x.shape)
    return mul(b, x, x, False)


def s_layer_norm(b: Builder, x: Val | None = None, same: bool = True) -> Val:
    """Decomposed LayerNormalization / RMSNormalization, and the SkipLayerNorm sources."""
    x = x or transformer_input(b, 1, 3, (F32, F64) if b.flag(0.25) else (F32,))
    dt = x.dtype
    if x.rank == 0:
        x = unsqueeze(b, x, [0])
    kind = b.choice(["layer", "rms", "skip"])
    b.root.steps.append(f"norm-{kind}")
    hidden = x.shape[-1]
    if kind == "skip" or b.flag(0.2):
        if b.flag(0.5):
            bias = b.const(b.weights((hidden,), dt, 1.0))
            x = add(b, x, bias)
        shape, name = x.shape, x.name  # read in the lambda: x itself is rebound
        found = b.pick(
            lambda v: v.dtype == dt and v.shape == shape and v.name != name, lambda: None
        )
        skip = found or b.new_input(dt, x.shape)
        x = add(b, x, skip)
        b.share(x)
        if kind == "skip" and b.opset >= 17 and b.flag(0.6):
            axis = b.choice([-1, x.rank - 1]) if not b.flag(0.1) else 0
            norm_shape = x.shape[axis % x.rank :]
            inputs = [x, b.const(b.weights(norm_shape, dt, 1.0))]
            if b.flag(0.7):
                inputs.append(b.const(b.weights(norm_shape, dt, 1.0)))
            eps = b.choice([None, 1e-5, 1e-12])
            return b.op("LayerNormalization", inputs, dt, x.shape, axis=axis, epsilon=eps)
    axes = [-1] if b.flag(0.5) else [x.rank - 1]
    if b.flag(0.05) and x.rank > 1:
        axes = [0]  # distractor: not the last axis

    def reduce_mean(v: Val) -> Val:
        return reduction(b, "ReduceMean", v, axes, keepdims=1)

    eps = b.const(np.full(() if b.flag(0.6) else (1,), b.choice([1e-5, 1e-12, 1e-6]), dt))
    gamma = (
        b.const(b.weights((hidden,), dt, 1.0)) if not b.flag(0.08) else b.new_input(dt, (hidden,))
    )
    square_by_pow = b.flag(0.5)
    if kind == "rms":
        p = square(b, x, square_by_pow)
        v = reduce_mean(p)
        s = b.op("Sqrt", [add(b, v, eps)], dt, v.shape)
        if b.flag(0.5):
            n = b.op("Div", [x, s], dt, x.shape)
        else:
            n = mul(b, x, b.op("Reciprocal", [s], dt, s.shape))
        return mul(b, n, gamma)
    m = reduce_mean(x)
    d = b.op("Sub", [x, m], dt, x.shape)
    b.share(d)
    d2 = b.op("Sub", [x, m], dt, x.shape) if b.flag(0.3) else d
    p = square(b, d2, square_by_pow)
    v = reduce_mean(p)
    s = b.op("Sqrt", [add(b, v, eps)], dt, v.shape)
    n = b.op("Div", [d, s], dt, x.shape)
    g = mul(b, n, gamma)
    beta = b.const(b.weights((hidden,), dt, 1.0))
    return add(b, g, beta)


# -- steps: plain ops -------------------------------------------------------------


def s_unary(b: Builder, x: Val | None = None, same: bool = True) -> Val:
    op = b.choice(
        ["Relu", "Sigmoid", "Tanh", "Abs", "Neg", "LeakyRelu", "HardSigmoid", "Softplus", "Exp"]
    )
    if op in ("Exp",) and b.flag(0.5):
        op = "Tanh"
    dtypes = float_dtypes(b, op, (F32, F64))
    x = x or operand(b, dtypes, 0, 5)
    given = x
    if x.dtype not in dtypes:
        x = cast_to(b, x, dtypes[0])
    attrs = {}
    if op == "LeakyRelu" and b.flag(0.5):
        attrs["alpha"] = 0.3
    y = b.op(op, [x], x.dtype, x.shape, **attrs)
    if b.flag(0.2) and ort_ok("Sqrt", y.dtype, b.opset):
        y = b.op("Sqrt", [b.op("Abs", [y], y.dtype, y.shape)], y.dtype, y.shape)
    return cast_to(b, y, given.dtype) if same else y


def s_binary(b: Builder, x: Val | None = None, same: bool = False) -> Val:
    op = b.choice(["Add", "Mul", "Sub", "Max", "Min", "Div", "Sum", "Where"])
    x = x or operand(b, (F32, F64), 0, 5)
    if x.dtype not in (F32, F64):
        x = cast_to(b, x, F32)
    partner = None
    if not same and b.flag(0.5):
        partner = b.pick(
            lambda v: (
                v.dtype == x.dtype
                and v.name != x.name
                and (broadcast(x.shape, v.shape) or (0,)) != (0,)
                and math.prod(broadcast(x.shape, v.shape) or (0,)) <= MAX_ELEMENTS
            ),
            lambda: None,
        )
    if partner is None:
        shape = broadcast_partner_shape(b, x.shape)
        array = b.weights(shape, x.dtype, scale=1.0) if shape else np.asarray(0.7, x.dtype)
        if op == "Div":
            array = (np.sign(array) + (array == 0)) * (np.abs(array) + 0.5)
        partner = b.const(array.astype(x.dtype))
        if b.flag(0.3):
            partner = b.new_input(x.dtype, shape) if op != "Div" else partner
    elif op == "Div":
        partner = b.op("Sigmoid", [partner], x.dtype, partner.shape)
    out = broadcast(x.shape, partner.shape)
    assert out is not None
    order = [x, partner] if not b.flag(0.4) else [partner, x]
    if op == "Where":
        cond = b.op("Greater", [x, b.scalar(0.0, x.dtype)], BOOL, x.shape)
        return b.op("Where", [cond, *order], x.dtype, out)
    if op == "Sum" and b.flag(0.3):
        order.append(x)
    return b.op(op, order, x.dtype, out)


def s_matmul(b: Builder, x: Val | None = None, same: bool = False) -> Val:
    x = x or operand(b, (F32, F64), 1, 4, pred=lambda v: v.shape[-1] <= 16)
    k = x.shape[-1]
    n = b.int(1, 6)
    w_shape: tuple[int, ...] = (k, n)
    if x.rank >= 3 and b.flag(0.3):
        w_shape = (x.shape[-3], k, n)
    w = b.const(b.weights(w_shape, x.dtype)) if not b.flag(0.15) else b.new_input(x.dtype, w_shape)
    if x.rank == 1:
        return b.op("MatMul", [x, w], x.dtype, (n,))
    return b.op("MatMul", [x, w], x.dtype, (*x.shape[:-1], n))


def s_conv(b: Builder, x: Val | None = None, same: bool = False) -> Val:
    x = x or conv_input(b)
    y, _ = make_conv(b, x, same=same)
    return y


def s_pool(b: Builder, x: Val | None = None, same: bool = False) -> Val:
    x = x or conv_input(b, (3, 4))
    n = x.rank - 2
    op = b.choice(["MaxPool", "AveragePool", "GlobalAveragePool"])
    if op == "GlobalAveragePool":
        return b.op(op, [x], F32, (*x.shape[:2], *([1] * n)))
    kernel = [b.int(1, min(3, x.shape[2 + i])) for i in range(n)]
    strides = [b.choice([1, 2]) for _ in range(n)]
    pads = [b.int(0, kernel[i % n] - 1) if b.flag(0.3) else 0 for i in range(2 * n)]
    spec = ConvSpec(kernel, strides, [1] * n, pads, "NOTSET", 1, x.shape[1])
    return b.op(
        op, [x], F32, conv_out_shape(x, spec), kernel_shape=kernel, strides=strides, pads=pads
    )


def s_norm(b: Builder, x: Val | None = None, same: bool = True) -> Val:
    op = b.choice(["BatchNormalization", "LayerNormalization", "InstanceNormalization"])
    if op == "LayerNormalization" and b.opset < 17:
        op = "BatchNormalization"
    dtypes = float_dtypes(b, op, (F32, F64))
    min_rank = 3 if op == "InstanceNormalization" else 2 if op == "BatchNormalization" else 1
    x = x or operand(b, dtypes, min_rank, 5)
    # Not over an empty tensor: onnxruntime 1.32's InstanceNormalization crashes the
    # process on one (a MaxPool whose kernel outgrows its input makes them).
    if x.rank < min_rank or x.numel == 0:
        x = b.new_input(dtypes[0], random_shape(b, min_rank + 1))
    if x.dtype not in dtypes:
        x = cast_to(b, x, dtypes[0])
    if op == "LayerNormalization":
        axis = b.int(-x.rank, x.rank - 1)
        norm_shape = x.shape[axis % x.rank :]
        inputs = [x, b.const(b.weights(norm_shape, x.dtype, 1.0))]
        if b.flag(0.5):
            inputs.append(b.const(b.weights(norm_shape, x.dtype, 1.0)))
        return b.op(op, inputs, x.dtype, x.shape, axis=axis)
    c = x.shape[1]
    scale = b.const(b.weights((c,), x.dtype, 1.0))
    bias = b.const(b.weights((c,), x.dtype, 1.0))
    if op == "InstanceNormalization":
        return b.op(op, [x, scale, bias], x.dtype, x.shape)
    mean = b.const(b.weights((c,), x.dtype, 1.0))
    var = b.const((np.abs(b.weights((c,), x.dtype, 1.0)) + 0.2).astype(x.dtype))
    return b.op(op, [x, scale, bias, mean, var], x.dtype, x.shape)


def s_softmax(b: Builder, x: Val | None = None, same: bool = True) -> Val:
    op = b.choice(["Softmax", "LogSoftmax"])
    x = x or operand(b, (F32, F64), 1, 5)
    if x.rank == 0 or x.dtype not in (F32, F64):
        x = b.new_input(F32, random_shape(b, 2))
    axis = b.int(-x.rank, x.rank - 1)
    default_ok = b.opset >= 13 or x.rank >= 2  # the default axis is 1 before opset 13
    return b.op(op, [x], x.dtype, x.shape, axis=None if default_ok and b.flag(0.2) else axis)


def reduction(b: Builder, op: str, x: Val, axes: list[int] | None, keepdims: int) -> Val:
    norm = sorted({a % x.rank for a in axes}) if axes else list(range(x.rank))
    if keepdims:
        shape = [1 if i in norm else d for i, d in enumerate(x.shape)]
    else:
        shape = [d for i, d in enumerate(x.shape) if i not in norm]
    attrs: dict = {"keepdims": keepdims}
    inputs: list[Val] = [x]
    axes_as_input = b.opset >= 18 or (op == "ReduceSum" and b.opset >= 13)
    if axes is not None:
        if axes_as_input:
            inputs.append(b.ints(axes))
        else:
            attrs["axes"] = axes
    return b.op(op, inputs, x.dtype, shape, **attrs)


def s_reduce(b: Builder, x: Val | None = None, same: bool = False) -> Val:
    op = b.choice(["ReduceSum", "ReduceMean", "ReduceMax"])
    x = x or operand(b, (F32, F64), 1, 5)
    if x.rank == 0:
        x = b.new_input(x.dtype, random_shape(b, 2))
    axes = random_axes(b, x.rank, b.int(1, x.rank)) if not b.flag(0.15) else None
    return reduction(b, op, x, axes, keepdims=b.int(0, 1))


def s_shape_op(b: Builder, x: Val | None = None, same: bool = False) -> Val:
    kind = b.choice(["reshape", "transpose", "flatten", "slice", "concat", "split", "unsqueeze"])
    x = x or operand(b, (F32, F64, F16, I64), 1, 5)
    if x.rank == 0:
        x = unsqueeze(b, x, [0])
    if kind == "reshape":
        return reshape(b, x, factor_shape(b, x.numel))
    if kind == "transpose":
        return transpose(b, x, permutation(b, x.rank))
    if kind == "flatten":
        axis = b.int(0, x.rank)
        flat = (math.prod(x.shape[:axis]), math.prod(x.shape[axis:]))
        return b.op("Flatten", [x], x.dtype, flat, axis=axis)
    if kind == "unsqueeze":
        return unsqueeze(b, x, random_axes(b, x.rank + 1, 1))
    if kind == "slice":
        give_axes = b.flag(0.6)
        axis = b.int(0, x.rank - 1) if give_axes else 0
        size = x.shape[axis]
        step = b.choice([1, 1, 2, -1]) if give_axes else 1
        if step > 0:
            start = b.int(0, size - 1)
            end = max(b.int(1, size + 2), start + 1)
            count = len(range(start, min(end, size), step))
        else:
            start, end = b.int(0, size - 1), -size - 1
            count = len(range(start, -1, step))
        inputs: list[Val | str | None] = [x, b.ints([start]), b.ints([end])]
        if give_axes:
            inputs.append(b.ints([axis - x.rank if b.flag(0.3) else axis]))
            if step != 1 or b.flag(0.5):
                inputs.append(b.ints([step]))
        shape = list(x.shape)
        shape[axis] = count
        return b.op("Slice", inputs, x.dtype, shape)
    if kind == "concat":
        axis = b.int(0, x.rank - 1)
        others = [x]
        for _ in range(b.int(1, 2)):
            shape = list(x.shape)
            shape[axis] = b.int(1, 3)
            if b.flag(0.4):
                others.append(x)
            else:
                array = b.weights(tuple(shape), x.dtype, 1.0) if x.dtype.kind == "f" else None
                if array is None:
                    array = np.arange(math.prod(shape), dtype=x.dtype).reshape(shape)
                others.append(b.const(array))
        shape = list(x.shape)
        shape[axis] = sum(v.shape[axis] for v in others)
        if math.prod(shape) > MAX_ELEMENTS:
            return x
        return b.op("Concat", others, x.dtype, shape, axis=axis - x.rank if b.flag(0.3) else axis)
    # split into two parts along an axis of size >= 2
    axes = [i for i, d in enumerate(x.shape) if d >= 2]
    if not axes:
        return x
    axis = b.choice(axes)
    first = b.int(1, x.shape[axis] - 1)
    sizes = [first, x.shape[axis] - first]
    names_in = [x.name]
    attrs: dict = {"axis": axis}
    if b.opset >= 13:
        names_in.append(b.ints(sizes).name)
    else:
        attrs["split"] = sizes
    names = b.node("Split", names_in, 2, **attrs)
    parts = []
    for name, size in zip(names, sizes):
        shape = list(x.shape)
        shape[axis] = size
        parts.append(b.add(name, x.dtype, shape))
    return parts[b.int(0, 1)]


def s_cast(b: Builder, x: Val | None = None, same: bool = False) -> Val:
    """Casts between float types, to float16 / int side chains and back."""
    x = x or operand(b, (F32, F64), 0, 5)
    to = b.choice([F16, F64, F32, I32, I64])
    if to == x.dtype:
        to = F16
    if to.kind == "i":
        # Integers from a graph input: a float result rounded differently by a
        # rewrite could flip an integer downstream (not a bug, but not comparable).
        x = b.new_input(x.dtype, x.shape)
    y = b.op("Cast", [x], to, x.shape, to=elem_type(to))
    # A few ops in the new type, then maybe back.
    for _ in range(b.int(0, 2)):
        if to in (F16, I32, I64, F32, F64) and b.flag(0.5):
            y = s_clip_chain(b, y)
        elif ort_ok("Relu", to, b.opset) and b.flag(0.5):
            y = b.op("Relu", [y], y.dtype, y.shape)
        else:
            y = s_transpose_pair(b, y, same=True) if y.rank else y
    if b.flag(0.6) and y.dtype != x.dtype:
        y = b.op("Cast", [y], x.dtype, y.shape, to=elem_type(x.dtype))
    return y


# Steps that keep their operand's shape and dtype: usable in If branches.
SAME_STEPS: list[tuple[str, Callable[..., Val], Callable[[Val], bool]]] = [
    ("unary", s_unary, lambda v: v.dtype in (F32, F64)),
    ("eliminate", s_eliminate, lambda v: True),
    ("clip", s_clip_chain, lambda v: v.dtype in (F32, F64, F16, I32, I64)),
    ("transpose", s_transpose_pair, lambda v: v.rank >= 1),
    ("reshape", s_reshape_pair, lambda v: True),
    ("squeeze", s_squeeze_pair, lambda v: v.rank <= 4),
    ("conv", s_conv_tail, lambda v: v.dtype == F32 and 3 <= v.rank <= 5 and v.shape[1] <= 8),
    ("pad", s_pad_fold, lambda v: v.dtype == F32 and 3 <= v.rank <= 5 and v.shape[1] <= 8),
    ("matmul", s_matmul_add, lambda v: v.dtype in (F32, F64) and v.rank == 2),
    ("softmax", s_softmax, lambda v: v.dtype in (F32, F64) and v.rank >= 1),
    ("binary", s_binary, lambda v: v.dtype in (F32, F64)),
    ("gelu", s_gelu, lambda v: v.dtype == F32 and v.rank >= 1),
    ("quick_gelu", s_quick_gelu, lambda v: v.dtype == F32),
    ("layer_norm", s_layer_norm, lambda v: v.dtype == F32 and v.rank >= 1),
]


def s_if(b: Builder, x: Val | None = None, same: bool = False) -> Val:
    """An If whose branches compute from an outer value, with rule sources inside."""
    b.root.steps.append("if")
    x = x or operand(b, (F32, F64, F16, I64), 0, 5)
    kind = b.choice(["input", "data", "constant", "shape"])
    if kind == "input":
        cond = b.new_input(BOOL, ())
    elif kind == "data":
        source = operand(b, (F32, F64), 0, 5)
        total = reduction(b, "ReduceSum", source, None, keepdims=0)
        cond = b.op("Greater", [total, b.scalar(0.0, source.dtype)], BOOL, ())
    elif kind == "constant":
        cond = b.const(np.array(b.flag(0.5)), override_ok=False)
    else:
        cond = _dim_test(b)
    branches = []
    for label in ("then", "else"):
        sub = b.child()
        y = x
        for _ in range(b.int(0, 3)):
            usable = [(n, f) for n, f, ok in SAME_STEPS if ok(y)]
            _, step = usable[b.int(0, len(usable) - 1)]
            y = step(sub, y, same=True)
            assert y.shape == x.shape and y.dtype == x.dtype, (step, y, x)
        if y.name == x.name or b.flag(0.2):
            y = sub.op("Identity", [y], y.dtype, y.shape)
        out = helper.make_tensor_value_info(y.name, elem_type(y.dtype), list(y.shape))
        graph = helper.make_graph(sub.nodes, f"{label}_{b.fresh('g')}", [], [out], sub.inits)
        branches.append(graph)
    return b.op("If", [cond], x.dtype, x.shape, then_branch=branches[0], else_branch=branches[1])


def s_loop(b: Builder, x: Val | None = None, same: bool = False) -> Val:
    """A Loop of a constant 0, 1 or 2 trips carrying a value through rule sources,
    sometimes scanning it out too: folded where it runs its body at most once."""
    b.root.steps.append("loop")
    x = x or operand(b, (F32, F64), 0, 4)
    trips = b.choice([0, 1, 1, 2])
    count = b.scalar(trips, I64, override_ok=False)
    sub = b.child()
    iteration = Val(b.fresh("iter"), I64, ())
    cond_in = Val(b.fresh("cond"), BOOL, ())
    carried_in = Val(b.fresh("carried"), x.dtype, x.shape)
    y = carried_in
    for _ in range(b.int(1, 2)):
        usable = [(n, f) for n, f, ok in SAME_STEPS if ok(y)]
        _, step = usable[b.int(0, len(usable) - 1)]
        y = step(sub, y, same=True)
    cond_out = sub.op("Identity", [cond_in], BOOL, ())
    outputs = [cond_out, y]
    scan = trips > 0 and b.flag(0.4)
    if scan:
        outputs.append(sub.op("Identity", [y], y.dtype, y.shape))
    graph = helper.make_graph(
        sub.nodes,
        f"body_{b.fresh('g')}",
        [
            helper.make_tensor_value_info(v.name, elem_type(v.dtype), list(v.shape))
            for v in (iteration, cond_in, carried_in)
        ],
        [helper.make_tensor_value_info(v.name, elem_type(v.dtype), list(v.shape)) for v in outputs],
        sub.inits,
    )
    names = b.node("Loop", [count.name, "", x.name], 1 + scan, body=graph)
    result = b.add(names[0], x.dtype, x.shape)
    if scan:
        b.add(names[1], x.dtype, (trips, *x.shape))
    return result


def _symbolic_input(b: Builder) -> Val:
    """A graph input whose first dim (and maybe others) is symbolic, as exports declare
    a dynamic batch or sequence."""
    shape = random_shape(b, b.int(2, 4))
    symbolic = {a: f"d{a}_{shape[a]}" for a in range(len(shape)) if a == 0 or b.flag(0.4)}
    return b.new_input(b.choice([F32, F64]), shape, symbolic)


def _dim(b: Builder, shape: Val, axis: int, rank: int) -> Val:
    """Gather(Shape(x), axis) as a rank-0 int64 (the index sometimes negative)."""
    index = axis - rank if b.flag(0.3) else axis
    return b.op("Gather", [shape, b.scalar(index, I64, override_ok=False)], I64, (), axis=0)


def _dim_test(b: Builder) -> Val:
    """Equal(Gather(Shape(x), i), k): an If condition that shapes decide, folded only
    where dim i is static."""
    x = _symbolic_input(b)
    shape = b.op("Shape", [x], I64, (x.rank,))
    axis = b.int(0, x.rank - 1)
    size = x.shape[axis] if b.flag(0.5) else x.shape[axis] + 1
    return b.op("Equal", [_dim(b, shape, axis, x.rank), b.scalar(size, I64)], BOOL, ())


def s_shape_chain(b: Builder, x: Val | None = None, same: bool = False) -> Val:
    """A shape computed at run time as exporters write it, on an input with symbolic
    dims: Shape, then Gather or Slice of the leading dims, Unsqueeze, Concat with -1,
    Reshape; or a ConstantOfShape of the whole shape added to the input."""
    x = _symbolic_input(b)
    shape = b.op("Shape", [x], I64, (x.rank,))
    if b.flag(0.25):
        fill = b.op(
            "ConstantOfShape",
            [shape],
            x.dtype,
            x.shape,
            value=numpy_helper.from_array(np.ones(1, x.dtype)),
        )
        return b.op("Add", [x, fill], x.dtype, x.shape)
    keep = b.int(1, x.rank - 1)
    if b.flag(0.5):
        parts = [unsqueeze(b, _dim(b, shape, axis, x.rank), [0]) for axis in range(keep)]
        lead = parts[0] if len(parts) == 1 else b.op("Concat", parts, I64, (keep,), axis=0)
    else:
        lead = b.op("Slice", [shape, b.ints([0]), b.ints([keep])], I64, (keep,))
    target = b.op("Concat", [lead, b.ints([-1])], I64, (keep + 1,), axis=0)
    flat = (*x.shape[:keep], math.prod(x.shape[keep:]))
    return b.op("Reshape", [x, target], x.dtype, flat)


class _FunctionBuilder(Builder):
    """The body of a model-local function: it sees only its own inputs; constants are
    Constant nodes (a function has no initializers); a value it needs from outside
    becomes one more function input, fed by a new graph input at the call."""

    def __init__(self, parent: Builder):
        super().__init__(parent.draw, parent.opset, parent.ir_version, parent.rng, parent=parent)
        self.outer = parent  # the builder the function is called from
        self.formals: list[str] = []
        self.actuals: list[str] = []

    def int(self, low: int, high: int) -> int:
        return self.outer.int(low, high)

    def flag(self, p: float) -> bool:
        return self.outer.flag(p)

    def choice(self, options):
        return self.outer.choice(options)

    def visible(self) -> list[Val]:
        return list(self.pool)

    def bind(self, actual: Val) -> Val:
        formal = Val(self.fresh("p"), actual.dtype, actual.shape)
        self.formals.append(formal.name)
        self.actuals.append(actual.name)
        self.root.uses[actual.name] += 1
        self.pool.append(formal)
        return formal

    def new_input(
        self, dtype: np.dtype, shape, symbolic: dict[builtins.int, str] | None = None
    ) -> Val:
        return self.bind(self.root.new_input(dtype, shape, symbolic))

    def const(self, array, *, override_ok: bool = True, as_node_ok: bool = True) -> Val:
        array = np.asarray(array)
        name = self.fresh("c")
        tensor = numpy_helper.from_array(array, name="value")
        self.nodes.append(
            helper.make_node("Constant", [], [name], name=self.fresh("const_"), value=tensor)
        )
        return Val(name, array.dtype, array.shape, array)


def s_function(b: Builder, x: Val | None = None, same: bool = False) -> Val:
    """Rule sources inside a model-local function (IR >= 8), called from the main graph."""
    if b.parent is not None or b.ir_version < 8:
        return s_unary(b, x, same)
    b.root.steps.append("function")
    x = x or operand(b, (F32, F64, F16, I64), 0, 5)
    body = _FunctionBuilder(b)
    y = formal = body.bind(x)
    for _ in range(b.int(1, 3)):
        usable = [f for _, f, ok in SAME_STEPS if ok(y)]
        y = usable[b.int(0, len(usable) - 1)](body, y, same=True)
        assert y.shape == x.shape and y.dtype == x.dtype, (y, x)
    if y.name == formal.name:
        y = body.op("Identity", [y], y.dtype, y.shape)
    name = f"fn{len(b.root.functions)}"
    imports = [helper.make_opsetid("", b.opset)]
    imports += [helper.make_opsetid(d, v) for d, v in sorted(b.root.domains.items())]
    b.root.functions.append(
        helper.make_function("fuzz.local", name, body.formals, [y.name], body.nodes, imports)
    )
    b.root.domains["fuzz.local"] = 1
    (out,) = b.node(name, body.actuals, domain="fuzz.local")
    return b.add(out, x.dtype, x.shape)


def s_duplicate(b: Builder, x: Val | None = None, same: bool = False) -> Val:
    """A second copy of an earlier node (same op, inputs and attributes), so that
    common-subexpression elimination has work, sometimes followed by a rule source."""
    values = {v.name: v for v in b.pool}
    candidates = [
        n
        for n in b.nodes
        if n.op_type not in ("Constant", "If", "Dropout")
        and not n.domain
        and len(n.output) == 1
        and n.output[0] in values
    ]
    if not candidates:
        return s_unary(b, x, same)
    b.root.steps.append("duplicate")
    original = candidates[-1 - b.int(0, len(candidates) - 1)]
    copy = onnx.NodeProto()
    copy.CopyFrom(original)
    copy.output[0] = b.fresh("v")
    copy.name = "" if b.root.unnamed_nodes else b.fresh(f"{original.op_type.lower()}_")
    for name in copy.input:
        if name:
            b.root.uses[name] += 1
    b.nodes.append(copy)
    source = values[original.output[0]]
    y = b.add(copy.output[0], source.dtype, source.shape)
    if original.op_type == "Conv" and b.flag(0.5):
        # Conv weights shared with the first copy; fold a BatchNormalization into this one.
        m = y.shape[1]
        params = [b.const(b.weights((m,), scale=1.0)) for _ in range(3)]
        params.append(b.const((np.abs(b.weights((m,), scale=1.0)) + 0.1).astype(np.float32)))
        return b.op("BatchNormalization", [y, *params], F32, y.shape)
    return y


def s_rule_instance(b: Builder, x: Val | None = None, same: bool = False) -> Val:
    """An instance of any built-in rule's source, drawn from its verification domain."""
    from onnxfuse.fuzz.rule_instances import splice_rule_instance

    return splice_rule_instance(b, x, same)


# The step menu: rule sources first (they shrink towards the front), then plain ops.
STEPS: list[tuple[str, Callable[..., Val], int]] = [
    ("conv_tail", s_conv_tail, 6),
    ("clip_chain", s_clip_chain, 3),
    ("eliminate", s_eliminate, 3),
    ("transpose_pair", s_transpose_pair, 3),
    ("reshape_pair", s_reshape_pair, 3),
    ("squeeze_pair", s_squeeze_pair, 2),
    ("pad_fold", s_pad_fold, 3),
    ("matmul_add", s_matmul_add, 4),
    ("convtranspose_bn", s_convtranspose_bn, 1),
    ("gelu", s_gelu, 3),
    ("quick_gelu", s_quick_gelu, 2),
    ("layer_norm", s_layer_norm, 3),
    ("rule_instance", s_rule_instance, 8),
    ("unary", s_unary, 3),
    ("binary", s_binary, 3),
    ("matmul", s_matmul, 1),
    ("conv", s_conv, 1),
    ("pool", s_pool, 1),
    ("norm", s_norm, 2),
    ("softmax", s_softmax, 1),
    ("reduce", s_reduce, 1),
    ("shape_op", s_shape_op, 3),
    ("cast", s_cast, 2),
    ("if", s_if, 2),
    ("shape_chain", s_shape_chain, 2),
    ("loop", s_loop, 1),
    ("function", s_function, 1),
    ("duplicate", s_duplicate, 1),
]
_MENU = [name for name, _, weight in STEPS for _ in range(weight)]
_BY_NAME = {name: fn for name, fn, _ in STEPS}


def assemble(b: Builder) -> onnx.ModelProto:
    """The model: graph outputs are the values nothing consumes, and forced ones."""
    produced = {n for node in b.nodes for n in node.output}
    leaves = [v for v in b.pool if v.name in produced and b.uses[v.name] == 0]
    outputs: list[Val] = leaves[-6:]
    for value in b.forced_outputs:
        if value.name in produced and all(value.name != o.name for o in outputs):
            outputs.append(value)
    if not outputs:
        source = b.input_vals[0] if b.input_vals else b.new_input(F32, (2, 3))
        outputs.append(b.op("Identity", [source], source.dtype, source.shape))
    # Rarely, a graph input or an initializer that is itself a graph output.
    if b.passthrough_outputs and b.input_vals and b.flag(0.04):
        outputs.append(b.input_vals[b.int(0, len(b.input_vals) - 1)])
    constants = [t for t in b.inits if t.name not in b.overridable]
    if b.passthrough_outputs and constants and b.ir_version >= 4 and b.flag(0.03):
        chosen = constants[b.int(0, len(constants) - 1)]
        dtype = helper.tensor_dtype_to_np_dtype(chosen.data_type)
        outputs.append(Val(chosen.name, np.dtype(dtype), tuple(chosen.dims)))
    graph_outputs = [
        helper.make_tensor_value_info(v.name, elem_type(v.dtype), list(v.shape)) for v in outputs
    ]
    inputs = list(b.inputs)
    if b.ir_version < 4:
        listed = {i.name for i in inputs}
        inputs += [
            helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
            for t in b.inits
            if t.name not in listed
        ]
    value_info = []
    if b.value_info:
        listed = {v.name for v in outputs}
        value_info = [
            helper.make_tensor_value_info(v.name, elem_type(v.dtype), list(v.shape))
            for v in b.pool
            if v.name in produced and v.name not in listed and b.flag(0.5)
        ]
    listed = {v.name for v in outputs} | {v.name for v in value_info}
    value_info += [v for v in b.known_types if v.name not in listed and v.name in produced]
    graph = helper.make_graph(
        b.nodes, "fuzz", inputs, graph_outputs, b.inits, value_info=value_info
    )
    imports = [helper.make_opsetid("", b.opset)]
    imports += [helper.make_opsetid(domain, v) for domain, v in sorted(b.domains.items())]
    return helper.make_model(
        graph,
        opset_imports=imports,
        ir_version=b.ir_version,
        producer_name="onnxfuse-fuzz",
        functions=b.functions,
    )


@st.composite
def graph_cases(draw, max_steps: int = 8) -> GraphCase:
    """A random model with embedded rule sources, and how to feed it."""
    opset, ir_version = draw(st.sampled_from(OPSETS))
    if opset == 11 and draw(st.integers(0, 99)) >= 75:
        ir_version = 3  # every initializer is also a graph input
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    b = Builder(draw, opset, ir_version, rng)
    if b.flag(0.2):
        b.prefix = "/model/layers.0/"
    b.unnamed_nodes = b.flag(0.15)
    b.value_info = b.flag(0.25)
    for _ in range(b.int(0, 2)):
        float_input(b, (F32,) if not b.flag(0.2) else (F64,))
    error = ""
    try:
        for _ in range(draw(st.integers(1, max_steps))):
            name = draw(st.sampled_from(_MENU))
            b.steps.append(name)
            _BY_NAME[name](b)
        model = assemble(b)
    except (AssertionError, ValueError, TypeError, IndexError, KeyError, ZeroDivisionError) as exc:
        # A bug of this generator: the runner counts it as a discard, with the reason.
        error = f"{type(exc).__name__} in step {b.steps[-1] if b.steps else '?'}: {exc}"
        model = onnx.ModelProto()
    return GraphCase(
        model=model,
        feed_seed=draw(st.integers(0, 2**16)),
        special=draw(st.booleans()),
        override=bool(b.overridable) and draw(st.booleans()),
        overridable=list(b.overridable),
        steps=list(b.steps),
        error=error[:300],
    )


# -- models without hypothesis (the rule fuzzer's zoo) ------------------------------------


class _RandomBuilder(Builder):
    """A Builder whose choices come from a seeded ``random.Random`` instead of hypothesis."""

    def __init__(self, choices, opset: int, ir_version: int, rng, parent=None):
        super().__init__(None, opset, ir_version, rng, parent)
        self.choices = choices if parent is None else parent.choices
        self.root: _RandomBuilder

    def child(self) -> Builder:
        return _RandomBuilder(self.choices, self.opset, self.ir_version, self.rng, parent=self)

    def int(self, low: int, high: int) -> int:
        return self.root.choices.randint(low, high)

    def flag(self, p: float) -> bool:
        return self.root.choices.random() < p

    def choice(self, options):
        return self.root.choices.choice(list(options))


RULE_STEPS = [
    s_conv_tail,
    s_clip_chain,
    s_eliminate,
    s_transpose_pair,
    s_reshape_pair,
    s_squeeze_pair,
    s_pad_fold,
    s_matmul_add,
    s_convtranspose_bn,
    s_gelu,
    s_quick_gelu,
    s_layer_norm,
    s_rule_instance,
]


def random_model(index: int) -> onnx.ModelProto | None:
    """A small model with instances of one rule-source step (by ``index``), or None."""
    import random

    choices = random.Random(index)
    opset, ir_version = ((17, 8), (18, 8), (21, 10), (13, 7))[index // len(RULE_STEPS) % 4]
    b = _RandomBuilder(choices, opset, ir_version, np.random.default_rng(index))
    step = RULE_STEPS[index % len(RULE_STEPS)]
    try:
        for _ in range(choices.randint(1, 3)):
            step(b)
        model = assemble(b)
        onnx.checker.check_model(model, full_check=True)
    except Exception:  # a generator bug or an invalid combination: leave it out
        return None
    return model
