"""Exports quantized with onnxruntime's own tools, cached on disk like the exports.

Each corpus entry is an export (tests/exports/export.py) and a quantizer setting:

| setting | onnxruntime.quantization call |
|---|---|
| qdq-s8s8-pc | quantize_static, QDQ, int8 activations, int8 weights per channel |
| qdq-u8s8 | quantize_static, QDQ, uint8 activations, int8 weights per tensor |
| qoperator-u8s8 | quantize_static, QOperator (QLinearConv, QLinearMatMul, ...), per tensor |
| dynamic | quantize_dynamic (DynamicQuantizeLinear + MatMulInteger / ConvInteger) |
| int4-qdq | MatMulNBitsQuantizer, QDQ format: DequantizeLinear(int4, blocked) -> MatMul |

Static quantization is calibrated on CALIBRATION_SAMPLES seeded random feeds shaped like
the export's example inputs (integer inputs, token ids and masks, are the example's own).
The cache key is the export's file name (itself keyed by its config and the tool
versions), the setting, onnxruntime's version and QUANTIZE_VERSION (bump it when a
setting changes what it makes).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import numpy_helper

from .anchors import ATOL, RTOL, quiet
from .export import ALL_EXPORTS, Export, cache_dir, export_by_name, export_name, get_export
from .models import BENCH_EXPORTS, BENCH_MODELS_BY_NAME

QUANTIZE_VERSION = 1
CALIBRATION_SAMPLES = 4
SETTINGS = ("qdq-s8s8-pc", "qdq-u8s8", "qoperator-u8s8", "dynamic", "int4-qdq")

# The corpus: every setting on a CNN, the CNN families in QDQ form, and the transformers
# in the forms they are deployed in (dynamic and int4 weight-only for text, QDQ for ViT).
# About a minute to quantize on 2 cores with the exports cached.
CORPUS = (
    "resnet-small-dynamo18.qdq-s8s8-pc",
    "resnet-small-dynamo18.qdq-u8s8",
    "resnet-small-dynamo18.qoperator-u8s8",
    "resnet-small-dynamo18.dynamic",
    "mobilenet-relu6-legacy17.qdq-s8s8-pc",
    "mobilenetv3-small-legacy17.qdq-u8s8",
    "efficientnet-small-dynamo18.qdq-u8s8",
    "convnext-small-dynamo18.qdq-s8s8-pc",
    "vit-legacy17.qdq-s8s8-pc",
    "bert-mask-legacy17.qdq-u8s8",
    "bert-mask-legacy17.dynamic",
    "bert-mask-legacy17.int4-qdq",
    "llama-gqa-dynamo18.int4-qdq",
)
# bench/quantized.py's latency models: bench-size CNNs (one 224x224 image), S8S8 and U8S8.
BENCH_CORPUS = (
    "resnet-bench-dynamo18.qdq-s8s8-pc",
    "resnet-bench-dynamo18.qdq-u8s8",
    "mobilenetv2-bench-dynamo18.qdq-s8s8-pc",
    "mobilenetv2-bench-dynamo18.qdq-u8s8",
)
_BENCH = {
    export_name(spec, exporter, opset): (spec, exporter, opset)
    for spec, exporter, opset in ((BENCH_MODELS_BY_NAME[m], e, o) for m, e, o in BENCH_EXPORTS)
}


@dataclass(frozen=True)
class Quantized:
    """One quantized export on disk; its feeds are the export's."""

    name: str  # e.g. resnet-small-dynamo18.qdq-s8s8-pc
    export: Export
    setting: str
    path: Path

    @property
    def feeds(self) -> dict[str, np.ndarray]:
        return self.export.feeds


def get_quantized(name: str) -> Quantized:
    """The corpus entry `export.setting`, quantized now if not cached."""
    source, setting = name.rsplit(".", 1)
    if setting not in SETTINGS:
        raise ValueError(f"unknown quantizer setting {setting!r} (one of {', '.join(SETTINGS)})")
    export = export_by_name(source) if source in ALL_EXPORTS else get_export(*_BENCH[source])
    blob = json.dumps(
        {
            "export": export.path.name,
            "setting": setting,
            "onnxruntime": ort.__version__,
            "samples": CALIBRATION_SAMPLES,
            "version": QUANTIZE_VERSION,
        },
        sort_keys=True,
    )
    key = hashlib.sha256(blob.encode()).hexdigest()[:12]
    path = cache_dir() / f"{name}-{key}.onnx"
    if not path.exists():
        with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
            out = Path(tmp) / "model.onnx"
            with quiet():
                _quantize(export, setting, Path(tmp), out)
            os.replace(out, path)
    return Quantized(name, export, setting, path)


# Ops an output's value passes through unchanged on its way from a DequantizeLinear.
_MOVES_DATA = {"Reshape", "Flatten", "Transpose", "Squeeze", "Unsqueeze", "Identity"}


def output_steps(model: onnx.ModelProto) -> list[float | None]:
    """Per graph output, the largest scale of the DequantizeLinear it is read from."""
    producers = {o: n for n in model.graph.node for o in n.output}
    scales = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    steps: list[float | None] = []
    for output in model.graph.output:
        node = producers.get(output.name)
        while node is not None and node.op_type in _MOVES_DATA:
            node = producers.get(node.input[0])
        scale = None
        if node is not None and node.op_type == "DequantizeLinear" and node.input[1] in scales:
            scale = float(np.abs(scales[node.input[1]]).max())
        steps.append(scale)
    return steps


def differences(got: list[np.ndarray], want: list[np.ndarray], steps) -> list[float]:
    """Per output, the largest difference in quantization steps, or, without a step, in
    units of the float tolerance."""
    out = []
    for g, w, step in zip(got, want, steps):
        g64, w64 = np.asarray(g, np.float64), np.asarray(w, np.float64)
        unit = step if step is not None else ATOL + RTOL * np.abs(w64)
        out.append(float((np.abs(g64 - w64) / unit).max(initial=0.0)))
    return out


class _RandomFeeds:
    """A CalibrationDataReader of seeded random feeds like the export's example."""

    def __init__(self, example: dict[str, np.ndarray], seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        self._feeds = iter(
            [
                {
                    k: rng.standard_normal(v.shape).astype(v.dtype)
                    if np.issubdtype(v.dtype, np.floating)
                    else v
                    for k, v in example.items()
                }
                for _ in range(CALIBRATION_SAMPLES)
            ]
        )

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._feeds, None)


def _quantize(export: Export, setting: str, tmp: Path, out: Path) -> None:
    from onnxruntime import quantization as q
    from onnxruntime.quantization import matmul_nbits_quantizer as nbits

    source = tmp / "float.onnx"
    # onnxruntime's pre-processing (shape inference, onnxruntime's basic fusions folded
    # in) is what its documentation asks for before static quantization.
    q.quant_pre_process(str(export.path), str(source), skip_symbolic_shape=True)
    if setting == "dynamic":
        q.quantize_dynamic(str(source), str(out), weight_type=q.QuantType.QInt8)
        return
    if setting == "int4-qdq":
        config = nbits.DefaultWeightOnlyQuantConfig(
            block_size=32, is_symmetric=True, quant_format=q.QuantFormat.QDQ
        )
        quantizer = nbits.MatMulNBitsQuantizer(onnx.load(source), algo_config=config)
        quantizer.process()
        quantizer.model.save_model_to_file(str(out), use_external_data_format=False)
        return
    per_channel, activations, form = {
        "qdq-s8s8-pc": (True, q.QuantType.QInt8, q.QuantFormat.QDQ),
        "qdq-u8s8": (False, q.QuantType.QUInt8, q.QuantFormat.QDQ),
        "qoperator-u8s8": (False, q.QuantType.QUInt8, q.QuantFormat.QOperator),
    }[setting]
    q.quantize_static(
        str(source),
        str(out),
        _RandomFeeds(export.feeds),
        quant_format=form,
        per_channel=per_channel,
        activation_type=activations,
        weight_type=q.QuantType.QInt8,
        calibrate_method=q.CalibrationMethod.MinMax,
    )
