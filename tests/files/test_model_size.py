"""The report states both sizes, and why an output is larger than its input when it is."""

from __future__ import annotations

import json

import numpy as np
import onnx
from helpers import make_model, tensor_input
from onnx import helper, numpy_helper

from onnxfuse.api import optimize_file, select_rules
from onnxfuse.cli.main import main
from onnxfuse.passes.pipeline import Options
from onnxfuse.targets.capabilities import load_target


def _save(model: onnx.ModelProto, path) -> None:
    onnx.save(model, path)


def _expanded_constant():
    """Add(x, Expand(c, [64, 64])) with a 64-element c: folding stores 4096 elements."""
    return make_model(
        [
            helper.make_node("Expand", ["c", "shape"], ["e"]),
            helper.make_node("Add", ["x", "e"], ["y"]),
        ],
        [tensor_input("x", [64, 64])],
        [tensor_input("y", [64, 64])],
        [
            numpy_helper.from_array(np.arange(64, dtype=np.float32), "c"),
            numpy_helper.from_array(np.array([64, 64], np.int64), "shape"),
        ],
    )


def test_a_folded_constant_larger_than_its_source_is_named(tmp_path):
    source, out = tmp_path / "in.onnx", tmp_path / "out.onnx"
    _save(_expanded_constant(), source)
    report = optimize_file(source, out, [])
    assert report.bytes_before == source.stat().st_size
    assert report.bytes_after == out.stat().st_size > report.bytes_before
    assert any(r.startswith("folded constants hold more") for r in report.larger_because)
    assert any("[64x64]" in r for r in report.larger_because)


def test_recorded_types_are_named(tmp_path):
    """A Neg chain: no constant, the output records its 20 intermediates' types."""
    nodes = [helper.make_node("Relu", ["x"], ["r0"])]
    nodes += [helper.make_node("Neg", [f"r{i}"], [f"r{i + 1}"]) for i in range(20)]
    model = make_model(
        nodes, [tensor_input("x", ["batch", 8])], [tensor_input("r20", ["batch", 8])]
    )
    source, out = tmp_path / "in.onnx", tmp_path / "out.onnx"
    _save(model, source)
    report = optimize_file(source, out, [])
    assert report.bytes_after > report.bytes_before
    expected = "value_info records the inferred type and shape of 20 values"
    assert report.larger_because[0].startswith(expected)


def test_a_smaller_output_states_no_reason(tmp_path, capsys):
    """The sample shrinks: both sizes on the terminal and in JSON, no reason."""
    out, report_json = tmp_path / "out.onnx", tmp_path / "r.json"
    assert main(["optimize", "-o", str(out), "--report-json", str(report_json)]) == 0
    printed = capsys.readouterr().out
    assert "  size " in printed and "larger:" not in printed
    data = json.loads(report_json.read_text())
    assert data["bytes_after"] == out.stat().st_size
    assert data["bytes_after"] <= data["bytes_before"] and data["larger_because"] == []


def test_the_terminal_says_why_it_is_larger(tmp_path, capsys):
    source, out = tmp_path / "in.onnx", tmp_path / "out.onnx"
    _save(_expanded_constant(), source)
    assert main(["optimize", str(source), "-o", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert any(line.startswith("  larger: folded constants") for line in lines)


def test_the_provenance_of_created_nodes_is_named(tmp_path):
    """Conv -> Relu fused: the fused node records its rule and the nodes it replaced, more
    bytes than the Relu it saves; without provenance that reason goes."""
    model = make_model(
        [
            helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
            helper.make_node("Relu", ["c"], ["y"], name="relu"),
        ],
        [tensor_input("x", [1, 2, 4, 4])],
        [tensor_input("y", [1, 3, 4, 4])],
        [numpy_helper.from_array(np.ones([3, 2, 1, 1], np.float32), "w")],
    )
    source, out = tmp_path / "in.onnx", tmp_path / "out.onnx"
    _save(model, source)
    reason = "each created node records the rule and the nodes it replaced"
    report = optimize_file(
        source, out, select_rules(target="cpu"), Options(target=load_target("cpu"))
    )
    assert report.bytes_after > report.bytes_before
    assert any(r.startswith(reason) for r in report.larger_because), report.larger_because
    options = Options(target=load_target("cpu"), provenance=False)
    report = optimize_file(source, out, select_rules(target="cpu"), options)
    assert not any(r.startswith(reason) for r in report.larger_because)
