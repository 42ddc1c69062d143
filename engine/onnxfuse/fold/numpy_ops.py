"""Folding without onnx's reference evaluator for the ops folds meet most.

Each function does exactly what the reference evaluator's implementation of the op
does (the same numpy calls on the same arrays), so the folded bytes are the same;
building an evaluator per node and importing its op table cost more than the
arithmetic on small models, and a fold of a weight-sized Cast or Mul through it
copies the weights several times. Anything outside the cases handled here (other
dtypes, attributes, opsets) returns None and goes to the evaluator, as does any
case where numpy raises: the evaluator then decides, as it always did.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import numpy as np
import onnx_ir as ir

Arrays = list[np.ndarray | None]

# Plain numpy dtypes: no ml_dtypes (bfloat16, float8), strings or complex numbers.
_FLOATS = (np.float16, np.float32, np.float64)
_NUMBERS: tuple[type[np.generic], ...] = (*_FLOATS, np.int8, np.int16, np.int32, np.int64)
_NUMBERS += (np.uint8, np.uint16, np.uint32, np.uint64, np.bool_)
_CAST_TARGETS = {
    ir.DataType.FLOAT: np.float32,
    ir.DataType.DOUBLE: np.float64,
    ir.DataType.FLOAT16: np.float16,
    ir.DataType.INT8: np.int8,
    ir.DataType.INT16: np.int16,
    ir.DataType.INT32: np.int32,
    ir.DataType.INT64: np.int64,
    ir.DataType.UINT8: np.uint8,
    ir.DataType.UINT16: np.uint16,
    ir.DataType.UINT32: np.uint32,
    ir.DataType.UINT64: np.uint64,
    ir.DataType.BOOL: np.bool_,
}


def numpy_result(node: ir.Node, inputs: Arrays, opset: int) -> list[np.ndarray] | None:
    """``node``'s outputs computed as the reference evaluator would, or None (unhandled)."""
    if node.domain != "" or len(node.outputs) != 1:
        return None
    compute, since = _OPS.get(node.op_type, (None, 0))
    if compute is None or opset < since or any(a is None for a in inputs):
        return None
    try:
        result = compute(node, inputs)
    except Exception:  # numpy refused: the evaluator decides (it would refuse too)
        return None
    return None if result is None else [np.asarray(result)]


def _binary(function: Callable[..., np.ndarray], dtypes: tuple[type, ...]):
    """OpRunBinaryNumpy: same dtype in, the numpy function, same dtype out."""

    def compute(node: ir.Node, inputs: Arrays) -> np.ndarray | None:
        if len(inputs) != 2 or node.attributes:
            return None
        x, y = inputs
        assert x is not None and y is not None
        if x.dtype != y.dtype or x.dtype.type not in dtypes:
            return None
        result = function(x, y)
        return result if result.dtype == x.dtype else None

    return compute


def _sqrt(node: ir.Node, inputs: Arrays) -> np.ndarray | None:
    (x,) = inputs if len(inputs) == 1 else (None,)
    if x is None or node.attributes or x.dtype.type not in _FLOATS:
        return None
    with warnings.catch_warnings():  # as the evaluator: sqrt of a negative is NaN
        warnings.simplefilter("ignore")
        return np.sqrt(x).astype(x.dtype)


def _reshape(node: ir.Node, inputs: Arrays) -> np.ndarray | None:
    """reshape_reference_implementation (Reshape 5 and later)."""
    if len(inputs) != 2 or set(node.attributes) - {"allowzero"}:
        return None
    data, shape = inputs
    assert data is not None and shape is not None
    if shape.dtype != np.int64:
        return None
    attr = node.attributes.get("allowzero")
    allowzero = attr is not None and attr.as_int() == 1
    new_shape = np.copy(shape)
    if not allowzero:
        zeros_index = np.where(shape == 0)
        new_shape[zeros_index] = np.array(data.shape)[zeros_index]
    return np.reshape(data, new_shape)


def _cast(node: ir.Node, inputs: Arrays) -> np.ndarray | None:
    """cast_to for plain numeric types: ``astype`` (saturate applies to float8 only)."""
    if len(inputs) != 1 or set(node.attributes) - {"to", "saturate"}:
        return None
    (x,) = inputs
    attr = node.attributes.get("to")
    target = _CAST_TARGETS.get(ir.DataType(attr.as_int())) if attr is not None else None
    if x is None or target is None or x.dtype.type not in _NUMBERS:
        return None
    return x.astype(target)


def _transpose(node: ir.Node, inputs: Arrays) -> np.ndarray | None:
    if len(inputs) != 1 or set(node.attributes) - {"perm"}:
        return None
    (data,) = inputs
    assert data is not None
    attr = node.attributes.get("perm")
    perm = list(attr.as_ints()) if attr is not None else []
    if not perm:
        return np.transpose(data)
    if len(perm) != len(data.shape):
        return None
    return np.transpose(data, axes=perm)


def _concat(node: ir.Node, inputs: Arrays) -> np.ndarray | None:
    attr = node.attributes.get("axis")
    if attr is None or set(node.attributes) != {"axis"} or not inputs:
        return None
    axis = attr.as_int()
    arrays = [a for a in inputs if a is not None]
    if any(a.dtype != arrays[0].dtype or not -a.ndim <= axis < a.ndim for a in arrays):
        return None  # rank 0 or an axis out of range: the evaluator's errors
    return np.concatenate(arrays, axis)


def _divide(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    return np.divide(x, y)


# Op type -> (implementation, first opset it applies to: multidirectional broadcasting
# from 7, Reshape's shape input from 5, no consumed_inputs from 6, Cast's integer `to`
# from 6, Concat's required axis from 4).
_OPS: dict[str, tuple[Callable[[ir.Node, Arrays], np.ndarray | None], int]] = {
    "Add": (_binary(np.add, _NUMBERS[:-1]), 7),
    "Sub": (_binary(np.subtract, _NUMBERS[:-1]), 7),
    "Mul": (_binary(np.multiply, _NUMBERS[:-1]), 7),
    # Float Div only: integer Div truncates toward zero, the evaluator's own code.
    "Div": (_binary(_divide, _FLOATS), 7),
    "Sqrt": (_sqrt, 6),
    "Reshape": (_reshape, 5),
    "Cast": (_cast, 6),
    "Transpose": (_transpose, 1),
    "Concat": (_concat, 4),
}
