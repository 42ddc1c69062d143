"""Expressions of verification domains: the guard language plus comprehensions.

Shapes, constant values and attribute values of a rule's ``verify:`` domain
are computed by expressions over the names drawn so far (dimensions,
attribute values, ``opset``, ``T``) and the variables already built
(``shape(X)``, ``value(X)``). The syntax is the guard language's (Python
expressions parsed with ``ast``, checked against a whitelist, never passed to
``eval``) with list comprehensions and a few more functions, since a domain
often builds a list element by element.
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

_MAX_SEQUENCE = 100_000


class ExprError(Exception):
    """An expression is not in the language, or cannot be evaluated."""


@dataclass(frozen=True)
class VarRef:
    """A variable of the instance being built, as expressions see it."""

    name: str
    shape: tuple[int, ...] | None
    dtype: str | None
    value: np.ndarray | None  # the value of a constant, else None
    present: bool = True


def _var(ref: Any, fn: str) -> VarRef:
    if not isinstance(ref, VarRef):
        raise ExprError(f"{fn}() takes a pattern variable")
    if not ref.present:
        raise ExprError(f"{fn}({ref.name}): the variable is absent")
    return ref


def _shape(ref: Any) -> tuple[int, ...]:
    var = _var(ref, "shape")
    if var.shape is None:
        raise ExprError(f"shape({var.name}) is not known yet")
    return tuple(var.shape)


def _rank(ref: Any) -> int:
    return len(_shape(ref))


def _numel(ref: Any) -> int:
    return math.prod(_shape(ref))


def _dtype(ref: Any) -> str:
    var = _var(ref, "dtype")
    if var.dtype is None:
        raise ExprError(f"dtype({var.name}) is not known yet")
    return var.dtype


def _value(ref: Any) -> Any:
    var = _var(ref, "value")
    if var.value is None:
        raise ExprError(f"value({var.name}): not a constant")
    return var.value.item() if var.value.ndim == 0 else var.value.tolist()


def _present(ref: Any) -> bool:
    if not isinstance(ref, VarRef):
        raise ExprError("present() takes a pattern variable")
    return ref.present


def _is_constant(ref: Any) -> bool:
    return _var(ref, "is_constant").value is not None


def _checked_range(*args: int) -> tuple[int, ...]:
    result = range(*args)
    if len(result) > _MAX_SEQUENCE:
        raise ExprError("range() too long")
    return tuple(result)


def _prod(items: Any) -> Any:
    return math.prod(items)


# ONNX element type codes (TensorProto.DataType), for attributes such as Cast's `to`.
ONNX_TYPE_CODES = {
    "float32": 1,
    "uint8": 2,
    "int8": 3,
    "uint16": 4,
    "int16": 5,
    "int32": 6,
    "int64": 7,
    "string": 8,
    "bool": 9,
    "float16": 10,
    "float64": 11,
    "uint32": 12,
    "uint64": 13,
    "bfloat16": 16,
}


def _onnx_type(name: Any) -> int:
    if name not in ONNX_TYPE_CODES:
        raise ExprError(f"onnx_type({name!r}): unknown dtype")
    return ONNX_TYPE_CODES[name]


FUNCTIONS: dict[str, tuple[Callable[..., Any], int, int]] = {
    "onnx_type": (_onnx_type, 1, 1),
    "shape": (_shape, 1, 1),
    "rank": (_rank, 1, 1),
    "numel": (_numel, 1, 1),
    "dtype": (_dtype, 1, 1),
    "value": (_value, 1, 1),
    "present": (_present, 1, 1),
    "is_constant": (_is_constant, 1, 1),
    "len": (len, 1, 1),
    "abs": (abs, 1, 1),
    "min": (min, 1, 8),
    "max": (max, 1, 8),
    "all": (all, 1, 1),
    "any": (any, 1, 1),
    "sum": (sum, 1, 1),
    "prod": (_prod, 1, 1),
    "sorted": (sorted, 1, 1),
    "reversed": (lambda x: tuple(reversed(x)), 1, 1),
    "tuple": (tuple, 1, 1),
    "list": (list, 1, 1),
    "int": (int, 1, 1),
    "float": (float, 1, 1),
    "bool": (bool, 1, 1),
    "range": (_checked_range, 1, 3),
    "zip": (lambda *xs: tuple(zip(*xs)), 1, 8),
    "enumerate": (lambda x: tuple(enumerate(x)), 1, 1),
}

CONSTANTS: dict[str, Any] = {
    "True": True,
    "False": False,
    "None": None,
    "inf": math.inf,
    "nan": math.nan,
}

_BINARY: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type, Callable[[Any], Any]] = {
    ast.Not: operator.not_,
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}
_COMPARE: dict[type, Callable[[Any, Any], Any]] = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
    ast.In: lambda a, b: a in b,
    ast.NotIn: lambda a, b: a not in b,
    ast.Is: operator.is_,
    ast.IsNot: operator.is_not,
}
_ALLOWED = (
    ast.Expression,
    ast.BoolOp,
    ast.And,
    ast.Or,
    ast.BinOp,
    ast.UnaryOp,
    ast.Compare,
    ast.Call,
    ast.Name,
    ast.Load,
    ast.Store,
    ast.Constant,
    ast.Tuple,
    ast.List,
    ast.Subscript,
    ast.Slice,
    ast.IfExp,
    ast.ListComp,
    ast.GeneratorExp,
    ast.comprehension,
    *_BINARY,
    *_UNARY,
    *_COMPARE,
)


@dataclass(frozen=True)
class Expr:
    """A checked expression."""

    text: str
    tree: ast.Expression

    def names(self) -> set[str]:
        """Free names the expression reads (comprehension targets excluded)."""
        bound = {
            n.id
            for n in ast.walk(self.tree)
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)
        }
        calls = {id(n.func) for n in ast.walk(self.tree) if isinstance(n, ast.Call)}
        return {
            n.id
            for n in ast.walk(self.tree)
            if isinstance(n, ast.Name)
            and isinstance(n.ctx, ast.Load)
            and id(n) not in calls
            and n.id not in bound
            and n.id not in CONSTANTS
        }

    def evaluate(self, names: Mapping[str, Any]) -> Any:
        return _Evaluator(dict(names)).visit(self.tree.body)


def parse_expr(text: str) -> Expr:
    """Parse and check an expression; raise ExprError naming the problem."""
    if not isinstance(text, str) or not text.strip():
        raise ExprError("an expression must be a non-empty string")
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as exc:
        raise ExprError(f"invalid expression {text!r}: {exc.msg}") from None
    for node in ast.walk(tree):
        if not isinstance(node, _ALLOWED):
            raise ExprError(f"{type(node).__name__} is not allowed in an expression ({text!r})")
        if isinstance(node, ast.Call):
            if not isinstance(node.func, ast.Name) or node.func.id not in FUNCTIONS:
                raise ExprError(f"unknown function '{ast.unparse(node.func)}' in {text!r}")
            if node.keywords:
                raise ExprError(f"keyword arguments are not allowed in {text!r}")
            _, low, high = FUNCTIONS[node.func.id]
            if not low <= len(node.args) <= high:
                raise ExprError(f"{node.func.id}() takes {low} to {high} argument(s) in {text!r}")
        elif isinstance(node, ast.comprehension) and node.is_async:
            raise ExprError(f"async comprehensions are not allowed in {text!r}")
        elif isinstance(node, ast.Constant) and not isinstance(
            node.value, (int, float, str, bool, type(None))
        ):
            raise ExprError(f"literal {node.value!r} is not allowed in {text!r}")
    return Expr(text=text.strip(), tree=tree)


class _Evaluator:
    def __init__(self, names: dict[str, Any]):
        self.names = names

    def visit(self, node: ast.AST) -> Any:
        return getattr(self, f"visit_{type(node).__name__}")(node)

    def visit_Constant(self, node: ast.Constant) -> Any:
        return node.value

    def visit_Name(self, node: ast.Name) -> Any:
        if node.id in self.names:
            return self.names[node.id]
        if node.id in CONSTANTS:
            return CONSTANTS[node.id]
        raise ExprError(f"unknown name '{node.id}'")

    def visit_Tuple(self, node: ast.Tuple) -> Any:
        return tuple(self.visit(e) for e in node.elts)

    def visit_List(self, node: ast.List) -> Any:
        return [self.visit(e) for e in node.elts]

    def visit_BoolOp(self, node: ast.BoolOp) -> Any:
        result: Any = isinstance(node.op, ast.And)
        for operand in node.values:
            result = self.visit(operand)
            if isinstance(node.op, ast.And) and not result:
                return result
            if isinstance(node.op, ast.Or) and result:
                return result
        return result

    def visit_UnaryOp(self, node: ast.UnaryOp) -> Any:
        return _apply(_UNARY[type(node.op)], self.visit(node.operand))

    def visit_BinOp(self, node: ast.BinOp) -> Any:
        left, right = self.visit(node.left), self.visit(node.right)
        if isinstance(node.op, ast.Pow) and (not isinstance(right, (int, float)) or right > 64):
            raise ExprError("exponent too large")
        if isinstance(node.op, ast.Mult):
            for seq, count in ((left, right), (right, left)):
                if (
                    isinstance(seq, (list, tuple, str))
                    and isinstance(count, int)
                    and len(seq) * count > _MAX_SEQUENCE
                ):
                    raise ExprError("sequence repetition too long")
        return _apply(_BINARY[type(node.op)], left, right)

    def visit_Compare(self, node: ast.Compare) -> Any:
        left = self.visit(node.left)
        for op, comparator in zip(node.ops, node.comparators):
            right = self.visit(comparator)
            if not _apply(_COMPARE[type(op)], left, right):
                return False
            left = right
        return True

    def visit_Call(self, node: ast.Call) -> Any:
        assert isinstance(node.func, ast.Name)
        function = FUNCTIONS[node.func.id][0]
        return _apply(function, *(self.visit(a) for a in node.args))

    def visit_Subscript(self, node: ast.Subscript) -> Any:
        return _apply(operator.getitem, self.visit(node.value), self.visit(node.slice))

    def visit_Slice(self, node: ast.Slice) -> Any:
        parts = (node.lower, node.upper, node.step)
        return slice(*(None if p is None else self.visit(p) for p in parts))

    def visit_IfExp(self, node: ast.IfExp) -> Any:
        return self.visit(node.body) if self.visit(node.test) else self.visit(node.orelse)

    def visit_ListComp(self, node: ast.ListComp) -> Any:
        return self._comprehension(node.elt, node.generators)

    def visit_GeneratorExp(self, node: ast.GeneratorExp) -> Any:
        return self._comprehension(node.elt, node.generators)

    def _comprehension(self, elt: ast.AST, generators: list[ast.comprehension]) -> list[Any]:
        results: list[Any] = []
        saved = dict(self.names)
        try:
            self._loop(elt, generators, results)
        finally:
            self.names = saved
        return results

    def _loop(self, elt: ast.AST, generators: list[ast.comprehension], out: list[Any]) -> None:
        if not generators:
            out.append(self.visit(elt))
            if len(out) > _MAX_SEQUENCE:
                raise ExprError("comprehension too long")
            return
        first, rest = generators[0], generators[1:]
        iterable = self.visit(first.iter)
        try:
            items = list(iterable)
        except TypeError:
            raise ExprError("a comprehension must iterate over a sequence") from None
        for item in items:
            self._bind(first.target, item)
            if all(self.visit(condition) for condition in first.ifs):
                self._loop(elt, rest, out)

    def _bind(self, target: ast.AST, item: Any) -> None:
        if isinstance(target, ast.Name):
            self.names[target.id] = item
        elif isinstance(target, (ast.Tuple, ast.List)):
            parts = list(item)
            if len(parts) != len(target.elts):
                raise ExprError("cannot unpack: wrong number of values")
            for sub, part in zip(target.elts, parts):
                self._bind(sub, part)
        else:
            raise ExprError("comprehension targets must be names")


def _apply(function: Callable[..., Any], *args: Any) -> Any:
    try:
        return function(*args)
    except ExprError:
        raise
    except (
        TypeError,
        ValueError,
        IndexError,
        KeyError,
        ZeroDivisionError,
        OverflowError,
        AttributeError,
    ) as exc:
        raise ExprError(str(exc) or type(exc).__name__) from None
