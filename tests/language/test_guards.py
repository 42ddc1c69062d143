"""Guards (`where`) and lets: what they read, how they splice, which are refused or cut short."""

from __future__ import annotations

import pytest
from helpers import assert_same_outputs, make_model, optimize_proto, rules_from_text, tensor_input
from onnx import TensorProto, helper
from rule_cases import ADD_ZERO, RELU_RELU, X4, _add_model, _relu_pair_rule, fired

GUARDS = """
rules:
  - name: guarded-relu
    source: |
      f (X) => (Y) {
        Y = Relu(X)
      }
    where:
      - dtype(X) == "float"
      - rank(X) == 4 and shape(X)[0] == 2
    target: |
      f (X) => (Y) {
        z = Constant<value_float = 0.0>()
        Y = Max(X, z)
      }
"""


@pytest.mark.parametrize(
    ("shape", "elem", "expected"),
    [
        (X4, TensorProto.FLOAT, 1),
        ([3, 3, 4, 5], TensorProto.FLOAT, 0),
        ([2, 3, 4], TensorProto.FLOAT, 0),
        (X4, TensorProto.DOUBLE, 0),
    ],
)
def test_guards_on_dtype_rank_and_shape(shape, elem, expected):
    nodes = [helper.make_node("Relu", ["x"], ["y"], name="r")]
    model = make_model(nodes, [tensor_input("x", shape, elem)], [tensor_input("y", shape, elem)])
    report, result = optimize_proto(model, rules_from_text(GUARDS))
    assert fired(report, "guarded-relu") == expected
    assert_same_outputs(model, result)


def test_guard_on_symbolic_dimension_is_false():
    nodes = [helper.make_node("Relu", ["x"], ["y"], name="r")]
    shape = ["N", 3, 4, 5]
    model = make_model(nodes, [tensor_input("x", shape)], [tensor_input("y", shape)])
    report, _ = optimize_proto(model, rules_from_text(GUARDS))
    assert fired(report, "guarded-relu") == 0


SAME_BATCH = """
rules:
  - name: same-batch-add
    source: |
      f (X, Y) => (Z) {
        Z = Add(X, Y)
      }
    where:
      - shape(X)[0] == shape(Y)[0]
    target: |
      f (X, Y) => (Z) {
        Z = Sum(X, Y)
      }
"""


@pytest.mark.parametrize(
    ("x_batch", "y_batch", "expected"),
    [("N", "N", 1), ("N", "M", 0), (None, None, 0), (None, "N", 0), (2, 2, 1)],
)
def test_unnamed_dimensions_are_never_proven_equal(x_batch, y_batch, expected):
    # Two dims with neither a size nor a name may differ at run time.
    nodes = [helper.make_node("Add", ["x", "y"], ["z"], name="a")]
    inputs = [tensor_input("x", [x_batch, 3]), tensor_input("y", [y_batch, 3])]
    model = make_model(nodes, inputs, [tensor_input("z", [None, 3])])
    report, _ = optimize_proto(model, rules_from_text(SAME_BATCH))
    assert fired(report, "same-batch-add") == expected


SHARED_WHERE = """
rules:
  - name: r1
    source: |
      f (X) => (Y) {
        Y = Relu(X)
      }
    where: &shared
      - rank(X) == 4
      - dtype(X) == "float"
    target: |
      f (X) => (Y) {
        z = Constant<value_float = 0.0>()
        Y = Max(X, z)
      }
  - name: r2
    source: |
      f (X) => (Y) {
        Y = Sigmoid(X)
      }
    where:
      - *shared
      - shape(X)[0] == 2
    target: |
      f (X) => (Y) {
        Y = Sigmoid(X)
        Z = Identity(Y)
      }
"""


def test_where_splices_a_shared_guard_list():
    first, second = rules_from_text(SHARED_WHERE)
    assert [g.text for g in first.guards] == ["rank(X) == 4", 'dtype(X) == "float"']
    assert [g.text for g in second.guards] == [
        "rank(X) == 4",
        'dtype(X) == "float"',
        "shape(X)[0] == 2",
    ]


def test_where_refuses_a_non_expression_item():
    from onnxfuse.errors import RuleError

    text = GUARDS.replace('- dtype(X) == "float"', "- [[1]]")
    with pytest.raises(RuleError, match="'where' must be an expression or a list of them"):
        rules_from_text(text)


LET_IN_WHERE = """
rules:
  - name: transpose-pair
    source: |
      f <p, q> (X) => (Y) {
        T = Transpose<perm: ints = @p>(X)
        Y = Transpose<perm: ints = @q>(T)
      }
    let:
      composed: "[p[i] for i in q]"
    where: composed != list(range(len(composed)))
    target: |
      f <composed> (X) => (Y) {
        Y = Transpose<perm: ints = @composed>(X)
      }
"""


@pytest.mark.parametrize(
    ("first", "second", "expected"),
    [([1, 0, 2, 3], [0, 2, 1, 3], 1), ([1, 0, 2, 3], [1, 0, 2, 3], 0)],
)
def test_let_values_usable_in_where_and_comprehensions(first, second, expected):
    nodes = [
        helper.make_node("Transpose", ["x"], ["t"], perm=first, name="t1"),
        helper.make_node("Transpose", ["t"], ["y"], perm=second, name="t2"),
    ]
    out_shape = [X4[first[i]] for i in second]
    model = make_model(nodes, [tensor_input("x", X4)], [tensor_input("y", out_shape)])
    report, result = optimize_proto(model, rules_from_text(LET_IN_WHERE))
    assert fired(report, "transpose-pair") == expected
    assert_same_outputs(model, result)


CAST_NOOP = """
rules:
  - name: cast-noop
    source: |
      f <to> (X) => (Y) {
        Y = Cast<to: int = @to>(X)
      }
    where: dtype_name(to) == dtype(X)
    target: |
      f (X) => (Y) {
        Y = Identity(X)
      }
"""


@pytest.mark.parametrize(("to", "expected"), [(TensorProto.FLOAT, 1), (TensorProto.DOUBLE, 0)])
def test_dtype_name_of_an_element_type_number(to, expected):
    nodes = [
        helper.make_node("Cast", ["x"], ["c"], to=to, name="c"),
        helper.make_node("Abs", ["c"], ["y"], name="a"),
    ]
    elem = TensorProto.FLOAT if to == TensorProto.FLOAT else TensorProto.DOUBLE
    model = make_model(nodes, [tensor_input("x", X4)], [tensor_input("y", X4, elem)])
    report, _ = optimize_proto(model, rules_from_text(CAST_NOOP))
    assert fired(report, "cast-noop") == expected


FINITE = ADD_ZERO.replace(
    "    where: broadcastable(X, Y) and shape(X) == shape(Y)\n",
    "    where: all_finite(z)\n",
).replace("Y = Add(X, z)", "Y = Add(X, z)")


def test_all_finite_guard():
    assert fired(optimize_proto(_add_model("x", "c", 0.0), rules_from_text(FINITE))[0], "add-zero")


@pytest.mark.parametrize(
    ("guard", "message"),
    [
        ("-" * 200 + "1", "nested"),
        ("1 + " * 2000 + "1", "longer than"),
    ],
)
def test_pathological_guards_are_refused(guard, message):
    from onnxfuse.errors import RuleError

    with pytest.raises(RuleError, match=message):
        rules_from_text(RELU_RELU + f"    where: '{guard}'\n")


# relu-relu, on block-size targets only: one guard reads only target_params.
PARAM_GUARDED = RELU_RELU.replace(
    "    target: |",
    "    where:\n"
    "      - \"'block' in target_params\"\n"
    "      - \"rank(X) >= 1 or 'layout' in target_params\"\n"
    "    target: |",
)


def test_guard_reading_only_target_params_decides_the_rule_per_target():
    (rule,) = rules_from_text(PARAM_GUARDED)
    assert rule.refused_by({}) == "'block' in target_params"
    assert rule.refused_by({"block": 8}) is None  # the mixed guard is left to matching
    assert [g.names for g in rule.guards] == [
        frozenset({"target_params"}),
        frozenset({"X", "target_params"}),
    ]


def test_guard_lists_aliased_within_aliases_are_walked_once():
    """Eight levels of ten aliases each would be 10**8 guards spliced in one by one."""
    levels = ['      - &l0 ["rank(X) > 0", "rank(X) < 9"]']
    for k in range(1, 8):
        levels.append(f"      - &l{k} [{', '.join([f'*l{k - 1}'] * 10)}]")
    text = _relu_pair_rule("f (X) => (Y) { Y = Relu(X) }", "    where:\n" + "\n".join(levels))
    (rule,) = rules_from_text(text)
    assert [g.text for g in rule.guards] == ["rank(X) > 0", "rank(X) < 9"]


def test_a_guard_of_nested_loops_over_long_ranges_is_cut_short():
    """Three nested loops over 10,000 items each: undecided after a bounded number of
    steps (the rule does not fire), not 10**12 steps at every candidate node."""
    loops = "for a in range(10000) for b in range(10000) for c in range(10000)"
    text = _relu_pair_rule(
        "f (X) => (Y) { Y = Relu(X) }", f'    where: "[1 {loops} if a < 0] == []"'
    )
    nodes = [helper.make_node("Relu", ["x"], ["t"]), helper.make_node("Relu", ["t"], ["y"])]
    model = make_model(nodes, [tensor_input("x", [2, 3])], [tensor_input("y", [2, 3])])
    report, optimized = optimize_proto(model, rules_from_text(text))
    assert report.rules["my-rule"].applied == 0
    assert len(optimized.graph.node) == 2
