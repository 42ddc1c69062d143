"""Explain: each node a rule could anchor on, matched or the furthest failure."""

from __future__ import annotations

import onnx
import onnx_ir as ir
from helpers import relu_relu_rule, rules_from_text
from onnx import helper

from onnxfuse.rewrite.explain import explain_rule

F = onnx.TensorProto.FLOAT


def _model_calling_a_function(model_opset: int, function_opset: int) -> ir.Model:
    body = [
        helper.make_node("Relu", ["x"], ["t"], name="inner1"),
        helper.make_node("Relu", ["t"], ["y"], name="inner2"),
    ]
    function = helper.make_function(
        "local", "double_relu", ["x"], ["y"], body, [helper.make_opsetid("", function_opset)]
    )
    graph = helper.make_graph(
        [helper.make_node("double_relu", ["a"], ["b"], domain="local", name="call")],
        "g",
        [helper.make_tensor_value_info("a", F, [4])],
        [helper.make_tensor_value_info("b", F, [4])],
    )
    model = helper.make_model(
        graph,
        functions=[function],
        opset_imports=[helper.make_opsetid("", model_opset), helper.make_opsetid("local", 1)],
        ir_version=10,
    )
    return ir.from_proto(model)


def test_a_function_body_is_explained_at_its_own_opsets():
    text = relu_relu_rule("relu-relu-18") + '    opset: {"": [18, 18]}\n'
    (rule,) = rules_from_text(text)
    found = explain_rule(_model_calling_a_function(17, 18), rule)
    assert [(e.node, e.matched) for e in found] == [("inner1", False), ("inner2", True)]
    assert found[0].reason == "input 0 of Relu -> Y: 'x' has no producer (expected T)"


def test_the_model_opset_outside_the_rule_range_is_the_reason():
    text = relu_relu_rule("relu-relu-18") + '    opset: {"": [18, 18]}\n'
    (rule,) = rules_from_text(text)
    found = explain_rule(_model_calling_a_function(17, 17), rule)
    assert [e.matched for e in found] == [False, False]
    assert all("model opset 17" in (e.reason or "") for e in found)


def test_an_unnamed_node_is_named_by_its_first_output():
    (rule,) = rules_from_text(relu_relu_rule("relu-relu"))
    graph = helper.make_graph(
        [helper.make_node("Relu", ["a"], ["t"]), helper.make_node("Relu", ["t"], ["b"])],
        "g",
        [helper.make_tensor_value_info("a", F, [4])],
        [helper.make_tensor_value_info("b", F, [4])],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    found = explain_rule(ir.from_proto(proto), rule)
    assert [(e.node, e.matched) for e in found] == [("t", False), ("b", True)]
