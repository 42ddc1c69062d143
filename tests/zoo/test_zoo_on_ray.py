"""`onnxfuse zoo --ray` on the session's local Ray: the rows of a local run, in the same
order (timings aside)."""

from __future__ import annotations

import json

from helpers import FIVE_MODELS, five_models

from onnxfuse.cli.main import main


def _measured(rows_file) -> list[dict]:
    """Each row without what depends on the machine's load (times)."""
    rows = [json.loads(line) for line in rows_file.read_text().splitlines()]
    for row in rows:
        row.pop("latency", None)
        for tool in row["tools"].values():
            tool.pop("seconds")
    return rows


def test_five_models_on_ray_give_the_rows_of_a_local_run(local_ray, tmp_path, capsys):
    models = five_models(tmp_path / "models")
    argv = ["zoo", str(models), "--peers", "ort,onnxslim", "--latency-runs", "1", "--json"]
    assert main([*argv, str(tmp_path / "here.jsonl")]) == 0
    here = capsys.readouterr().out
    assert main([*argv, str(tmp_path / "ray.jsonl"), "--ray"]) == 0
    there = capsys.readouterr().out
    assert there.splitlines()[-1] == here.splitlines()[-1] == "5 passed, 0 failed"
    rows = _measured(tmp_path / "here.jsonl")
    assert [row["model"] for row in rows] == FIVE_MODELS
    assert _measured(tmp_path / "ray.jsonl") == rows
