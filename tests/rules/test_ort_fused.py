"""The ort pack's activation fusions: each fires where it should and keeps numerics."""

from __future__ import annotations

import numpy as np
import pytest
from core_pack_support import as_arrays, build, node, special_feeds
from helpers import assert_close, optimize_proto, run

from onnxfuse.language.packs import load_builtin_rules
from onnxfuse.targets.capabilities import load_target

RULES = {rule.name: rule for rule in load_builtin_rules(["ort"])}
F32 = np.float32
RNG = np.random.default_rng(7)


def weights(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(F32)


def conv_then(activation: str, *, bias: bool = True, dtype=F32, extra=None, **act_attrs):
    inits = {"w": weights(4, 3, 3, 3).astype(dtype)}
    conv_inputs = ["x", "w"]
    if bias:
        inits["b"] = weights(4).astype(dtype)
        conv_inputs.append("b")
    act_inputs = ["c", *(extra or {}).keys()]
    inits.update(extra or {})
    nodes = [
        node("Conv", conv_inputs, "c", pads=[1, 1, 1, 1]),
        node(activation, act_inputs, "y", **act_attrs),
    ]
    return build(nodes, {"x": ([1, 3, 6, 6], dtype)}, inits=inits)


def fires(model, name: str, target: str = "cpu"):
    report, result = optimize_proto(model, [RULES[name]], target=load_target(target))
    assert report.rules[name].applied == 1, f"{name} did not fire"
    assert "FusedConv" in [n.op_type for n in result.graph.node] or "FusedGemm" in [
        n.op_type for n in result.graph.node
    ]
    for feeds in (special_feeds(model), as_arrays(special_feeds(model, seed=3))):
        assert_close(run(result, feeds), run(model, feeds))
    return result


def does_not_fire(model, name: str, target: str = "cpu"):
    report, result = optimize_proto(model, [RULES[name]], target=load_target(target))
    assert report.rules[name].applied == 0
    assert len(result.graph.node) == len(model.graph.node)


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize(
    ("activation", "rule", "attrs"),
    [
        ("Relu", "fused-conv-relu", {}),
        ("Sigmoid", "fused-conv-sigmoid", {}),
        ("Tanh", "fused-conv-tanh", {}),
        ("LeakyRelu", "fused-conv-leakyrelu", {"alpha": 0.2}),
        ("HardSigmoid", "fused-conv-hardsigmoid", {"alpha": 0.3, "beta": 0.4}),
    ],
)
def test_conv_activation_fuses(activation, rule, attrs, bias):
    result = fires(conv_then(activation, bias=bias, **attrs), rule)
    fused = next(n for n in result.graph.node if n.op_type == "FusedConv")
    assert {a.name for a in fused.attribute} >= {"activation", "pads"}


@pytest.mark.parametrize(
    "bounds",
    [
        {"lo": np.array(0.0, F32), "hi": np.array(6.0, F32)},
        {"lo": np.array(-1.5, F32)},
    ],
)
def test_conv_clip_fuses_with_constant_bounds(bounds):
    result = fires(conv_then("Clip", extra=bounds), "fused-conv-clip")
    fused = next(n for n in result.graph.node if n.op_type == "FusedConv")
    params = next(a for a in fused.attribute if a.name == "activation_params")
    assert params.floats[0] == pytest.approx(float(bounds["lo"]))


def test_conv_clip_with_runtime_bound_does_not_fuse():
    nodes = [
        node("Conv", ["x", "w"], "c"),
        node("Clip", ["c", "lo"], "y"),
    ]
    model = build(
        nodes, {"x": ([1, 3, 6, 6], F32), "lo": ([], F32)}, inits={"w": weights(4, 3, 3, 3)}
    )
    does_not_fire(model, "fused-conv-clip")


def test_float16_conv_is_not_fused_for_cpu():
    does_not_fire(conv_then("Relu", dtype=np.float16), "fused-conv-relu")


def test_fusion_needs_a_target_that_runs_fusedconv():
    does_not_fire(conv_then("Relu"), "fused-conv-relu", target="onnx")


def test_conv_output_used_elsewhere_blocks_fusion():
    nodes = [
        node("Conv", ["x", "w"], "c"),
        node("Relu", ["c"], "y"),
        node("Neg", ["c"], "z"),
    ]
    model = build(
        nodes, {"x": ([1, 3, 6, 6], F32)}, outputs=("y", "z"), inits={"w": weights(4, 3, 3, 3)}
    )
    does_not_fire(model, "fused-conv-relu")


def _residual(z_shape):
    nodes = [
        node("Conv", ["x", "w", "b"], "c", pads=[1, 1, 1, 1]),
        node("Add", ["z", "c"], "s"),
        node("Relu", ["s"], "y"),
    ]
    return build(
        nodes,
        {"x": ([1, 3, 6, 6], F32), "z": (z_shape, F32)},
        inits={"w": weights(4, 3, 3, 3), "b": weights(4)},
    )


def test_conv_add_relu_fuses_residual():
    result = fires(_residual([1, 4, 6, 6]), "fused-conv-add-relu")
    fused = next(n for n in result.graph.node if n.op_type == "FusedConv")
    assert len(fused.input) == 4


def test_conv_add_relu_needs_same_shape_residual():
    does_not_fire(_residual([1, 4, 1, 1]), "fused-conv-add-relu")


def _gemm_relu(**gemm_attrs):
    nodes = [node("Gemm", ["a", "b", "c"], "g", **gemm_attrs), node("Relu", ["g"], "y")]
    return build(nodes, {"a": ([3, 5], F32)}, inits={"b": weights(5, 4), "c": weights(4)})


@pytest.mark.parametrize("attrs", [{}, {"alpha": 0.5, "beta": 2.0}])
def test_gemm_relu_fuses_and_keeps_gemm_attributes(attrs):
    result = fires(_gemm_relu(**attrs), "fused-gemm-relu")
    fused = next(n for n in result.graph.node if n.op_type == "FusedGemm")
    assert {a.name for a in fused.attribute} >= {"activation", *attrs}


def test_gemm_sigmoid_is_not_a_gemm_relu():
    nodes = [node("Gemm", ["a", "b"], "g"), node("Sigmoid", ["g"], "y")]
    model = build(nodes, {"a": ([3, 5], F32)}, inits={"b": weights(5, 4)})
    does_not_fire(model, "fused-gemm-relu")


def test_conv_sum_relu_fuses_residual():
    nodes = [
        node("Conv", ["x", "w", "b"], "c", pads=[1, 1, 1, 1]),
        node("Sum", ["c", "z"], "s"),
        node("Relu", ["s"], "y"),
    ]
    model = build(
        nodes,
        {"x": ([1, 3, 6, 6], F32), "z": ([1, 4, 6, 6], F32)},
        inits={"w": weights(4, 3, 3, 3), "b": weights(4)},
    )
    fires(model, "fused-conv-add-relu")
