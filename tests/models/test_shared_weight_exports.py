"""Shared weights stay shared on real exports: ALBERT (every layer runs the same weights),
GPT-2's and Gemma's LM heads (tied to the token embedding; Gemma's dynamo export reads the
table transposed).

onnxfuse's result (every built-in pack, --target cpu) stores no weight twice, stores no
more weight bytes than the export did, and computes the export's outputs.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import onnx
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from exports.anchors import run, worst_error
from exports.export import export_by_name, get_export
from exports.models import CAUSAL_LM_MODELS_BY_NAME

from onnxfuse.api import optimize_file, select_rules
from onnxfuse.passes.pipeline import Options
from onnxfuse.targets.capabilities import load_target

pytestmark = pytest.mark.slow

EXPORTS = ("albert-legacy17", "albert-dynamo18", "gpt2-legacy17", "gemma-kv-dynamo18")


def _export(name: str):
    if name == "gemma-kv-dynamo18":  # a decoder with its KV cache (bench/llm.py's set)
        return get_export(CAUSAL_LM_MODELS_BY_NAME["gemma-kv"], "dynamo", 18)
    return export_by_name(name)


def _weights(path: Path) -> list[np.ndarray]:
    """The large initializers (above onnx_ir's small-tensor deduplication) of every graph."""
    model = onnx.load(path)
    return [
        onnx.numpy_helper.to_array(t) for t in model.graph.initializer if np.prod(t.dims) > 1024
    ]


@pytest.mark.parametrize("name", EXPORTS)
def test_no_weight_is_stored_twice(name, tmp_path):
    export = _export(name)
    out = tmp_path / "optimized.onnx"
    optimize_file(export.path, out, select_rules(), Options(target=load_target("cpu")))
    before, after = _weights(export.path), _weights(out)
    digests = [hashlib.sha256(a.tobytes()).hexdigest() + str(a.shape) for a in after]
    assert len(digests) == len(set(digests)), "two initializers hold the same weight"
    assert sum(a.nbytes for a in after) <= sum(a.nbytes for a in before)
    assert worst_error(run(out, export.feeds), run(export.path, export.feeds)) <= 1.0
