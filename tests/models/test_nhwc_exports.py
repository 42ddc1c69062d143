"""The CNN exports in channels-last form (the nhwc pack), measured in this run:

- quantized (onnxruntime.quantization.quantize_static, QOperator format) and
  optimized for `cpu:layout=nhwc`: no more Transposes than onnxruntime's own
  ORT_ENABLE_ALL result (its NhwcTransformer), as many channels-last ops, and
  the original's outputs exactly (onnxruntime, optimizations off);
- float, optimized for `cuda:layout=nhwc`: every Transpose sits at a border of
  a channels-last region (next to a graph input or output, or to an op with no
  channels-last form: pools, Flatten, LayerNormalization...), and the outputs
  match the original's when NhwcConv runs as its reference definition (a check
  of the rewrite against our definition of the op, not of the CUDA kernel).
"""

from __future__ import annotations

import collections

import numpy as np
import onnx
import onnxruntime as ort
import pytest

pytest.importorskip("torch")

from exports.anchors import session
from exports.export import get_export
from exports.models import CNN_NAMES, MODELS_BY_NAME

from onnxfuse import api
from onnxfuse.passes.pipeline import Options
from onnxfuse.proof.reference_ops import with_reference_definitions
from onnxfuse.targets.capabilities import load_target

pytestmark = pytest.mark.slow

CNNS = CNN_NAMES
EXPORTS = [
    (name, exporter, opset) for name in CNNS for exporter, opset in (("legacy", 17), ("dynamo", 18))
]
IDS = [f"{n}-{e}{o}" for n, e, o in EXPORTS]
# Where we keep more Transposes than onnxruntime, and why.
QUANTIZED_GAPS: dict[tuple[str, str], str] = {}
# Ops a Transpose may sit between inside a channels-last region: the channels-last
# ops and the ops the transpose rules move Transposes through.
CHANNELS_LAST = {
    "com.microsoft::NhwcConv",
    "com.microsoft::QuickGelu",
    "Relu",
    "Clip",
    "Sigmoid",
    "Tanh",
    "LeakyRelu",
    "HardSigmoid",
    "HardSwish",
    "Add",
    "Mul",
    "Transpose",
}


def _op(node: onnx.NodeProto) -> str:
    return f"{node.domain}::{node.op_type}" if node.domain else node.op_type


def _ops(model: onnx.ModelProto) -> collections.Counter:
    return collections.Counter(_op(n) for n in model.graph.node)


def inner_transposes(model: onnx.ModelProto, inside: set[str]) -> list[str]:
    """Transposes whose producer and every consumer are ops of ``inside``: not at a
    border of the channels-last region (a pair there should have cancelled)."""
    graph = model.graph
    producer = {out: node for node in graph.node for out in node.output}
    outputs = {o.name for o in graph.output}
    found = []
    for node in graph.node:
        if node.op_type != "Transpose":
            continue
        before = producer.get(node.input[0])
        after = [n for n in graph.node if node.output[0] in n.input]
        if before is None or node.output[0] in outputs or not after:
            continue
        if _op(before) in inside and all(_op(n) in inside for n in after):
            found.append(node.output[0])
    return found


@pytest.fixture(scope="module")
def cuda_nhwc():
    target = load_target("cuda:layout=nhwc")
    return target, api.select_rules(target=target)


@pytest.fixture(scope="module")
def cpu_nhwc():
    target = load_target("cpu:layout=nhwc")
    return target, api.select_rules(target=target)


@pytest.mark.parametrize(("name", "exporter", "opset"), EXPORTS, ids=IDS)
def test_float_cnn_for_cuda_nhwc_has_transposes_only_at_borders(
    name, exporter, opset, cuda_nhwc, tmp_path
):
    export = get_export(MODELS_BY_NAME[name], exporter, opset)
    target, rules = cuda_nhwc
    ours_path = tmp_path / "ours.onnx"
    api.optimize_file(export.path, ours_path, rules, Options(target=target))
    ours = onnx.load(str(ours_path))
    ops = _ops(ours)
    assert ops["com.microsoft::NhwcConv"] > 0 and ops["Conv"] == 0, ops
    assert ops["com.microsoft::FusedConv"] == 0, ops
    assert inner_transposes(ours, CHANNELS_LAST) == [], ops

    expanded_path = tmp_path / "expanded.onnx"
    onnx.save(with_reference_definitions(ours), str(expanded_path))
    got = session(expanded_path).run(None, export.feeds)
    original = session(export.path).run(None, export.feeds)
    for value, base in zip(got, original):
        np.testing.assert_allclose(value, base, rtol=1e-4, atol=1e-4)


def _quantized(path, name, tmp_path):
    quantization = pytest.importorskip("onnxruntime.quantization")
    model = onnx.load(str(path))
    first = model.graph.input[0]
    shape = [d.dim_value or 1 for d in first.type.tensor_type.shape.dim]

    class Calibration(quantization.CalibrationDataReader):
        def __init__(self):
            self.rng = np.random.default_rng(0)
            self.left = 4

        def get_next(self):
            if not self.left:
                return None
            self.left -= 1
            return {first.name: self.rng.standard_normal(shape).astype(np.float32)}

    out = tmp_path / f"{name}-quantized.onnx"
    quantization.quantize_static(
        str(path),
        str(out),
        Calibration(),
        quant_format=quantization.QuantFormat.QOperator,
        activation_type=quantization.QuantType.QUInt8,
        weight_type=quantization.QuantType.QInt8,
    )
    return out, {first.name: np.random.default_rng(1).standard_normal(shape).astype(np.float32)}


@pytest.mark.parametrize(("name", "exporter", "opset"), EXPORTS, ids=IDS)
def test_quantized_cnn_on_the_cpu_like_the_nhwc_transformer(
    name, exporter, opset, cpu_nhwc, tmp_path
):
    export = get_export(MODELS_BY_NAME[name], exporter, opset)
    quantized, feeds = _quantized(export.path, name, tmp_path)
    target, rules = cpu_nhwc
    ours_path = tmp_path / "ours.onnx"
    api.optimize_file(quantized, ours_path, rules, Options(target=target))
    ours = onnx.load(str(ours_path))
    ort_path = tmp_path / "ort.onnx"
    session(quantized, ort.GraphOptimizationLevel.ORT_ENABLE_ALL, saved=ort_path)
    theirs = onnx.load(str(ort_path))

    mine, reference = _ops(ours), _ops(theirs)
    for op in ("com.microsoft::QLinearConv", "com.microsoft::NhwcMaxPool"):
        assert mine[op] == reference[op], (op, mine, reference)
    assert mine["QLinearConv"] == 0, mine
    if (name, exporter) in QUANTIZED_GAPS:
        assert mine["Transpose"] > reference["Transpose"], "reached parity: remove the gap"
    else:
        assert mine["Transpose"] <= reference["Transpose"], (mine, reference)

    got = session(ours_path).run(None, feeds)
    original = session(quantized).run(None, feeds)
    for value, base in zip(got, original):
        np.testing.assert_array_equal(value, base)
