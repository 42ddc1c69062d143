"""Channels-last regions across Resize and Split (rules/core/transpose_split_resize.yaml).

An FPN/U-Net upsampling (Conv, Resize x2, Conv) and a channel Split feeding two
convs, optimized for `cuda:layout=nhwc`: the Transposes the NhwcConv rules put
around each conv cancel across the Resize and the Split, so only the region's
borders keep one; the outputs equal the original's with NhwcConv run as its
reference definition.
"""

from __future__ import annotations

import collections
import functools

import numpy as np
import onnx
import pytest
from helpers import make_model, optimize_proto, run, tensor_input
from onnx import helper, numpy_helper

from onnxfuse import api
from onnxfuse.proof.reference_ops import with_reference_definitions
from onnxfuse.targets.capabilities import load_target

RNG = np.random.default_rng(3)


def _weights(name: str, shape: list[int]) -> onnx.TensorProto:
    return numpy_helper.from_array(RNG.standard_normal(shape).astype(np.float32), name)


@functools.cache
def _rules(spec: str):
    target = load_target(spec)
    return target, api.select_rules(target=target)


def _optimize(model: onnx.ModelProto, spec: str) -> onnx.ModelProto:
    target, rules = _rules(spec)
    return optimize_proto(model, rules, target=target)[1]


def _ops(model: onnx.ModelProto) -> collections.Counter:
    return collections.Counter(
        f"{n.domain}::{n.op_type}" if n.domain else n.op_type for n in model.graph.node
    )


def _same_outputs(model: onnx.ModelProto, ours: onnx.ModelProto, x_shape: list[int]) -> None:
    x = RNG.standard_normal(x_shape).astype(np.float32)
    want = run(model, {"X": x})
    got = run(with_reference_definitions(ours), {"X": x})
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def _upsampling_model(mode: str) -> onnx.ModelProto:
    nodes = [
        helper.make_node("Conv", ["X", "W1"], ["C1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["C1"], ["R"]),
        helper.make_node("Resize", ["R", "", "S"], ["U"], mode=mode),
        helper.make_node("Conv", ["U", "W2"], ["Y"]),
    ]
    scales = numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "S")
    return make_model(
        nodes,
        [tensor_input("X", [1, 3, 6, 6])],
        [tensor_input("Y", [1, 4, 12, 12])],
        [_weights("W1", [8, 3, 3, 3]), _weights("W2", [4, 8, 1, 1]), scales],
    )


@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_an_upsampling_keeps_transposes_only_at_the_borders(mode):
    model = _upsampling_model(mode)
    ours = _optimize(model, "cuda:layout=nhwc")
    ops = _ops(ours)
    assert ops["com.microsoft::NhwcConv"] == 2 and ops["Transpose"] == 2, ops
    (resize,) = [n for n in ours.graph.node if n.op_type == "Resize"]
    scales = {i.name: numpy_helper.to_array(i) for i in ours.graph.initializer}[resize.input[2]]
    assert scales.tolist() == [1, 2, 2, 1]  # the Resize runs on the NHWC tensor
    _same_outputs(model, ours, [1, 3, 6, 6])


def test_a_cubic_upsampling_is_left_between_transposes():
    """Cubic is separable too, but not written: the Resize keeps its NCHW input."""
    ours = _optimize(_upsampling_model("cubic"), "cuda:layout=nhwc")
    assert _ops(ours)["Transpose"] == 4


def _split_model(second_consumer: str) -> onnx.ModelProto:
    nodes = [
        helper.make_node("Conv", ["X", "W1"], ["C1"], pads=[1, 1, 1, 1]),
        helper.make_node("Split", ["C1", "S"], ["A", "B"], axis=1),
        helper.make_node("Conv", ["A", "WA"], ["YA"]),
    ]
    if second_consumer == "Conv":
        nodes.append(helper.make_node("Conv", ["B", "WB"], ["YB"]))
    else:
        nodes.append(helper.make_node("ReduceSum", ["B"], ["YB"], keepdims=1))
    split = numpy_helper.from_array(np.array([4, 4], np.int64), "S")
    yb = [1, 2, 6, 6] if second_consumer == "Conv" else [1, 1, 1, 1]
    return make_model(
        nodes,
        [tensor_input("X", [1, 3, 6, 6])],
        [tensor_input("YA", [1, 2, 6, 6]), tensor_input("YB", yb)],
        [
            _weights("W1", [8, 3, 3, 3]),
            _weights("WA", [2, 4, 1, 1]),
            _weights("WB", [2, 4, 1, 1]),
            split,
        ],
    )


def test_a_split_between_channels_last_convs_keeps_transposes_only_at_the_borders():
    model = _split_model("Conv")
    ours = _optimize(model, "cuda:layout=nhwc")
    ops = _ops(ours)
    # input, and one per output: without the Split rule 6 (two per branch, two around it)
    assert ops["com.microsoft::NhwcConv"] == 3 and ops["Transpose"] == 3, ops
    (split,) = [n for n in ours.graph.node if n.op_type == "Split"]
    assert [a.i for a in split.attribute if a.name == "axis"] == [3]
    _same_outputs(model, ours, [1, 3, 6, 6])


def test_a_split_with_an_output_not_transposed_keeps_its_transpose():
    """One output feeds a ReduceSum over every axis: moving the Transpose would add one."""
    model = _split_model("ReduceSum")
    ours = _optimize(model, "cuda:layout=nhwc")
    (split,) = [n for n in ours.graph.node if n.op_type == "Split"]
    assert [a.i for a in split.attribute if a.name == "axis"] == [1]
    _same_outputs(model, ours, [1, 3, 6, 6])
