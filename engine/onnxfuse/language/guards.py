"""Guard expressions: a small, safe language over bound values and attributes.

Expressions are parsed with ``ast`` and checked against a whitelist when the
rule is loaded; they are interpreted node by node, never passed to ``eval``.
"""

from __future__ import annotations

import ast
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
import onnx_ir as ir

from onnxfuse.errors import RuleError
from onnxfuse.language import interpreter, symbolic
from onnxfuse.language.interpreter import Dialect
from onnxfuse.ops import element_types

# Results larger than this are refused: a guard must stay cheap to evaluate.
_MAX_SEQUENCE = 10_000
_MAX_VALUE_ELEMENTS = 4096


class GuardUnknown(Exception):
    """The guard cannot be decided (unknown shape, non-constant value, ...)."""


@dataclass(frozen=True)
class ValueRef:
    """A pattern variable as seen by a guard: the graph value it is bound to."""

    name: str
    value: ir.Value | None
    ir_version: int = 10


def _need(ref: Any, fn: str) -> ir.Value:
    if not isinstance(ref, ValueRef):
        raise GuardUnknown(f"{fn}() takes a pattern variable")
    if ref.value is None:
        raise GuardUnknown(f"{fn}({ref.name}): input is absent")
    return ref.value


def constant_tensor(value: ir.Value | None, ir_version: int = 10) -> ir.TensorProtocol | None:
    """The tensor behind a value, if it is a constant the model cannot override."""
    if value is None:
        return None
    if value.is_initializer():
        # From IR 4 on, an initializer that is also a graph input is a default
        # the caller may replace: not a constant.
        if value.is_graph_input() and ir_version >= 4:
            return None
        return value.const_value
    producer = value.producer()
    if producer is not None and producer.op_type == "Constant" and producer.domain == "":
        if value.const_value is not None:
            return value.const_value
        return ir.convenience.get_const_tensor(value)
    return None


class UnnamedDim:
    """A dimension with neither a size nor a name: equal to nothing, itself included.

    Two unnamed dimensions may differ at run time, so ``shape(a)[0] == shape(b)[0]``
    must not prove them equal (``None == None`` would).
    """

    __slots__ = ()

    def __eq__(self, other: object) -> bool:
        return False

    def __ne__(self, other: object) -> bool:
        return True

    __hash__ = object.__hash__

    def __repr__(self) -> str:
        return "?"


def _shape(ref: Any) -> tuple[int | str | UnnamedDim, ...]:
    value = _need(ref, "shape")
    if value.shape is None:
        raise GuardUnknown(f"shape({ref.name}) is unknown")
    dims: list[int | str | UnnamedDim] = []
    for dim in value.shape:
        if isinstance(dim, int):
            dims.append(dim)
        elif isinstance(dim, ir.SymbolicDim) and dim.value is not None:
            dims.append(dim.value)
        else:
            dims.append(UnnamedDim())
    return tuple(dims)


def _rank(ref: Any) -> int:
    value = _need(ref, "rank")
    if value.shape is None:
        raise GuardUnknown(f"rank({ref.name}) is unknown")
    return len(value.shape)


def _dtype(ref: Any) -> str:
    value = _need(ref, "dtype")
    if value.dtype is None:
        raise GuardUnknown(f"dtype({ref.name}) is unknown")
    return _dtype_name(value.dtype)


def _dtype_name(dtype: ir.DataType) -> str:
    """ONNX's name of an element type ('float', 'double', 'int64', ...)."""
    return element_types.from_onnx(dtype) or "undefined"


def _is_constant(ref: Any) -> bool:
    if not isinstance(ref, ValueRef):
        raise GuardUnknown("is_constant() takes a pattern variable")
    return constant_tensor(ref.value, ref.ir_version) is not None


def _value(ref: Any) -> Any:
    value = _need(ref, "value")
    tensor = constant_tensor(value, ref.ir_version)
    if tensor is None:
        raise GuardUnknown(f"value({ref.name}): not a constant")
    if tensor.size > _MAX_VALUE_ELEMENTS:
        raise GuardUnknown(f"value({ref.name}): too large to inspect ({tensor.size} elements)")
    array = tensor.numpy()
    return array.item() if array.ndim == 0 else array.tolist()


def _scalar(ref: Any) -> Any:
    """The single value of a one-element constant, whatever its rank."""
    value = _need(ref, "scalar")
    tensor = constant_tensor(value, ref.ir_version)
    if tensor is None:
        raise GuardUnknown(f"scalar({ref.name}): not a constant")
    if tensor.size != 1:
        raise GuardUnknown(f"scalar({ref.name}): {tensor.size} elements, not one")
    return tensor.numpy().reshape(-1)[0].item()


def _numel(ref: Any) -> int:
    dims = _shape(ref)
    count = 1
    for dim in dims:
        if not isinstance(dim, int):
            raise GuardUnknown(f"numel({ref.name}): dimension {dim!r} is symbolic")
        count *= dim
    return count


def _present(ref: Any) -> bool:
    if not isinstance(ref, ValueRef):
        raise GuardUnknown("present() takes a pattern variable")
    return ref.value is not None


def _consumers(ref: Any) -> int:
    value = _need(ref, "consumers")
    return len(value.uses()) + (1 if value.is_graph_output() else 0)


def _is_graph_input(ref: Any) -> bool:
    return _need(ref, "is_graph_input").is_graph_input()


def _op_name(node: ir.Node) -> str:
    return f"{node.domain}::{node.op_type}" if node.domain else node.op_type


def _producer_op(ref: Any) -> str:
    """The op type of the node computing x ('domain::Op' outside ai.onnx; '' for
    graph inputs and initializers)."""
    producer = _need(ref, "producer_op").producer()
    return "" if producer is None else _op_name(producer)


def _consumer_ops(ref: Any) -> tuple[str, ...]:
    """The op types of the nodes using x, sorted (one entry per use)."""
    value = _need(ref, "consumer_ops")
    return tuple(sorted(_op_name(use.node) for use in value.uses()))


def _transpose_perm(node: ir.Node) -> list[int] | None:
    """The permutation a Transpose node applies (absent: the reversal), None if unknown."""
    attr = node.attributes.get("perm")
    if attr is not None:
        return list(attr.value)
    shape = node.inputs[0].shape if node.inputs and node.inputs[0] is not None else None
    return None if shape is None else list(range(len(shape) - 1, -1, -1))


def _meets_transpose(ref: Any, moved: Any, perm: Any) -> bool:
    """A Transpose of ``perm`` put on ``ref`` would merge with another at once.

    ``ref``'s only use is a Transpose (the two compose into one), or a node with
    another input computed by a Transpose of the same perm that has no other use
    (the two-Transposes-meeting rules turn both into one). That other Transpose
    may be ``moved`` itself, the shared one being sunk, when the match's node and
    this one are its only two uses (a diamond: Sub(T, ReduceMean(T))). So a rule
    that keeps ``moved`` for its other uses adds no Transpose overall. Structure
    only: the meeting op still needs a rule that merges the two.
    """
    value = _need(ref, "meets_transpose")
    shared = _need(moved, "meets_transpose")
    wanted = list(_bounded(perm))
    uses = list(value.uses())
    if value.is_graph_output() or len(uses) != 1:
        return False
    node, index = uses[0].node, uses[0].idx
    if node.op_type == "Transpose" and node.domain in ("", "ai.onnx"):
        return True
    for i, other in enumerate(node.inputs):
        producer = other.producer() if other is not None and i != index else None
        if (
            producer is None
            or producer.op_type != "Transpose"
            or producer.domain not in ("", "ai.onnx")
        ):
            continue
        assert other is not None  # it has a producer
        if _transpose_perm(producer) != wanted or other.is_graph_output():
            continue
        users = [use.node for use in other.uses()]
        if users == [node] or (
            other is shared and len(users) == 2 and value.producer() in users and node in users
        ):
            return True
    return False


def _all_equal(ref: Any, target: Any) -> bool:
    """Every element of a constant equals ``target`` (no size limit, no copy to lists)."""
    value = _need(ref, "all_equal")
    tensor = constant_tensor(value, ref.ir_version)
    if tensor is None:
        raise GuardUnknown(f"all_equal({ref.name}, ...): not a constant")
    return bool(np.all(tensor.numpy() == target))


def _all_finite(ref: Any) -> bool:
    value = _need(ref, "all_finite")
    tensor = constant_tensor(value, ref.ir_version)
    if tensor is None:
        raise GuardUnknown(f"all_finite({ref.name}): not a constant")
    array = tensor.numpy()
    if array.dtype.kind not in "fc" and str(array.dtype) != "bfloat16":
        return True
    return bool(np.all(np.isfinite(array.astype(np.float64))))


def _dtype_name_of(code: Any) -> str:
    """The name dtype() would give for an ONNX element type number (Cast's `to`)."""
    try:
        return _dtype_name(ir.DataType(int(code)))
    except (TypeError, ValueError):
        raise GuardUnknown(f"dtype_name({code!r}): not an ONNX element type") from None


def _checked_zip(*sequences: Any) -> tuple[tuple[Any, ...], ...]:
    return tuple(zip(*(_bounded(s) for s in sequences)))


def _checked_enumerate(sequence: Any) -> tuple[tuple[int, Any], ...]:
    return tuple(enumerate(_bounded(sequence)))


def _bounded(sequence: Any) -> tuple[Any, ...]:
    if not isinstance(sequence, (list, tuple, str, range)):
        raise GuardUnknown(f"expected a sequence, got {type(sequence).__name__}")
    if len(sequence) > _MAX_SEQUENCE:
        raise GuardUnknown("sequence too long")
    return tuple(sequence)


def _checked_range(*args: int) -> tuple[int, ...]:
    result = range(*args)
    if len(result) > _MAX_SEQUENCE:
        raise GuardUnknown("range() too long")
    return tuple(result)


def _broadcastable(*refs: Any) -> bool:
    shapes = [_shape(r) for r in refs]
    rank = max(len(s) for s in shapes)
    for axis in range(1, rank + 1):
        dims = {s[-axis] for s in shapes if len(s) >= axis} - {1}
        if len(dims) > 1:
            if any(not isinstance(d, int) for d in dims):
                raise GuardUnknown("broadcastable(): symbolic dimensions")
            return False
    return True


def _elements(ref: Any) -> Any:
    """The elements of a small integer value, looked up through the ops computing it."""
    value = _need(ref, "elements")
    found = symbolic.elements(value, lambda v: constant_tensor(v, ref.ir_version))
    if found is None:
        raise GuardUnknown(f"elements({ref.name}): not a rank-0/1 integer value of known size")
    rank, items = found
    # An element computed at run time by an op elements() does not follow is unknown:
    # like an unnamed dim, it equals nothing.
    known = [UnnamedDim() if item is None else item for item in items]
    return known[0] if rank == 0 else tuple(known)


def _dims(ref: Any) -> tuple[Any, ...]:
    """A value's dimensions as elements() names them: ints where static, symbolic otherwise."""
    value = _need(ref, "dims")
    found = symbolic.value_dims(value, ref.name)
    if found is None:
        raise GuardUnknown(f"dims({ref.name}): the rank is unknown")
    return tuple(found)


def _known(item: Any) -> bool:
    """An element of elements() or dims() whose value is known (an int)."""
    return isinstance(item, int) and not isinstance(item, bool)


# Functions a guard may call, with their number of arguments (min, max).
FUNCTIONS: dict[str, tuple[Callable[..., Any], int, int]] = {
    "rank": (_rank, 1, 1),
    "shape": (_shape, 1, 1),
    "dtype": (_dtype, 1, 1),
    "numel": (_numel, 1, 1),
    "is_constant": (_is_constant, 1, 1),
    "value": (_value, 1, 1),
    "scalar": (_scalar, 1, 1),
    "all_equal": (_all_equal, 2, 2),
    "all_finite": (_all_finite, 1, 1),
    "dtype_name": (_dtype_name_of, 1, 1),
    "zip": (_checked_zip, 1, 4),
    "enumerate": (_checked_enumerate, 1, 1),
    "reversed": (lambda s: tuple(reversed(_bounded(s))), 1, 1),
    "present": (_present, 1, 1),
    "consumers": (_consumers, 1, 1),
    "is_graph_input": (_is_graph_input, 1, 1),
    "producer_op": (_producer_op, 1, 1),
    "consumer_ops": (_consumer_ops, 1, 1),
    "meets_transpose": (_meets_transpose, 3, 3),
    "broadcastable": (_broadcastable, 1, 8),
    "elements": (_elements, 1, 1),
    "dims": (_dims, 1, 1),
    "known": (_known, 1, 1),
    "len": (len, 1, 1),
    "abs": (abs, 1, 1),
    "min": (min, 1, 8),
    "max": (max, 1, 8),
    "all": (all, 1, 1),
    "any": (any, 1, 1),
    "sum": (sum, 1, 1),
    "prod": (math.prod, 1, 1),
    "sorted": (sorted, 1, 1),
    "tuple": (tuple, 1, 1),
    "list": (list, 1, 1),
    "int": (int, 1, 1),
    "float": (float, 1, 1),
    "range": (_checked_range, 1, 3),
}

CONSTANTS: dict[str, Any] = {"True": True, "False": False, "None": None}

GUARDS = Dialect(
    functions=FUNCTIONS,
    constants=CONSTANTS,
    error=GuardUnknown,
    max_sequence=_MAX_SEQUENCE,
    allow_repeat=False,
)


@dataclass(frozen=True)
class Guard:
    """A checked expression, ready to evaluate against bindings."""

    text: str
    tree: ast.Expression
    names: frozenset[str] = frozenset()  # what it reads from its bindings

    def evaluate(self, names: Mapping[str, Any]) -> Any:
        return self._compiled(names)

    @cached_property
    def _compiled(self) -> interpreter.Compiled:
        return interpreter.compiled(self.tree, GUARDS)

    def __getstate__(self) -> dict[str, Any]:
        # Closures do not pickle (the load cache); the reader compiles its own.
        state = dict(self.__dict__)
        state.pop("_compiled", None)
        return state


# Checked guards by their exact text: rules repeat guards (YAML anchors, op-set
# families: 1630 guards, 616 texts in the built-in packs). A tree is never changed
# after checking, so the rules share it and its compiled closures. Bounded, for
# processes that load many rule files.
_CHECKED: dict[str, tuple[ast.Expression, frozenset[str]]] = {}
_MAX_CHECKED = 8192


def parse_guard(text: str, known_names: set[str]) -> Guard:
    """Parse and check an expression; raise RuleError (no place) naming the problem."""
    tree, names = _checked(text)
    # Per rule, not cached: what a guard may name depends on the rule's bindings.
    for name in sorted(names - known_names):
        raise RuleError(f"unknown name '{name}' in guard {text!r}")
    return Guard(text=text.strip(), tree=tree, names=names)


def _checked(text: str) -> tuple[ast.Expression, frozenset[str]]:
    """The checked tree of ``text`` and the names it reads (errors are not cached)."""
    if not isinstance(text, str):  # not hashable, maybe; an error anyway
        return interpreter.check_expression(text, GUARDS, RuleError, "guard")
    found = _CHECKED.get(text)
    if found is None:
        found = interpreter.check_expression(text, GUARDS, RuleError, "guard")
        check_element_types(found[0], text)
        if len(_CHECKED) >= _MAX_CHECKED:
            _CHECKED.clear()
        _CHECKED[text] = found
    return found


# Functions whose result is an element type name: a string compared with one must be a name.
_TYPED_FUNCTIONS = frozenset({"dtype", "dtype_name"})


def _typed(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in _TYPED_FUNCTIONS
    )


def check_element_types(tree: ast.Expression, text: str) -> None:
    """A string compared with ``dtype(...)`` or ``dtype_name(...)`` must be an element
    type name as ONNX spells it ('float', not 'float32'): any other never matches.
    'undefined' is what ``dtype_name(0)`` gives."""
    for literal in interpreter.literals_compared_with(tree, _typed):
        if not element_types.is_name(literal) and literal != "undefined":
            raise RuleError(f"in guard {text.strip()!r}: {element_types.unknown(literal)}")
