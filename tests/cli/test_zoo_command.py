"""`onnxfuse zoo DIR`: a line and a JSON row per model, in the folder's order; random
inputs from the declared shapes; a wrong rule's model fails with its repro command; the
Markdown tables; bad input is one line and exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest
from helpers import FIVE_MODELS, NEARLY_RIGHT, five_models
from onnx import TensorProto, helper

from onnxfuse.cli.main import main


def divide_by_sqrt2(path: Path) -> None:
    """Y = X / 1.4142135, the pattern NEARLY_RIGHT rewrites with a wrong constant."""
    r = helper.make_node("Constant", [], ["r"], value_float=1.4142135)
    div = helper.make_node("Div", ["X", "r"], ["Y"])
    graph = helper.make_graph(
        [r, div],
        "g",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["batch", 8])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["batch", 8])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    onnx.save(model, path)


def test_a_folder_of_models_gives_a_row_and_a_line_each(tmp_path, capsys):
    models = five_models(tmp_path / "models")
    rows, tables = tmp_path / "rows.jsonl", tmp_path / "zoo.md"
    argv = ["zoo", str(models), "--target", "cpu", "--peers", "ort", "--latency-runs", "2"]
    assert main([*argv, "--json", str(rows), "--markdown", str(tables)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == "5 passed, 0 failed"
    assert [line.split()[1].rstrip(":") for line in out[:-1]] == FIVE_MODELS  # the folder's order
    found = [json.loads(line) for line in rows.read_text().splitlines()]
    assert [r["model"] for r in found] == FIVE_MODELS and all(r["ok"] for r in found)
    gemm = found[2]
    assert gemm["inputs"] == "random (K, M, N = 1)"  # symbolic dimensions, said so
    assert gemm["nodes"] == 3 and gemm["tools"]["onnxfuse"]["nodes"] == 1
    assert gemm["fired"] == {"transpose-gemm-a": 1, "transpose-gemm-b": 1}
    assert gemm["tools"]["ort-extended"]["valid"] and gemm["latency"]["ratio"] > 0
    text = tables.read_text()
    assert "| gemm_transpose_2inputs_transposed | 12 | 3 | 1 | 1 | ORT ext 1 | yes |  |" in text
    assert "transpose-gemm-a 1, transpose-gemm-b 1" in text


def test_a_wrong_rule_fails_its_model_with_a_one_line_repro(tmp_path, capsys):
    models = tmp_path / "models"
    models.mkdir()
    divide_by_sqrt2(models / "div.onnx")
    rules = tmp_path / "wrong.yaml"
    rules.write_text(NEARLY_RIGHT)
    argv = ["zoo", str(models), "--rules", str(rules), "--latency-runs", "0"]
    assert main([*argv, "--json", str(tmp_path / "rows.jsonl")]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("  FAIL  div: outputs differ:")
    assert out[1].strip() == (
        f"reproduce: onnxfuse optimize {models / 'div.onnx'} -o out.onnx --target cpu "
        f"--rules {rules}"
    )
    assert out[-1] == "0 passed, 1 failed"
    (row,) = [json.loads(line) for line in (tmp_path / "rows.jsonl").read_text().splitlines()]
    assert row["fired"] == {"div-sqrt2-as-rounded-mul": 1}


def test_a_file_that_is_no_model_fails_its_row_and_the_others_run(tmp_path, capsys):
    models = five_models(tmp_path / "models")
    (models / "broken.onnx").write_bytes(b"not a model")
    assert main(["zoo", str(models), "--latency-runs", "0"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[1].startswith("  FAIL  broken: DecodeError")  # in the folder's order
    assert out[2].strip().startswith(f"reproduce: onnxfuse optimize {models / 'broken.onnx'}")
    assert out[-1] == "5 passed, 1 failed"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["zoo", "no-such-folder"], "no-such-folder: no such folder or manifest"),
        (["zoo", "{models}/empty"], "empty: no .onnx file in this folder"),
        (["zoo", "{models}/list.yaml"], "list.yaml: not a folder of models or a zoo manifest"),
        (["zoo", "{models}", "--peers", "ort,tvm"], "--peers: unknown tvm (one of ort,"),
        (["zoo", "{models}", "--target", "nowhere"], "nowhere"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, argv, message):
    models = five_models(tmp_path / "models")
    (models / "empty").mkdir()
    (models / "list.yaml").write_text("- not\n- a manifest\n")
    assert main([a.format(models=models) for a in argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("onnxfuse: error: ") and message in err[0]


def test_a_manifest_of_local_files_feeds_stored_inputs_and_times_every_result(tmp_path, capsys):
    """bench/parity.py's form: local files, stored inputs, the ort-transformers peer only
    where the entry says what the model is (else `n/a`, no failure)."""
    import numpy as np
    import yaml

    models = five_models(tmp_path / "models")
    name = "gemm_transpose_2inputs_transposed"
    model = onnx.load(models / f"{name}.onnx")
    rng = np.random.default_rng(0)
    feeds = {}
    for value in model.graph.input:
        shape = [d.dim_value or 2 for d in value.type.tensor_type.shape.dim]
        feeds[value.name] = rng.standard_normal(shape).astype(np.float32)
    np.savez(models / "gemm.npz", **feeds)
    entry = {"name": "gemm", "file": f"{name}.onnx", "feeds": "gemm.npz"}
    manifest = models / "local.yaml"
    manifest.write_text(yaml.safe_dump({"models": [entry]}))
    rows, tables = tmp_path / "rows.jsonl", tmp_path / "zoo.md"
    argv = ["zoo", str(manifest), "--peers", "ort,ort-transformers", "--latency-runs", "2"]
    assert main([*argv, "--json", str(rows), "--markdown", str(tables)]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "1 passed, 0 failed"
    (row,) = [json.loads(line) for line in rows.read_text().splitlines()]
    assert row["inputs"] == "stored"
    assert row["tools"]["ort-transformers"]["error"].startswith("n/a")
    assert set(row["latency"]) == {"original", "onnxfuse", "ort-extended", "ratio"}
    text = tables.read_text()
    assert "| gemm | 12 | 3 | 1 | 1 | n/a | ORT ext 1 | yes |  |" in text
    assert "ORT transformers: n/a" not in text  # not applicable is not a failure note
