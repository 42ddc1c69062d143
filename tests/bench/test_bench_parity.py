"""bench/parity.py: its exports run through `onnxfuse zoo`'s runner, from a manifest that
`onnxfuse zoo` itself reads, and its table keeps the other benchmarks' sections."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

pytest.importorskip("torch")
pytest.importorskip("transformers")

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import parity  # noqa: E402  (bench/parity.py)

from onnxfuse.cli.main import main  # noqa: E402


@pytest.mark.slow
def test_an_export_runs_through_the_zoo_runner_and_its_manifest_replays(tmp_path, capsys):
    doc = tmp_path / "parity.md"
    doc.write_text("# old\n\n## Quantized models\n\nkept as it is\n")
    argv = ["--only", "resnet-small-dynamo18", "bert-mask-legacy14", "--runs", "2"]
    assert parity.main([*argv, "--markdown", str(doc)]) == 0
    text = doc.read_text()
    # onnxfuse and every anchor, ORT transformers n/a for the CNN, ms of each valid result.
    row = next(line for line in text.splitlines() if line.startswith("| resnet-small-dynamo18 |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1:3] == ["17", "10"] and cells[4] == "n/a" and cells[8] == "yes", cells
    assert all(float(ms) > 0 for ms in (cells[9], cells[10])), cells
    assert "| bert-mask-legacy14 | 317 | 22 |" in text
    assert text.endswith("## Quantized models\n\nkept as it is\n")
    # The manifest the run wrote: local files, stored inputs, the transformer settings.
    manifest = Path(capsys.readouterr().err.split("manifest: ")[1].split()[0])
    entries = {e["name"]: e for e in yaml.safe_load(manifest.read_text())["models"]}
    assert entries["bert-mask-legacy14"]["transformer"] == {
        "model_type": "bert",
        "num_heads": 4,
        "hidden_size": 32,
    }
    assert "transformer" not in entries["resnet-small-dynamo18"]
    # `onnxfuse zoo` on it gives the same node counts.
    rows = tmp_path / "rows.jsonl"
    zoo = ["zoo", str(manifest), "--every-pack", "--every-fusion", "--latency-runs", "0"]
    assert main([*zoo, "--peers", "ort,ort-transformers", "--json", str(rows)]) == 0
    found = [json.loads(line) for line in rows.read_text().splitlines()]
    nodes = {r["model"]: r["tools"]["onnxfuse"]["nodes"] for r in found}
    assert nodes == {"resnet-small-dynamo18": 10, "bert-mask-legacy14": 22}
    assert {r["model"]: r["inputs"] for r in found} == dict.fromkeys(nodes, "stored")
