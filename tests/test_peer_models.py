"""onnxruntime's own fusion test models: optimizing them never breaks them.

For every model of tests/data/ort-fusion that onnxruntime can load and that
passes onnx's checker, the optimized model (all built-in packs, --target cpu)
passes the full checker, has no more nodes, and computes the same outputs
where the model is deterministic and runnable at its declared shapes.
"""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest
from helpers import assert_close, random_feeds, run

from onnxfuse.api import optimize_file, select_rules
from onnxfuse.errors import ModelError
from onnxfuse.optimizer import Options
from onnxfuse.targets import load_target

DATA = Path(__file__).parent / "data" / "ort-fusion"
MANIFEST = json.loads((DATA / "manifest.json").read_text())
LOADABLE = [e for e in MANIFEST if e["ops_after_ort_cpu_extended"] is not None]


def _not_comparable(entry: dict) -> str | None:
    notes = entry["notes"] or ""
    for marker in ("random", "ORT run fail", "not executed"):
        if marker in notes:
            return notes
    return None


@pytest.fixture(scope="module")
def rules():
    return select_rules()


@pytest.mark.parametrize("entry", LOADABLE, ids=[e["model"] for e in LOADABLE])
def test_optimized_peer_model_is_valid_and_equivalent(entry, rules, tmp_path):
    path = DATA / entry["model"]
    out = tmp_path / "out.onnx"
    try:
        # Saving runs onnx's full checker on the result before it is renamed into place.
        report = optimize_file(path, out, rules, Options(target=load_target("cpu")))
    except ModelError as exc:
        # Loadable by onnxruntime but not valid ONNX (LayerNormalization at opset 12
        # from old exporters, unsorted nodes, declared output shapes the graph does
        # not compute): onnxfuse refuses it with a one-line error, never a bad model.
        pytest.skip(f"rejected as invalid ONNX: {exc}")
    assert report.nodes_after <= entry["nodes_before"]
    if _not_comparable(entry):
        return
    original = onnx.load(path)
    feeds = random_feeds(original, dims=entry["dims"])
    assert_close(run(out, feeds), run(original, feeds))
