"""The fixpoint driver: order, caps, opset imports, gating, subgraphs, folding and cleanup."""

from __future__ import annotations

import numpy as np
import onnx
from helpers import assert_same_outputs, make_model, optimize_proto, rules_from_text, tensor_input
from onnx import TensorProto, helper, numpy_helper
from rule_cases import RELU_RELU, X4, _relu_pair_rule, fired, unary_chain

from onnxfuse.rewrite.report import StopKind, StopReason


def test_fixpoint_collapses_long_chain():
    model = unary_chain(*["Relu"] * 6)
    report, result = optimize_proto(model, rules_from_text(RELU_RELU))
    assert fired(report, "relu-relu") == 5
    assert len(result.graph.node) == 1
    assert_same_outputs(model, result)


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
    assert report.stopped is not None and report.stopped.kind is StopKind.OSCILLATION
    assert set(report.stopped.rules) == {"relu-to-max", "max-to-relu"}
    assert "rules oscillate" in str(report.stopped)
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
    assert report.stopped == StopReason(StopKind.REWRITE_CAP, limit=200)
    assert_same_outputs(model, result)


def test_rewrite_cap_is_enforced():
    model = unary_chain(*["Relu"] * 6)
    report, result = optimize_proto(model, rules_from_text(RELU_RELU), max_rewrites=2)
    assert report.rewrites == 2
    assert report.stopped == StopReason(StopKind.REWRITE_CAP, limit=2)
    assert report.to_json()["stopped"] == {
        "kind": "rewrite-cap",
        "limit": 2,
        "rules": [],
        "message": "rewrite cap reached (2)",
    }
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
