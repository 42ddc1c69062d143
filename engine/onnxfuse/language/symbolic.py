"""Symbolic elements of small integer tensors that a graph computes from shapes.

Exporters build shapes at run time: ``Shape``, then ``Gather``/``Slice``,
``Unsqueeze``, ``Concat``. A source pattern cannot name such a chain (its
length varies), so guards look through it instead: ``elements(S)`` gives each
element of S as an ``int`` where it is known, a ``Dim`` where it is a
dimension of some value whose size is only known at run time, and ``None``
where it is computed some other way. ``value_dims(X)`` gives X's own
dimensions in the same terms, so ``elements(S)[i] == dims(X)[i]`` says "S
holds X's i-th dimension at position i".

Only ops whose result is exact on integers are looked through; anything else
keeps its element count (from its static shape) with unknown elements.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import onnx_ir as ir

# Longer shape tensors are not looked into: a guard must stay cheap.
MAX_ELEMENTS = 64
# Producer chains deeper than this are treated as unknown.
_MAX_DEPTH = 32

_INTEGER_TYPES = frozenset(
    {
        ir.DataType.INT8,
        ir.DataType.INT16,
        ir.DataType.INT32,
        ir.DataType.INT64,
        ir.DataType.UINT8,
        ir.DataType.UINT16,
        ir.DataType.UINT32,
    }
)

ConstantOf = Callable[[ir.Value], "ir.TensorProtocol | None"]


@dataclass(frozen=True)
class Dim:
    """Dimension ``index`` of a graph value, not known before run time."""

    value_id: int  # the value's identity: equal Dims are the same dimension of the same value
    index: int
    label: str = field(compare=False)

    def __repr__(self) -> str:
        return self.label


Element = int | Dim | None
# (rank, elements): rank 0 holds one element, rank 1 a list of them.
Symbolic = tuple[int, list[Element]]


def value_dims(value: ir.Value, label: str) -> list[int | Dim] | None:
    """The dimensions of ``value``: ints where static, Dims otherwise (None: rank unknown).

    A dimension that an op copies from one of its inputs (a MatMul by a 2-D matrix keeps
    its left operand's leading dimensions, an elementwise op the dimensions its other
    operand broadcasts along, a shape-keeping op all of them) is that input's Dim: the
    same dimension, traced back to the value it comes from.
    """
    if value.shape is None:
        return None
    dims: list[int | Dim] = []
    for axis, dim in enumerate(value.shape):
        if isinstance(dim, int):
            dims.append(dim)
            continue
        origin, index = _dim_origin(value, axis)
        dims.append(Dim(id(origin), index, f"{label}.shape[{axis}]"))
    return dims


# ai.onnx ops whose first output has the first input's shape.
_SHAPE_KEEPING = frozenset(
    {
        "Identity",
        "Cast",
        "Relu",
        "LeakyRelu",
        "Sigmoid",
        "Tanh",
        "Erf",
        "Neg",
        "Abs",
        "Sqrt",
        "Exp",
        "Softmax",
        "LayerNormalization",
        "Dropout",
    }
)
_BROADCASTING = frozenset({"Add", "Sub", "Mul", "Div"})


def _rank(value: ir.Value | None) -> int | None:
    return None if value is None or value.shape is None else len(value.shape)


def _dim_origin(value: ir.Value, axis: int, depth: int = 0) -> tuple[ir.Value, int]:
    """The value (and its axis) whose dimension ``axis`` of ``value`` is a copy of."""
    node = value.producer()
    rank = _rank(value)
    if (
        depth >= _MAX_DEPTH
        or node is None
        or node.domain != ""
        or rank is None
        or node.outputs[0] is not value
    ):
        return value, axis
    inputs = list(node.inputs)
    op = node.op_type
    found: tuple[ir.Value, int] | None = None
    if op == "MatMul" and len(inputs) == 2 and inputs[0] is not None and inputs[1] is not None:
        a, b = inputs[0], inputs[1]
        if rank >= 2 and axis < rank - 1 and _rank(a) == rank and _rank(b) == 2:
            found = _dim_origin(a, axis, depth + 1)
        elif rank >= 3 and axis < rank - 2 and _rank(a) == rank and _rank(b) == rank:
            found = _same_origin(a, b, axis, axis, depth)  # a batch axis of both
        elif rank >= 2 and axis == rank - 2 and _rank(a) == rank:
            found = _dim_origin(a, axis, depth + 1)  # A's rows
        elif rank >= 2 and axis == rank - 1 and _rank(b) == rank:
            found = _dim_origin(b, axis, depth + 1)  # B's columns
    elif op in _SHAPE_KEEPING and inputs and inputs[0] is not None and _rank(inputs[0]) == rank:
        found = _dim_origin(inputs[0], axis, depth + 1)
    elif op == "Transpose" and inputs and inputs[0] is not None and _rank(inputs[0]) == rank:
        perm = _ints_attribute(node, "perm") or list(reversed(range(rank)))
        if len(perm) == rank:
            found = _dim_origin(inputs[0], perm[axis], depth + 1)
    elif op == "Reshape" and len(inputs) == 2 and inputs[0] is not None:
        # a 0 in a constant shape copies the input's dimension (allowzero = 0)
        shape = inputs[1].const_value if inputs[1] is not None else None
        if shape is not None and _int_attribute(node, "allowzero", 0) == 0:
            target = shape.numpy().reshape(-1).tolist()
            source_rank = _rank(inputs[0])
            if (
                len(target) == rank
                and target[axis] == 0
                and source_rank is not None
                and axis < source_rank
            ):
                found = _dim_origin(inputs[0], axis, depth + 1)
    elif (
        op in _BROADCASTING and len(inputs) == 2 and inputs[0] is not None and inputs[1] is not None
    ):
        x, y = inputs[0], inputs[1]
        rx, ry = _rank(x), _rank(y)
        if rx is not None and ry is not None and x.shape is not None and y.shape is not None:
            px, py = axis - (rank - rx), axis - (rank - ry)
            if rx == rank and (py < 0 or y.shape[py] == 1):
                found = _dim_origin(x, axis, depth + 1)
            elif ry == rank and (px < 0 or x.shape[px] == 1):
                found = _dim_origin(y, axis, depth + 1)
            elif px >= 0 and py >= 0:
                found = _same_origin(x, y, px, py, depth)
    return found if found is not None else (value, axis)


def _same_origin(
    x: ir.Value, y: ir.Value, ax: int, ay: int, depth: int
) -> tuple[ir.Value, int] | None:
    """The common origin of two broadcast dimensions that are the same dimension (so the
    result is that dimension too), else None."""
    if x.shape is None or y.shape is None:
        return None
    if isinstance(x.shape[ax], int) or isinstance(y.shape[ay], int):
        return None
    ox, oy = _dim_origin(x, ax, depth + 1), _dim_origin(y, ay, depth + 1)
    if ox[0] is oy[0] and ox[1] == oy[1]:
        return ox
    return None


def elements(value: ir.Value, constant_of: ConstantOf) -> Symbolic | None:
    """The elements of a rank-0 or rank-1 integer ``value``; None if their count is unknown."""
    return _Evaluator(constant_of).evaluate(value, 0)


class _Evaluator:
    def __init__(self, constant_of: ConstantOf):
        self.constant_of = constant_of
        self.memo: dict[int, Symbolic | None] = {}

    def evaluate(self, value: ir.Value | None, depth: int) -> Symbolic | None:
        if value is None:
            return None
        key = id(value)
        if key not in self.memo:
            self.memo[key] = self._evaluate(value, depth)
        return self.memo[key]

    def _evaluate(self, value: ir.Value, depth: int) -> Symbolic | None:
        if value.dtype is not None and value.dtype not in _INTEGER_TYPES:
            return None
        tensor = self.constant_of(value)
        if tensor is not None:
            return _from_constant(tensor)
        producer = value.producer()
        if (
            producer is not None
            and producer.domain == ""
            and depth < _MAX_DEPTH
            and producer.outputs[0] is value
        ):
            handler = _HANDLERS.get(producer.op_type)
            found = handler(self, producer, depth + 1) if handler is not None else None
            if found is not None and len(found[1]) <= MAX_ELEMENTS:
                return found
        return _opaque(value)

    def ints(self, value: ir.Value | None) -> list[int] | None:
        """A constant's values as a flat list (rank 0 or 1), else None."""
        if value is None:
            return None
        tensor = self.constant_of(value)
        found = _from_constant(tensor) if tensor is not None else None
        if found is None:
            return None
        return [int(e) for e in found[1] if isinstance(e, int)]


def _from_constant(tensor: ir.TensorProtocol) -> Symbolic | None:
    if tensor.dtype not in _INTEGER_TYPES or len(tensor.shape) > 1:
        return None
    if tensor.size > MAX_ELEMENTS:
        return None
    array = tensor.numpy()
    return (array.ndim, [int(v) for v in array.reshape(-1)])


def _opaque(value: ir.Value) -> Symbolic | None:
    """Unknown elements, as many as the static shape says."""
    shape = value.shape
    if shape is None or len(shape) > 1:
        return None
    if len(shape) == 0:
        return (0, [None])
    count = shape[0]
    if not isinstance(count, int) or count > MAX_ELEMENTS:
        return None
    return (1, [None] * count)


def _int_attribute(node: ir.Node, name: str, default: int) -> int:
    attr = node.attributes.get(name)
    return default if attr is None else attr.as_int()


def _ints_attribute(node: ir.Node, name: str) -> list[int] | None:
    attr = node.attributes.get(name)
    return None if attr is None else list(attr.as_ints())


def _clamp(index: int, size: int) -> int:
    """An index as Shape and Slice (step 1) read it: negative counts from the end, clamped."""
    if index < 0:
        index += size
    return min(max(index, 0), size)


def _shape(ev: _Evaluator, node: ir.Node, depth: int) -> Symbolic | None:
    data = node.inputs[0] if node.inputs else None
    dims = value_dims(data, data.name or "?") if data is not None else None
    if dims is None:
        return None
    rank = len(dims)
    start = _clamp(_int_attribute(node, "start", 0), rank)
    end = _clamp(_int_attribute(node, "end", rank), rank)
    return (1, list(dims[start:end]))


def _identity(ev: _Evaluator, node: ir.Node, depth: int) -> Symbolic | None:
    return ev.evaluate(node.inputs[0] if node.inputs else None, depth)


def _cast(ev: _Evaluator, node: ir.Node, depth: int) -> Symbolic | None:
    # Only widening to int64 keeps every value; a narrowing Cast could wrap.
    source = node.inputs[0] if node.inputs else None
    if _int_attribute(node, "to", 0) != ir.DataType.INT64 or source is None:
        return None
    if source.dtype not in _INTEGER_TYPES:
        return None
    return ev.evaluate(source, depth)


def _gather(ev: _Evaluator, node: ir.Node, depth: int) -> Symbolic | None:
    if len(node.inputs) != 2 or _int_attribute(node, "axis", 0) not in (0, -1):
        return None
    data = ev.evaluate(node.inputs[0], depth)
    tensor = ev.constant_of(node.inputs[1]) if node.inputs[1] is not None else None
    indices = _from_constant(tensor) if tensor is not None else None
    if data is None or data[0] != 1 or indices is None:
        return None
    size = len(data[1])
    picked: list[Element] = []
    for index in indices[1]:
        assert isinstance(index, int)
        if not -size <= index < size:
            return None  # the Gather fails at run time
        picked.append(data[1][index])
    return (indices[0], picked)


def _slice(ev: _Evaluator, node: ir.Node, depth: int) -> Symbolic | None:
    data = ev.evaluate(node.inputs[0] if node.inputs else None, depth)
    if data is None or data[0] != 1:
        return None
    if "starts" in node.attributes:  # opset < 10
        starts = _ints_attribute(node, "starts")
        ends = _ints_attribute(node, "ends")
        axes = _ints_attribute(node, "axes")
        steps: list[int] | None = None
    else:
        inputs = list(node.inputs) + [None] * (5 - len(node.inputs))
        starts, ends = ev.ints(inputs[1]), ev.ints(inputs[2])
        axes = ev.ints(inputs[3]) if inputs[3] is not None else None
        steps = ev.ints(inputs[4]) if inputs[4] is not None else None
        if (inputs[3] is not None and axes is None) or (inputs[4] is not None and steps is None):
            return None
    if starts is None or ends is None or len(starts) != 1 or len(ends) != 1:
        return None
    if axes not in (None, [0], [-1]) or steps not in (None, [1]):
        return None
    size = len(data[1])
    start, end = _clamp(starts[0], size), _clamp(ends[0], size)
    return (1, data[1][start:end])


def _unsqueeze(ev: _Evaluator, node: ir.Node, depth: int) -> Symbolic | None:
    data = ev.evaluate(node.inputs[0] if node.inputs else None, depth)
    axes = _ints_attribute(node, "axes")
    if axes is None and len(node.inputs) > 1:
        axes = ev.ints(node.inputs[1])
    if data is None or data[0] != 0 or axes not in ([0], [-1]):
        return None
    return (1, data[1])


def _squeeze(ev: _Evaluator, node: ir.Node, depth: int) -> Symbolic | None:
    data = ev.evaluate(node.inputs[0] if node.inputs else None, depth)
    axes = _ints_attribute(node, "axes")
    if axes is None and len(node.inputs) > 1 and node.inputs[1] is not None:
        axes = ev.ints(node.inputs[1])
        if axes is None:
            return None
    if data is None or data[0] != 1 or len(data[1]) != 1 or axes not in (None, [0], [-1]):
        return None
    return (0, data[1])


def _concat(ev: _Evaluator, node: ir.Node, depth: int) -> Symbolic | None:
    if _int_attribute(node, "axis", 0) not in (0, -1):
        return None
    joined: list[Element] = []
    for part in node.inputs:
        found = ev.evaluate(part, depth)
        if found is None or found[0] != 1:
            return None
        joined.extend(found[1])
        if len(joined) > MAX_ELEMENTS:
            return None
    return (1, joined)


def _reshape(ev: _Evaluator, node: ir.Node, depth: int) -> Symbolic | None:
    """A reshape between rank 0 and rank 1 keeps the elements (Reshape(x, [1]), [-1], [])."""
    if len(node.inputs) != 2:
        return None
    data = ev.evaluate(node.inputs[0], depth)
    shape = ev.ints(node.inputs[1])
    if data is None or shape is None or len(shape) > 1:
        return None
    count = len(data[1])
    if not shape:
        return (0, data[1]) if count == 1 else None
    return (1, data[1]) if shape[0] in (count, -1) else None


_HANDLERS: dict[str, Callable[[_Evaluator, ir.Node, int], Symbolic | None]] = {
    "Shape": _shape,
    "Identity": _identity,
    "Cast": _cast,
    "Gather": _gather,
    "Slice": _slice,
    "Unsqueeze": _unsqueeze,
    "Squeeze": _squeeze,
    "Concat": _concat,
    "Reshape": _reshape,
}

# The ops elements() looks through: the folder folds one of them once all its elements
# are known, though its inputs are not all constant (Gather(Shape(x), 1), x[batch, 128]).
FOLLOWED_OPS = frozenset(_HANDLERS)
