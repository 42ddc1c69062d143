"""Expressions of verification domains: the guard language plus comprehensions.

Shapes, constant values and attribute values of a rule's ``verify:`` domain
are computed by expressions over the names drawn so far (dimensions,
attribute values, ``opset``, ``T``) and the variables already built
(``shape(X)``, ``value(X)``). The language is the guards' (``onnxfuse.language.interpreter``)
with other functions, ``inf`` and ``nan``, longer sequences and repetition
(``[1] * R``), since a domain often builds a list element by element.
"""

from __future__ import annotations

import ast
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from onnxfuse.language import interpreter
from onnxfuse.language.interpreter import Dialect
from onnxfuse.ops import element_types

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


def _onnx_type(name: Any) -> int:
    """The ONNX element type number of a name (Cast's `to`): onnx_type('float') is 1."""
    if not element_types.is_name(name):
        raise ExprError(f"onnx_type({name!r}): {element_types.unknown(name)}")
    return element_types.to_onnx(name)


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

DOMAINS = Dialect(
    functions=FUNCTIONS,
    constants=CONSTANTS,
    error=ExprError,
    max_sequence=_MAX_SEQUENCE,
    allow_repeat=True,
)


@dataclass(frozen=True)
class Expr:
    """A checked expression."""

    text: str
    tree: ast.Expression

    def names(self) -> set[str]:
        """Free names the expression reads (comprehension targets excluded)."""
        return interpreter.free_names(self.tree, DOMAINS)

    def evaluate(self, names: Mapping[str, Any]) -> Any:
        return interpreter.evaluate(self.tree, names, DOMAINS)


def parse_expr(text: str) -> Expr:
    """Parse and check an expression; raise ExprError naming the problem."""
    tree = interpreter.check_syntax(text, DOMAINS, ExprError)
    _check_element_types(tree, text)
    return Expr(text=text.strip(), tree=tree)


def _typed(node: ast.AST) -> bool:
    """The instance's element type `dt`, or `dtype(X)`: values that are type names."""
    if isinstance(node, ast.Name):
        return node.id == "dt"
    called = node.func if isinstance(node, ast.Call) else None
    return isinstance(called, ast.Name) and called.id == "dtype"


def _check_element_types(tree: ast.Expression, text: str) -> None:
    """Strings compared with `dt` or `dtype(X)`, and given to onnx_type(), must be
    element type names as ONNX spells them ('float', not 'float32')."""
    literals = interpreter.literals_compared_with(tree, _typed)
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "onnx_type"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            literals.append(node.args[0].value)
    for literal in literals:
        if not element_types.is_name(literal):
            raise ExprError(f"in {text.strip()!r}: {element_types.unknown(literal)}")
