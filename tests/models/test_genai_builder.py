"""An LLM as onnxruntime-genai's model builder writes it: repaired, optimized, the same.

Every builder model declares a rank-0 value_info on a Constant whose tensor is [1]-shaped
(tests/data/genai-builder/PROVENANCE.md): onnx's checker refuses it, onnxruntime runs it,
and onnxfuse drops the declaration with one warning.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from helpers import assert_close

from onnxfuse.files.model_io import load_model
from onnxfuse.rewrite.report import REPAIRS_META
from onnxfuse.targets.capabilities import load_target

MODEL = Path(__file__).parents[1] / "data" / "genai-builder" / "model.onnx"
WARNING = (
    "onnxfuse: warning: repaired: value_info contradicting its constant's tensor dropped "
    "(the tensor wins), '/model/constants/INT64/[1]' int64[] -> int64[1]"
)


def _feeds(sequence: int = 3, past: int = 2) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    feeds = {
        "input_ids": rng.integers(0, 256, (1, sequence)).astype(np.int64),
        "attention_mask": np.ones((1, sequence + past), np.int64),
    }
    for layer in range(2):
        for kind in ("key", "value"):
            shape = (1, 2, past, 16)
            feeds[f"past_key_values.{layer}.{kind}"] = rng.standard_normal(shape).astype(np.float32)
    return feeds


def _run(path: Path) -> list[np.ndarray]:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return session.run(None, _feeds())


def test_the_builders_declaration_is_what_the_checker_refuses():
    model = onnx.load(MODEL, load_external_data=False)
    (declared,) = [v for v in model.graph.value_info if v.name == "/model/constants/INT64/[1]"]
    assert len(declared.type.tensor_type.shape.dim) == 0
    (constant,) = [n for n in model.graph.node if n.output[0] == declared.name]
    assert list(constant.attribute[0].t.dims) == [1]


def test_a_builder_model_is_optimized_with_one_warning(tmp_path: Path):
    out = tmp_path / "model.onnx"
    result = subprocess.run(
        [sys.executable, "-m", "onnxfuse", "optimize", str(MODEL), "-o", str(out), "-q"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr.splitlines() == [WARNING]
    # onnx's full checker, extension ops allowed; nothing left to repair.
    assert REPAIRS_META not in load_model(out, target=load_target("cpu")).meta
    assert_close(_run(out), _run(MODEL))
