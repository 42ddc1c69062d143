"""QDQ node units: the `qdq` pack's fused quantized ops for cpu, units kept whole for the
targets that consume them (`quantization: qdq_units`), on models quantized at test time
with onnxruntime's own quantize_static."""

from __future__ import annotations

import collections

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from helpers import make_model, model_bytes, optimize_proto, run, tensor_input
from onnx import helper, numpy_helper
from onnxruntime.quantization import (
    CalibrationDataReader,
    QuantFormat,
    QuantType,
    matmul_nbits_quantizer,
    quantize_static,
)

from onnxfuse import api
from onnxfuse.cli.main import main
from onnxfuse.errors import OnnxfuseError, RuleError
from onnxfuse.language.rulefile import parse_rule_text
from onnxfuse.language.yaml_lines import load_yaml
from onnxfuse.rewrite.qdq_units import is_unit_op
from onnxfuse.targets.capabilities import TargetError, load_target, parse_target
from onnxfuse.targets.params import parse_params

UNIT_CONSUMERS = ["qnn", "nnapi", "coreml", "webnn", "tensorrt", "dml"]
FORMS = {
    "s8s8-per-channel": (QuantType.QInt8, QuantType.QInt8, True),
    "u8s8-per-tensor": (QuantType.QUInt8, QuantType.QInt8, False),
}


def _weight(rng, *shape):
    return (rng.standard_normal(shape) * 0.3).astype(np.float32)


def small_cnn() -> onnx.ModelProto:
    """Conv-Relu, Conv-Relu, a residual Add, global pooling, Flatten, Gemm and a MatMul."""
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(a, n)
        for n, a in [
            ("w1", _weight(rng, 8, 3, 3, 3)),
            ("b1", _weight(rng, 8)),
            ("w2", _weight(rng, 8, 8, 3, 3)),
            ("b2", _weight(rng, 8)),
            ("wg", _weight(rng, 6, 8)),
            ("bg", _weight(rng, 6)),
            ("wm", _weight(rng, 6, 5)),
        ]
    ]
    conv = {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], **conv),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], **conv),
        helper.make_node("Relu", ["c2"], ["r2"]),
        helper.make_node("Add", ["r1", "r2"], ["s"]),
        helper.make_node("GlobalAveragePool", ["s"], ["p"]),
        helper.make_node("Flatten", ["p"], ["f"]),
        helper.make_node("Gemm", ["f", "wg", "bg"], ["g"], transB=1),
        helper.make_node("MatMul", ["g", "wm"], ["y"]),
    ]
    return make_model(
        nodes, [tensor_input("x", [1, 3, 8, 8])], [tensor_input("y", [1, 5])], inits, opset=17
    )


class _Reader(CalibrationDataReader):
    def __init__(self, count: int = 4):
        rng = np.random.default_rng(1)
        self._feeds = iter(
            [{"x": rng.standard_normal((1, 3, 8, 8)).astype(np.float32)} for _ in range(count)]
        )

    def get_next(self):
        return next(self._feeds, None)


def quantized(model: onnx.ModelProto, form: str, tmp_path) -> onnx.ModelProto:
    activations, weights, per_channel = FORMS[form]
    source, out = tmp_path / "float.onnx", tmp_path / f"{form}.onnx"
    onnx.save(model, source)
    quantize_static(
        str(source),
        str(out),
        _Reader(),
        quant_format=QuantFormat.QDQ,
        activation_type=activations,
        weight_type=weights,
        per_channel=per_channel,
    )
    return onnx.load(out)


def optimized(model: onnx.ModelProto, target: str) -> onnx.ModelProto:
    resolved = load_target(target)
    _, result = optimize_proto(model, api.select_rules(target=resolved), target=resolved)
    return result


def steps(model: onnx.ModelProto, result: onnx.ModelProto) -> float:
    """The largest output difference in steps of the output's quantization scale."""
    feeds = {"x": np.random.default_rng(2).standard_normal((1, 3, 8, 8)).astype(np.float32)}
    dq = next(n for n in model.graph.node if n.output[0] == model.graph.output[0].name)
    scale = next(i for i in model.graph.initializer if i.name == dq.input[1])
    (want,), (got,) = run(model, feeds), run(result, feeds)
    return float(np.max(np.abs(got - want)) / numpy_helper.to_array(scale))


def counts(model: onnx.ModelProto) -> collections.Counter:
    return collections.Counter(n.op_type for n in model.graph.node)


# -- the capability field ------------------------------------------------------------


@pytest.mark.parametrize("name", UNIT_CONSUMERS)
def test_providers_that_consume_qdq_units_say_so_in_their_file(name):
    assert load_target(name).quantization == "qdq_units"
    assert load_target(name).keeps_qdq_units


@pytest.mark.parametrize("name", ["cpu", "xnnpack", "cuda", "onnx"])
def test_other_targets_take_fused_quantized_ops(name):
    assert load_target(name).quantization == "qlinear"


def test_a_bad_quantization_value_is_an_error_with_its_line(tmp_path):
    path = tmp_path / "npu.yaml"
    path.write_text("name: npu\nops: []\nquantization: qdq-units\n")
    with pytest.raises(TargetError, match=r"npu.yaml:3: 'quantization' must be one of qlinear"):
        parse_target(load_yaml(path.read_text()), path)


def test_targets_show_prints_the_quantization_mode(capsys):
    assert main(["targets", "show", "nnapi"]) == 0
    assert "quantization: qdq_units" in capsys.readouterr().out
    assert main(["targets", "show", "cpu"]) == 0
    assert "quantization:" not in capsys.readouterr().out


# -- cpu: node units into quantized ops ------------------------------------------------


@pytest.mark.parametrize(
    ("form", "target"),
    [("u8s8-per-tensor", "cpu"), ("s8s8-per-channel", "cpu:int8=on")],
)
def test_cpu_fuses_conv_gemm_and_matmul_units_without_moving_the_output(form, target, tmp_path):
    model = quantized(small_cnn(), form, tmp_path)
    result = optimized(model, target)
    ops = counts(result)
    assert ops["QLinearConv"] == 2 and ops["QGemm"] == 1 and ops["QLinearMatMul"] == 1
    assert ops["QLinearAdd"] == 1 and ops["QLinearGlobalAveragePool"] == 1
    assert ops["Conv"] == ops["Gemm"] == ops["MatMul"] == ops["Add"] == 0
    assert steps(model, result) <= 1
    assert model_bytes(result) <= 1.05 * model_bytes(model)
    # With int8 allowed, the activations stay as quantized (no int8 -> uint8 conversion).
    types = {i.name: i.data_type for i in result.graph.initializer}
    conv = next(n for n in result.graph.node if n.op_type == "QLinearConv")
    activations = onnx.TensorProto.INT8 if "int8" in target else onnx.TensorProto.UINT8
    assert types[conv.input[2]] == activations


def test_s8s8_units_fuse_on_plain_cpu_once_their_activations_are_uint8(tmp_path):
    """qdq_cpu's int8 -> uint8 conversion makes every Q -> DQ pair uint8 (zero point +128),
    and the units it leaves are U8S8 ones, which fuse without int8=on."""
    model = quantized(small_cnn(), "s8s8-per-channel", tmp_path)
    result = optimized(model, "cpu")
    ops = counts(result)
    assert ops["QLinearConv"] == 2 and ops["QLinearMatMul"] == 1 and ops["QGemm"] == 1
    assert ops["Conv"] == ops["MatMul"] == ops["Gemm"] == 0
    fused = [n for n in result.graph.node if n.op_type in ("QLinearConv", "QLinearMatMul")]
    types = {i.name: i.data_type for i in result.graph.initializer}
    assert {types[n.input[2]] for n in fused} == {onnx.TensorProto.UINT8}  # x's zero point
    assert {types[n.input[5]] for n in fused} == {onnx.TensorProto.INT8}  # w's
    assert steps(model, result) <= 1


def test_int8_activation_convs_stay_units_for_plain_cpu():
    """An int8 unit no Q -> DQ pair feeds (the model's input is int8) stays int8: onnxruntime
    fuses it on Arm only, its x86 int8 kernels being slower than the unit."""
    model = _conv_relu_unit(onnx.TensorProto.INT8, relu=False)
    assert counts(optimized(model, "cpu"))["Conv"] == 1
    result = optimized(model, "cpu:int8=on")
    assert [n.op_type for n in result.graph.node] == ["QLinearConv"]
    feeds = {"x": np.random.default_rng(0).integers(-128, 128, (1, 2, 3, 3)).astype(np.int8)}
    got, want = run(result, feeds)[0].astype(int), run(model, feeds)[0].astype(int)
    assert np.max(np.abs(got - want)) <= 1


def test_a_dequantized_matmul_with_a_float_output_becomes_matmul_integer_to_float():
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(np.array(0.02, np.float32), "xs"),
        numpy_helper.from_array(np.array(128, np.uint8), "xz"),
        numpy_helper.from_array(rng.integers(-127, 128, (4, 3)).astype(np.int8), "w"),
        numpy_helper.from_array(np.full([3], 0.01, np.float32), "ws"),
        numpy_helper.from_array(np.zeros([3], np.int8), "wz"),
    ]
    nodes = [
        helper.make_node("DequantizeLinear", ["x", "xs", "xz"], ["a"]),
        helper.make_node("DequantizeLinear", ["w", "ws", "wz"], ["b"], axis=1),
        helper.make_node("MatMul", ["a", "b"], ["y"]),
    ]
    model = make_model(
        nodes,
        [tensor_input("x", [2, 4], onnx.TensorProto.UINT8)],
        [tensor_input("y", [2, 3])],
        inits,
    )
    result = optimized(model, "cpu")
    assert [n.op_type for n in result.graph.node] == ["MatMulIntegerToFloat"]
    feeds = {"x": rng.integers(0, 256, (2, 4)).astype(np.uint8)}
    np.testing.assert_allclose(run(result, feeds)[0], run(model, feeds)[0], rtol=1e-5)


def _conv_relu_unit(
    activations: int = onnx.TensorProto.UINT8, relu: bool = True, y_zero: int | None = None
) -> onnx.ModelProto:
    """DQ -> Conv -> Relu -> Q; with the default ``y_zero`` (its type's lowest value) the
    Relu is left for the Q to make redundant."""
    rng = np.random.default_rng(0)
    dtype = helper.tensor_dtype_to_np_dtype(activations)
    lowest = int(np.iinfo(dtype).min)
    inits = [
        numpy_helper.from_array(np.array(0.02, np.float32), "xs"),
        numpy_helper.from_array(np.array(lowest + 128, dtype), "xz"),
        numpy_helper.from_array(rng.integers(-127, 128, (4, 2, 1, 1)).astype(np.int8), "w"),
        numpy_helper.from_array(np.array(0.01, np.float32), "ws"),
        numpy_helper.from_array(np.array(0, np.int8), "wz"),
        numpy_helper.from_array(np.array(0.05, np.float32), "ys"),
        numpy_helper.from_array(np.array(lowest if y_zero is None else y_zero, dtype), "yz"),
    ]
    nodes = [
        helper.make_node("DequantizeLinear", ["x", "xs", "xz"], ["a"]),
        helper.make_node("DequantizeLinear", ["w", "ws", "wz"], ["b"]),
        helper.make_node("Conv", ["a", "b"], ["c"]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("QuantizeLinear", ["r", "ys", "yz"], ["y"]),
    ]
    if not relu:
        nodes = [n for n in nodes if n.op_type != "Relu"]
        nodes[2].output[0] = "r"
    return make_model(
        nodes,
        [tensor_input("x", [1, 2, 3, 3], activations)],
        [tensor_input("y", [1, 4, 3, 3], activations)],
        inits,
    )


def test_a_float_fusion_leaves_the_conv_of_a_unit_alone():
    # Zero point 10: the Relu clamps where the Q does not, so it stays in the unit.
    result = optimized(_conv_relu_unit(y_zero=10), "cpu")
    assert "FusedConv" not in counts(result)
    assert counts(result)["Conv"] == 1 and counts(result)["Relu"] == 1


def test_a_relu_the_q_makes_redundant_goes_and_the_unit_fuses_on_cpu():
    # qdq_cpu's qdq-relu-quantize drops it (zero point 0), then qdq-conv fuses the unit.
    model = _conv_relu_unit()
    result = optimized(model, "cpu")
    assert [n.op_type for n in result.graph.node] == ["QLinearConv"]
    feeds = {"x": np.random.default_rng(0).integers(0, 256, (1, 2, 3, 3)).astype(np.uint8)}
    got, want = run(result, feeds)[0].astype(int), run(model, feeds)[0].astype(int)
    assert np.max(np.abs(got - want)) <= 1


# -- units kept whole for the providers that consume them ------------------------------


def _units(model: onnx.ModelProto) -> list[tuple[str, tuple[str, ...]]]:
    """Each unit op with the op types around it (its DQs, its Qs)."""
    graph = ir.from_proto(model).graph
    found = []
    for node in graph:
        if is_unit_op(node):
            around = [v.producer().op_type for v in node.inputs if v is not None and v.producer()]
            around += [use.node.op_type for out in node.outputs for use in out.uses()]
            found.append((node.op_type, tuple(sorted(around))))
    return sorted(found)


@pytest.mark.parametrize("target", ["qnn", "nnapi"])
@pytest.mark.parametrize("form", list(FORMS))
def test_every_unit_is_still_a_unit_for_providers_that_consume_them(target, form, tmp_path):
    model = quantized(small_cnn(), form, tmp_path)
    result = optimized(model, target)
    assert _units(result) == _units(model) and len(_units(model)) >= 7
    assert counts(result) == counts(model)


def _two_sigmoid_units() -> onnx.ModelProto:
    """Two Sigmoid units on one DQ, quantized alike (a model the graph fuzzer found)."""
    inits = [
        numpy_helper.from_array(np.asarray(np.float32(0.02)), "s"),
        numpy_helper.from_array(np.asarray(np.uint8(128)), "z"),
        numpy_helper.from_array(np.asarray(np.float32(1 / 256)), "ys"),
        numpy_helper.from_array(np.asarray(np.uint8(0)), "yz"),
    ]
    nodes = [helper.make_node("DequantizeLinear", ["x", "s", "z"], ["d"])]
    for i in (1, 2):
        nodes += [
            helper.make_node("Sigmoid", ["d"], [f"f{i}"], name=f"sigmoid{i}"),
            helper.make_node("QuantizeLinear", [f"f{i}", "ys", "yz"], [f"y{i}"]),
        ]
    outputs = [tensor_input(f"y{i}", [1, 4], onnx.TensorProto.UINT8) for i in (1, 2)]
    return make_model(
        nodes, [tensor_input("x", [1, 4], onnx.TensorProto.UINT8)], outputs, inits, opset=17
    )


@pytest.mark.parametrize("target", ["qnn", "nnapi"])
def test_two_equal_units_on_one_dq_stay_two_units(target):
    # Common-subexpression elimination would leave one Sigmoid feeding both Qs: no unit.
    model = _two_sigmoid_units()
    result = optimized(model, target)
    assert (
        _units(result) == _units(model) == [("Sigmoid", ("DequantizeLinear", "QuantizeLinear"))] * 2
    )


def test_the_relu_of_a_unit_is_kept_for_nnapi():
    result = optimized(_conv_relu_unit(), "nnapi")
    assert [n.op_type for n in result.graph.node] == [
        "DequantizeLinear",
        "DequantizeLinear",
        "Conv",
        "Relu",
        "QuantizeLinear",
    ]


# -- int4 weight-only MatMuls into MatMulNBits -------------------------------------------


def int4_weight_only(symmetric: bool, k: int = 64, n: int = 96) -> onnx.ModelProto:
    """Two MatMuls whose weights onnxruntime's quantizer makes int4 behind a blocked DQ."""
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(_weight(rng, k, n), "w1"),
        numpy_helper.from_array(_weight(rng, n, k), "w2"),
    ]
    nodes = [
        helper.make_node("MatMul", ["a", "w1"], ["h"]),
        helper.make_node("Relu", ["h"], ["r"]),
        helper.make_node("MatMul", ["r", "w2"], ["y"]),
    ]
    model = make_model(
        nodes, [tensor_input("a", [2, 3, k])], [tensor_input("y", [2, 3, k])], inits, opset=21
    )
    config = matmul_nbits_quantizer.DefaultWeightOnlyQuantConfig(
        block_size=32, is_symmetric=symmetric, quant_format=QuantFormat.QDQ
    )
    quantizer = matmul_nbits_quantizer.MatMulNBitsQuantizer(model, algo_config=config)
    quantizer.process()
    return quantizer.model.model


@pytest.mark.parametrize("symmetric", [True, False])
def test_int4_weights_stay_4_bit_packed_once_into_matmul_nbits(symmetric):
    model = int4_weight_only(symmetric)
    assert {i.data_type for i in model.graph.initializer} >= {
        onnx.TensorProto.INT4 if symmetric else onnx.TensorProto.UINT4
    }
    result = optimized(model, "cpu")
    assert counts(result) == {"MatMulNBits": 2, "Relu": 1}
    packed = {i.name: i for i in result.graph.initializer}
    for node in result.graph.node:
        if node.op_type == "MatMulNBits":
            attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
            n, blocks = attributes["N"], -(-attributes["K"] // 32)
            weight = packed[node.input[1]]
            assert weight.data_type == onnx.TensorProto.UINT8
            assert list(weight.dims) == [n, blocks, 16]
            assert (len(node.input) == 4) != symmetric  # zero points only where the DQ had them
    floats = [i for i in result.graph.initializer if i.data_type == onnx.TensorProto.FLOAT]
    assert sum(np.prod(i.dims) for i in floats) == 96 * 2 + 64 * 3  # the scales, no weight
    weights = [sum(i.ByteSize() for i in m.graph.initializer) for m in (model, result)]
    assert weights[1] <= 1.05 * weights[0]
    feeds = {"a": np.random.default_rng(3).standard_normal((2, 3, 64)).astype(np.float32)}
    np.testing.assert_allclose(run(result, feeds)[0], run(model, feeds)[0], rtol=1e-5, atol=1e-5)


def test_a_weight_dq_with_another_use_is_not_fused_into_matmul_nbits():
    model = int4_weight_only(True)
    dq = next(n for n in model.graph.node if n.op_type == "DequantizeLinear")
    weight = helper.make_tensor_value_info(dq.output[0], onnx.TensorProto.FLOAT, [64, 96])
    model.graph.output.append(weight)
    result = optimized(model, "cpu")
    assert counts(result)["MatMulNBits"] == 1 and counts(result)["DequantizeLinear"] == 1


@pytest.mark.parametrize("target", ["qnn", "dml"])
def test_a_weight_only_dq_stays_for_providers_that_consume_units(target):
    """qnn and dml list MatMulNBits, but read a weight's DQ before a MatMul themselves."""
    model = int4_weight_only(False)
    assert counts(optimized(model, target)) == counts(model)


def _reasons(model: onnx.ModelProto, rule_name: str, target_name: str) -> str:
    target = load_target(target_name)
    rule = next(r for r in api.select_rules(target=target) if r.name == rule_name)
    return " ".join(str(e.reason) for e in api.explain(ir.from_proto(model), rule, target=target))


def test_explain_names_the_unit_a_float_fusion_would_break():
    reasons = _reasons(_conv_relu_unit(), "fused-conv-relu", "cpu")
    assert "is part of a QDQ node unit (a rule without Q or DQ in its source leaves" in reasons


def test_explain_names_the_target_that_keeps_units():
    model = _conv_relu_unit()
    relu = next(n for n in model.graph.node if n.op_type == "Relu")
    model.graph.node.remove(relu)
    next(n for n in model.graph.node if n.op_type == "Conv").output[0] = "r"
    assert "(target 'nnapi' consumes QDQ units itself)" in _reasons(model, "qdq-conv", "nnapi")
    assert counts(optimized(model, "cpu"))["QLinearConv"] == 1


def test_the_int8_parameter_reads_on_off_and_auto(monkeypatch):
    assert load_target("cpu:int8=on").params == {"int8": True}
    assert load_target("cpu:int8=off").params == {}
    monkeypatch.setattr("platform.machine", lambda: "aarch64")
    assert parse_params("cpu", "int8=auto") == {"int8": True}
    monkeypatch.setattr("platform.machine", lambda: "x86_64")
    assert parse_params("cpu", "int8=auto") == {}
    with pytest.raises(OnnxfuseError, match="int8='yes': expected on, off or auto"):
        parse_params("cpu", "int8=yes")


_DROP_RELU = """
rules:
  - name: drop-relu
    keeps_units: {declared}
    source: |
      r (x) => (y) {{
        y = Relu(x)
      }}
    replacement: |
      r (x) => (x) {{
      }}
"""


def test_a_rule_declaring_it_keeps_units_is_still_refused_on_a_unit_node():
    # keeps_units lifts the ban on Qs and DQs outside units only: this Relu is the unit's.
    (rule,) = parse_rule_text(_DROP_RELU.format(declared="true"))
    assert rule.keeps_units
    target = load_target("nnapi")
    report, result = optimize_proto(_conv_relu_unit(y_zero=10), [rule], target=target)
    assert counts(result)["Relu"] == 1
    assert "is part of a QDQ node unit (target 'nnapi' consumes QDQ units itself)" in str(
        report.rules["drop-relu"].blocked_reason
    )


def test_keeps_units_must_be_true_or_false():
    with pytest.raises(RuleError, match=r":4: 'keeps_units' must be true or false"):
        parse_rule_text(_DROP_RELU.format(declared="1"), "drop.yaml")


def test_a_gemm_whose_weight_scale_and_zero_point_differ_in_shape_stays_a_unit():
    # QGemm's CheckInputs refuses b's scale [] with zero point [1]: the DQ accepts both.
    inits = [
        numpy_helper.from_array(np.array(0.0625, np.float32), "sa"),
        numpy_helper.from_array(np.array(128, np.uint8), "az"),
        numpy_helper.from_array(np.array([[7]], np.uint8), "b"),
        numpy_helper.from_array(np.array(0.0142, np.float32), "bs"),
        numpy_helper.from_array(np.array([0], np.uint8), "bz"),
        numpy_helper.from_array(np.array(0.5, np.float32), "ys"),
        numpy_helper.from_array(np.array(146, np.uint8), "yz"),
    ]
    nodes = [
        helper.make_node("DequantizeLinear", ["a", "sa", "az"], ["A"]),
        helper.make_node("DequantizeLinear", ["b", "bs", "bz"], ["B"], axis=0),
        helper.make_node("Gemm", ["A", "B"], ["C"], transB=1),
        helper.make_node("QuantizeLinear", ["C", "ys", "yz"], ["y"]),
    ]
    model = make_model(
        nodes,
        [tensor_input("a", [1, 1], onnx.TensorProto.UINT8)],
        [tensor_input("y", [1, 1], onnx.TensorProto.UINT8)],
        inits,
        opset=13,
    )
    result = optimized(model, "cpu")
    assert "QGemm" not in counts(result) and counts(result)["Gemm"] == 1
    feeds = {"a": np.array([[9]], np.uint8)}
    np.testing.assert_array_equal(run(result, feeds)[0], run(model, feeds)[0])
