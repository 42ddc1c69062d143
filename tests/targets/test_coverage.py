"""Coverage: the nodes a target cannot run, the partitions they cut the graph into,
and the fused ops a target runs only by inlining their function body again."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
from helpers import make_model, mish_rule, tensor_input
from onnx import helper, numpy_helper

from onnxfuse.cli.main import main
from onnxfuse.passes.normalize import normalize
from onnxfuse.targets.capabilities import load_target
from onnxfuse.targets.coverage import coverage

RELU_ONLY = """
name: relu-only
description: runs Relu and Add, nothing else
ops:
- {domain: '', op: Relu, since: 1, types: {T: [float]}}
- {domain: '', op: Add, since: 1, types: {T: [float]}}
"""

MISH = mish_rule("mish")


def _relu_sigmoid_relu() -> ir.Model:
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="r1"),
        helper.make_node("Relu", ["a"], ["b"], name="r2"),
        helper.make_node("Sigmoid", ["b"], ["c"], name="sig"),
        helper.make_node("Relu", ["c"], ["d"], name="r3"),
        helper.make_node("Add", ["d", "a"], ["y"], name="add"),
    ]
    model = make_model(nodes, [tensor_input("x", [4])], [tensor_input("y", [4])])
    return ir.from_proto(model)


def test_an_op_the_target_lacks_cuts_the_graph_in_two(tmp_path: Path):
    path = tmp_path / "relu-only.yaml"
    path.write_text(RELU_ONLY)
    found = coverage(_relu_sigmoid_relu(), load_target(str(path)))
    assert [(u.node, u.op, u.reason) for u in found.uncovered] == [
        ("sig", "Sigmoid", "Sigmoid at opset 17")
    ]
    assert found.partitions == ((2, "r1", "r2"), (2, "r3", "add"))
    assert found.summary() == "5 nodes, 1 not covered (Sigmoid 1), 2 partitions (2, 2 nodes)"


def test_an_attribute_the_ops_opset_lacks_does_not_break_a_limit():
    # nnapi limits BatchNormalization to spatial=1, an attribute gone from opset 9 on.
    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.random((4, 3, 3, 3)).astype(np.float32), "w")]
    weights += [
        numpy_helper.from_array((rng.random(4) + 0.5).astype(np.float32), name) for name in "sbmv"
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
        helper.make_node("BatchNormalization", ["c", "s", "b", "m", "v"], ["y"], name="bn"),
    ]
    proto = make_model(
        nodes, [tensor_input("x", [1, 3, 8, 8])], [tensor_input("y", [1, 4, 6, 6])], weights
    )
    model = ir.from_proto(proto)
    normalize(model)
    found = coverage(model, load_target("nnapi"))
    assert found.uncovered == () and found.partitions == ((2, "conv", "bn"),)


def _mish_model(path: Path) -> str:
    nodes = [
        helper.make_node("Softplus", ["x"], ["s"], name="softplus"),
        helper.make_node("Tanh", ["s"], ["t"], name="tanh"),
        helper.make_node("Mul", ["x", "t"], ["y"], name="mul"),
    ]
    model = make_model(nodes, [tensor_input("x", [4])], [tensor_input("y", [4])], opset=18)
    onnx.save(model, path)
    return str(path)


def test_the_report_warns_of_a_fused_op_run_as_its_function_body(tmp_path: Path, capsys):
    model = _mish_model(tmp_path / "m.onnx")
    (tmp_path / "mish.yaml").write_text(MISH)
    report = tmp_path / "r.json"
    args = ["optimize", model, "--rules", str(tmp_path / "mish.yaml")]
    assert main([*args, "--report-json", str(report)]) == 0
    out = capsys.readouterr().out
    assert (
        "warning: Mish (1 created) runs on cpu only as its ONNX function body: "
        "onnxruntime inlines it again when it loads the model" in out
    ), out
    data = json.loads(report.read_text())["coverage"]
    assert data["before"]["inlined"] == {} and data["after"]["inlined"] == {"Mish": 1}
    assert data["inlined_created"] == {"Mish": 1}
    assert data["after"]["partitions"] == [{"nodes": 1, "first": "mul/mish", "last": "mul/mish"}]


def test_targets_coverage_lists_what_the_target_cannot_run(tmp_path: Path, capsys):
    model = _mish_model(tmp_path / "m.onnx")
    (tmp_path / "relu-only.yaml").write_text(RELU_ONLY)
    written = tmp_path / "coverage.json"
    code = main(
        [
            "targets",
            "coverage",
            model,
            "--target",
            str(tmp_path / "relu-only.yaml"),
            "--json",
            str(written),
        ]
    )
    out = capsys.readouterr().out.splitlines()
    assert code == 0
    assert (
        out[0]
        == "before optimizing: 3 nodes, 3 not covered (Mul 1, Softplus 1, Tanh 1), 0 partitions"
    )
    assert "  not covered: Softplus 'softplus': Softplus at opset 18" in out
    data = json.loads(written.read_text())
    assert data["after"]["uncovered_ops"] == {"Mul": 1, "Softplus": 1, "Tanh": 1}
