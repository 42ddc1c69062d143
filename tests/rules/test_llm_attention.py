"""llm-scores-key-transpose (rules/llm/attention.yaml): the Kᵀ that torch's SDPA
decomposition writes as Reshape / Transpose / Reshape of the key heads becomes FusedMatMul's
transB; a split that is not the heads' order, or a reshape that is no transpose, stays."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from core_pack_support import node
from helpers import assert_close, make_model, optimize_proto, random_feeds, run, tensor_input
from onnx import numpy_helper

from onnxfuse.language.packs import load_builtin_rules
from onnxfuse.targets.capabilities import load_target

RULE = "llm-scores-key-transpose"
RULES = {rule.name: rule for rule in load_builtin_rules(["llm"])}
B, N, S, T, H = 2, 4, 3, 5, 8


def scores(split=(B, N, H, T), merged=(-1, T, H)) -> onnx.ModelProto:
    inits = [
        numpy_helper.from_array(np.array(merged, np.int64), "s1"),
        numpy_helper.from_array(np.array(split, np.int64), "s2"),
    ]
    nodes = [
        node("Reshape", ["kh", "s1"], "k3"),
        node("Transpose", ["k3"], "k3t", perm=[0, 2, 1]),
        node("Reshape", ["k3t", "s2"], "kt"),
        onnx.helper.make_node(
            "FusedMatMul", ["q", "kt"], ["y"], domain="com.microsoft", alpha=H**-0.5
        ),
    ]
    return make_model(
        nodes,
        [tensor_input("q", [B, N, S, H]), tensor_input("kh", [B, N, T, H])],
        [tensor_input("y", [B, N, S, T])],
        inits,
        opset=18,
        extra_opsets={"com.microsoft": 1},
    )


def optimize(model):
    report, result = optimize_proto(model, [RULES[RULE]], target=load_target("cpu"))
    return report.rules[RULE].applied, result


def test_the_key_reshapes_become_trans_b():
    model = scores()
    applied, result = optimize(model)
    assert applied == 1
    (fused,) = result.graph.node
    assert fused.op_type == "FusedMatMul" and list(fused.input) == ["q", "kh"]
    assert {a.name: onnx.helper.get_attribute_value(a) for a in fused.attribute}["transB"] == 1
    feeds = random_feeds(model)
    assert_close(run(result, feeds), run(model, feeds))


@pytest.mark.parametrize(
    "split, merged, why",
    [
        ((N, B, H, T), (-1, T, H), "heads and batch swapped: another element order"),
        ((B, N, T, H), (-1, H, T), "the merged reshape keeps head and total swapped"),
    ],
)
def test_reshapes_that_are_not_the_transpose_stay(split, merged, why):
    applied, _ = optimize(scores(split, merged))
    assert applied == 0, why
