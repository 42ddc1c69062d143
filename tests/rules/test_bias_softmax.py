"""rules/ort/bias_softmax.yaml: Softmax(X + bias) over the last axis into BiasSoftmax.

BiasSoftmax runs on CUDA and ROCm only: the rule fires for `--target cuda`,
never for `cpu`, and outputs are compared through the op's reference
definition (rules/ort/reference/bias_softmax.yaml). The derived property tests
(tests/proof) draw the shapes; here: onnxruntime's own BiasSoftmax test
models, the two broadcast styles, and the shapes that must stay.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from helpers import assert_close, make_model, random_feeds, run
from onnx import TensorProto, helper

from onnxfuse.api import optimize_file, select_rules
from onnxfuse.language.packs import load_builtin_rules
from onnxfuse.passes.pipeline import Options
from onnxfuse.proof.reference_ops import with_reference_definitions
from onnxfuse.targets.capabilities import load_target

PEERS = Path(__file__).parent.parent / "data" / "ort-fusion"
RULE = [r for r in load_builtin_rules(["ort"]) if r.name == "ort-bias-softmax"]
DIMS = {f"d_{i}": 2 + i % 3 for i in range(9)}


@pytest.fixture(scope="module")
def all_rules():
    return select_rules()


def _optimize(model_or_path, tmp_path: Path, target: str, rules=RULE) -> onnx.ModelProto:
    src = model_or_path
    if isinstance(model_or_path, onnx.ModelProto):
        src = tmp_path / "in.onnx"
        onnx.save(model_or_path, src)
    out = tmp_path / "out.onnx"
    optimize_file(src, out, rules, Options(target=load_target(target)))
    return onnx.load(out)


def _fused(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    return [n for n in model.graph.node if n.op_type == "BiasSoftmax"]


def _same_outputs(original: onnx.ModelProto, result: onnx.ModelProto, dims=None) -> None:
    feeds = random_feeds(original, dims=dims)
    assert_close(run(with_reference_definitions(result), feeds), run(original, feeds))


@pytest.mark.parametrize(
    "name", ["bias_softmax_fusion_simple.onnx", "bias_softmax_fusion_simple_no_axis_opset13.onnx"]
)
def test_peer_models_fuse_for_cuda(name, tmp_path, all_rules):
    original = onnx.load(PEERS / name)
    result = _optimize(PEERS / name, tmp_path, "cuda", all_rules)
    (node,) = _fused(result)
    assert len(result.graph.node) == 1
    assert {a.name: a.i for a in node.attribute} == {"axis": 1, "is_inner_broadcast": 0}
    _same_outputs(original, result, DIMS)


@pytest.mark.parametrize(
    "name",
    [
        # Softmax over axis 6 of 9 (opset 21: that axis alone); BiasSoftmax would
        # normalize over axes 6-8.
        "bias_softmax_fusion_middleones.onnx",
        "bias_softmax_fusion_middleones_badaxis.onnx",
        "bias_softmax_fusion_allleadingones.onnx",
    ],
)
def test_peer_models_over_an_inner_axis_stay(name, tmp_path, all_rules):
    assert not _fused(_optimize(PEERS / name, tmp_path, "cuda", all_rules))


def test_cpu_has_no_bias_softmax(tmp_path, all_rules):
    result = _optimize(PEERS / "bias_softmax_fusion_simple.onnx", tmp_path, "cpu", all_rules)
    assert not _fused(result)


def _model(x_shape, b_shape, axis=-1, opset=17, dtype=TensorProto.FLOAT):
    nodes = [
        helper.make_node("Add", ["x", "b"], ["s"]),
        helper.make_node("Softmax", ["s"], ["y"], axis=axis),
    ]
    return make_model(
        nodes,
        [
            helper.make_tensor_value_info("x", dtype, x_shape),
            helper.make_tensor_value_info("b", dtype, b_shape),
        ],
        [helper.make_tensor_value_info("y", dtype, x_shape)],
        opset=opset,
    )


@pytest.mark.parametrize(
    ("x_shape", "b_shape", "inner"),
    [
        ([2, 3, 4, 4], [1, 1, 4, 4], 0),  # a mask shared by batch and heads
        ([2, 3, 4, 4], [4], 0),
        ([2, 3, 4, 4], [2, 1, 1, 4], 1),  # a per-batch padding mask
        (["N", 3, 4, 4], ["N", 1, 1, 4], 1),
        ([2, 3, 4, 4], [2, 3, 4, 4], 0),
    ],
)
def test_broadcast_styles(x_shape, b_shape, inner, tmp_path):
    original = _model(x_shape, b_shape)
    result = _optimize(original, tmp_path, "cuda")
    (node,) = _fused(result)
    assert {a.name: a.i for a in node.attribute} == {"axis": 3, "is_inner_broadcast": inner}
    _same_outputs(original, result, {"N": 2})


@pytest.mark.parametrize(
    ("x_shape", "b_shape", "axis"),
    [
        ([2, 3, 4, 4], [1, 3, 1, 4], -1),  # broadcast in the middle only: neither style
        ([2, 3, 4, 4], [2, 1, 4, 1], -1),  # the bias constant along the softmax axis
        ([2, 3, 4, 4], [1, 1, 4, 4], 2),  # softmax over an inner axis
        (["N", 4], ["M", 4], -1),  # two symbolic dims that may differ
    ],
)
def test_shapes_that_stay(x_shape, b_shape, axis, tmp_path):
    assert not _fused(_optimize(_model(x_shape, b_shape, axis), tmp_path, "cuda"))


def test_reference_definition_normalizes_from_axis_on():
    # The schema: softmax "to elements for dimensions axis or higher".
    node = helper.make_node(
        "BiasSoftmax", ["x", "b"], ["y"], domain="com.microsoft", axis=1, is_inner_broadcast=0
    )
    model = make_model(
        [node],
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4]),
            helper.make_tensor_value_info("b", TensorProto.FLOAT, [3, 4]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3, 4])],
        opset=17,
        extra_opsets={"com.microsoft": 1},
    )
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 4)).astype(np.float32)
    b = rng.standard_normal((3, 4)).astype(np.float32)
    (y,) = run(with_reference_definitions(model), {"x": x, "b": b})
    s = (x + b).reshape(2, 12)
    e = np.exp(s - s.max(axis=1, keepdims=True))
    np.testing.assert_allclose(y, (e / e.sum(axis=1, keepdims=True)).reshape(2, 3, 4), rtol=1e-6)
