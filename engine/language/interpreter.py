"""The expression language shared by guards and verification domains.

Python expression syntax, parsed with ``ast`` and checked against a
whitelist; interpreted node by node, never passed to ``eval``. A *dialect*
says which functions and constants exist, which exception reports a value the
expression cannot compute, and how large a sequence may grow: guards
(``onnxfuse.language.guards``) decide matches and must stay cheap; domain
expressions (``onnxfuse.proof.expr``) build shapes and constants for tests.
"""

from __future__ import annotations

import ast
import operator
from collections import ChainMap
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

MAX_EXPRESSION_CHARS = 4000
# The interpreter recurses over the tree: keep it far from Python's limit.
MAX_DEPTH = 60
MAX_INT_BITS = 4096


@dataclass(frozen=True)
class Dialect:
    """What an expression may call and name, and how evaluation fails."""

    functions: Mapping[str, tuple[Callable[..., Any], int, int]]  # name -> (fn, min, max args)
    constants: Mapping[str, Any]
    error: type[Exception]  # raised when a value cannot be computed
    max_sequence: int
    allow_repeat: bool  # `[1] * R`: domains build shapes so, guards have no need


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
_ALLOWED_NODES = (
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


def check_syntax(
    text: Any, dialect: Dialect, error: type[Exception], what: str = "expression"
) -> ast.Expression:
    """Parse ``text`` and check it is in the language; raise ``error`` naming the problem."""
    if not isinstance(text, str) or not text.strip():
        raise error(f"a {what} must be a non-empty expression string")
    if len(text) > MAX_EXPRESSION_CHARS:
        raise error(f"{what} longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as exc:
        raise error(f"invalid expression {text!r}: {exc.msg}") from None
    except (RecursionError, MemoryError):
        raise error("expression nested too deeply") from None
    if _depth(tree) > MAX_DEPTH:
        raise error(f"expression nested deeper than {MAX_DEPTH} levels")
    for node in ast.walk(tree):
        if isinstance(node, ast.comprehension) and (
            node.is_async or not _simple_target(node.target)
        ):
            raise error(f"only `for name in ...` comprehensions are allowed ({text!r})")
        if not isinstance(node, _ALLOWED_NODES):
            raise error(f"{type(node).__name__} is not allowed in a {what} ({text!r})")
        if isinstance(node, ast.Call):
            _check_call(node, text, dialect, error, what)
        elif isinstance(node, ast.Constant) and not isinstance(
            node.value, (int, float, str, bool, type(None))
        ):
            raise error(f"literal {node.value!r} is not allowed in a {what}")
    return tree


def free_names(tree: ast.AST, dialect: Dialect) -> set[str]:
    """Names the expression reads from its bindings: not functions, constants or names
    a comprehension binds."""
    local = {
        n.id
        for c in ast.walk(tree)
        if isinstance(c, ast.comprehension)
        for n in ast.walk(c.target)
        if isinstance(n, ast.Name)
    }
    called = {id(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    return {
        n.id
        for n in ast.walk(tree)
        if isinstance(n, ast.Name)
        and isinstance(n.ctx, ast.Load)
        and id(n) not in called
        and n.id not in local
        and n.id not in dialect.constants
    }


def evaluate(tree: ast.Expression, names: Mapping[str, Any], dialect: Dialect) -> Any:
    return _Interpreter(names, dialect).visit(tree.body)


def _depth(node: ast.AST) -> int:
    deepest, stack = 0, [(node, 1)]
    while stack:
        current, level = stack.pop()
        deepest = max(deepest, level)
        stack.extend((child, level + 1) for child in ast.iter_child_nodes(current))
    return deepest


def _simple_target(target: ast.AST) -> bool:
    if isinstance(target, ast.Name):
        return True
    return isinstance(target, ast.Tuple) and all(isinstance(e, ast.Name) for e in target.elts)


def _check_call(
    node: ast.Call, text: str, dialect: Dialect, error: type[Exception], what: str
) -> None:
    if not isinstance(node.func, ast.Name) or node.func.id not in dialect.functions:
        raise error(f"unknown function '{ast.unparse(node.func)}' in {what} {text!r}")
    if node.keywords:
        raise error(f"keyword arguments are not allowed in {what} {text!r}")
    _, low, high = dialect.functions[node.func.id]
    if not low <= len(node.args) <= high:
        raise error(
            f"{node.func.id}() takes {low if low == high else f'{low} to {high}'} "
            f"argument(s) in {what} {text!r}"
        )


class _Interpreter:
    def __init__(self, names: Mapping[str, Any], dialect: Dialect):
        self.names = names
        self.dialect = dialect

    def fail(self, message: str) -> Exception:
        return self.dialect.error(message)

    def visit(self, node: ast.AST) -> Any:
        return getattr(self, f"visit_{type(node).__name__}")(node)

    def visit_Constant(self, node: ast.Constant) -> Any:
        return node.value

    def visit_Name(self, node: ast.Name) -> Any:
        if node.id in self.dialect.constants:
            return self.dialect.constants[node.id]
        try:
            return self.names[node.id]
        except KeyError:
            raise self.fail(f"unknown name '{node.id}'") from None

    def visit_Tuple(self, node: ast.Tuple) -> Any:
        return tuple(self.visit(e) for e in node.elts)

    def visit_List(self, node: ast.List) -> Any:
        return [self.visit(e) for e in node.elts]

    def visit_BoolOp(self, node: ast.BoolOp) -> Any:
        conjunction = isinstance(node.op, ast.And)
        result: Any = conjunction
        for operand in node.values:
            result = self.visit(operand)
            if bool(result) != conjunction:
                return result
        return result

    def visit_UnaryOp(self, node: ast.UnaryOp) -> Any:
        return self.apply(_UNARY[type(node.op)], self.visit(node.operand))

    def visit_BinOp(self, node: ast.BinOp) -> Any:
        left, right = self.visit(node.left), self.visit(node.right)
        if isinstance(node.op, ast.Pow):
            if not isinstance(right, (int, float)) or right > 64:
                raise self.fail("exponent too large")
            if (
                isinstance(left, int)
                and isinstance(right, int)
                and abs(left) > 1
                and left.bit_length() * right > MAX_INT_BITS
            ):
                raise self.fail("integer result too large")
        if isinstance(node.op, ast.Mult):
            self._check_repeat(left, right)
        result = self.apply(_BINARY[type(node.op)], left, right)
        # Nested arithmetic could otherwise build integers of billions of digits.
        if isinstance(result, int) and result.bit_length() > MAX_INT_BITS:
            raise self.fail("integer result too large")
        return result

    def _check_repeat(self, left: Any, right: Any) -> None:
        for sequence, count in ((left, right), (right, left)):
            if not isinstance(sequence, (str, list, tuple)):
                continue
            if not self.dialect.allow_repeat:
                raise self.fail("sequence repetition is not allowed")
            if isinstance(count, int) and len(sequence) * count > self.dialect.max_sequence:
                raise self.fail("sequence repetition too long")

    def visit_Compare(self, node: ast.Compare) -> Any:
        left = self.visit(node.left)
        for op, comparator in zip(node.ops, node.comparators):
            right = self.visit(comparator)
            if not self.apply(_COMPARE[type(op)], left, right):
                return False
            left = right
        return True

    def visit_Call(self, node: ast.Call) -> Any:
        assert isinstance(node.func, ast.Name)
        function = self.dialect.functions[node.func.id][0]
        return self.apply(function, *(self.visit(a) for a in node.args))

    def visit_Subscript(self, node: ast.Subscript) -> Any:
        return self.apply(operator.getitem, self.visit(node.value), self.visit(node.slice))

    def visit_Slice(self, node: ast.Slice) -> Any:
        parts = (node.lower, node.upper, node.step)
        return slice(*(None if p is None else self.visit(p) for p in parts))

    def visit_IfExp(self, node: ast.IfExp) -> Any:
        return self.visit(node.body) if self.visit(node.test) else self.visit(node.orelse)

    def visit_ListComp(self, node: ast.ListComp) -> Any:
        return self._comprehend(node.elt, node.generators)

    def visit_GeneratorExp(self, node: ast.GeneratorExp) -> Any:
        return tuple(self._comprehend(node.elt, node.generators))

    def _comprehend(self, element: ast.AST, generators: list[ast.comprehension]) -> list[Any]:
        results: list[Any] = []
        outer = self.names

        def loop(index: int, scope: Mapping[str, Any]) -> None:
            if index == len(generators):
                self.names = scope
                results.append(self.visit(element))
                if len(results) > self.dialect.max_sequence:
                    raise self.fail("comprehension too long")
                return
            generator = generators[index]
            self.names = scope
            for item in self.bounded(self.visit(generator.iter)):
                local: dict[str, Any] = {}
                self._assign(generator.target, item, local)
                inner = ChainMap(local, scope)
                self.names = inner
                if all(self.visit(condition) for condition in generator.ifs):
                    loop(index + 1, inner)

        try:
            loop(0, outer)
        finally:
            self.names = outer
        return results

    def _assign(self, target: ast.AST, item: Any, scope: dict[str, Any]) -> None:
        if isinstance(target, ast.Name):
            scope[target.id] = item
            return
        assert isinstance(target, ast.Tuple)
        values = self.bounded(item)
        if len(values) != len(target.elts):
            raise self.fail("cannot unpack in comprehension")
        for element, value in zip(target.elts, values):
            assert isinstance(element, ast.Name)
            scope[element.id] = value

    def bounded(self, sequence: Any) -> tuple[Any, ...]:
        if not isinstance(sequence, (list, tuple, str, range)):
            raise self.fail(f"expected a sequence, got {type(sequence).__name__}")
        if len(sequence) > self.dialect.max_sequence:
            raise self.fail("sequence too long")
        return tuple(sequence)

    def apply(self, function: Callable[..., Any], *args: Any) -> Any:
        """Call a whitelisted function; Python's errors become the dialect's."""
        try:
            return function(*args)
        except self.dialect.error:
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
            raise self.fail(str(exc) or type(exc).__name__) from None
