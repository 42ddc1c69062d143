"""Running instances and comparing outputs.

onnxruntime's CPU provider (all graph optimizations off) runs the source and
the rewritten model. Where onnxruntime has no kernel for the source (float16
Conv, most bfloat16 ops), both run on onnx's reference evaluator instead.
bfloat16 graph inputs and outputs pass through an exact float32 Cast, since
onnxruntime's Python API cannot exchange bfloat16 arrays.
Ops with a reference definition (no CPU kernel: com.microsoft.NhwcConv) are
inlined as it first (reference_ops).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np
import onnx
from onnx import helper

from onnxfuse.ops import element_types
from onnxfuse.proof.reference_ops import with_reference_definitions

ORT = "onnxruntime"
REFERENCE = "onnx.reference"
_BF16 = onnx.TensorProto.BFLOAT16


class RuntimeFailure(Exception):
    """A runtime could not load or run a model."""


@dataclass
class Runner:
    """Runs models on one runtime."""

    name: str

    def run(
        self, model: onnx.ModelProto, feeds: Sequence[dict[str, np.ndarray]]
    ) -> list[list[np.ndarray]]:
        if self.name == ORT:
            return _run_ort(model, feeds)
        return _run_reference(model, feeds)


def choose_runner(model: onnx.ModelProto) -> Runner:
    """onnxruntime if it can load the model, else the reference evaluator."""
    try:
        _ort_session(_bf16_boundary(model))
    except RuntimeFailure:
        return Runner(REFERENCE)
    return Runner(ORT)


# The last sessions created, by serialized model: choose_runner loads a model that is
# then run right away, and the same source runs again for every boundary case.
_SESSIONS: OrderedDict[bytes, Any] = OrderedDict()
_SESSION_CACHE_SIZE = 4


def _ort_session(model: onnx.ModelProto):
    try:
        model = with_reference_definitions(model)
    except ValueError as exc:  # a node its reference definition does not allow
        raise RuntimeFailure(str(exc)) from None
    data = model.SerializeToString()
    key = hashlib.sha256(data).digest()
    session = _SESSIONS.get(key)
    if session is None:
        session = _new_session(data)
        _SESSIONS[key] = session
        if len(_SESSIONS) > _SESSION_CACHE_SIZE:
            _SESSIONS.popitem(last=False)
    else:
        _SESSIONS.move_to_end(key)
    return session


def _new_session(data: bytes):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 4
    options.intra_op_num_threads = 1  # tiny models: threads only contend
    options.inter_op_num_threads = 1
    try:
        return ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime raises its own exception types
        raise RuntimeFailure(f"onnxruntime cannot load the model: {first_line(exc)}") from None


def _run_ort(
    model: onnx.ModelProto, feeds: Sequence[dict[str, np.ndarray]]
) -> list[list[np.ndarray]]:
    wrapped = _bf16_boundary(model)
    session = _ort_session(wrapped)
    bf16_outputs = {o.name for o in model.graph.output if o.type.tensor_type.elem_type == _BF16}
    results = []
    for feed in feeds:
        converted = {
            k: v.astype(np.float32) if v.dtype == ml_dtypes.bfloat16 else v for k, v in feed.items()
        }
        try:
            outputs = session.run(None, converted)
        except Exception as exc:
            raise RuntimeFailure(f"onnxruntime fails to run the model: {first_line(exc)}") from None
        results.append(
            [
                np.asarray(out).astype(ml_dtypes.bfloat16)
                if o.name in bf16_outputs
                else np.asarray(out)
                for o, out in zip(model.graph.output, outputs)
            ]
        )
    return results


def _run_reference(
    model: onnx.ModelProto, feeds: Sequence[dict[str, np.ndarray]]
) -> list[list[np.ndarray]]:
    from onnx.reference import ReferenceEvaluator

    try:
        evaluator = ReferenceEvaluator(with_reference_definitions(model))
    except Exception as exc:
        raise RuntimeFailure(f"onnx.reference cannot load the model: {first_line(exc)}") from None
    results = []
    for feed in feeds:
        try:
            with np.errstate(all="ignore"):
                outputs = evaluator.run(None, dict(feed))
        except Exception as exc:
            raise RuntimeFailure(
                f"onnx.reference fails to run the model: {first_line(exc)}"
            ) from None
        results.append([np.asarray(out) for out in outputs])
    return results


def _bf16_boundary(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model with bfloat16 inputs/outputs exchanged as float32 (exact casts)."""
    bf16_in = [v for v in model.graph.input if v.type.tensor_type.elem_type == _BF16]
    bf16_out = [v for v in model.graph.output if v.type.tensor_type.elem_type == _BF16]
    if not bf16_in and not bf16_out:
        return model
    wrapped = onnx.ModelProto()
    wrapped.CopyFrom(model)
    graph = wrapped.graph
    renames = {v.name: f"{v.name}__bf16" for v in bf16_in}
    out_renames = {v.name: f"{v.name}__bf16out" for v in bf16_out}
    for node in graph.node:
        for i, name in enumerate(node.input):
            if name in renames:
                node.input[i] = renames[name]
        for i, name in enumerate(node.output):
            if name in out_renames:
                node.output[i] = out_renames[name]
        for i, name in enumerate(node.input):
            if name in out_renames:
                node.input[i] = out_renames[name]
    casts = [helper.make_node("Cast", [old], [new], to=_BF16) for old, new in renames.items()]
    for value in graph.input:
        if value.name in renames:
            value.type.tensor_type.elem_type = onnx.TensorProto.FLOAT
    tail = []
    for value in graph.output:
        if value.name in out_renames:
            source = out_renames[value.name]
            if value.name in renames:  # a graph input passed straight through
                source = renames[value.name]
            tail.append(helper.make_node("Cast", [source], [value.name], to=onnx.TensorProto.FLOAT))
            value.type.tensor_type.elem_type = onnx.TensorProto.FLOAT
    nodes = casts + list(graph.node) + tail
    del graph.node[:]
    graph.node.extend(nodes)
    return wrapped


# -- comparison ------------------------------------------------------------------------


@dataclass
class Mismatch:
    message: str


def compare(
    expected: Sequence[np.ndarray],
    actual: Sequence[np.ndarray],
    names: Sequence[str],
    tolerance,
) -> Mismatch | None:
    """``actual`` must match ``expected`` within ``tolerance(dtype_name)``, NaN where NaN."""
    if len(expected) != len(actual):
        return Mismatch(f"{len(actual)} outputs instead of {len(expected)}")
    for name, e, a in zip(names, expected, actual):
        e, a = np.asarray(e), np.asarray(a)
        if e.dtype != a.dtype:
            return Mismatch(f"output '{name}': dtype {a.dtype} instead of {e.dtype}")
        if e.shape != a.shape:
            return Mismatch(f"output '{name}': shape {list(a.shape)} instead of {list(e.shape)}")
        dtype_name = element_types.from_numpy(e.dtype) or str(e.dtype)
        rtol, atol = tolerance(dtype_name)
        if e.dtype.kind in "iu":  # atol: quantization steps
            bad = np.abs(e.astype(np.int64) - a.astype(np.int64)) > atol
        elif e.dtype.kind not in "fc" and dtype_name != "bfloat16":
            bad = e != a
        else:
            e64, a64 = e.astype(np.float64), a.astype(np.float64)
            both_nan = np.isnan(e64) & np.isnan(a64)
            same = e64 == a64  # equal infinities, exact matches
            with np.errstate(invalid="ignore", over="ignore"):
                close = np.abs(a64 - e64) <= atol + rtol * np.abs(e64)
            bad = ~(both_nan | same | (close & np.isfinite(e64) & np.isfinite(a64)))
        if np.any(bad):
            index = tuple(int(i) for i in np.argwhere(bad)[0])
            count = int(np.count_nonzero(bad))
            detail = ""
            if e.dtype.kind == "f" or dtype_name == "bfloat16":
                e64, a64 = e.astype(np.float64), a.astype(np.float64)
                finite = bad & np.isfinite(e64) & np.isfinite(a64)
                if np.any(finite):
                    worst = float(np.max(np.abs(a64[finite] - e64[finite])))
                    detail = f"; max abs difference {worst:.6g}"
                detail += f" (rtol {rtol:g}, atol {atol:g})"
            elif e.dtype.kind in "iu":
                worst = int(np.max(np.abs(e.astype(np.int64) - a.astype(np.int64))))
                detail = f"; max difference {worst} steps (allowed {atol:g})"
            return Mismatch(
                f"output '{name}': {count} of {e.size} elements differ{detail}; first at "
                f"{list(index)}: source {e[index]!r}, rewritten {a[index]!r}"
            )
    return None


def first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    lines = [line for line in text.splitlines() if line.strip()]
    return (lines[0] if lines else text)[:300]
