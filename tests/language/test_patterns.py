"""What a pattern matches and must not match: ops, domains, opsets, variables, constants, inputs."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from helpers import assert_same_outputs, make_model, optimize_proto, rules_from_text, tensor_input
from onnx import helper, numpy_helper
from rule_cases import ADD_ZERO, RELU_RELU, X4, _add_model, fired, unary_chain


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
