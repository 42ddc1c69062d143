"""bench/llm.py: what it counts in a model (weight MatMuls, the builder's fused ops) and the
ratios its summary gives against the builder's fp32 model."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from helpers import make_model, tensor_input
from onnx import helper, numpy_helper

pytest.importorskip("torch")

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import llm  # noqa: E402  (bench/llm.py)


def test_weight_matmuls_are_those_with_a_constant_weight(tmp_path: Path):
    w = numpy_helper.from_array(np.ones((4, 4), np.float32), "w")
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["a"]),  # a weight
        helper.make_node("MatMul", ["a", "y"], ["b"]),  # activations times activations
        helper.make_node(
            "SkipSimplifiedLayerNormalization", ["b", "x", "g"], ["c"], domain="com.microsoft"
        ),
    ]
    g = numpy_helper.from_array(np.ones(4, np.float32), "g")
    model = make_model(
        nodes,
        [tensor_input("x", [4, 4]), tensor_input("y", [4, 4])],
        [tensor_input("c", [4, 4])],
        [w, g],
        extra_opsets={"com.microsoft": 1},
    )
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    found = llm.Model("llama", "dynamo18", "onnxfuse", path)
    llm.describe(found)
    assert (found.nodes, found.weight_matmuls, found.fused) == (3, 1, {"SkipSLN": 1})


def test_the_summary_divides_by_the_builders_fp32_and_takes_the_best_peer():
    models = [
        llm.Model("llama", "builder", "fp32", decode_ms=1.0, prefill_ms=4.0),
        llm.Model("llama", "builder", "int4", decode_ms=0.5, prefill_ms=3.0),
        llm.Model("llama", "dynamo18", "onnxfuse", decode_ms=1.2, prefill_ms=4.4),
        llm.Model("llama", "dynamo18", "onnxscript", decode_ms=1.5, prefill_ms=5.0),
        llm.Model("llama", "dynamo18", "ort-transformers", decode_ms=1.3, prefill_ms=6.0),
        llm.Model("llama", "dynamo18", "export", decode_ms=0.1, prefill_ms=0.1),  # not a peer
    ]
    (row,) = llm.summary(models)[2:]
    assert row == "| llama | dynamo18 | 1.20 | 1.30 | 1.10 | 1.25 |"
