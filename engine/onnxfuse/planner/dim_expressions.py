"""Symbolic dims written as expressions (``floor(width/2 - 1/2) + 1``), evaluated safely.

Tools that track symbolic shapes (onnxruntime's SymbolicShapeInference, torch's
exporter) write a dim they derived as the sympy text of its expression in
``dim_param``. The grammar is what sympy prints for integer dims: integers, names,
``+ - * / // % **``, parentheses and ``floor``, ``ceiling``/``ceil``, ``Min``/``min``,
``Max``/``max``, ``Mod``/``mod``. ``/`` is exact (``width/2 - 1/2`` is a rational
until ``floor`` makes it whole), so arithmetic is on fractions, and the value of a dim
must come out whole and not negative. Nothing is handed to ``eval``: the text is
parsed into a tree of the operations above and only that tree is computed.
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from fractions import Fraction

from onnxfuse.errors import ModelError

# A name as the tools write them: torch's s0 and u0, SymbolicShapeInference's
# NonZero_3_o0__d1, paddle's p2o.DynamicDimension.0 (dots are part of the name).
_TOKEN = re.compile(r"\s*(?:(\d+)|([A-Za-z_][A-Za-z0-9_.]*)|(//|\*\*|[-+*/%(),]))")

# A text this long or this deeply nested is not a dim a tool wrote; refusing it keeps the
# parser's recursion (a few frames per level) far below Python's limit.
_MAX_LENGTH = 2000
_MAX_DEPTH = 100
# No dim has more elements than a 64-bit size can count; a power is refused past that
# before it is computed, so `9**9**9**9` cannot take the machine.
_MAX_MAGNITUDE = 2**63


class DimExpressionError(ModelError):
    """A dim expression that does not give a whole, non-negative number."""


def _mod(a: Fraction, b: Fraction) -> Fraction:
    if b == 0:
        raise DimExpressionError("modulo by zero")
    return a % b  # sympy's Mod takes the divisor's sign, as Python's % does


def _floordiv(a: Fraction, b: Fraction) -> Fraction:
    if b == 0:
        raise DimExpressionError("division by zero")
    return Fraction(a // b)


def _truediv(a: Fraction, b: Fraction) -> Fraction:
    if b == 0:
        raise DimExpressionError("division by zero")
    return a / b


def _power(a: Fraction, b: Fraction) -> Fraction:
    if b.denominator != 1 or b < 0:
        raise DimExpressionError(f"power {b} is not a whole number")
    if abs(a) > 1 and b * math.log2(abs(a)) > math.log2(_MAX_MAGNITUDE):
        raise DimExpressionError("power too large for a dim")
    return a ** int(b)


_BINARY: dict[str, Callable[[Fraction, Fraction], Fraction]] = {
    "+": operator.add,
    "-": operator.sub,
    "*": operator.mul,
    "/": _truediv,
    "//": _floordiv,
    "%": _mod,
    "**": _power,
}

_FUNCTIONS: dict[str, tuple[int, Callable[..., Fraction]]] = {
    "floor": (1, lambda a: Fraction(math.floor(a))),
    "ceiling": (1, lambda a: Fraction(math.ceil(a))),
    "ceil": (1, lambda a: Fraction(math.ceil(a))),
    "Min": (-1, min),
    "min": (-1, min),
    "Max": (-1, max),
    "max": (-1, max),
    "Mod": (2, _mod),
    "mod": (2, _mod),
}


@dataclass(frozen=True)
class _Number:
    value: int


@dataclass(frozen=True)
class _Name:
    name: str


@dataclass(frozen=True)
class _Apply:
    """An operator (``+``, ``neg``, ...) or a function applied to its arguments."""

    op: str
    args: tuple[_Tree, ...]


_Tree = _Number | _Name | _Apply


class _Parser:
    def __init__(self, text: str):
        self.tokens = _tokenize(text)
        self.at = 0
        self.depth = 0

    def peek(self) -> str | None:
        return self.tokens[self.at] if self.at < len(self.tokens) else None

    def take(self, expected: str | None = None) -> str:
        token = self.peek()
        if token is None or (expected is not None and token != expected):
            raise ValueError(f"expected {expected or 'more'}")
        self.at += 1
        return token

    def parse(self) -> _Tree:
        tree = self.sum()
        if self.peek() is not None:
            raise ValueError(f"unexpected {self.peek()!r}")
        return tree

    def sum(self) -> _Tree:
        tree = self.product()
        while self.peek() in ("+", "-"):
            op = self.take()
            tree = _Apply(op, (tree, self.product()))
        return tree

    def product(self) -> _Tree:
        tree = self.unary()
        while self.peek() in ("*", "/", "//", "%"):
            op = self.take()
            tree = _Apply(op, (tree, self.unary()))
        return tree

    def unary(self) -> _Tree:
        # Every nesting (parentheses, arguments, signs, exponents) passes through here.
        self.depth += 1
        if self.depth > _MAX_DEPTH:
            raise ValueError("nested too deeply")
        if self.peek() in ("-", "+"):
            sign = self.take()
            operand = self.unary()
            tree = _Apply("neg", (operand,)) if sign == "-" else operand
        else:
            tree = self.power()
        self.depth -= 1
        return tree

    def power(self) -> _Tree:
        base = self.atom()
        if self.peek() == "**":
            self.take()
            return _Apply("**", (base, self.unary()))  # right-associative, binds tighter than -
        return base

    def atom(self) -> _Tree:
        token = self.take()
        if token == "(":
            tree = self.sum()
            self.take(")")
            return tree
        if token.isdigit():
            return _Number(int(token))
        if not (token[0].isalpha() or token[0] == "_"):
            raise ValueError(f"unexpected {token!r}")
        if self.peek() != "(":
            return _Name(token)
        if token not in _FUNCTIONS:
            raise ValueError(f"unknown function {token!r}")
        self.take("(")
        args = [self.sum()]
        while self.peek() == ",":
            self.take()
            args.append(self.sum())
        self.take(")")
        arity = _FUNCTIONS[token][0]
        if arity >= 0 and len(args) != arity:
            raise ValueError(f"{token} takes {arity} arguments")
        return _Apply(token, tuple(args))


def _tokenize(text: str) -> list[str]:
    tokens, at = [], 0
    text = text.rstrip()
    while at < len(text):
        match = _TOKEN.match(text, at)
        if match is None:
            raise ValueError(f"unexpected {text[at:].lstrip()[:1]!r}")
        tokens.append(match.group(match.lastindex or 0))
        at = match.end()
    return tokens


@dataclass(frozen=True)
class DimExpression:
    """The ``dim_param`` text of a dim, parsed: a plain name, or an expression of names.

    A text that is not an expression in the grammar (``p2o.DynamicDimension.0``, ``?``)
    is one name, the text itself.
    """

    text: str
    tree: _Tree

    @property
    def names(self) -> frozenset[str]:
        found: set[str] = set()
        stack = [self.tree]
        while stack:
            tree = stack.pop()
            if isinstance(tree, _Name):
                found.add(tree.name)
            elif isinstance(tree, _Apply):
                stack.extend(tree.args)
        return frozenset(found)

    @property
    def is_name(self) -> bool:
        return isinstance(self.tree, _Name)

    def path_like(self) -> bool:
        """Names joined by ``/`` only: torch's legacy exporter names a dim after the
        node's path (``Squeeze/decoder/Squeeze_output_0_dim_0``); it is one name."""
        tree = self.tree
        while isinstance(tree, _Apply) and tree.op == "/" and isinstance(tree.args[1], _Name):
            tree = tree.args[0]
        return isinstance(tree, _Name) and not self.is_name

    def value(self, dims: Mapping[str, int]) -> int | None:
        """The dim's value with ``dims`` bound, or None if a name it reads is unbound.

        Raises DimExpressionError if the value is not a whole, non-negative number.
        """
        if self.text in dims:  # a name bound whole wins over reading it as an expression
            return dims[self.text]
        if not self.names <= dims.keys():
            return None
        try:
            result = _evaluate(self.tree, dims)
        except DimExpressionError as exc:
            raise DimExpressionError(f"dim {self.text!r}: {exc}") from None
        if result.denominator != 1 or result < 0:
            bound = ", ".join(f"{n}={dims[n]}" for n in sorted(self.names))
            raise DimExpressionError(
                f"dim {self.text!r} is {result} with {bound}: not a whole, non-negative number"
            )
        return int(result)


def parse_dim(text: str) -> DimExpression:
    """Parse a ``dim_param``; a text outside the grammar is a name."""
    if len(text) <= _MAX_LENGTH:
        try:
            return DimExpression(text, _Parser(text).parse())
        except ValueError:
            pass
    return DimExpression(text, _Name(text))


def _evaluate(tree: _Tree, dims: Mapping[str, int]) -> Fraction:
    if isinstance(tree, _Number):
        return Fraction(tree.value)
    if isinstance(tree, _Name):
        return Fraction(dims[tree.name])
    args = [_evaluate(arg, dims) for arg in tree.args]
    if tree.op == "neg":
        return -args[0]
    if tree.op in _BINARY:
        return _BINARY[tree.op](*args)
    return _FUNCTIONS[tree.op][1](*args)
