"""A user's rule that would change a value's shape or type, or create a node that does
not type-check, is blocked before anything changes, named in the report, and the run
goes on."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from helpers import (
    MUL_ONE_RULE,
    assert_same_outputs,
    make_model,
    optimize_proto,
    relu_relu_rule,
    rules_from_text,
    tensor_input,
)
from onnx import TensorProto, helper, numpy_helper

import onnxfuse
from onnxfuse.cli.main import main
from onnxfuse.errors import InvariantError

MUL_ONE = """
rules:
  - name: mul-one-passthrough
    source: |
      f (X) => (Y) {
        one = Constant<value_float = 1.0>()
        Y = Mul(X, one)
      }
    replacement: |
      f (X) => (X) {
      }
"""


def _broadcasting_mul(feeds_relu: bool) -> onnx.ModelProto:
    one = numpy_helper.from_array(np.ones((1, 1), np.float32), "one")
    nodes = [helper.make_node("Mul", ["x", "one"], ["y"], name="mul")]
    out = "y"
    if feeds_relu:
        nodes.append(helper.make_node("Relu", ["y"], ["z"], name="relu"))
        out = "z"
    return make_model(nodes, [tensor_input("x", [8])], [tensor_input(out, [1, 8])], [one])


@pytest.mark.parametrize(
    ("feeds_relu", "reason"),
    [
        (True, "changes the shape of 'y' from [1, 8] to [8]"),
        (False, "graph output 'y' would be renamed onto 'x'"),
    ],
)
def test_a_passthrough_that_changes_the_value_is_blocked_and_named(feeds_relu, reason):
    rules = rules_from_text(MUL_ONE)
    report, result = optimize_proto(_broadcasting_mul(feeds_relu), rules)
    assert [n.op_type for n in result.graph.node][:1] == ["Mul"]
    stats = report.rules["mul-one-passthrough"]
    assert (stats.applied, stats.blocked, stats.blocked_reason) == (0, 1, reason)
    assert report.to_json()["rules"]["mul-one-passthrough"]["blocked"] == 1


def test_the_same_rule_still_fires_where_the_shape_is_kept():
    one = numpy_helper.from_array(np.ones((1,), np.float32), "one")
    model = make_model(
        [
            helper.make_node("Mul", ["x", "one"], ["y"], name="mul"),
            helper.make_node("Relu", ["y"], ["z"], name="relu"),
        ],
        [tensor_input("x", [8])],
        [tensor_input("z", [8])],
        [one],
    )
    rules = rules_from_text(MUL_ONE)
    report, result = optimize_proto(model, rules)
    assert [n.op_type for n in result.graph.node] == ["Relu"]
    assert report.rules["mul-one-passthrough"].blocked == 0


def test_the_command_line_finishes_and_prints_the_blocked_rewrite(tmp_path: Path, capsys):
    model_path, rules_path = tmp_path / "m.onnx", tmp_path / "rules.yaml"
    onnx.save(_broadcasting_mul(feeds_relu=True), model_path)
    rules_path.write_text(MUL_ONE)
    code = main(
        [
            "optimize",
            str(model_path),
            "-o",
            str(tmp_path / "o.onnx"),
            "--rules",
            str(rules_path),
            "--no-builtin",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0 and (tmp_path / "o.onnx").is_file()
    assert "blocked: mul-one-passthrough (1x): changes the shape of 'y'" in out, out


def _conv_relu(shared: bool) -> onnx.ModelProto:
    weight = numpy_helper.from_array(np.ones((4, 3, 3, 3), np.float32), "w")
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
        helper.make_node("Relu", ["c"], ["y"], name="relu"),
    ]
    outputs = [tensor_input("y", [1, 4, 6, 6])]
    if shared:  # the Conv's output is also read outside a Conv+Relu match
        nodes.append(helper.make_node("Sigmoid", ["c"], ["z"], name="sigmoid"))
        outputs.append(tensor_input("z", [1, 4, 6, 6]))
    return make_model(nodes, [tensor_input("x", [1, 3, 8, 8])], outputs, [weight])


@pytest.mark.parametrize(
    ("shared", "target", "reason"),
    [
        (False, "onnx", "target 'onnx' cannot run com.microsoft::FusedConv"),
        (True, "cpu", "intermediate 'c' is also used by Sigmoid 'sigmoid' outside the match"),
    ],
)
def test_a_match_the_target_or_a_kept_value_refuses_is_counted_blocked(
    tmp_path: Path, capsys, shared, target, reason
):
    model_path, report_path = tmp_path / "m.onnx", tmp_path / "r.json"
    onnx.save(_conv_relu(shared), model_path)
    code = main(
        ["optimize", str(model_path), "--target", target, "--report-json", str(report_path)]
    )
    out = capsys.readouterr().out
    assert code == 0
    stats = json.loads(report_path.read_text())["rules"]["fused-conv-relu"]
    assert (stats["matched"], stats["applied"], stats["blocked"]) == (0, 0, 1)
    assert stats["blocked_reason"].startswith(reason), stats
    assert re.search(r"fused-conv-relu +0 +0 +1 ", out), out
    assert f"blocked: fused-conv-relu (1x): {reason}" in out, out


def _mul_one_then_relus() -> onnx.ModelProto:
    """``Mul(x[8], one[1, 1])``: the 1 broadcasts x to [1, 8]; two Relus after it."""
    one = numpy_helper.from_array(np.ones((1, 1), np.float32), "one")
    nodes = [
        helper.make_node("Mul", ["x", "one"], ["y"], name="mul"),
        helper.make_node("Relu", ["y"], ["r"], name="relu1"),
        helper.make_node("Relu", ["r"], ["z"], name="relu2"),
    ]
    return make_model(nodes, [tensor_input("x", [8])], [tensor_input("z", [1, 8])], [one])


def _rule_files(tmp_path: Path) -> list[Path]:
    mul_one, relu_relu = tmp_path / "mulone.yaml", tmp_path / "relu.yaml"
    mul_one.write_text(MUL_ONE_RULE)
    relu_relu.write_text(relu_relu_rule("relu-relu"))
    return [mul_one, relu_relu]


def test_a_created_node_of_another_shape_is_blocked_and_the_other_rules_go_on(tmp_path: Path):
    model = _mul_one_then_relus()
    result, report = onnxfuse.optimize(
        model, target=None, rules=_rule_files(tmp_path), builtin=False, return_report=True
    )
    onnx.checker.check_model(result, full_check=True)
    assert [n.op_type for n in result.graph.node] == ["Mul", "Relu"]
    stats = report.rules["my-mul-one"]
    # Tried again after each rewrite nearby, blocked each time, counted once for its node.
    assert stats.applied == 0 and stats.blocked == 1 and stats.matched >= 1
    assert stats.blocked_reason == "changes the shape of 'y' from [1, 8] to [8]"
    assert report.rules["relu-relu"].applied == 1
    assert_same_outputs(model, result)


def test_a_blocked_rewrite_leaves_no_use_behind():
    model = ir.from_proto(_mul_one_then_relus())
    onnxfuse.optimize(model, target=None, rules=rules_from_text(MUL_ONE_RULE), builtin=False)
    x = model.graph.inputs[0]
    assert [use.node.op_type for use in x.uses()] == ["Mul"]


def test_the_command_line_names_the_blocked_rule_and_writes_a_valid_model(tmp_path: Path, capsys):
    source, output = tmp_path / "m.onnx", tmp_path / "out.onnx"
    onnx.save(_mul_one_then_relus(), source)
    rules = [str(path) for path in _rule_files(tmp_path)]
    code = main(["optimize", str(source), "-o", str(output), "--rules", rules[0]])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    onnx.checker.check_model(onnx.load(output), full_check=True)
    blocked = re.search(r"blocked: my-mul-one \(\d+x\): (.*)", captured.out)
    assert blocked is not None, captured.out
    assert blocked.group(1) == "changes the shape of 'y' from [1, 8] to [8]"


def _add_model(dtype: int = TensorProto.FLOAT) -> onnx.ModelProto:
    nodes = [
        helper.make_node("Add", ["a", "b"], ["y"], name="add"),
        helper.make_node("Relu" if dtype == TensorProto.FLOAT else "Neg", ["y"], ["z"]),
    ]
    inputs = [tensor_input("a", [2, 3], dtype), tensor_input("b", [2, 3], dtype)]
    return make_model(nodes, inputs, [tensor_input("z", [2, 3], dtype)])


def test_a_created_node_that_does_not_type_check_is_blocked():
    rules = rules_from_text(
        """
rules:
  - name: add-as-matmul
    source: |
      f (A, B) => (Y) {
        Y = Add(A, B)
      }
    replacement: |
      f (A, B) => (Y) {
        Y = MatMul(A, B)
      }
"""
    )
    report, result = optimize_proto(_add_model(), rules)
    assert [n.op_type for n in result.graph.node] == ["Add", "Relu"]
    reason = report.rules["add-as-matmul"].blocked_reason
    assert reason is not None and reason.startswith("the MatMul it creates does not type-check")


def test_a_created_node_of_another_element_type_is_blocked():
    rules = rules_from_text(
        """
rules:
  - name: add-as-cast
    source: |
      f (A, B) => (Y) {
        Y = Add(A, B)
      }
    replacement: |
      f (A, B) => (Y) {
        Y = Cast<to = 1>(A)
      }
"""
    )
    report, result = optimize_proto(_add_model(TensorProto.INT64), rules)
    assert [n.op_type for n in result.graph.node] == ["Add", "Neg"]
    stats = report.rules["add-as-cast"]
    assert stats.blocked_reason == "changes the type of 'y' from int64 to float"


# Its mistake shows only once the created Constant folds: Reshape to [-1] is rank 1.
FLATTEN_AS_RESHAPE = """
rules:
  - name: my-flatten-reshape
    source: |
      f (X) => (Y) {
        Y = Flatten(X)
      }
    replacement: |
      f (X) => (Y) {
        s = Constant<value_ints = [-1]>()
        Y = Reshape(X, s)
      }
"""


def _flatten_then_relus() -> onnx.ModelProto:
    nodes = [
        helper.make_node("Flatten", ["x"], ["y"], name="flatten"),
        helper.make_node("Relu", ["y"], ["r"], name="relu1"),
        helper.make_node("Relu", ["r"], ["z"], name="relu2"),
    ]
    return make_model(nodes, [tensor_input("x", [2, 3, 4])], [tensor_input("z", [2, 12])])


def test_a_rule_whose_result_fails_the_checker_is_left_out_and_the_run_redone(tmp_path: Path):
    flatten, relu = tmp_path / "flatten.yaml", tmp_path / "relu.yaml"
    flatten.write_text(FLATTEN_AS_RESHAPE)
    relu.write_text(relu_relu_rule("relu-relu"))
    model = _flatten_then_relus()
    result, report = onnxfuse.optimize(
        model, target=None, rules=[flatten, relu], builtin=False, return_report=True
    )
    onnx.checker.check_model(result, full_check=True)
    assert [n.op_type for n in result.graph.node] == ["Flatten", "Relu"]
    assert_same_outputs(model, result)
    stats = report.rules["my-flatten-reshape"]
    assert stats.applied == 0 and stats.blocked == 1
    assert stats.blocked_reason is not None
    assert stats.blocked_reason.startswith("left out of the run: with its rewrites the optimized")
    assert "differ in rank" in stats.blocked_reason
    assert report.rules["relu-relu"].applied == 1


def test_the_command_line_names_the_rule_left_out_and_exits_0(tmp_path: Path, capsys):
    source, output, rules = tmp_path / "m.onnx", tmp_path / "out.onnx", tmp_path / "r.yaml"
    onnx.save(_flatten_then_relus(), source)
    rules.write_text(FLATTEN_AS_RESHAPE)
    code = main(["optimize", str(source), "-o", str(output), "--rules", str(rules)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "internal error" not in captured.err
    onnx.checker.check_model(onnx.load(output), full_check=True)
    assert "blocked: my-flatten-reshape (1x): left out of the run: " in captured.out


def test_an_ir_model_optimized_in_place_names_the_rule_its_checker_failure_is_in():
    model = ir.from_proto(_flatten_then_relus())
    with pytest.raises(InvariantError, match="rule my-flatten-reshape created nodes the ONNX"):
        onnxfuse.optimize(
            model, target=None, rules=rules_from_text(FLATTEN_AS_RESHAPE), builtin=False
        )
