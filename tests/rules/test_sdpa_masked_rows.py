"""The semantics rules/ort/attention_sdpa.yaml is built on: torch's SDPA decomposition maps
a fully masked row of scores (every key -inf) to zeros with IsNaN/Where after the Softmax,
and onnxruntime's Attention returns NaN for that row. So ort-attention-sdpa fuses only a
finite mask, and ort-attention-sdpa-inf-mask zeroes those rows itself. If onnxruntime ever
returns zeros here, this test fails and the rules can be simplified."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
from helpers import make_model, tensor_input
from onnx import TensorProto, helper, numpy_helper

B, S, D, HEADS = 1, 3, 4, 2
RNG = np.random.default_rng(3)
W = RNG.standard_normal((D, 3 * D)).astype(np.float32)
BIAS = np.zeros(3 * D, np.float32)


def _session(model) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )


def _mask_with_a_fully_masked_row() -> np.ndarray:
    mask = np.zeros((B, 1, S, S), np.float32)
    mask[0, 0, 1, :] = -np.inf
    return mask


def test_softmax_isnan_where_gives_zeros_for_a_fully_masked_row():
    nodes = [
        helper.make_node("Add", ["scores", "mask"], ["a"]),
        helper.make_node("Softmax", ["a"], ["p"], axis=-1),
        helper.make_node("IsNaN", ["p"], ["nan"]),
        helper.make_node("Where", ["nan", "zero", "p"], ["y"]),
    ]
    model = make_model(
        nodes,
        [tensor_input("scores", [B, 1, S, S]), tensor_input("mask", [B, 1, S, S])],
        [tensor_input("y", [B, 1, S, S])],
        [numpy_helper.from_array(np.array(0.0, np.float32), "zero")],
        opset=17,
    )
    scores = RNG.standard_normal((B, 1, S, S)).astype(np.float32)
    (y,) = _session(model).run(None, {"scores": scores, "mask": _mask_with_a_fully_masked_row()})
    assert np.all(y[0, 0, 1] == 0.0)
    assert np.all(np.isfinite(y))


def test_onnxruntime_attention_gives_nan_for_a_fully_masked_row():
    node = helper.make_node(
        "Attention", ["X", "W", "B", "", "", "M"], ["Y"], domain="com.microsoft", num_heads=HEADS
    )
    model = make_model(
        [node],
        [tensor_input("X", [B, S, D]), tensor_input("M", [B, 1, S, S])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [B, S, D])],
        [numpy_helper.from_array(W, "W"), numpy_helper.from_array(BIAS, "B")],
        opset=17,
        extra_opsets={"com.microsoft": 1},
    )
    x = RNG.standard_normal((B, S, D)).astype(np.float32)
    (y,) = _session(model).run(None, {"X": x, "M": _mask_with_a_fully_masked_row()})
    assert np.all(np.isnan(y[0, 1]))
    assert np.all(np.isfinite(y[0, [0, 2]]))
