"""QDQ models side by side: onnxfuse's fused quantized ops against onnxruntime's.

```
python bench/qdq_units.py [--json FILE] [MODEL ...]
```

Each CNN export of the test set (tests/exports, cached) is quantized with
onnxruntime's own `quantize_static` in QDQ form, S8S8 per-channel and U8S8
per-tensor, and then optimized by onnxfuse for `cpu`, `qnn` and `nnapi` and by
onnxruntime at ORT_ENABLE_EXTENDED (its QDQ fusions). For each: node counts, the
quantized ops each result holds, file sizes, and the largest output difference
from the original (both run at ORT_DISABLE_ALL) in steps of the output's
quantization scale. For qnn and nnapi: how many QDQ node units of the input are
still units.
"""

from __future__ import annotations

import argparse
import collections
import json
import logging
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnxruntime.quantization import (
    CalibrationDataReader,
    QuantFormat,
    QuantType,
    matmul_nbits_quantizer,
    quantize_static,
)

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from onnxfuse.api import optimize_file, select_rules  # noqa: E402
from onnxfuse.passes.pipeline import Options  # noqa: E402
from onnxfuse.rewrite.qdq_units import is_unit_op  # noqa: E402
from onnxfuse.targets.capabilities import load_target  # noqa: E402
from tests.exports.export import export_by_name  # noqa: E402

MODELS = ("resnet-small-legacy17", "mobilenet-relu6-legacy17", "efficientnet-small-legacy17")
# Transformers whose MatMul weights are quantized to int4 (weight-only, QDQ form).
INT4_MODELS = ("bert-nomask-dynamo20", "llama-gqa-dynamo20")
INT4_FORMS = {"int4 symmetric": True, "int4 asymmetric": False}
FORMS = {
    "S8S8 per-channel": dict(
        activation_type=QuantType.QInt8, weight_type=QuantType.QInt8, per_channel=True
    ),
    "U8S8 per-tensor": dict(
        activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8, per_channel=False
    ),
}
QUANTIZED = ("QLinear", "QGemm", "MatMulInteger", "MatMulNBits", "DynamicQuantize")


class _Reader(CalibrationDataReader):
    def __init__(self, feeds: dict[str, np.ndarray], count: int = 8):
        rng = np.random.default_rng(0)
        self._items = iter(
            [
                {k: rng.standard_normal(v.shape).astype(v.dtype) for k, v in feeds.items()}
                for _ in range(count)
            ]
        )

    def get_next(self):
        return next(self._items, None)


def quantize(source: Path, feeds: dict[str, np.ndarray], form: str, out: Path) -> Path:
    if form in INT4_FORMS:
        config = matmul_nbits_quantizer.DefaultWeightOnlyQuantConfig(
            block_size=32, is_symmetric=INT4_FORMS[form], quant_format=QuantFormat.QDQ
        )
        quantizer = matmul_nbits_quantizer.MatMulNBitsQuantizer(
            onnx.load(source), algo_config=config
        )
        quantizer.process()
        onnx.save(quantizer.model.model, out)
        return out
    quantize_static(
        str(source), str(out), _Reader(feeds), quant_format=QuantFormat.QDQ, **FORMS[form]
    )
    return out


def run(path: Path, feeds: dict[str, np.ndarray], level=ort.GraphOptimizationLevel.ORT_DISABLE_ALL):
    options = ort.SessionOptions()
    options.graph_optimization_level = level
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def ort_extended(path: Path, out: Path) -> Path:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    options.optimized_model_filepath = str(out)
    ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return out


def output_steps(model: onnx.ModelProto) -> list[float]:
    """The quantization step of each graph output: the scale of the DQ computing it (1 for
    a float output, whose difference is then absolute)."""
    inits = {i.name: onnx.numpy_helper.to_array(i) for i in model.graph.initializer}
    producers = {o: n for n in model.graph.node for o in n.output}
    steps = []
    for output in model.graph.output:
        node = producers.get(output.name)
        scale = (
            inits.get(node.input[1])
            if node is not None and node.op_type == "DequantizeLinear"
            else None
        )
        steps.append(float(np.max(scale)) if scale is not None else 1.0)
    return steps


def quantized_ops(model: onnx.ModelProto) -> dict[str, int]:
    counts = collections.Counter(n.op_type for n in model.graph.node)
    return {op: c for op, c in sorted(counts.items()) if op.startswith(QUANTIZED)}


def unit_count(path: Path) -> int:
    import onnx_ir as ir

    graph = ir.load(str(path)).graph
    return sum(1 for node in graph if is_unit_op(node))


def measure(name: str, form: str, work: Path) -> dict:
    export = export_by_name(name)
    feeds = export.feeds
    stem = f"{name}-{form.replace(' ', '-')}"
    original = quantize(export.path, feeds, form, work / f"{stem}.onnx")
    model = onnx.load(original)
    steps = output_steps(model)
    want = run(original, feeds)
    row: dict = {"model": name, "form": form, "nodes": len(model.graph.node)}
    row["bytes"] = original.stat().st_size
    row["units"] = unit_count(original)
    results = {}
    for target in ("cpu", "qnn", "nnapi"):
        out = work / f"{stem}-{target}.onnx"
        resolved = load_target(target)
        optimize_file(original, out, select_rules(target=resolved), Options(target=resolved))
        results[target] = out
    results["ort-extended"] = ort_extended(original, work / f"{stem}-ortext.onnx")
    for label, path in results.items():
        result = onnx.load(path)
        got = run(path, feeds)
        diff = max(
            float(np.max(np.abs(g.astype(np.float64) - w.astype(np.float64)))) / s
            for g, w, s in zip(got, want, steps)
        )
        row[label] = {
            "nodes": len(result.graph.node),
            "quantized_ops": quantized_ops(result),
            "max_steps": round(diff, 3),
            "size_ratio": round(path.stat().st_size / row["bytes"], 3),
        }
        if label in ("qnn", "nnapi"):
            row[label]["units_kept"] = unit_count(path)
    return row


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("models", nargs="*", default=[*MODELS, *INT4_MODELS])
    parser.add_argument("--json", help="write every figure to this file")
    args = parser.parse_args(argv)
    ort.set_default_logger_severity(3)
    logging.getLogger().setLevel(logging.WARNING)  # the quantizers' per-node INFO lines
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models:
            for form in INT4_FORMS if name in INT4_MODELS else FORMS:
                rows.append(measure(name, form, Path(tmp)))
    print(
        "| model | form | nodes | onnxfuse cpu | ORT_ENABLE_EXTENDED | onnxfuse cpu quantized ops "
        "| ORT quantized ops | max steps cpu / ORT | size cpu | units kept qnn / nnapi |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        cpu, ext = r["cpu"], r["ort-extended"]

        def ops(d: dict) -> str:
            return ", ".join(f"{k} {v}" for k, v in d.items()) or "-"

        print(
            f"| {r['model']} | {r['form']} | {r['nodes']} | {cpu['nodes']} | {ext['nodes']} "
            f"| {ops(cpu['quantized_ops'])} | {ops(ext['quantized_ops'])} "
            f"| {cpu['max_steps']} / {ext['max_steps']} | {cpu['size_ratio']}x "
            f"| {r['qnn']['units_kept']}/{r['units']}, {r['nnapi']['units_kept']}/{r['units']} |"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
