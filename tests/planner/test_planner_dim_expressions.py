"""Dim expressions: what sympy prints parses and evaluates to sympy's own value."""

from __future__ import annotations

import pytest
import sympy
from hypothesis import assume, given
from hypothesis import strategies as st

from onnxfuse.planner.dim_expressions import DimExpressionError, parse_dim

WIDTH, HEIGHT = sympy.Symbol("width", integer=True, positive=True), sympy.Symbol("h")


@pytest.mark.parametrize(
    ("text", "dims", "value"),
    [
        ("floor(floor(floor(width/2 - 1/2)/2)/2) + 1", {"width": 640}, 80),
        ("floor(floor(floor(width/2 - 1/2)/2)/2) + 1", {"width": 33}, 5),
        ("Min(64, seq)", {"seq": 7}, 7),
        ("max(seq, 64)", {"seq": 7}, 64),
        ("2*s0**2 + Mod(s0, 3)", {"s0": 5}, 52),
        ("((s0 - 1)//2) + 1", {"s0": 9}, 5),
        ("ceiling(x/3) + ceil(x/4)", {"x": 10}, 7),
        ("mod(-x, 4) + x % 3", {"x": 5}, 5),  # the divisor's sign, as Python's and sympy's
        ("-x + 10", {"x": 3}, 7),
        ("p2o.DynamicDimension.0*2", {"p2o.DynamicDimension.0": 3}, 6),
        # A name bound whole wins over the expression it could be read as.
        ("batch-size", {"batch-size": 4}, 4),
    ],
)
def test_expressions_evaluate(text, dims, value):
    assert parse_dim(text).value(dims) == value


def test_names_and_unbound_names():
    expression = parse_dim("floor(width/2) + Max(height, 3)")
    assert expression.names == {"width", "height"} and not expression.is_name
    assert expression.value({"width": 8}) is None  # height is unbound
    assert parse_dim("unk__3").is_name and parse_dim("unk__3").names == {"unk__3"}


@pytest.mark.parametrize("text", ["?", "batch size", "f(x)", "x +", "(x", "x y", "1.5*x", "Min()"])
def test_text_outside_the_grammar_is_one_name(text):
    expression = parse_dim(text)
    assert expression.is_name and expression.names == {text}
    assert expression.value({text: 3}) == 3


def test_a_path_of_names_is_one_name():
    # torch's legacy exporter names a dim after the node's path.
    assert parse_dim("Squeeze/decoder/Squeeze_output_0_dim_0").path_like()
    assert not parse_dim("width/2").path_like() and not parse_dim("batch").path_like()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("x/2", r"is 3/2 with x=3: not a whole, non-negative number"),
        ("x - 5", r"is -2 with x=3"),
        ("x//(x - 3)", "division by zero"),
        ("Mod(x, x - 3)", "modulo by zero"),
        ("9**9**9**9", "power too large"),
    ],
)
def test_values_that_are_not_dims_are_errors(text, message):
    with pytest.raises(DimExpressionError, match=message):
        parse_dim(text).value({"x": 3})


@pytest.mark.parametrize("text", ["(" * 500 + "x" + ")" * 500, "-" * 1000 + "x", "x+" * 1500 + "x"])
def test_deep_or_long_texts_do_not_exhaust_the_stack(text):
    expression = parse_dim(text)  # refused as an expression: one opaque name
    assert expression.is_name


def _expressions() -> st.SearchStrategy[sympy.Expr]:
    leaves = st.one_of(st.integers(1, 50).map(sympy.Integer), st.sampled_from([WIDTH, HEIGHT]))

    def extend(children: st.SearchStrategy[sympy.Expr]) -> st.SearchStrategy[sympy.Expr]:
        pairs = st.tuples(children, children)
        return st.one_of(
            pairs.map(lambda p: p[0] + p[1]),
            pairs.map(lambda p: p[0] - p[1]),
            pairs.map(lambda p: p[0] * p[1]),
            st.tuples(children, st.integers(1, 7)).map(lambda p: sympy.floor(p[0] / p[1])),
            st.tuples(children, st.integers(1, 7)).map(lambda p: sympy.ceiling(p[0] / p[1])),
            st.tuples(children, st.integers(1, 7)).map(lambda p: p[0] / p[1]),
            st.tuples(children, st.integers(1, 7)).map(lambda p: sympy.Mod(p[0], p[1])),
            pairs.map(lambda p: sympy.Min(*p)),
            pairs.map(lambda p: sympy.Max(*p)),
            st.tuples(children, st.integers(0, 3)).map(lambda p: p[0] ** p[1]),
        )

    return st.recursive(leaves, extend, max_leaves=8)


@given(_expressions(), st.integers(1, 2000), st.integers(1, 2000))
def test_what_sympy_prints_evaluates_as_sympy_does(expression, width, height):
    text = str(expression)
    values = {WIDTH: width, HEIGHT: height}
    expected = expression.subs(values)
    # A power past 2**63 is refused (no dim is that large): leave those out.
    assume(all(abs(p.subs(values)) < 2**63 for p in expression.atoms(sympy.Pow)))
    parsed = parse_dim(text)
    assert not parsed.is_name or isinstance(expression, sympy.Symbol), text
    dims = {"width": width, "h": height}
    if expected.is_integer and expected >= 0:
        assert parsed.value(dims) == int(expected), text
    else:
        with pytest.raises(DimExpressionError):
            parsed.value(dims)
