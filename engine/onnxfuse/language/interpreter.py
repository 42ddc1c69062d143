"""The expression language shared by guards and verification domains.

Python expression syntax, parsed with ``ast`` and checked against a
whitelist; compiled once into Python closures (one per syntax node), never passed
to ``eval``. A *dialect* says which functions and constants exist, which exception
reports a value the expression cannot compute, and how large a sequence may grow: guards
(``onnxfuse.language.guards``) decide matches and must stay cheap; domain
expressions (``onnxfuse.proof.expr``) build shapes and constants for tests.
"""

from __future__ import annotations

import ast
import operator
from collections import ChainMap
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any, cast

MAX_EXPRESSION_CHARS = 4000
# The interpreter recurses over the tree: keep it far from Python's limit.
MAX_DEPTH = 60
MAX_INT_BITS = 4096

# Items a comprehension may visit, over all its loops: a guard is checked at every
# candidate node, and three nested loops over 10,000 items would never end.
_MAX_COMPREHENSION_STEPS = 100_000


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

# A set lookup first: isinstance with the tuple tries its types one by one.
_ALLOWED_TYPES = frozenset(_ALLOWED_NODES)


def check_syntax(
    text: Any, dialect: Dialect, error: type[Exception], what: str = "expression"
) -> ast.Expression:
    """Parse ``text`` and check it is in the language; raise ``error`` naming the problem."""
    return check_expression(text, dialect, error, what)[0]


def check_expression(
    text: Any, dialect: Dialect, error: type[Exception], what: str = "expression"
) -> tuple[ast.Expression, frozenset[str]]:
    """``check_syntax`` and ``free_names`` from one walk of the tree (a walk costs more
    than the parse: loading the built-in rules checks over a thousand guards)."""
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
    nodes, depth = _walk(tree)
    if depth > MAX_DEPTH:
        raise error(f"expression nested deeper than {MAX_DEPTH} levels")
    for node in nodes:
        _check_node(node, text, dialect, error, what)
    return tree, frozenset(_free_names(nodes, dialect))


def _check_node(
    node: ast.AST, text: str, dialect: Dialect, error: type[Exception], what: str
) -> None:
    if isinstance(node, ast.comprehension) and (node.is_async or not _simple_target(node.target)):
        raise error(f"only `for name in ...` comprehensions are allowed ({text!r})")
    if type(node) not in _ALLOWED_TYPES and not isinstance(node, _ALLOWED_NODES):
        raise error(f"{type(node).__name__} is not allowed in a {what} ({text!r})")
    if isinstance(node, ast.Call):
        _check_call(node, text, dialect, error, what)
    elif isinstance(node, ast.Constant) and not isinstance(
        node.value, (int, float, str, bool, type(None))
    ):
        raise error(f"literal {node.value!r} is not allowed in a {what}")


def literals_compared_with(tree: ast.AST, marked: Callable[[ast.AST], bool]) -> list[str]:
    """String literals the expression compares (``==``, ``!=``, ``in``, ``not in``) with
    a sub-expression ``marked`` picks out, in the order they are written in.

    ``f(X) == 'a'``, ``'a' != f(X)``, ``f(X) in ('a', 'b')`` each give their literals;
    so do tuples compared position by position: ``(f(A), f(B)) in (('a', 'b'),)``
    gives 'a' and 'b'. A literal reached any other way (a name, an index) is not seen.
    """
    found: list[tuple[int, int, str]] = []

    def pair(side: ast.AST, literal: ast.AST) -> None:
        if marked(side):
            if isinstance(literal, ast.Constant) and isinstance(literal.value, str):
                found.append((literal.lineno, literal.col_offset, literal.value))
        elif (
            isinstance(side, (ast.Tuple, ast.List))
            and isinstance(literal, (ast.Tuple, ast.List))
            and len(side.elts) == len(literal.elts)
        ):
            for part, value in zip(side.elts, literal.elts):
                pair(part, value)

    for node in _walk(tree)[0]:
        if not isinstance(node, ast.Compare):
            continue
        operands = [node.left, *node.comparators]
        for op, left, right in zip(node.ops, operands, operands[1:]):
            if isinstance(op, (ast.Eq, ast.NotEq)):
                pair(left, right)
                pair(right, left)
            elif isinstance(op, (ast.In, ast.NotIn)) and isinstance(right, (ast.Tuple, ast.List)):
                for item in right.elts:
                    pair(left, item)
    return [value for _, _, value in sorted(found)]


def free_names(tree: ast.AST, dialect: Dialect) -> set[str]:
    """Names the expression reads from its bindings: not functions, constants or names
    a comprehension binds."""
    return _free_names(_walk(tree)[0], dialect)


def _free_names(nodes: list[ast.AST], dialect: Dialect) -> set[str]:
    local = {
        n.id
        for c in nodes
        if isinstance(c, ast.comprehension)
        for n in ast.walk(c.target)
        if isinstance(n, ast.Name)
    }
    called = {id(n.func) for n in nodes if isinstance(n, ast.Call)}
    return {
        n.id
        for n in nodes
        if isinstance(n, ast.Name)
        and isinstance(n.ctx, ast.Load)
        and id(n) not in called
        and n.id not in local
        and n.id not in dialect.constants
    }


def _walk(tree: ast.AST) -> tuple[list[ast.AST], int]:
    """Every node in ``ast.walk``'s order (breadth first, so the first error found is
    the same), and the depth of the tree (the root alone: 1)."""
    order: list[ast.AST] = []
    level, depth = [tree], 0
    while level:
        depth += 1
        order.extend(level)
        level = [child for node in level for child in _children(node)]
    return order, depth


def _children(node: ast.AST) -> list[ast.AST]:
    """``ast.iter_child_nodes`` as a list, without its two generators."""
    found: list[ast.AST] = []
    for name in node._fields:
        value = getattr(node, name, None)
        if isinstance(value, ast.AST):
            found.append(value)
        elif isinstance(value, list):
            for item in value:
                if isinstance(item, ast.AST):
                    found.append(item)
    return found


def evaluate(tree: ast.Expression, names: Mapping[str, Any], dialect: Dialect) -> Any:
    return compiled(tree, dialect)(names)


Compiled = Callable[[Mapping[str, Any]], Any]

# Expressions already compiled, by tree and dialect; the entry keeps the tree alive so
# that its id is not reused. Bounded: verification domains parse fresh trees in tests.
_COMPILED: dict[tuple[int, int], tuple[ast.AST, Compiled]] = {}
_MAX_COMPILED = 4096


def compiled(tree: ast.Expression, dialect: Dialect) -> Compiled:
    """``tree`` as one closure per syntax node, made once: a guard runs at every try of
    its rule, and walking the tree each time (a method lookup per node) cost more than
    the evaluation itself."""
    key = (id(tree), id(dialect))
    entry = _COMPILED.get(key)
    if entry is not None and entry[0] is tree:
        return entry[1]
    function = _Compiler(dialect).compile(tree.body)
    if len(_COMPILED) >= _MAX_COMPILED:
        _COMPILED.clear()
    _COMPILED[key] = (tree, function)
    return function


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


class _Compiler:
    """Turns a checked tree into closures over the bindings. Evaluation order, results
    and errors are those of a walk of the tree: operands left to right, ``and``/``or``
    short-circuit, Python's errors in whitelisted calls become the dialect's error."""

    def __init__(self, dialect: Dialect):
        self.dialect = dialect

    def compile(self, node: ast.AST) -> Compiled:
        return getattr(self, f"compile_{type(node).__name__}")(node)

    def fail(self, message: str) -> Exception:
        return self.dialect.error(message)

    def compile_Constant(self, node: ast.Constant) -> Compiled:
        value = node.value
        return lambda names: value

    def compile_Name(self, node: ast.Name) -> Compiled:
        key, constants, fail = node.id, self.dialect.constants, self.fail

        def name(names: Mapping[str, Any]) -> Any:
            if key in constants:
                return constants[key]
            try:
                return names[key]
            except KeyError:
                raise fail(f"unknown name '{key}'") from None

        return name

    def compile_Tuple(self, node: ast.Tuple) -> Compiled:
        parts = [self.compile(e) for e in node.elts]
        return lambda names: tuple(part(names) for part in parts)

    def compile_List(self, node: ast.List) -> Compiled:
        parts = [self.compile(e) for e in node.elts]
        return lambda names: [part(names) for part in parts]

    def compile_BoolOp(self, node: ast.BoolOp) -> Compiled:
        conjunction = isinstance(node.op, ast.And)
        operands = [self.compile(v) for v in node.values]

        def boolean(names: Mapping[str, Any]) -> Any:
            result: Any = conjunction
            for operand in operands:
                result = operand(names)
                if bool(result) != conjunction:
                    return result
            return result

        return boolean

    def compile_UnaryOp(self, node: ast.UnaryOp) -> Compiled:
        function, operand, apply = _UNARY[type(node.op)], self.compile(node.operand), self.apply
        return lambda names: apply(function, operand(names))

    def compile_BinOp(self, node: ast.BinOp) -> Compiled:
        left_of, right_of = self.compile(node.left), self.compile(node.right)
        function, apply, fail = _BINARY[type(node.op)], self.apply, self.fail
        power, product = isinstance(node.op, ast.Pow), isinstance(node.op, ast.Mult)

        def binary(names: Mapping[str, Any]) -> Any:
            left, right = left_of(names), right_of(names)
            if power:
                if not isinstance(right, (int, float)) or right > 64:
                    raise fail("exponent too large")
                if (
                    isinstance(left, int)
                    and isinstance(right, int)
                    and abs(left) > 1
                    and left.bit_length() * right > MAX_INT_BITS
                ):
                    raise fail("integer result too large")
            if product:
                self._check_repeat(left, right)
            result = apply(function, left, right)
            # Nested arithmetic could otherwise build integers of billions of digits.
            if isinstance(result, int) and result.bit_length() > MAX_INT_BITS:
                raise fail("integer result too large")
            return result

        return binary

    def _check_repeat(self, left: Any, right: Any) -> None:
        for sequence, count in ((left, right), (right, left)):
            if not isinstance(sequence, (str, list, tuple)):
                continue
            if not self.dialect.allow_repeat:
                raise self.fail("sequence repetition is not allowed")
            if isinstance(count, int) and len(sequence) * count > self.dialect.max_sequence:
                raise self.fail("sequence repetition too long")

    def compile_Compare(self, node: ast.Compare) -> Compiled:
        first = self.compile(node.left)
        steps = [(_COMPARE[type(op)], self.compile(c)) for op, c in zip(node.ops, node.comparators)]
        apply = self.apply

        def compare(names: Mapping[str, Any]) -> Any:
            left = first(names)
            for function, comparator in steps:
                right = comparator(names)
                if not apply(function, left, right):
                    return False
                left = right
            return True

        return compare

    def compile_Call(self, node: ast.Call) -> Compiled:
        assert isinstance(node.func, ast.Name)
        function = self.dialect.functions[node.func.id][0]
        arguments, apply = [self.compile(a) for a in node.args], self.apply
        if len(arguments) == 1:
            (only,) = arguments
            return lambda names: apply(function, only(names))
        return lambda names: apply(function, *[a(names) for a in arguments])

    def compile_Subscript(self, node: ast.Subscript) -> Compiled:
        value, index, apply = self.compile(node.value), self.compile(node.slice), self.apply
        return lambda names: apply(operator.getitem, value(names), index(names))

    def compile_Slice(self, node: ast.Slice) -> Compiled:
        parts = [
            None if p is None else self.compile(p) for p in (node.lower, node.upper, node.step)
        ]
        return lambda names: slice(*(None if p is None else p(names) for p in parts))

    def compile_IfExp(self, node: ast.IfExp) -> Compiled:
        test, body, orelse = (
            self.compile(node.test),
            self.compile(node.body),
            self.compile(node.orelse),
        )
        return lambda names: body(names) if test(names) else orelse(names)

    def compile_ListComp(self, node: ast.ListComp) -> Compiled:
        return self._comprehension(node.elt, node.generators)

    def compile_GeneratorExp(self, node: ast.GeneratorExp) -> Compiled:
        comprehension = self._comprehension(node.elt, node.generators)
        return lambda names: tuple(comprehension(names))

    def _comprehension(self, element: ast.AST, generators: list[ast.comprehension]) -> Compiled:
        value = self.compile(element)
        loops = [
            (self.compile(g.iter), g.target, [self.compile(c) for c in g.ifs]) for g in generators
        ]
        limit, fail, bounded, assign = (
            self.dialect.max_sequence,
            self.fail,
            self.bounded,
            self._assign,
        )

        def comprehend(names: Mapping[str, Any]) -> list[Any]:
            results: list[Any] = []
            steps = [0]  # items visited at every level: nested loops multiply them

            def loop(index: int, scope: Mapping[str, Any]) -> None:
                if index == len(loops):
                    results.append(value(scope))
                    if len(results) > limit:
                        raise fail("comprehension too long")
                    return
                iterable, target, conditions = loops[index]
                for item in bounded(iterable(scope)):
                    steps[0] += 1
                    if steps[0] > _MAX_COMPREHENSION_STEPS:
                        raise fail("comprehension takes too many steps")
                    local: dict[str, Any] = {}
                    assign(target, item, local)
                    # ChainMap only reads the maps after the first.
                    inner = ChainMap(local, cast(MutableMapping[str, Any], scope))
                    if all(condition(inner) for condition in conditions):
                        loop(index + 1, inner)

            loop(0, names)
            return results

        return comprehend

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
