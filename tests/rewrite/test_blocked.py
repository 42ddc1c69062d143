"""A user's rule that would change a value's shape or type is blocked, named in the
report, and the run goes on."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import onnx
import pytest
from helpers import make_model, optimize_proto, rules_from_text, tensor_input
from onnx import helper, numpy_helper

from onnxfuse.cli.main import main

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
        (True, "changes the shape of 'y': [8] where the graph has [1, 8]"),
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
