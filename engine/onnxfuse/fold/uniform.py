"""Folding of uniform values on one element.

onnx's IR-3 models build every weight with a ``ConstantOfShape`` fill, which folds to
a ``spill.FillTensor`` (one value, never materialized). Folds that read such a fill
(a Conv+BatchNormalization fold scales its weight by a per-channel factor that is a
fill too) would otherwise build the whole array and compute on it, for a result that
is one repeated value again. Here, when every data input of a node is uniform (a
``FillTensor``, a stride-0 view, or a small array whose elements are bitwise equal),
the op is computed by the same evaluation path on one element per input and the
result is ``np.broadcast_to`` that element: it stays a ``FillTensor``.

Only ops whose element result cannot depend on the array around it qualify: correctly
rounded IEEE arithmetic, comparisons, logic, casts numpy does the same way for one
element and for many, and data movement. Output shapes are never derived from the
ONNX spec by hand where the old path can give them: data movement runs the old path
on stride-0 views (numpy keeps them views), elementwise ops broadcast as numpy does.
Anything else returns None and the caller computes on the full arrays, as before.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from onnxfuse.fold import spill

Arrays = list[np.ndarray | None]
Evaluate = Callable[[ir.Node, Arrays], list[np.ndarray] | None]

# Plain numpy types only (no ml_dtypes, strings, complex): their element operations
# are the ones numpy applies to every element of an array.
_PLAIN = frozenset(
    np.dtype(t)
    for t in (
        np.float16,
        np.float32,
        np.float64,
        np.int8,
        np.int16,
        np.int32,
        np.int64,
        np.uint8,
        np.uint16,
        np.uint32,
        np.uint64,
        np.bool_,
    )
)

# Elementwise ops -> first opset with numpy (multidirectional) broadcasting and no
# legacy attributes (``broadcast``/``axis`` before 7, ``consumed_inputs`` before 6).
_ELEMENTWISE = {
    "Add": 7,
    "Sub": 7,
    "Mul": 7,
    "Div": 7,
    "Neg": 6,
    "Abs": 6,
    "Sqrt": 6,
    "Max": 8,
    "Min": 8,
    "Identity": 1,
    "Cast": 6,
    "Equal": 7,
    "Less": 7,
    "Greater": 7,
    "LessOrEqual": 12,
    "GreaterOrEqual": 12,
    "Not": 1,
    "And": 7,
    "Or": 7,
    "Xor": 7,
    "Where": 9,
}
# Data movement whose old path (numpy or the reference evaluator) returns views: run
# on stride-0 views, they give the exact output shape without touching memory.
_VIEWS = {"Reshape": 5, "Transpose": 1, "Unsqueeze": 1, "Squeeze": 1, "Flatten": 1, "Slice": 1}
# Data movement that copies (np.tile, np.concatenate, data * ones): output shape
# computed here, element by the old path on one-element inputs.
_COPIES = {"Expand": 8, "Tile": 6, "Concat": 4}

_ATTRIBUTES = {"Cast": {"to", "saturate"}}


@dataclass(frozen=True)
class Uniform:
    """One element (a 0-d array) repeated over ``shape``."""

    element: np.ndarray
    shape: tuple[int, ...]

    def one(self, rank: int | None = None) -> np.ndarray:
        """The element as an array of ones-shape (the given rank, its own by default),
        a copy: the evaluator never sees the FillTensor's own value."""
        return self.element.reshape((1,) * (len(self.shape) if rank is None else rank)).copy()

    def view(self) -> np.ndarray:
        return np.broadcast_to(self.element, self.shape)


def uniform_of(tensor: ir.TensorProtocol) -> Uniform | None:
    """``tensor`` as one repeated element, or None. A large tensor is uniform only when
    it is held as one value: it is never read to find out."""
    if isinstance(tensor, spill.FillTensor):
        if tensor.value.dtype not in _PLAIN:
            return None
        return Uniform(tensor.value.reshape(-1)[:1].reshape(()), tuple(tensor.dims))
    raw = tensor.raw if isinstance(tensor, ir.Tensor) else None
    if isinstance(raw, np.ndarray) and raw.size and not any(raw.strides):
        if raw.dtype not in _PLAIN or ir.DataType.from_numpy(raw.dtype) != tensor.dtype:
            return None
        return Uniform(raw.reshape(-1)[:1].reshape(()).copy(), tuple(raw.shape))
    if tensor.nbytes >= spill.FILL_MIN_BYTES:
        return None
    array = tensor.numpy()
    if array.size == 0 or array.dtype not in _PLAIN:
        return None
    flat = np.ascontiguousarray(array).reshape(-1)
    if not _one_value(flat):
        return None
    return Uniform(flat[:1].reshape(()).copy(), tuple(array.shape))


def _one_value(flat: np.ndarray) -> bool:
    """All elements of a 1-D contiguous array bitwise equal: -0.0 is not 0.0, NaN
    payloads count."""
    if flat.size <= 1:
        return True
    bits = flat.view(f"u{flat.dtype.itemsize}")
    return bool((bits == bits[0]).all())


def uniform_result(
    node: ir.Node, tensors: list[ir.TensorProtocol | None], opset: int, evaluate: Evaluate
) -> list[np.ndarray] | None:
    """``node``'s single output as a stride-0 view of one element when its data inputs
    are uniform and the output is at least ``FILL_MIN_BYTES``; else None. ``evaluate``
    is the caller's full-array path (numpy or the reference evaluator). Sizes are
    decided from shapes first: most folds are small and cost nothing more here."""
    op = node.op_type
    if node.domain != "" or len(node.outputs) != 1 or not tensors:
        return None
    since = _ELEMENTWISE.get(op, _VIEWS.get(op, _COPIES.get(op)))
    if since is None or opset < since or any(t is None for t in tensors):
        return None
    present: list[ir.TensorProtocol] = tensors  # type: ignore[assignment]
    if op in _VIEWS:
        # The output is no larger than the input: a small input is as cheap as before.
        # The attributes (perm, axes) go to the old path with the node.
        if present[0].nbytes < spill.FILL_MIN_BYTES:
            return None
        source = uniform_of(present[0])
        if source is None:
            return None
        return _view_result(node, source, [t.numpy() for t in present[1:]], evaluate)
    if op in _ELEMENTWISE:
        if set(node.attributes) - _ATTRIBUTES.get(op, set()):
            return None
        shape = _broadcast(*(_dims(t) for t in present))
        data = present
    else:
        data = present if op == "Concat" else present[:1]
        params = [t.numpy() for t in present[len(data) :]]
        shape = _copy_shape(node, [_dims(t) for t in data], params)
    if shape is None or math.prod(shape) * 8 < spill.FILL_MIN_BYTES:
        return None  # too small to matter at any item size
    found = [uniform_of(t) for t in data]
    if any(u is None for u in found):
        return None
    uniforms: list[Uniform] = found  # type: ignore[assignment]
    if op in _ELEMENTWISE:
        if not _exact(op, node, uniforms):
            return None
        inputs: Arrays = [u.one(len(shape)) for u in uniforms]
    elif op == "Concat":
        if len({(u.element.dtype, u.element.tobytes()) for u in uniforms}) != 1:
            return None  # parts of different values: not one fill
        inputs = [u.one() for u in uniforms]
    else:  # Expand, Tile: the second input's ones keep the one-element shape
        inputs = [uniforms[0].one(), np.ones(len(params[0]), dtype=np.int64)]
    return _one_element_result(node, inputs, shape, evaluate)


def _dims(tensor: ir.TensorProtocol) -> tuple[int, ...]:
    return tuple(tensor.shape.numpy())


def _view_result(
    node: ir.Node, data: Uniform, params: list[np.ndarray], evaluate: Evaluate
) -> list[np.ndarray] | None:
    results = evaluate(node, [data.view(), *params])
    if results is None or len(results) != 1:
        return None
    (result,) = results
    if result.dtype != data.element.dtype:
        return None
    if result.nbytes < spill.FILL_MIN_BYTES:
        # Small (e.g. one row of a large fill): the same elements, made without
        # building the whole input.
        return [np.ascontiguousarray(result)]
    if any(result.strides):
        return None  # numpy copied: unexpected, leave it to the old path
    return [result]


def _one_element_result(
    node: ir.Node, inputs: Arrays, shape: tuple[int, ...], evaluate: Evaluate
) -> list[np.ndarray] | None:
    results = evaluate(node, inputs)
    if results is None or len(results) != 1:
        return None
    (result,) = results
    if result.dtype not in _PLAIN or result.size == 0:
        return None
    if math.prod(shape) * result.dtype.itemsize < spill.FILL_MIN_BYTES:
        return None
    if result.ndim != len(shape):
        return None
    flat = np.ascontiguousarray(result).reshape(-1)
    if not _one_value(flat):
        return None  # the op is not uniform after all: never guess
    return [np.broadcast_to(flat[:1].reshape(()), shape)]


def _broadcast(*shapes: tuple[int, ...]) -> tuple[int, ...] | None:
    """numpy's (and ONNX's multidirectional) broadcasting of ``shapes``; None if they do
    not broadcast. Plain Python: most calls are on small folds, declined right after."""
    rank = max(len(shape) for shape in shapes)
    padded = [(1,) * (rank - len(shape)) + shape for shape in shapes]
    out = []
    for dims in zip(*padded):
        sizes = set(dims) - {1}
        if len(sizes) > 1:
            return None
        out.append(sizes.pop() if sizes else 1)
    return tuple(out)


def _exact(op: str, node: ir.Node, inputs: list[Uniform]) -> bool:
    """False where one element could differ from the same element of a full array."""
    if op == "Div" and inputs[0].element.dtype.kind in "iu":
        x, y = (int(u.element) for u in inputs)
        info = np.iinfo(inputs[0].element.dtype)
        return y != 0 and not (y == -1 and x == info.min)
    if op == "Cast":
        return _exact_cast(node, inputs[0].element)
    if op == "Where":
        return inputs[0].element.dtype == np.bool_
    if op in _ORDERED and inputs[0].element.dtype.kind == "f":
        return _order_free(op, [u.element for u in inputs])
    return True


# numpy's loops for a broadcast operand may swap the operands of a commutative ufunc
# (np.add(x, scalar) computes scalar + x): where IEEE leaves the choice to the order,
# one element and a full array can disagree.
_ORDERED = frozenset({"Add", "Sub", "Mul", "Div", "Max", "Min"})


def _order_free(op: str, elements: list[np.ndarray]) -> bool:
    """False when the result's bits depend on the operand order: two NaNs of different
    bits (which one propagates), or Max/Min of equal values of different bits (-0.0
    and 0.0)."""
    bits = {e.tobytes() for e in elements}
    if len(bits) == 1:
        return True
    if sum(bool(np.isnan(e)) for e in elements) > 1:
        return False
    if op in ("Max", "Min"):
        values = [e for e in elements if not np.isnan(e)]
        return all(a.tobytes() == b.tobytes() or a != b for a in values for b in values)
    return True


def _exact_cast(node: ir.Node, element: np.ndarray) -> bool:
    """Float to integer casts of NaN, infinities or values out of range are undefined
    in C: numpy's one-element and vectorized loops may disagree. Everything else is
    exact or correctly rounded."""
    attr = node.attributes.get("to")
    if attr is None:
        return False
    try:
        target = ir.DataType(attr.as_int()).numpy()
    except (TypeError, ValueError):
        return False
    if np.dtype(target) not in _PLAIN:
        return False
    if element.dtype.kind != "f" or np.dtype(target).kind not in "iub":
        return True
    value = float(element)
    if not math.isfinite(value):
        return False
    if np.dtype(target).kind == "b":
        return True
    info = np.iinfo(target)
    return info.min <= math.trunc(value) <= info.max


def _copy_shape(
    node: ir.Node, shapes: list[tuple[int, ...]], params: list[np.ndarray]
) -> tuple[int, ...] | None:
    """Output shape of Expand, Tile or Concat, or None (the old path decides)."""
    op = node.op_type
    if op == "Concat":
        return _concat_shape(node, shapes)
    (param,) = params if len(params) == 1 else (None,)
    if param is None or param.dtype != np.int64 or param.ndim != 1 or (param < 0).any():
        return None
    (source,) = shapes
    values = tuple(int(v) for v in param)
    if op == "Expand":
        # data * ones(shape): numpy's broadcasting, as the reference evaluator computes it.
        return _broadcast(source, values)
    if node.attributes or len(values) != len(source):
        return None  # Tile's repeats must match the rank (np.tile would pad instead)
    return tuple(d * r for d, r in zip(source, values))


def _concat_shape(node: ir.Node, shapes: list[tuple[int, ...]]) -> tuple[int, ...] | None:
    attr = node.attributes.get("axis")
    if attr is None or set(node.attributes) != {"axis"}:
        return None
    first = shapes[0]
    rank = len(first)
    axis = attr.as_int()
    if rank == 0 or not -rank <= axis < rank:
        return None
    axis %= rank
    for shape in shapes:
        if len(shape) != rank:
            return None
        if any(d != f for k, (d, f) in enumerate(zip(shape, first)) if k != axis):
            return None
    out = list(first)
    out[axis] = sum(shape[axis] for shape in shapes)
    return tuple(out)
