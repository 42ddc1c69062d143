"""Rule files and Python rules: what loads, what is refused on load, and the metadata kept."""

from __future__ import annotations

import re

import pytest
from helpers import (
    assert_same_outputs,
    make_model,
    optimize_proto,
    relu_relu_rule,
    rules_from_text,
    tensor_input,
)
from onnx import helper
from rule_cases import RELU_RELU, X4, _relu_pair_rule, fired, unary_chain

from onnxfuse.errors import RuleError


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


def test_replacement_is_the_key_and_target_its_older_name():
    text = relu_relu_rule("relu-relu")
    assert "target:" in text
    old = rules_from_text(text)[0]
    new = rules_from_text(text.replace("target:", "replacement:"))[0]
    assert [n.op_type for n in new.replacement.nodes] == [n.op_type for n in old.replacement.nodes]


def test_a_rule_with_both_replacement_and_target_is_refused_with_its_line():
    text = relu_relu_rule("relu-relu").replace(
        "    target:",
        "    replacement: |\n      f (X) => (Y) {\n        Y = Relu(X)\n      }\n    target:",
    )
    with pytest.raises(RuleError, match=r"test.yaml:\d+: rule has both 'replacement' and 'target'"):
        rules_from_text(text)
