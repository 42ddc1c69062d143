"""Every power of the rule language: a case where it matches and one where it must not."""

from __future__ import annotations

import re

import numpy as np
import onnx
import pytest
from helpers import (
    assert_same_outputs,
    make_model,
    optimize_proto,
    rules_from_text,
    tensor_input,
)
from onnx import TensorProto, helper, numpy_helper

X4 = [2, 3, 4, 5]


def unary_chain(*ops: str, shape=X4, opset: int = 17, **attributes) -> onnx.ModelProto:
    nodes, previous = [], "x"
    for index, op in enumerate(ops):
        out = "y" if index == len(ops) - 1 else f"t{index}"
        nodes.append(helper.make_node(op, [previous], [out], name=f"n{index}", **attributes))
        previous = out
    return make_model(nodes, [tensor_input("x", shape)], [tensor_input("y", shape)], opset=opset)


def fired(report, name: str) -> int:
    return report.rules[name].applied


RELU_RELU = """
rules:
  - name: relu-relu
    description: Relu is idempotent.
    benefit: 3
    references: [math]
    source: |
      f (X) => (Y) {
        T = Relu(X)
        Y = Relu(T)
      }
    target: |
      f (X) => (Y) {
        Y = Relu(X)
      }
"""


def test_op_type_and_chain_fire_and_preserve_numerics():
    model = unary_chain("Relu", "Relu")
    report, result = optimize_proto(model, rules_from_text(RELU_RELU))
    assert fired(report, "relu-relu") == 1
    assert [n.op_type for n in result.graph.node] == ["Relu"]
    assert result.graph.output[0].name == "y"
    assert_same_outputs(model, result)


def test_op_type_mismatch_does_not_fire():
    model = unary_chain("Relu", "Sigmoid")
    report, result = optimize_proto(model, rules_from_text(RELU_RELU))
    assert fired(report, "relu-relu") == 0
    assert len(result.graph.node) == 2


def test_fixpoint_collapses_long_chain():
    model = unary_chain(*["Relu"] * 6)
    report, result = optimize_proto(model, rules_from_text(RELU_RELU))
    assert fired(report, "relu-relu") == 5
    assert len(result.graph.node) == 1
    assert_same_outputs(model, result)


def test_intermediate_with_outside_consumer_blocks_match():
    nodes = [
        helper.make_node("Relu", ["x"], ["t"], name="a"),
        helper.make_node("Relu", ["t"], ["y"], name="b"),
        helper.make_node("Neg", ["t"], ["z"], name="c"),
    ]
    model = make_model(
        nodes, [tensor_input("x", X4)], [tensor_input("y", X4), tensor_input("z", X4)]
    )
    report, result = optimize_proto(model, rules_from_text(RELU_RELU))
    assert fired(report, "relu-relu") == 0
    assert len(result.graph.node) == 3


def test_intermediate_graph_output_blocks_match():
    nodes = [
        helper.make_node("Relu", ["x"], ["t"], name="a"),
        helper.make_node("Relu", ["t"], ["y"], name="b"),
    ]
    model = make_model(
        nodes, [tensor_input("x", X4)], [tensor_input("y", X4), tensor_input("t", X4)]
    )
    report, _ = optimize_proto(model, rules_from_text(RELU_RELU))
    assert fired(report, "relu-relu") == 0


DOMAIN_RULE = """
rules:
  - name: custom-double-neg
    source: |
      f (X) => (Y) {
        T = vendor.acme.Twice(X)
        Y = vendor.acme.Half(T)
      }
    target: |
      f (X) => (Y) {
        Y = Identity(X)
      }
"""


def test_domain_is_part_of_the_op():
    def model_in(domain: str) -> onnx.ModelProto:
        nodes = [
            helper.make_node("Twice", ["x"], ["t"], domain=domain, name="a"),
            helper.make_node("Half", ["t"], ["y"], domain=domain, name="b"),
        ]
        graph = helper.make_graph(nodes, "g", [tensor_input("x", X4)], [tensor_input("y", X4)])
        opsets = [helper.make_opsetid("", 17), helper.make_opsetid(domain, 1)]
        return helper.make_model(graph, opset_imports=opsets, ir_version=8)

    import onnx_ir as ir

    from onnxfuse.passes.pipeline import optimize

    rules = rules_from_text(DOMAIN_RULE)
    matching = ir.from_proto(model_in("vendor.acme"))
    assert optimize(matching, rules).rules["custom-double-neg"].applied == 1
    other = ir.from_proto(model_in("vendor.other"))
    assert optimize(other, rules).rules["custom-double-neg"].applied == 0


OPSET_RULE = RELU_RELU.replace("    benefit: 3\n", "    benefit: 3\n    opset: {'': [13, 15]}\n")


@pytest.mark.parametrize(("opset", "expected"), [(13, 1), (15, 1), (17, 0)])
def test_opset_range(opset, expected):
    model = unary_chain("Relu", "Relu", opset=opset)
    report, _ = optimize_proto(model, rules_from_text(OPSET_RULE))
    assert fired(report, "relu-relu") == expected


SQUARE_RULE = """
rules:
  - name: mul-self-to-pow
    source: |
      f (X) => (Y) {
        Y = Mul(X, X)
      }
    target: |
      f (X) => (Y) {
        two = Constant<value_float = 2.0>()
        t = CastLike(two, X)
        Y = Pow(X, t)
      }
"""


def test_variable_used_twice_is_one_value():
    nodes = [helper.make_node("Mul", ["x", "x"], ["y"], name="m")]
    model = make_model(nodes, [tensor_input("x", X4)], [tensor_input("y", X4)])
    report, result = optimize_proto(model, rules_from_text(SQUARE_RULE))
    assert fired(report, "mul-self-to-pow") == 1
    assert [n.op_type for n in result.graph.node] == ["Pow"]
    assert_same_outputs(model, result)


def test_variable_used_twice_rejects_two_values():
    nodes = [helper.make_node("Mul", ["x", "z"], ["y"], name="m")]
    model = make_model(
        nodes, [tensor_input("x", X4), tensor_input("z", X4)], [tensor_input("y", X4)]
    )
    report, _ = optimize_proto(model, rules_from_text(SQUARE_RULE))
    assert fired(report, "mul-self-to-pow") == 0


ADD_ZERO = """
rules:
  - name: add-zero
    source: |
      f (X) => (Y) {
        z = Constant<value_float = 0.0>()
        Y = Add(X, z)
      }
    where: broadcastable(X, Y) and shape(X) == shape(Y)
    target: |
      f (X) => (X) {
      }
"""


def _add_model(first: str, second: str, constant: float, dtype=np.float32, ir_version=8):
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    zero = numpy_helper.from_array(np.array(constant, dtype=dtype), "c")
    nodes = [
        helper.make_node("Add", [first, second], ["s"], name="add"),
        helper.make_node("Relu", ["s"], ["y"], name="relu"),
    ]
    return make_model(
        nodes,
        [tensor_input("x", X4, elem)],
        [tensor_input("y", X4, elem)],
        [zero],
        ir_version=ir_version,
    )


@pytest.mark.parametrize("order", [("x", "c"), ("c", "x")])
def test_commutative_inputs_match_in_either_order(order):
    model = _add_model(*order, constant=0.0)
    report, result = optimize_proto(model, rules_from_text(ADD_ZERO))
    assert fired(report, "add-zero") == 1
    assert [n.op_type for n in result.graph.node] == ["Relu"]
    assert_same_outputs(model, result)


def test_commutative_rule_is_not_copied():
    rule = rules_from_text(ADD_ZERO)[0]
    assert len(rule.sources) == 1
    assert rule.sources[0].anchor.commutative


def test_constant_with_other_value_does_not_match():
    model = _add_model("x", "c", constant=0.5)
    report, _ = optimize_proto(model, rules_from_text(ADD_ZERO))
    assert fired(report, "add-zero") == 0


def test_constant_tolerance_follows_dtype():
    # -0.0 equals 0.0; a float16 zero matches a float pattern constant.
    assert fired(
        optimize_proto(_add_model("x", "c", -0.0), rules_from_text(ADD_ZERO))[0], "add-zero"
    )
    model16 = _add_model("x", "c", 0.0, dtype=np.float16)
    assert fired(optimize_proto(model16, rules_from_text(ADD_ZERO))[0], "add-zero") == 1
    tiny = _add_model("x", "c", 1e-3)
    assert fired(optimize_proto(tiny, rules_from_text(ADD_ZERO))[0], "add-zero") == 0


def test_initializer_that_is_a_graph_input_is_not_a_constant():
    model = _add_model("x", "c", 0.0)
    model.graph.input.append(tensor_input("c", []))
    report, _ = optimize_proto(model, rules_from_text(ADD_ZERO))
    assert fired(report, "add-zero") == 0


def test_ir3_initializers_listed_as_inputs_are_constants():
    model = _add_model("x", "c", 0.0)
    model.graph.input.append(tensor_input("c", []))
    model.ir_version = 3
    model.opset_import[0].version = 8
    onnx.checker.check_model(model)
    report, result = optimize_proto(model, rules_from_text(ADD_ZERO))
    assert fired(report, "add-zero") == 1
    # Written as IR 4: the initializers are no longer listed as inputs.
    assert result.ir_version == 4
    assert [i.name for i in result.graph.input] == ["x"]
    assert_same_outputs(model, result)


def test_constant_node_counts_as_constant():
    nodes = [
        helper.make_node("Constant", [], ["c"], value_float=0.0, name="k"),
        helper.make_node("Add", ["x", "c"], ["s"], name="add"),
        helper.make_node("Relu", ["s"], ["y"], name="relu"),
    ]
    model = make_model(nodes, [tensor_input("x", X4)], [tensor_input("y", X4)])
    report, _ = optimize_proto(model, rules_from_text(ADD_ZERO))
    assert fired(report, "add-zero") == 1


SUM_RULE = """
rules:
  - name: sum-of-three-with-duplicate
    source: |
      f (A, B) => (Y) {
        Y = Sum(A, B, A)
      }
    target: |
      f (A, B) => (Y) {
        two = Constant<value_float = 2.0>()
        t = CastLike(two, A)
        d = Mul(A, t)
        Y = Add(d, B)
      }
"""


@pytest.mark.parametrize("inputs", [["a", "b", "a"], ["b", "a", "a"], ["a", "a", "b"]])
def test_variadic_commutative_sum(inputs):
    nodes = [helper.make_node("Sum", inputs, ["y"], name="s")]
    model = make_model(
        nodes, [tensor_input("a", X4), tensor_input("b", X4)], [tensor_input("y", X4)]
    )
    report, result = optimize_proto(model, rules_from_text(SUM_RULE))
    assert fired(report, "sum-of-three-with-duplicate") == 1
    assert_same_outputs(model, result)


def test_variadic_sum_needs_the_duplicate():
    nodes = [helper.make_node("Sum", ["a", "b", "c"], ["y"], name="s")]
    model = make_model(
        nodes,
        [tensor_input("a", X4), tensor_input("b", X4), tensor_input("c", X4)],
        [tensor_input("y", X4)],
    )
    report, _ = optimize_proto(model, rules_from_text(SUM_RULE))
    assert fired(report, "sum-of-three-with-duplicate") == 0


DECLARED_COMMUTATIVE = """
rules:
  - name: pair-swap-free
    commutative: [vendor.acme::Pair]
    source: |
      f (X) => (Y) {
        z = Constant<value_float = 0.0>()
        Y = vendor.acme.Pair(z, X)
      }
    target: |
      f (X) => (X) {
      }
"""


@pytest.mark.parametrize(("commutative", "expected"), [(True, 1), (False, 0)])
def test_declared_commutative_op(commutative, expected):
    text = (
        DECLARED_COMMUTATIVE
        if commutative
        else DECLARED_COMMUTATIVE.replace("    commutative: [vendor.acme::Pair]\n", "")
    )
    nodes = [
        helper.make_node("Pair", ["x", "c"], ["p"], domain="vendor.acme", name="p"),
        helper.make_node("Relu", ["p"], ["y"], name="r"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [tensor_input("x", X4)],
        [tensor_input("y", X4)],
        [numpy_helper.from_array(np.array(0.0, np.float32), "c")],
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("vendor.acme", 1)]
    model = helper.make_model(graph, opset_imports=opsets, ir_version=8)
    import onnx_ir as ir

    from onnxfuse.passes.pipeline import optimize

    report = optimize(ir.from_proto(model), rules_from_text(text))
    assert report.rules["pair-swap-free"].applied == expected


CONV_RELU_OPTIONAL = """
rules:
  - name: conv-relu-clip
    optional: [B]
    copy_attributes: {C: C2}
    source: |
      f (X, W, B) => (Y) {
        C = Conv(X, W, B)
        Y = Relu(C)
      }
    target: |
      f (X, W, B) => (Y) {
        C2 = Conv(X, W, B)
        lo = Constant<value_float = 0.0>()
        lo_t = CastLike(lo, X)
        Y = Clip(C2, lo_t, "")
      }
"""


def _conv_model(with_bias: bool, **conv_attributes) -> onnx.ModelProto:
    rng = np.random.default_rng(1)
    inits = [numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w")]
    inputs = ["x", "w"]
    if with_bias:
        inits.append(numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "b"))
        inputs.append("b")
    nodes = [
        helper.make_node("Conv", inputs, ["c"], name="conv", **conv_attributes),
        helper.make_node("Relu", ["c"], ["y"], name="relu"),
    ]
    pads = conv_attributes.get("pads", [0, 0, 0, 0])
    out = 8 - 2 + pads[0] + pads[2]
    return make_model(
        nodes, [tensor_input("x", [1, 3, 8, 8])], [tensor_input("y", [1, 4, out, out])], inits
    )


@pytest.mark.parametrize("with_bias", [True, False])
def test_optional_input_binds_present_or_absent(with_bias):
    model = _conv_model(with_bias, pads=[1, 1, 1, 1], strides=[1, 1])
    report, result = optimize_proto(model, rules_from_text(CONV_RELU_OPTIONAL))
    assert fired(report, "conv-relu-clip") == 1
    conv = next(n for n in result.graph.node if n.op_type == "Conv")
    assert len([i for i in conv.input if i]) == (3 if with_bias else 2)
    assert {a.name for a in conv.attribute} == {"pads", "strides"}  # copied attributes
    assert_same_outputs(model, result)


def test_non_optional_variable_requires_the_input():
    text = CONV_RELU_OPTIONAL.replace("    optional: [B]\n", "")
    report, _ = optimize_proto(_conv_model(False), rules_from_text(text))
    assert fired(report, "conv-relu-clip") == 0


ALTERNATIVES = """
rules:
  - name: hard-swish
    sources:
      - |
        f (X) => (Y) {
          hs = HardSigmoid<alpha: float = 0.16666667, beta: float = 0.5>(X)
          Y = Mul(X, hs)
        }
      - |
        f (X) => (Y) {
          hs = HardSigmoid<alpha: float = 0.16666667, beta: float = 0.5>(X)
          Y = Mul(hs, X)
        }
    target: |
      f (X) => (Y) {
        Y = HardSwish(X)
      }
"""


def test_alternatives_share_one_target():
    nodes = [
        helper.make_node("HardSigmoid", ["x"], ["h"], alpha=1 / 6, beta=0.5, name="h"),
        helper.make_node("Mul", ["x", "h"], ["y"], name="m"),
    ]
    model = make_model(nodes, [tensor_input("x", X4)], [tensor_input("y", X4)])
    report, result = optimize_proto(model, rules_from_text(ALTERNATIVES))
    assert fired(report, "hard-swish") == 1
    assert [n.op_type for n in result.graph.node] == ["HardSwish"]
    assert_same_outputs(model, result)


def test_alternatives_respect_attribute_values():
    nodes = [
        helper.make_node("HardSigmoid", ["x"], ["h"], alpha=0.2, beta=0.5, name="h"),
        helper.make_node("Mul", ["h", "x"], ["y"], name="m"),
    ]
    model = make_model(nodes, [tensor_input("x", X4)], [tensor_input("y", X4)])
    report, _ = optimize_proto(model, rules_from_text(ALTERNATIVES))
    assert fired(report, "hard-swish") == 0


LEAKY = """
rules:
  - name: leaky-default-to-max
    source: |
      f (X) => (Y) {
        Y = LeakyRelu(X)
      }
    target: |
      f (X) => (Y) {
        a = Constant<value_float = 0.01>()
        a_t = CastLike(a, X)
        m = Mul(X, a_t)
        Y = Max(X, m)
      }
  - name: softmax-last-axis
    source: |
      f <axis> (X) => (Y) {
        Y = Softmax<axis: int = @axis>(X)
      }
    where: axis in (-1, rank(X) - 1)
    target: |
      f (X) => (Y) {
        t = Transpose<perm = [0, 1, 3, 2]>(X)
        s = Softmax<axis = 2>(t)
        Y = Transpose<perm = [0, 1, 3, 2]>(s)
      }
"""


@pytest.mark.parametrize(("alpha", "expected"), [(None, 1), (0.01, 1), (0.2, 0)])
def test_strict_attributes_default_from_schema(alpha, expected):
    attributes = {} if alpha is None else {"alpha": alpha}
    model = unary_chain("LeakyRelu", **attributes)
    report, result = optimize_proto(model, rules_from_text(LEAKY))
    assert fired(report, "leaky-default-to-max") == expected
    if expected:
        assert_same_outputs(model, result)


@pytest.mark.parametrize(("axis", "expected"), [(None, 1), (-1, 1), (3, 1), (1, 0)])
def test_attribute_bound_and_checked_in_a_set(axis, expected):
    attributes = {} if axis is None else {"axis": axis}
    model = unary_chain("Softmax", **attributes)
    report, result = optimize_proto(model, rules_from_text(LEAKY))
    assert fired(report, "softmax-last-axis") == expected
    assert_same_outputs(model, result)


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


TWO_ROOTS = """
rules:
  - name: relu-beside-abs
    source: |
      f (X) => (A, B) {
        A = Relu(X)
        B = Abs(X)
      }
    target: |
      f (X) => (A, B) {
        z = Constant<value_float = 0.0>()
        zt = CastLike(z, X)
        A = Max(X, zt)
        B = Abs(X)
      }
"""


def test_multi_output_multi_root_pattern():
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="r1"),
        helper.make_node("Abs", ["x"], ["b"], name="r2"),
        helper.make_node("Add", ["a", "b"], ["y"], name="add"),
    ]
    model = make_model(nodes, [tensor_input("x", X4)], [tensor_input("y", X4)])
    report, result = optimize_proto(model, rules_from_text(TWO_ROOTS))
    assert fired(report, "relu-beside-abs") == 1
    assert sorted(n.op_type for n in result.graph.node) == ["Abs", "Add", "Max"]
    assert_same_outputs(model, result)


def test_multi_root_pattern_needs_both_roots():
    model = unary_chain("Relu")
    report, _ = optimize_proto(model, rules_from_text(TWO_ROOTS))
    assert fired(report, "relu-beside-abs") == 0


def test_duplicate_computations_are_merged_before_rules_run():
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="r1"),
        helper.make_node("Relu", ["x"], ["b"], name="r2"),
        helper.make_node("Add", ["a", "b"], ["y"], name="add"),
    ]
    model = make_model(nodes, [tensor_input("x", X4)], [tensor_input("y", X4)])
    _, result = optimize_proto(model, [])
    assert sorted(n.op_type for n in result.graph.node) == ["Add", "Relu"]
    assert_same_outputs(model, result)


BENEFIT = """
rules:
  - name: low
    benefit: 1
    source: |
      f (X) => (Y) {
        Y = Relu(X)
      }
    target: |
      f (X) => (Y) {
        z = Constant<value_float = 0.0>()
        Y = Max(X, z)
      }
  - name: high
    benefit: 5
    source: |
      f (X) => (Y) {
        Y = Relu(X)
      }
    target: |
      f (X) => (Y) {
        z = Constant<value_float = 0.0>()
        Y = Max(z, X)
      }
"""


def test_higher_benefit_fires_first():
    report, _ = optimize_proto(unary_chain("Relu"), rules_from_text(BENEFIT))
    assert fired(report, "high") == 1
    assert fired(report, "low") == 0


OSCILLATE = """
rules:
  - name: relu-to-max
    source: |
      f (X) => (Y) {
        Y = Relu(X)
      }
    target: |
      f (X) => (Y) {
        z = Constant<value_float = 0.0>()
        Y = Max(X, z)
      }
  - name: max-to-relu
    source: |
      f (X) => (Y) {
        z = Constant<value_float = 0.0>()
        Y = Max(X, z)
      }
    target: |
      f (X) => (Y) {
        Y = Relu(X)
      }
"""


def test_oscillating_rules_are_stopped_and_named():
    model = unary_chain("Relu", "Neg")
    report, result = optimize_proto(model, rules_from_text(OSCILLATE))
    assert report.stopped is not None
    assert "relu-to-max" in report.stopped and "max-to-relu" in report.stopped
    assert report.rewrites < 10
    assert_same_outputs(model, result)


DIVERGE = """
rules:
  - name: sub-to-neg-sub
    source: |
      f (A, B) => (Y) {
        Y = Sub(A, B)
      }
    target: |
      f (A, B) => (Y) {
        d = Sub(B, A)
        Y = Neg(d)
      }
"""


def test_rules_that_grow_forever_hit_the_cap():
    nodes = [helper.make_node("Sub", ["a", "b"], ["y"], name="s")]
    model = make_model(
        nodes, [tensor_input("a", X4), tensor_input("b", X4)], [tensor_input("y", X4)]
    )
    report, result = optimize_proto(model, rules_from_text(DIVERGE), max_rewrites=200)
    assert report.stopped and "rewrite cap" in report.stopped
    assert_same_outputs(model, result)


def test_rewrite_cap_is_enforced():
    model = unary_chain(*["Relu"] * 6)
    report, result = optimize_proto(model, rules_from_text(RELU_RELU), max_rewrites=2)
    assert report.rewrites == 2
    assert report.stopped and "rewrite cap" in report.stopped
    assert_same_outputs(model, result)


COM_MICROSOFT = """
rules:
  - name: to-contrib-gelu
    imports: {com.microsoft: 1}
    source: |
      f (X) => (Y) {
        Y = Gelu(X)
      }
    target: |
      f (X) => (Y) {
        Y = com.microsoft.Gelu(X)
      }
"""


def test_new_domain_adds_opset_import_and_runs():
    model = unary_chain("Gelu", opset=20)
    report, result = optimize_proto(model, rules_from_text(COM_MICROSOFT))
    assert fired(report, "to-contrib-gelu") == 1
    assert {o.domain: o.version for o in result.opset_import}["com.microsoft"] == 1
    assert_same_outputs(model, result)


def test_target_capability_gates_rules():
    from onnxfuse.targets.capabilities import load_target

    model = unary_chain("Gelu", opset=20)
    report, _ = optimize_proto(model, rules_from_text(COM_MICROSOFT), target=load_target("onnx"))
    assert fired(report, "to-contrib-gelu") == 0
    report, _ = optimize_proto(model, rules_from_text(COM_MICROSOFT), target=load_target("cpu"))
    assert fired(report, "to-contrib-gelu") == 1


IDENTITY = """
rules:
  - name: identity
    source: |
      f (X) => (Y) {
        Y = Identity(X)
      }
    target: |
      f (X) => (X) {
      }
"""


def test_graph_output_keeps_its_name_when_eliminated():
    model = unary_chain("Relu", "Identity")
    report, result = optimize_proto(model, rules_from_text(IDENTITY))
    assert fired(report, "identity") == 1
    assert [n.op_type for n in result.graph.node] == ["Relu"]
    assert [o.name for o in result.graph.output] == ["y"]
    assert_same_outputs(model, result)


def test_identity_from_graph_input_to_output_is_kept():
    model = unary_chain("Identity")
    report, result = optimize_proto(model, rules_from_text(IDENTITY))
    assert fired(report, "identity") == 0
    assert [n.op_type for n in result.graph.node] == ["Identity"]


def test_if_branches_are_rewritten():
    def branch(name: str, op: str) -> onnx.GraphProto:
        nodes = [
            helper.make_node("Relu", ["x"], [f"{name}_r"], name=f"{name}_relu"),
            helper.make_node(op, [f"{name}_r"], [f"{name}_out"], name=f"{name}_op"),
        ]
        return helper.make_graph(nodes, name, [], [tensor_input(f"{name}_out", X4)])

    nodes = [
        helper.make_node(
            "If",
            ["cond"],
            ["y"],
            name="if",
            then_branch=branch("then", "Identity"),
            else_branch=branch("else", "Neg"),
        )
    ]
    model = make_model(
        nodes,
        [tensor_input("cond", [], TensorProto.BOOL), tensor_input("x", X4)],
        [tensor_input("y", X4)],
    )
    report, result = optimize_proto(model, rules_from_text(IDENTITY))
    assert fired(report, "identity") == 1
    then_ops = [n.op_type for n in result.graph.node[0].attribute[0].g.node]
    assert "Identity" not in then_ops
    for cond in (True, False):
        from helpers import assert_close, run

        feeds = {
            "cond": np.array(cond),
            "x": np.random.default_rng(0).standard_normal(X4).astype(np.float32),
        }
        assert_close(run(result, feeds), run(model, feeds))


def test_model_local_functions_are_rewritten():
    function = helper.make_function(
        "local",
        "DoubleRelu",
        ["a"],
        ["b"],
        [
            helper.make_node("Relu", ["a"], ["t"]),
            helper.make_node("Relu", ["t"], ["b"]),
        ],
        [helper.make_opsetid("", 17)],
    )
    nodes = [helper.make_node("DoubleRelu", ["x"], ["y"], domain="local", name="call")]
    graph = helper.make_graph(nodes, "g", [tensor_input("x", X4)], [tensor_input("y", X4)])
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("local", 1)],
        ir_version=8,
        functions=[function],
    )
    report, result = optimize_proto(model, rules_from_text(RELU_RELU))
    assert fired(report, "relu-relu") == 1
    assert [n.op_type for n in result.functions[0].node] == ["Relu"]
    assert_same_outputs(model, result)


CONV_BN = """
rules:
  - name: conv-bn
    copy_attributes: {C: Y}
    source: |
      f <eps> (X, W, B, scale, bias, mean, var) => (Y) {
        C = Conv(X, W, B)
        Y = BatchNormalization<epsilon: float = @eps>(C, scale, bias, mean, var)
      }
    where:
      - is_constant(W) and is_constant(B) and is_constant(scale)
      - is_constant(bias) and is_constant(mean) and is_constant(var)
    let:
      axes: tuple(range(1, rank(W)))
    target: |
      f <eps, axes> (X, W, B, scale, bias, mean, var) => (Y) {
        e = Constant<value_float: float = @eps>()
        e2 = CastLike(e, var)
        v = Add(var, e2)
        sd = Sqrt(v)
        k = Div(scale, sd)
        ax = Constant<value_ints: ints = @axes>()
        kcol = Unsqueeze(k, ax)
        W2 = Mul(W, kcol)
        d = Sub(B, mean)
        d2 = Mul(d, k)
        B2 = Add(d2, bias)
        Y = Conv(X, W2, B2)
      }
"""


def _conv_bn_model(weights_are_inputs: bool = False) -> onnx.ModelProto:
    rng = np.random.default_rng(2)
    arrays = {
        "w": rng.standard_normal((4, 3, 3, 3)),
        "b": rng.standard_normal(4),
        "s": rng.standard_normal(4),
        "bb": rng.standard_normal(4),
        "m": rng.standard_normal(4),
        "v": rng.random(4) + 0.5,
    }
    inits = [numpy_helper.from_array(a.astype(np.float32), n) for n, a in arrays.items()]
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], name="conv"),
        helper.make_node(
            "BatchNormalization", ["c", "s", "bb", "m", "v"], ["y"], epsilon=1e-3, name="bn"
        ),
    ]
    inputs = [tensor_input("x", [1, 3, 8, 8])]
    if weights_are_inputs:
        inputs.append(tensor_input("w", [4, 3, 3, 3]))
    return make_model(nodes, inputs, [tensor_input("y", [1, 4, 8, 8])], inits)


def test_target_computes_constants_that_fold_away():
    model = _conv_bn_model()
    report, result = optimize_proto(model, rules_from_text(CONV_BN))
    assert fired(report, "conv-bn") == 1
    assert [n.op_type for n in result.graph.node] == ["Conv"]
    assert report.folded > 0
    assert_same_outputs(model, result)


def test_overridable_weights_block_folding():
    report, _ = optimize_proto(_conv_bn_model(weights_are_inputs=True), rules_from_text(CONV_BN))
    assert fired(report, "conv-bn") == 0


def test_rule_metadata_is_kept():
    rule = rules_from_text(RELU_RELU)[0]
    assert (rule.name, rule.description, rule.benefit, rule.references) == (
        "relu-relu",
        "Relu is idempotent.",
        3,
        ["math"],
    )
    assert rule.origin == "test.yaml:3"


def test_python_onnxscript_rules_compile_to_the_same_ir():
    from onnxscript_rules import RELU_RELU as rule

    yaml_rule = rules_from_text(RELU_RELU)[0]
    assert rule.benefit == 2
    assert [n.op_type for n in rule.sources[0].nodes] == [
        n.op_type for n in yaml_rule.sources[0].nodes
    ]
    model = unary_chain("Relu", "Relu", "Relu")
    report, result = optimize_proto(model, [rule])
    assert report.rules["py-relu-relu"].applied == 2
    assert_same_outputs(model, result)


LEGACY_ATTRIBUTES = """
rules:
  - name: unsqueeze-squeeze-legacy
    opset: {"": [11, 12]}
    source: |
      f (X) => (Y) {
        T = Unsqueeze<axes = [0]>(X)
        Y = Squeeze<axes = [0]>(T)
      }
    target: |
      f (X) => (X) {
      }
"""


def test_attributes_are_checked_against_the_rule_opset_range():
    nodes = [
        helper.make_node("Unsqueeze", ["x"], ["t"], axes=[0], name="u"),
        helper.make_node("Squeeze", ["t"], ["s"], axes=[0], name="s"),
        helper.make_node("Relu", ["s"], ["y"], name="r"),
    ]
    model = make_model(nodes, [tensor_input("x", X4)], [tensor_input("y", X4)], opset=11)
    report, result = optimize_proto(model, rules_from_text(LEGACY_ATTRIBUTES))
    assert fired(report, "unsqueeze-squeeze-legacy") == 1
    assert_same_outputs(model, result)


def test_attribute_unknown_in_the_whole_range_is_an_error():
    from onnxfuse.errors import RuleError

    text = LEGACY_ATTRIBUTES.replace('{"": [11, 12]}', '{"": 13}')
    with pytest.raises(RuleError, match="no attribute 'axes' in the rule's opset range"):
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


ABSENT_INTO_REQUIRED = """
rules:
  - name: negate-bias
    optional: [B]
    copy_attributes: {Y: Y}
    source: |
      f (X, W, B) => (Y) {
        Y = Conv(X, W, B)
      }
    target: |
      f (X, W, B) => (Y) {
        B2 = Neg(B)
        N = Neg(B2)
        Y = Conv(X, W, N)
      }
"""


def test_absent_optional_variable_cannot_feed_a_required_input():
    rules = rules_from_text(ABSENT_INTO_REQUIRED)
    report, _ = optimize_proto(_conv_model(False), rules)
    assert report.rules["negate-bias"].matched >= 1
    assert report.rules["negate-bias"].applied == 0
    report, _ = optimize_proto(_conv_model(True), rules, max_rewrites=1)
    assert report.rules["negate-bias"].applied == 1


def test_a_variable_cannot_bind_a_value_computed_inside_the_match():
    text = """
rules:
  - name: add-self-relu
    source: |
      f (X, Z) => (Y) {
        C = Neg(X)
        S = Add(C, Z)
        Y = Relu(S)
      }
    target: |
      f (X, Z) => (Y) {
        C = Neg(X)
        S = Sub(Z, X)
        Y = Relu(S)
      }
"""
    nodes = [
        helper.make_node("Neg", ["x"], ["c"], name="n"),
        helper.make_node("Add", ["c", "c"], ["s"], name="a"),
        helper.make_node("Relu", ["s"], ["y"], name="r"),
    ]
    model = make_model(nodes, [tensor_input("x", X4)], [tensor_input("y", X4)])
    report, result = optimize_proto(model, rules_from_text(text))
    assert report.rules["add-self-relu"].applied == 0
    assert_same_outputs(model, result)


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


# -- op-type sets (`ops:`) ---------------------------------------------------------

OP_SET = """
rules:
  - name: t-unary
    description: An elementwise op commutes with a permutation.
    references: [math]
    ops:
      Op: [Relu, LeakyRelu, Cast, com.microsoft::Gelu]
    copy_attributes: {Y: Z}
    source: |
      f <perm> (X) => (Y) {
        T = Transpose<perm = @perm>(X)
        Y = Op(T)
      }
    target: |
      f <perm> (X) => (Y) {
        Z = Op(X)
        Y = Transpose<perm = @perm>(Z)
      }
"""


def _transposed(op: str, domain: str = "", opset: int = 17, **attributes) -> onnx.ModelProto:
    nodes = [
        helper.make_node("Transpose", ["x"], ["t"], name="tr", perm=[0, 2, 3, 1]),
        helper.make_node(op, ["t"], ["y"], name="op", domain=domain, **attributes),
    ]
    out_type = TensorProto.INT64 if op == "Cast" else TensorProto.FLOAT
    y = helper.make_tensor_value_info("y", out_type, [2, 4, 5, 3])
    extra = {domain: 1} if domain else None
    return make_model(nodes, [tensor_input("x", X4)], [y], opset=opset, extra_opsets=extra)


def test_op_set_expands_to_one_rule_per_member():
    rules = rules_from_text(OP_SET)
    assert [r.name for r in rules] == [
        "t-unary[Relu]",
        "t-unary[LeakyRelu]",
        "t-unary[Cast]",
        "t-unary[com.microsoft::Gelu]",
    ]
    gelu = rules[3]
    assert gelu.family == "t-unary" and gelu.op_bindings == {"Op": "com.microsoft::Gelu"}
    # The op-type index (could_match) and capability gating see the concrete op.
    assert gelu.anchor_keys == {("com.microsoft", "Gelu")}
    assert gelu.created_ops() == {("com.microsoft", "Gelu"), ("", "Transpose")}
    assert all(r.description and r.references == ["math"] for r in rules)


@pytest.mark.parametrize(
    ("op", "attributes"), [("Relu", {}), ("LeakyRelu", {"alpha": 0.3}), ("Cast", {"to": 7})]
)
def test_op_set_member_fires_and_keeps_its_attributes(op, attributes):
    model = _transposed(op, **attributes)
    report, result = optimize_proto(model, rules_from_text(OP_SET))
    assert fired(report, f"t-unary[{op}]") == 1
    assert sum(r.applied for r in report.rules.values()) == 1
    assert [n.op_type for n in result.graph.node] == [op, "Transpose"]
    moved = result.graph.node[0]
    assert {a.name: helper.get_attribute_value(a) for a in moved.attribute} == pytest.approx(
        attributes
    )
    assert_same_outputs(model, result)


def test_op_set_gates_each_member_on_the_target():
    from onnxfuse.targets.capabilities import load_target

    rules = rules_from_text(OP_SET)
    model = _transposed("Gelu", domain="com.microsoft")
    report, _ = optimize_proto(model, rules, target=load_target("onnx"))
    assert fired(report, "t-unary[com.microsoft::Gelu]") == 0
    report, _ = optimize_proto(model, rules, target=load_target("cpu"))
    assert fired(report, "t-unary[com.microsoft::Gelu]") == 1
    # The standard members still fire for the standard-only target.
    report, _ = optimize_proto(_transposed("Relu"), rules, target=load_target("onnx"))
    assert fired(report, "t-unary[Relu]") == 1


def test_op_set_per_op_keys_and_first_opset():
    text = OP_SET.replace("Op: [Relu, LeakyRelu, Cast, com.microsoft::Gelu]", "Op: [Relu, Gelu]")
    text += "    per_op:\n      Relu: {where: rank(X) == 3, opset: {'': [13, 16]}}\n"
    relu, gelu = rules_from_text(text)
    assert relu.opset == {"": (13, 16)} and len(relu.guards) == 1
    # Gelu exists from opset 20: its rule applies from there, without a guard of Relu's.
    assert gelu.opset == {"": (20, None)} and not gelu.guards
    report, _ = optimize_proto(_transposed("Relu"), [relu])
    assert fired(report, "t-unary[Relu]") == 0  # rank 4: the per-op guard refuses
    report, _ = optimize_proto(_transposed("Gelu", opset=20), [gelu])
    assert fired(report, "t-unary[Gelu]") == 1


@pytest.mark.parametrize(
    ("change", "line", "message"),
    [
        ((OP_SET_LINE := "      Op: [Relu, LeakyRelu, Cast, com.microsoft::Gelu]"), 6, None),
        ("      Op: [Relu, Rleu]", 7, "unknown op 'Rleu' in the set 'Op'"),
        ("      Op: [Relu, com.microsoft::NoSuchOp]", 7, "unknown op 'com.microsoft::NoSuchOp'"),
        ("      Op: []", 7, "'Op' must be a non-empty list of op types"),
        ("      Op: Relu", 7, "'Op' must be a non-empty list of op types"),
        ("      Op: [Relu, Relu]", 7, "'Relu' is listed twice"),
        ("      op: [Relu]", 7, "must be a name starting with a capital letter"),
        ("      Sigmoid: [Relu]", 7, "is the name of an ONNX op"),
        ("      Fn: [Relu]", 10, "op-type variable 'Fn' is not used as an op type"),
        (
            "      Op: [Relu, Sigmoid]\n    per_op: {Tanh: {where: 'True'}}",
            8,
            "'Tanh' is not a member",
        ),
        ("      Op: [Relu]\n    per_op: {Relu: {benefit: 3}}", 8, "'benefit' cannot differ"),
    ],
)
def test_op_set_errors_are_one_line_with_file_and_line(change, line, message):
    from onnxfuse.errors import RuleError

    text = OP_SET.replace(OP_SET_LINE, change)
    if message is None:  # the unchanged rule loads
        assert len(rules_from_text(text)) == 4
        return
    with pytest.raises(RuleError) as caught:
        rules_from_text(text, path="ops.yaml")
    assert str(caught.value).startswith(f"ops.yaml:{line}: ")
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_op_set_checks_each_member_against_its_schema():
    from onnxfuse.errors import RuleError

    text = OP_SET.replace("Y = Op(T)", "Y = Op<alpha: float = @a>(T)").replace(
        "<perm>", "<perm, a>"
    )
    text = text.replace("Op: [Relu, LeakyRelu, Cast, com.microsoft::Gelu]", "Op: [LeakyRelu, Relu]")
    with pytest.raises(RuleError, match=r"member \[Relu\]: source: Relu has no attribute 'alpha'"):
        rules_from_text(text)
    # Without copy_attributes a member's required attribute must be named (Cast's `to`).
    text = OP_SET.replace("    copy_attributes: {Y: Z}\n", "")
    with pytest.raises(RuleError, match=r"member \[Cast\]: .*required attribute 'to'"):
        rules_from_text(text)


def test_check_takes_an_op_set_family_name(tmp_path, capsys):
    from onnxfuse.cli.main import main

    verify = """    verify:
      dtypes: [float]
      dims: {p: {permutation: 3}}
      attributes: {perm: p}
      inputs: {X: [2, 3, 4]}
"""
    text = OP_SET.replace("[Relu, LeakyRelu, Cast, com.microsoft::Gelu]", "[Relu, Sigmoid]")
    path = tmp_path / "ops.yaml"
    path.write_text(text + verify)
    argv = ["check", str(path), "--rule", "t-unary", "--examples", "3", "--save-dir", str(tmp_path)]
    code = main(argv)
    out = capsys.readouterr().out
    assert code == 0, out
    assert "2 rule(s)" in out and "t-unary[Relu]" in out and "t-unary[Sigmoid]" in out


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


def _relu_pair_rule(target: str, extra: str = "") -> str:
    return f"""
rules:
  - name: my-rule
    source: |
      f (X) => (Y) {{
        T = Relu(X)
        Y = Relu(T)
      }}
    target: "{target}"
{extra}"""


@pytest.mark.parametrize(
    ("target", "extra", "message"),
    [
        ("f (X) => (Y) { Y = Relu(X, X, X) }", "", "Relu takes no 3 inputs and 1 outputs"),
        ("f (X) => (Y) { Y = Add() }", "", "Add takes no 0 inputs and 1 outputs"),
        ("f (X) => (Y) { Y = Cast(X) }", "", "Cast must name its required attribute 'to'"),
        ("f (X) => (Y) { Y = Cast<to = 999>(X) }", "", "Cast to: 999 is not an ONNX data type"),
        (
            'f (X) => (Y) { Y = LeakyRelu<alpha = \\"abc\\">(X) }',
            "",
            "LeakyRelu alpha: takes FLOAT, not STRING ('abc')",
        ),
        (
            "f (X) => (Y) { Y = ConstantOfShape<value = float[2] {1.0}>(X) }",
            "",
            "attribute value: cannot reshape array of size 1 into shape (2,)",
        ),
        (
            "f (X) => (Y) { Y = com.microsoft.Gelu(X) }",
            "    imports: {com.microsoft: 99999999999999999999}",
            "'imports' must map domains to opset versions",
        ),
    ],
)
def test_a_target_the_op_cannot_take_is_refused_on_load(target, extra, message):
    """Caught when the rule loads, not as an invalid model after it fired."""
    from onnxfuse.errors import RuleError

    with pytest.raises(RuleError, match=f"^test.yaml:\\d+: .*{re.escape(message)}"):
        rules_from_text(_relu_pair_rule(target, extra))


def test_an_alpha_written_as_an_int_still_loads():
    rules_from_text(_relu_pair_rule("f (X) => (Y) { Y = LeakyRelu<alpha = 1>(X) }"))


def test_a_let_beyond_int64_blocks_the_rewrite():
    rules = rules_from_text(
        _relu_pair_rule(
            "f <z> (X) => (Y) { Y = Flatten<axis: int = @z>(X) }", "    let:\n      z: 2**63"
        )
    )
    nodes = [helper.make_node("Relu", ["x"], ["t"]), helper.make_node("Relu", ["t"], ["y"])]
    model = make_model(nodes, [tensor_input("x", [2, 3])], [tensor_input("y", [2, 3])])
    report, optimized = optimize_proto(model, rules)
    assert [n.op_type for n in optimized.graph.node] == ["Relu", "Relu"]
    assert report.rules["my-rule"].applied == 0


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
