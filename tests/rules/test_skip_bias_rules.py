"""ort-skip-layer-norm-fold-bias(-sum) (rules/ort/skip_bias.yaml): a bias Add in front of a
SkipLayerNormalization that has none folds into its fifth input, on either summand, with
the residual-sum output used or not; and on the GPT-2 graph where it arises (the residual
fused before the Conv1D's Gemm became MatMul + Add)."""

from __future__ import annotations

import numpy as np
import pytest
from core_pack_support import node
from helpers import assert_close, make_model, optimize_proto, random_feeds, run, tensor_input
from onnx import numpy_helper

from onnxfuse.language.packs import load_builtin_rules
from onnxfuse.targets.capabilities import load_target

RULES = {rule.name: rule for rule in load_builtin_rules(["ort", "core"])}
FOLD, FOLD_SUM = "ort-skip-layer-norm-fold-bias", "ort-skip-layer-norm-fold-bias-sum"
F32 = np.float32
H = 8
MS = "com.microsoft"


def skip_ln(bias_on: int = 0, with_sum: bool = False, bias_shape=(H,), has_bias=False):
    """SkipLayerNormalization(Add(X, b), skip, gamma, beta) (bias_on=1: the Add is the skip)."""
    rng = np.random.default_rng(5)
    inits = {
        "b": rng.standard_normal(bias_shape).astype(F32),
        "gamma": rng.standard_normal((H,)).astype(F32),
        "beta": rng.standard_normal((H,)).astype(F32),
        "b2": rng.standard_normal((H,)).astype(F32),
    }
    summands = ["xb", "skip"] if bias_on == 0 else ["skip", "xb"]
    inputs = [*summands, "gamma", "beta"] + (["b2"] if has_bias else [])
    outputs = ["y", "mean", "inv_std", "sum"] if with_sum else ["y"]
    nodes = [
        node("Add", ["X", "b"], "xb"),
        node("SkipLayerNormalization", inputs, outputs, domain=MS, epsilon=1e-5),
    ]
    if with_sum:
        nodes.append(node("Relu", ["sum"], "r"))
    dims = ["batch", "seq", H]
    return model_of(nodes, dims, dims, inits, ["y", "r"] if with_sum else ["y"])


def model_of(nodes, x_dims, skip_dims, inits, outputs):
    """onnx cannot infer com.microsoft ops: every output is declared [batch, seq, H]."""
    return make_model(
        nodes,
        [tensor_input("X", x_dims), tensor_input("skip", skip_dims)],
        [tensor_input(name, skip_dims) for name in outputs],
        [numpy_helper.from_array(a, n) for n, a in inits.items()],
        opset=17,
        extra_opsets={MS: 1},
    )


def fold(model, name: str):
    report, result = optimize_proto(model, [RULES[name]], target=load_target("cpu"))
    return report.rules[name].applied, result


@pytest.mark.parametrize("bias_on", [0, 1])
@pytest.mark.parametrize("with_sum", [False, True])
def test_bias_folds_into_the_fifth_input(bias_on, with_sum):
    model = skip_ln(bias_on=bias_on, with_sum=with_sum)
    name = FOLD_SUM if with_sum else FOLD
    applied, result = fold(model, name)
    assert applied == 1
    (fused,) = [n for n in result.graph.node if n.op_type == "SkipLayerNormalization"]
    assert "Add" not in [n.op_type for n in result.graph.node]
    assert fused.input[4] == "b"
    feeds = random_feeds(model, dims={"batch": 2, "seq": 3})
    assert_close(run(result, feeds), run(model, feeds))


def test_without_the_sum_output_the_sum_rule_does_not_fire():
    applied, _ = fold(skip_ln(with_sum=False), FOLD_SUM)
    assert applied == 0


def test_a_used_sum_blocks_the_plain_rule():
    applied, _ = fold(skip_ln(with_sum=True), FOLD)
    assert applied == 0


def test_a_skip_layer_norm_with_a_bias_is_left_alone():
    applied, _ = fold(skip_ln(has_bias=True), FOLD)
    assert applied == 0


def test_a_bias_that_broadcasts_over_rows_does_not_fold():
    model = model_of(
        [
            node("Add", ["X", "b"], "xb"),
            node("SkipLayerNormalization", ["xb", "skip", "gamma"], "y", domain=MS),
        ],
        [2, 3, H],
        [2, 3, H],
        {"b": np.ones((3, H), F32), "gamma": np.ones((H,), F32)},
        ["y"],
    )
    applied, _ = fold(model, FOLD)
    assert applied == 0
