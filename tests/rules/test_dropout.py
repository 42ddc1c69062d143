"""rules/core/dropout.yaml: a Dropout with ratio 0 is the identity, even in training mode.

The derived property tests (tests/proof) draw instances of every rank, dtype and
training_mode; here: onnxruntime's own bias+dropout test models, whose Dropout
runs in training mode with ratio 0.8 and so must stay, and the same models with
ratio 0, where it goes and the outputs stay bit for bit.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from core_pack_support import F32, RULES, build, fire, no_fire, node, ops
from helpers import optimize_proto, random_feeds, run
from onnx import numpy_helper

from onnxfuse.api import select_rules

PEERS = Path(__file__).parent.parent / "data" / "ort-fusion"


@pytest.fixture(scope="module")
def all_rules():
    return select_rules()


TRAINING = [
    "bias_dropout_residual_fusion1.onnx",
    "bias_dropout_residual_fusion2.onnx",
    "bias_dropout_residual_fusion_mismatch.onnx",
    "bias_dropout_residual_same_shape_fusion.onnx",
]
DIMS = {"unk_1": 2, "unk_2": 3}


def _with_ratio(model: onnx.ModelProto, ratio: float) -> onnx.ModelProto:
    model = onnx.ModelProto.FromString(model.SerializeToString())
    for i, init in enumerate(model.graph.initializer):
        if init.name == "ratio_const":
            model.graph.initializer[i].CopyFrom(
                numpy_helper.from_array(np.array(ratio, dtype=np.float32), "ratio_const")
            )
    return model


@pytest.mark.parametrize("name", TRAINING)
def test_training_mode_dropout_of_peer_model_stays(name, all_rules):
    model = onnx.load(PEERS / name)
    _, result = optimize_proto(model, all_rules)
    assert "Dropout" in ops(result)


@pytest.mark.parametrize("name", TRAINING)
def test_zero_ratio_dropout_of_peer_model_goes_bit_exact(name, all_rules):
    model = _with_ratio(onnx.load(PEERS / name), 0.0)
    report, result = optimize_proto(model, all_rules)
    assert report.rules["dropout-zero-ratio"].applied == 1
    assert "Dropout" not in ops(result)
    feeds = random_feeds(model, dims=DIMS)
    for a, e in zip(run(result, feeds), run(model, feeds)):
        np.testing.assert_array_equal(a, e)


def _dropout(ratio, training=None, mask_used=False, runtime_ratio=False):
    inputs = {"x0": ([2, 5], F32)}
    inits = {}
    if runtime_ratio:
        inputs["r"] = ([], F32)
    else:
        inits["r"] = np.array(ratio, dtype=F32)
    args = ["x", "r"]
    if training is not None:
        inits["t"] = np.array(training)
        args.append("t")
    outputs = ["y", "m"] if mask_used else ["y"]
    # The Identity in front: an elimination may not rename a graph input onto an output.
    nodes = [node("Identity", ["x0"], "x"), node("Dropout", args, outputs)]
    return build(nodes, inputs, outputs=outputs, inits=inits)


@pytest.mark.parametrize("training", [None, True, False])
def test_zero_ratio_goes_whatever_the_mode(training):
    assert ops(fire(_dropout(0.0, training), "dropout-zero-ratio")) == ["Identity"]


def test_nonzero_ratio_in_training_mode_stays():
    no_fire(_dropout(0.1, True), "dropout-zero-ratio")


def test_runtime_ratio_stays():
    no_fire(_dropout(0.0, True, runtime_ratio=True), "dropout-zero-ratio")


def test_used_mask_keeps_the_dropout():
    no_fire(_dropout(0.0, True, mask_used=True), "dropout-zero-ratio")


def test_rule_is_in_the_core_pack():
    assert "dropout-zero-ratio" in RULES
