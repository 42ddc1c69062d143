"""Fusions against what they replace, and what plain `cpu` does with SkipLayerNormalization.

    python bench/fusion_speed.py [--models NAME ...] [--dim NAME=V ...] [--runs N]
                                 [--calibrate-runs N] [--json FILE]

For each export of tests/exports (default: BERT-base's shape by the legacy exporter and
the test-size BERT, Whisper encoder, SegFormer and ViT exports), in one process:

1. `onnxfuse targets calibrate cpu MODEL` (1 thread, ORT_DISABLE_ALL): the ratio
   fused / unfused of every fused op at the model's matches;
2. onnxruntime CPU latency, 1 intra-op thread, ORT_ENABLE_ALL, round robin (as
   bench/latency.py), median, of: the original; `--target cpu` with every fusion (the
   SkipLayerNormalization rules too: what plain `cpu` did before they needed a
   profile); plain `--target cpu`; `--target cpu:profile=` the profile of step 1.

`python bench/performance_doc.py ... --fusions FILE` renders the JSON in
docs/performance.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

import onnx  # noqa: E402
import onnxruntime as ort  # noqa: E402
import yaml  # noqa: E402
from environment import environment as environment_record  # noqa: E402
from exports.anchors import round_robin  # noqa: E402

DEFAULT_MODELS = (
    "bert-base-legacy17",
    "bert-mask-legacy17",
    "whisper-encoder-legacy17",
    "segformer-legacy17",
    "vit-legacy17",
)
VARIANTS = ("original", "every-fusion", "cpu", "cpu-profile")
SKIP_LN = "SkipLayerNormalization"
ort.set_default_logger_severity(4)


def export_of(name: str):
    from exports.export import ALL_EXPORTS, export_by_name, get_export
    from exports.models import BENCH_EXPORTS, BENCH_MODELS_BY_NAME

    if name in ALL_EXPORTS:
        return export_by_name(name)
    for model, exporter, opset in BENCH_EXPORTS:
        if name == f"{model}-{exporter}{opset}":
            return get_export(BENCH_MODELS_BY_NAME[model], exporter, opset)
    raise SystemExit(f"unknown export {name!r}")


def every_fusion(source: Path, out: Path) -> None:
    from onnxfuse.api import optimize_file, select_rules
    from onnxfuse.passes.pipeline import Options
    from onnxfuse.targets.capabilities import load_target

    target = load_target("cpu")
    rules = select_rules(target=target)
    optimize_file(source, out, rules, Options(target=target, gate_by_profile=False))


def cli(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "onnxfuse", *args], check=True)


def session(path: Path) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.log_severity_level = 4
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def count(path: Path, op: str) -> int:
    return sum(n.op_type == op for n in onnx.load(path, load_external_data=False).graph.node)


def feed_dims(path: Path, feeds: dict) -> list[str]:
    """``--dim`` options binding the model's named input dims to the feeds' sizes."""
    bound: dict[str, int] = {}
    for value in onnx.load(path, load_external_data=False).graph.input:
        if value.name in feeds:
            for dim, size in zip(value.type.tensor_type.shape.dim, feeds[value.name].shape):
                if dim.dim_param:
                    bound.setdefault(dim.dim_param, int(size))
    return [f"--dim={name}={size}" for name, size in bound.items()]


def measure(name: str, args, work: Path) -> dict:
    export = export_of(name)
    profile = work / f"{name}.profile.yaml"
    dims = [f"--dim={d}" for d in args.dim] or feed_dims(export.path, export.feeds)
    calibrate = ["targets", "calibrate", "cpu", str(export.path), "-o", str(profile), "-q"]
    cli(*calibrate, *dims, "--runs", str(args.calibrate_runs))
    paths = {v: work / f"{name}.{v}.onnx" for v in VARIANTS[1:]}
    paths["original"] = export.path
    every_fusion(export.path, paths["every-fusion"])
    cli("optimize", str(export.path), "-o", str(paths["cpu"]), "-q")
    target = f"cpu:profile={profile}"
    cli("optimize", str(export.path), "-o", str(paths["cpu-profile"]), "--target", target, "-q")
    sessions = {v: session(paths[v]) for v in VARIANTS}
    times = round_robin(sessions, export.feeds, args.runs, warmup=3)
    medians = {v: statistics.median(times[v]) for v in VARIANTS}
    measured = yaml.safe_load(profile.read_text())["measurements"]
    row = {
        "model": name,
        "median_ms": medians,
        "ratio": {v: medians[v] / medians["original"] for v in VARIANTS},
        "skip_layer_norm": {v: count(paths[v], SKIP_LN) for v in VARIANTS},
        "calibrated": [
            {k: m[k] for k in ("rule", "at", "unfused_us", "fused_us", "ratio")} for m in measured
        ],
    }
    ratios = " ".join(f"{v} x{row['ratio'][v]:.3f}" for v in VARIANTS)
    print(f"{name}: {ratios}", flush=True)
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=list(DEFAULT_MODELS))
    parser.add_argument(
        "--dim", action="append", default=[], help="for calibrate (default: the feeds')"
    )
    parser.add_argument("--runs", type=int, default=30, help="latency rounds")
    parser.add_argument("--calibrate-runs", type=int, default=30)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    started = environment_record(
        "fusion_speed.py", ["onnxruntime", "onnx"], runs=args.runs, threads=1
    )
    with tempfile.TemporaryDirectory(prefix="onnxfuse-fusions-") as tmp:
        rows = [measure(name, args, Path(tmp)) for name in args.models]
    if args.json:
        args.json.write_text(json.dumps({"environment": started, "models": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
