"""The public API at the top of the package: every kind of model, the pass, the README."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import onnx
import onnx_ir as ir
import pytest
from helpers import assert_same_outputs

import onnxfuse
from onnxfuse.api import sample_model_path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_a_model_proto_gives_a_new_model_proto_and_leaves_the_argument_alone():
    model = onnx.load(sample_model_path())
    before = model.SerializeToString()
    optimized = onnxfuse.optimize(model)
    assert isinstance(optimized, onnx.ModelProto)
    assert model.SerializeToString() == before
    assert len(optimized.graph.node) < len(model.graph.node)
    assert_same_outputs(model, optimized)


def test_an_ir_model_is_optimized_in_place_and_returned():
    model = ir.load(sample_model_path())
    nodes = len(model.graph)
    assert onnxfuse.optimize(model, target="cuda") is model
    assert len(model.graph) < nodes


def test_a_path_is_written_to_output_and_its_path_returned(tmp_path: Path):
    out = tmp_path / "out.onnx"
    result, report = onnxfuse.optimize(sample_model_path(), output=out, return_report=True)
    assert result == out and out.is_file()
    assert report.nodes_after == len(onnx.load(out).graph.node)


def test_a_path_without_an_output_is_refused():
    with pytest.raises(onnxfuse.OnnxfuseError, match="needs output="):
        onnxfuse.optimize(sample_model_path())


def test_an_unknown_option_or_model_kind_is_refused():
    with pytest.raises(onnxfuse.OnnxfuseError, match="unknown option fold"):
        onnxfuse.optimize(onnx.load(sample_model_path()), fold=1)
    with pytest.raises(onnxfuse.OnnxfuseError, match="not bytes"):
        onnxfuse.optimize(b"model")


def test_no_builtin_rules_and_no_gating_only_fold_and_clean_up():
    model = onnx.load(sample_model_path())
    optimized, report = onnxfuse.optimize(model, target=None, builtin=False, return_report=True)
    assert report.rewrites == 0 and report.rules == {}
    assert_same_outputs(model, optimized)


def test_optimize_pass_runs_inside_onnx_ir_sequential():
    fuse = onnxfuse.OptimizePass(onnxfuse.select_rules(target="cpu"))
    model = ir.load(sample_model_path())
    result = ir.passes.Sequential(ir.passes.common.RemoveUnusedNodesPass(), fuse)(model)
    assert result.modified and result.model is model
    assert fuse.report is not None and fuse.report.rewrites > 0


def test_optimize_pass_called_on_a_model_proto_returns_a_new_model_proto():
    fuse = onnxfuse.OptimizePass(onnxfuse.select_rules(target="cpu"))
    model = onnx.load(sample_model_path())
    before = model.SerializeToString()
    optimized = fuse(model)
    assert isinstance(optimized, onnx.ModelProto)
    assert model.SerializeToString() == before
    assert len(optimized.graph.node) < len(model.graph.node)
    assert fuse.report is not None and fuse.report.rewrites > 0
    assert_same_outputs(model, optimized)


def test_optimize_pass_on_anything_else_says_what_it_takes():
    fuse = onnxfuse.OptimizePass([])
    with pytest.raises(onnxfuse.OnnxfuseError, match=r"onnx_ir\.Model or an onnx\.ModelProto"):
        fuse(sample_model_path())


def test_every_python_example_of_the_readme_runs(tmp_path: Path, monkeypatch):
    shutil.copy(sample_model_path(), tmp_path / "model.onnx")
    (tmp_path / "my_rules.yaml").write_text(
        "rules:\n  - name: relu-relu-readme\n    source: |\n      f (X) => (Y) {\n"
        "        T = Relu(X)\n        Y = Relu(T)\n      }\n    replacement: |\n"
        "      f (X) => (Y) {\n        Y = Relu(X)\n      }\n"
    )
    monkeypatch.chdir(tmp_path)
    examples = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert len(examples) >= 2
    for example in examples:
        exec(compile(example, str(README), "exec"), {})
    assert (tmp_path / "out.onnx").is_file()
    assert os.listdir(tmp_path)
