"""rules/qdq/cleanup.yaml (every target) and rules/qdq_cpu/cleanup.yaml (cpu) on
hand-built QDQ graphs: which target gets which cleanup, the int8 -> uint8 conversion where
onnxruntime's own leaves a QuantizeLinear with several consumers, and the cases the rules
must leave alone (per-axis scales, a DequantizeLinear with another use). Each rule's own
property tests and domain negatives are in tests/proof."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnxruntime as ort
import pytest
from helpers import make_model, optimize_proto, run, tensor_input
from onnx import TensorProto, helper, numpy_helper

from onnxfuse.api import select_rules
from onnxfuse.targets.capabilities import load_target

CPU_ONLY = ("qdq-drop[Transpose]", "qdq-relu-quantize", "qdq-clip-quantize", "qdq-s8-to-u8")
EVERY_TARGET = ("qdq-dequantize-quantize", "qdq-propagate-forward[Transpose]")


def _scalar(name: str, value, dtype) -> TensorProto:
    return numpy_helper.from_array(np.array(value, dtype=dtype), name)


def _ops(model) -> Counter[str]:
    return Counter(n.op_type for n in model.graph.node)


def _optimize(model, target: str):
    return optimize_proto(model, select_rules(target=target), target=load_target(target))[1]


@pytest.mark.parametrize("target", ["qnn", "nnapi", "xnnpack", "coreml", "dml"])
def test_providers_that_consume_node_units_get_only_the_level_one_cleanups(target):
    names = {rule.name for rule in select_rules(target=target)}
    assert not names & set(CPU_ONLY), names & set(CPU_ONLY)
    assert set(EVERY_TARGET) <= names


def test_cpu_gets_every_cleanup():
    names = {rule.name for rule in select_rules(target="cpu")}
    assert set(CPU_ONLY) | set(EVERY_TARGET) <= names


def _residual(zero_point: int = 3, scale: float = 0.05):
    """x -> Q(int8) read by two DequantizeLinears: a Relu branch and the residual Add,
    each quantized again: the shape of a ResNet block's shortcut."""
    inits = [
        _scalar("s", scale, np.float32),
        _scalar("z", zero_point, np.int8),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
        helper.make_node("DequantizeLinear", ["q", "s", "z"], ["d1"]),
        helper.make_node("DequantizeLinear", ["q", "s", "z"], ["d2"]),
        helper.make_node("Relu", ["d1"], ["r"]),
        helper.make_node("Add", ["r", "d2"], ["a"]),
        helper.make_node("QuantizeLinear", ["a", "s", "z"], ["qa"]),
        helper.make_node("DequantizeLinear", ["qa", "s", "z"], ["y"]),
    ]
    return make_model(
        nodes, [tensor_input("x", [2, 8])], [tensor_input("y", [2, 8])], inits, opset=13
    )


def test_int8_pairs_with_several_consumers_become_uint8_exactly():
    model = _residual()
    optimized = _optimize(model, "cpu")
    types = {i.name: i.data_type for i in optimized.graph.initializer}
    zero_points = [n.input[2] for n in optimized.graph.node if "Quantize" in n.op_type]
    assert zero_points and all(types[z] == TensorProto.UINT8 for z in zero_points)
    assert _ops(optimized)["QuantizeLinear"] == 2  # one per quantized value, as before
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((2, 8)) * 8).astype(np.float32)  # saturates at both ends
    np.testing.assert_array_equal(run(optimized, {"x": x})[0], run(model, {"x": x})[0])


def test_onnxruntime_leaves_the_shared_int8_pair_that_onnxfuse_converts(tmp_path):
    # The reason for going past onnxruntime: its QDQS8ToU8Transformer converts only a
    # QuantizeLinear with one consumer, so the shortcut stays int8 on x86.
    path, saved = tmp_path / "m.onnx", tmp_path / "ort.onnx"
    path.write_bytes(_residual().SerializeToString())
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    options.optimized_model_filepath = str(saved)
    ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    from onnx import load

    theirs = load(saved)
    types = {i.name: i.data_type for i in theirs.graph.initializer}
    first_q = next(n for n in theirs.graph.node if n.op_type == "QuantizeLinear")
    assert types[first_q.input[2]] == TensorProto.INT8


def test_qnn_keeps_int8_and_the_units():
    model = _residual()
    optimized = _optimize(model, "qnn")
    # The two equal DequantizeLinears of q stay two (common-subexpression elimination
    # leaves Qs and DQs apart for such a target): one per unit, as the model has them.
    assert _ops(optimized) == _ops(model)
    types = {i.name: i.data_type for i in optimized.graph.initializer}
    pairs = [n for n in optimized.graph.node if "Quantize" in n.op_type]
    assert all(types[n.input[2]] == TensorProto.INT8 for n in pairs)


def _double_pair_then_transpose():
    """x -> Q -> DQ -> Q -> DQ (equal parameters) -> Transpose -> Add -> Q -> DQ: a DQ -> Q
    pair to cancel, and a Transpose no Q reads, which propagation makes a unit."""
    inits = [_scalar("s", 0.05, np.float32), _scalar("z", 131, np.uint8)]  # nnapi: uint8
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q1"]),
        helper.make_node("DequantizeLinear", ["q1", "s", "z"], ["d1"]),
        helper.make_node("QuantizeLinear", ["d1", "s", "z"], ["q2"]),
        helper.make_node("DequantizeLinear", ["q2", "s", "z"], ["d2"]),
        helper.make_node("Transpose", ["d2"], ["t"], perm=[1, 0]),
        helper.make_node("Add", ["t", "t"], ["a"]),
        helper.make_node("QuantizeLinear", ["a", "s", "z"], ["qa"]),
        helper.make_node("DequantizeLinear", ["qa", "s", "z"], ["y"]),
    ]
    return make_model(
        nodes, [tensor_input("x", [2, 8])], [tensor_input("y", [8, 2])], inits, opset=13
    )


@pytest.mark.parametrize("target", ["qnn", "nnapi", "dml"])
def test_the_level_one_cleanups_fire_for_providers_that_consume_units(target):
    # onnxruntime runs them for every provider before partitioning; they touch only Qs
    # and DQs that belong to no unit (keeps_units: true), and leave the units whole.
    model = _double_pair_then_transpose()
    report, optimized = optimize_proto(
        model, select_rules(target=target), target=load_target(target)
    )
    assert report.rules["qdq-dequantize-quantize"].applied == 1
    assert report.rules["qdq-propagate-forward[Transpose]"].applied == 1
    # One pair gone, one pair after the Transpose: DQ -> Transpose -> Q and DQ -> Add -> Q.
    assert _ops(optimized) == _ops(model)
    order = [n.op_type for n in optimized.graph.node]
    assert order.index("Transpose") < order.index("QuantizeLinear", order.index("Transpose"))
    x = (np.random.default_rng(0).standard_normal((2, 8)) * 8).astype(np.float32)
    np.testing.assert_array_equal(run(optimized, {"x": x})[0], run(model, {"x": x})[0])


def _dq_transpose_q(axis_scale: bool, shared: bool = False):
    shape = [3, 4]
    if axis_scale:
        inits = [
            numpy_helper.from_array(np.array([0.1, 0.2, 0.3], np.float32), "s"),
            numpy_helper.from_array(np.array([1, 2, 3], np.uint8), "z"),
        ]
    else:
        inits = [_scalar("s", 0.1, np.float32), _scalar("z", 7, np.uint8)]
    nodes = [
        helper.make_node("DequantizeLinear", ["x", "s", "z"], ["d"], axis=0),
        helper.make_node("Transpose", ["d"], ["t"], perm=[1, 0]),
        # Per axis, the output's channels are the input's: axis 1 after the Transpose.
        helper.make_node("QuantizeLinear", ["t", "s", "z"], ["y"], axis=1),
    ]
    outputs = [tensor_input("y", shape[::-1], TensorProto.UINT8)]
    if shared:
        nodes.append(helper.make_node("Neg", ["d"], ["n"]))
        outputs.append(tensor_input("n", shape))
    return make_model(nodes, [tensor_input("x", shape, TensorProto.UINT8)], outputs, inits, 13)


def test_a_per_tensor_pair_around_transpose_is_dropped_on_cpu():
    optimized = _optimize(_dq_transpose_q(axis_scale=False), "cpu")
    assert _ops(optimized) == Counter({"Transpose": 1})


def test_per_axis_parameters_are_left_alone():
    # onnxruntime's drop asks for scalar parameters; a per-axis pair, even one whose axis
    # follows the Transpose, is not dropped.
    model = _dq_transpose_q(axis_scale=True)
    assert _ops(_optimize(model, "cpu")) == _ops(model)


def test_a_dequantize_with_another_use_stays():
    model = _dq_transpose_q(axis_scale=False, shared=True)
    optimized = _optimize(model, "cpu")
    assert _ops(optimized)["DequantizeLinear"] == 1 and _ops(optimized)["QuantizeLinear"] == 1
