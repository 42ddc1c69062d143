"""Quantized models stay quantized: a DequantizeLinear of a constant weight is never
folded into a float weight, on models quantized here by onnxruntime's own tools."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from helpers import assert_same_outputs, make_model, optimize_proto, tensor_input
from onnx import helper, numpy_helper, version_converter

from onnxfuse.api import optimize_file, sample_model_path, select_rules
from onnxfuse.cli.main import main
from onnxfuse.errors import OnnxfuseError
from onnxfuse.passes.pipeline import Options
from onnxfuse.targets.capabilities import load_target

quantization = pytest.importorskip("onnxruntime.quantization")


class _Calibration(quantization.CalibrationDataReader):
    def __init__(self, count: int = 4):
        rng = np.random.default_rng(0)
        self.feeds = iter(
            {"input": rng.standard_normal((1, 3, 32, 32)).astype(np.float32)} for _ in range(count)
        )

    def get_next(self):
        return next(self.feeds, None)


def _quantize(tmp_path: Path, kind: str, opset: int = 21) -> Path:
    """The sample quantized by onnxruntime's tools; at opset 21 (where onnx's evaluator
    runs every DequantizeLinear, so folding one is possible) unless told otherwise."""
    source = tmp_path / f"float{opset}.onnx"
    onnx.save(version_converter.convert_version(onnx.load(sample_model_path()), opset), source)
    out = tmp_path / f"{kind}.onnx"
    if kind == "dynamic":
        quantization.quantize_dynamic(str(source), str(out))
        return out
    per_channel, activation = {"s8s8": (True, "QInt8"), "u8s8": (False, "QUInt8")}[kind]
    quantization.quantize_static(
        str(source),
        str(out),
        _Calibration(),
        quant_format=quantization.QuantFormat.QDQ,
        per_channel=per_channel,
        activation_type=getattr(quantization.QuantType, activation),
        weight_type=quantization.QuantType.QInt8,
    )
    return out


def _constant_dequantizes(model: onnx.ModelProto) -> int:
    constants = {i.name for i in model.graph.initializer}
    constants |= {o for n in model.graph.node if n.op_type == "Constant" for o in n.output}
    return sum(
        1 for n in model.graph.node if n.op_type == "DequantizeLinear" and n.input[0] in constants
    )


def _integer_weights(model: onnx.ModelProto) -> list[tuple[int, tuple[int, ...]]]:
    """Element type and shape of every 8-bit initializer that is not a scalar."""
    small = (onnx.TensorProto.INT8, onnx.TensorProto.UINT8)
    return sorted(
        (i.data_type, tuple(i.dims))
        for i in model.graph.initializer
        if i.data_type in small and len(i.dims) > 0 and max(i.dims) > 1
    )


def _float_weight_bytes(model: onnx.ModelProto) -> int:
    """Bytes of the float initializers: a folded DequantizeLinear would add its weight."""
    return sum(
        i.ByteSize() for i in model.graph.initializer if i.data_type == onnx.TensorProto.FLOAT
    )


def _initializer_bytes(model: onnx.ModelProto) -> int:
    return sum(i.ByteSize() for i in model.graph.initializer)


def _quantized_weights(model: onnx.ModelProto) -> list[str]:
    """The element types of the constants DequantizeLinear nodes read, sorted."""
    types = {i.name: onnx.TensorProto.DataType.Name(i.data_type) for i in model.graph.initializer}
    return sorted(
        types[n.input[0]]
        for n in model.graph.node
        if n.op_type == "DequantizeLinear" and n.input[0] in types
    )


@pytest.mark.parametrize("opset", [17, 21])
@pytest.mark.parametrize("kind", ["s8s8", "u8s8", "dynamic"])
def test_quantized_weights_stay_quantized_and_no_bigger(tmp_path: Path, kind: str, opset: int):
    source = _quantize(tmp_path, kind, opset)
    out = tmp_path / "out.onnx"
    target = load_target("cpu")
    optimize_file(source, out, select_rules(target=target), Options(target=target))
    before, after = onnx.load(source), onnx.load(out)
    if kind == "dynamic":
        assert _constant_dequantizes(after) == _constant_dequantizes(before)
        assert _quantized_weights(after) == _quantized_weights(before)
    else:
        # A weight's DequantizeLinear goes into the quantized kernel that now reads the
        # integer weight itself (the qdq pack's fusions); it is never folded.
        assert _float_weight_bytes(after) <= _float_weight_bytes(before)
    # Equal tensors (per-channel zero points) may be merged into one: compare as sets.
    assert set(_integer_weights(after)) == set(_integer_weights(before)) != set()
    # Weights never grow (equal scales and zero points may be merged into one).
    assert _initializer_bytes(after) <= _initializer_bytes(before)
    assert_same_outputs(before, after)


def test_dequantize_is_refused_for_a_target_that_runs_quantized_ops(tmp_path: Path, capsys):
    source = _quantize(tmp_path, "s8s8")
    code = main(["optimize", str(source), "-o", str(tmp_path / "o.onnx"), "--dequantize", "-q"])
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("onnxfuse: error: --dequantize: target 'cpu' runs quantized ops (")
    assert "\n" not in err and not (tmp_path / "o.onnx").exists()
    with pytest.raises(OnnxfuseError, match="not none"):
        optimize_file(source, None, [], Options(target=None, dequantize=True))


def test_dequantize_folds_weights_for_a_target_without_quantized_ops(tmp_path: Path):
    source = _quantize(tmp_path, "s8s8")
    out = tmp_path / "out.onnx"
    coreml = load_target("coreml")
    assert coreml.quantized_ops() == []
    options = Options(target=coreml, dequantize=True)
    optimize_file(source, out, select_rules(target=coreml), options)
    before, after = onnx.load(source), onnx.load(out)
    assert _constant_dequantizes(before) > 0 and _constant_dequantizes(after) == 0
    assert_same_outputs(before, after)


def _cast_scale_matmul() -> onnx.ModelProto:
    """Weight-only quantization written by hand, as some packaged models do it:
    MatMul(x, Mul(Cast(int8 W, float), scale))."""
    weight = np.random.default_rng(0).integers(-128, 128, (64, 64)).astype(np.int8)
    return make_model(
        [
            helper.make_node("Cast", ["Wq"], ["Wf"], to=onnx.TensorProto.FLOAT),
            helper.make_node("Mul", ["Wf", "scale"], ["W"]),
            helper.make_node("MatMul", ["x", "W"], ["y"]),
        ],
        [tensor_input("x", ["batch", 64])],
        [tensor_input("y", ["batch", 64])],
        [
            numpy_helper.from_array(weight, "Wq"),
            numpy_helper.from_array(np.array(0.02, np.float32), "scale"),
        ],
    )


def test_a_cast_of_an_int8_weight_stays_int8(tmp_path: Path):
    """Folding Cast + Mul would store the float weight, four times larger."""
    model = _cast_scale_matmul()
    _, optimized = optimize_proto(model, select_rules())
    assert _initializer_bytes(optimized) <= _initializer_bytes(model)
    assert [t.data_type for t in optimized.graph.initializer if t.name == "Wq"] == [
        onnx.TensorProto.INT8
    ]
    assert_same_outputs(model, optimized)


def test_dequantize_folds_a_cast_int8_weight_too():
    model = _cast_scale_matmul()
    _, optimized = optimize_proto(model, [], target=load_target("coreml"), dequantize=True)
    assert [n.op_type for n in optimized.graph.node] == ["MatMul"]
    assert_same_outputs(model, optimized)


def test_a_cast_of_a_small_int8_table_still_folds():
    """A few int8 values (a lookup table, a shape) are no quantized weight."""
    model = make_model(
        [
            helper.make_node("Cast", ["t"], ["tf"], to=onnx.TensorProto.FLOAT),
            helper.make_node("Add", ["x", "tf"], ["y"]),
        ],
        [tensor_input("x", [16])],
        [tensor_input("y", [16])],
        [numpy_helper.from_array(np.arange(16, dtype=np.int8), "t")],
    )
    _, optimized = optimize_proto(model, [])
    assert [n.op_type for n in optimized.graph.node] == ["Add"]
