"""`onnxfuse optimize`'s report: the trace of rewrites, and the rules the JSON lists."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
from helpers import make_model, tensor_input
from onnx import helper, numpy_helper

from onnxfuse.cli.main import main


def _conv_bn_relu(path: Path) -> str:
    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.random((4, 3, 3, 3)).astype(np.float32), "w")]
    weights += [
        numpy_helper.from_array((rng.random(4) + 0.5).astype(np.float32), name) for name in "sbmv"
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"]),  # unnamed: named 'c' as read
        helper.make_node("BatchNormalization", ["c", "s", "b", "m", "v"], ["n"], name="bn"),
        helper.make_node("Relu", ["n"], ["y"], name="relu"),
    ]
    model = make_model(
        nodes, [tensor_input("x", [1, 3, 8, 8])], [tensor_input("y", [1, 4, 6, 6])], weights
    )
    onnx.save(model, path)
    return str(path)


def _optimize(tmp_path: Path, capsys, *options: str) -> tuple[str, dict]:
    model = _conv_bn_relu(tmp_path / "m.onnx")
    report = tmp_path / "r.json"
    assert main(["optimize", model, "--report-json", str(report), *options]) == 0
    return capsys.readouterr().out, json.loads(report.read_text())


def test_trace_lists_each_rewrite_in_order(tmp_path: Path, capsys):
    out, data = _optimize(tmp_path, capsys, "--trace", "-o", str(tmp_path / "o.onnx"))
    steps = data["trace"]
    assert [(s["rule"], s["anchor"], s["replaced"]) for s in steps] == [
        ("conv-bn-fold-nobias", "bn", ["c", "bn"]),
        ("fused-conv-relu", "relu", [steps[0]["created"][0], "relu"]),
    ]
    assert steps[0]["folded"] > 0  # the folded BatchNormalization's weight computations
    (fused,) = steps[1]["created"]
    assert [n.name for n in onnx.load(tmp_path / "o.onnx").graph.node] == [fused]
    assert "trace (2 rewrites):" in out
    assert f"2. fused-conv-relu at 'relu': replaced '{steps[0]['created'][0]}', 'relu'; " in out
    assert f"created '{fused}'" in out


def test_without_trace_the_report_has_none(tmp_path: Path, capsys):
    out, data = _optimize(tmp_path, capsys)
    assert "trace" not in data and "trace (" not in out


def test_the_json_lists_the_rules_tried_or_all_on_request(tmp_path: Path, capsys):
    _, data = _optimize(tmp_path, capsys)
    assert sorted(data["rules"]) == ["conv-bn-fold-nobias", "fused-conv-relu"]
    _, everything = _optimize(tmp_path, capsys, "--report-all-rules")
    assert len(everything["rules"]) > 100
    untried = set(everything["rules"]) - set(data["rules"])
    assert all(everything["rules"][name]["matched"] == 0 for name in untried)
    assert everything["rules"]["fused-conv-relu"]["applied"] == 1
