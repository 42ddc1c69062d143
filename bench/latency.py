"""Inference latency under onnxruntime (CPU) of the original model and of onnxfuse's result.

    python bench/latency.py [--models NAME ...] [--runs N] [--warmup W] [--threads T]
                            [--json FILE]

For each bench-size export of tests/exports (BENCH_EXPORTS in tests/exports/models.py:
ResNet, MobileNet V2 and V3, EfficientNet and ConvNeXt style CNNs on one 224x224 image;
BERT-base's shape by the legacy and the dynamo exporter; GPT-2 and Llama style decoders of
4 layers (the 12-layer ones with --models); transformers on 2 sequences of 32 tokens),
these variants run in one process:

| variant        | model                                        | onnxruntime graph optimizations |
|----------------|----------------------------------------------|---------------------------------|
| orig-all       | the export                                   | ORT_ENABLE_ALL (the baseline)   |
| orig-none      | the export                                   | ORT_DISABLE_ALL                 |
| fuse-none      | `onnxfuse optimize --target cpu`             | ORT_DISABLE_ALL                 |
| fuse-all       | `onnxfuse optimize --target cpu`             | ORT_ENABLE_ALL                  |
| block-none     | `onnxfuse optimize --target cpu:block=auto`  | ORT_DISABLE_ALL                 |

(`block-none` only where that target exists: `onnxfuse.load_target` accepts it.)
Every variant's outputs are first compared with the original's at ORT_DISABLE_ALL, at the
tolerance of tests/models/test_exports.py (1e-4 relative, 1e-5 absolute); a variant that differs
is still timed but marked, one that fails to optimize or load is not timed. Then W warm-up
runs each, then N rounds in which every variant runs once, in turn (round robin: drift in
the machine's load hits all alike), each round starting one variant later (a variant's
place in the round biased it: two identical models measured 19% apart when each round ran
the variants in one order). Sessions use T intra-op threads (default 2) and run
sequentially. The table shows the median per-run time, the interquartile range and the
ratio of the median to orig-all's (below 1: faster than onnxruntime's own optimizations).

bench/parity.py times the test-size exports the same way (round robin, median) at one
thread with optimizations off; its figures are per-node overhead, these are compute.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

import numpy as np  # noqa: E402
import onnx  # noqa: E402
import onnxruntime as ort  # noqa: E402
from environment import environment as environment_record  # noqa: E402
from exports.anchors import count_nodes, round_robin, worst_error  # noqa: E402

ALL, NONE = ort.GraphOptimizationLevel.ORT_ENABLE_ALL, ort.GraphOptimizationLevel.ORT_DISABLE_ALL
BLOCK_TARGET = "cpu:block=auto"
VARIANTS = ("orig-all", "orig-none", "fuse-none", "fuse-all", "block-none")
BASELINE = "orig-all"
# The 12-layer decoders are there for bench/speed.py's depth comparison; their latency adds
# minutes and nothing the 4-layer ones do not show. Name them with --models to time them.
SKIPPED_BY_DEFAULT = ("gpt2-l12", "llama-l12")
ort.set_default_logger_severity(4)


@dataclass
class Variant:
    name: str
    path: Path | None
    level: ort.GraphOptimizationLevel
    nodes: int | None = None
    error: str | None = None  # failed to optimize or to run: not timed
    max_error: float | None = None  # worst error as a multiple of the tolerance
    times_ms: list[float] = field(default_factory=list)

    @property
    def differs(self) -> bool:
        return self.max_error is not None and self.max_error > 1.0

    def summary(self) -> dict:
        out: dict = {"nodes": self.nodes, "level": self.level.name}
        if self.error:
            return out | {"error": self.error}
        q1, median, q3 = np.percentile(self.times_ms, [25, 50, 75])
        out |= {"median_ms": float(median), "q1_ms": float(q1), "q3_ms": float(q3)}
        out |= {"max_error": self.max_error, "differs": self.differs, "times_ms": self.times_ms}
        return out


def block_target_available() -> bool:
    from onnxfuse.errors import OnnxfuseError
    from onnxfuse.targets.capabilities import load_target

    try:
        load_target(BLOCK_TARGET)
    except OnnxfuseError:
        return False
    return True


def optimize(source: Path, out: Path, target: str) -> str | None:
    """`onnxfuse optimize --target T` as a user runs it; the error's last line, or None."""
    command = [sys.executable, "-m", "onnxfuse", "optimize", str(source), "-o", str(out)]
    done = subprocess.run([*command, "--target", target, "-q"], capture_output=True, text=True)
    if done.returncode == 0:
        return None
    lines = done.stderr.strip().splitlines()
    return lines[-1][:300] if lines else f"exit {done.returncode}"


def session(path: Path, level, threads: int) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.graph_optimization_level = level
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.log_severity_level = 4
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def _feeds_for(sess: ort.InferenceSession, feeds: dict[str, np.ndarray]) -> dict:
    wanted = {i.name for i in sess.get_inputs()}
    return {k: v for k, v in feeds.items() if k in wanted}


def measure_model(label: str, source: Path, feeds: dict, args, block: bool, work: Path) -> dict:
    """Every variant of one model: verified, then timed round robin."""
    fuse, blocked = work / f"{label}-fuse.onnx", work / f"{label}-block.onnx"
    variants = [
        Variant("orig-all", source, ALL),
        Variant("orig-none", source, NONE),
        Variant("fuse-none", fuse, NONE),
        Variant("fuse-all", fuse, ALL),
    ]
    failed = {fuse: optimize(source, fuse, "cpu")}
    if block:
        variants.append(Variant("block-none", blocked, NONE))
        failed[blocked] = optimize(source, blocked, BLOCK_TARGET)
    reference = session(source, NONE, args.threads)
    want = reference.run(None, _feeds_for(reference, feeds))
    sessions = {}
    for variant in variants:
        if failed.get(variant.path):
            variant.error = f"optimize failed: {failed[variant.path]}"
            continue
        variant.nodes = count_nodes(onnx.load(variant.path, load_external_data=False).graph)
        try:
            sess = session(variant.path, variant.level, args.threads)
            got = sess.run(None, _feeds_for(sess, feeds))
        except Exception as exc:  # a result that does not load or run is a finding, not a crash
            variant.error = f"does not run: {str(exc).strip().splitlines()[0][:300]}"
            continue
        variant.max_error = worst_error(got, want)
        sessions[variant.name] = sess
    times = round_robin(sessions, feeds, args.runs, args.warmup)
    for variant in variants:
        variant.times_ms = times.get(variant.name, [])
    row = {"model": label, "variants": {v.name: v.summary() for v in variants}}
    base = row["variants"][BASELINE].get("median_ms")
    for summary in row["variants"].values():
        if base and "median_ms" in summary:
            summary["ratio"] = summary["median_ms"] / base
    print(line(row), flush=True)
    return row


def line(row: dict) -> str:
    parts = [f"{row['model']:>26}"]
    for name in VARIANTS:
        v = row["variants"].get(name)
        if v is None:
            continue
        if "median_ms" not in v:
            parts.append(f"{name} FAILED")
            continue
        mark = " ✗" if v["differs"] else ""
        iqr = v["q3_ms"] - v["q1_ms"]
        parts.append(f"{name} {v['median_ms']:7.2f} ±{iqr:5.2f} x{v['ratio']:.2f}{mark}")
    return " | ".join(parts)


def environment(args) -> dict:
    return environment_record(
        "latency.py",
        ["onnxruntime", "onnx", "torch", "transformers"],
        runs=args.runs,
        warmup=args.warmup,
        threads=args.threads,
    )


def main(argv: list[str] | None = None) -> int:
    from exports.export import export_name, get_export
    from exports.models import BENCH_EXPORTS, BENCH_MODELS_BY_NAME

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", help="bench model or export names (default all)")
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2, help="intra-op threads")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    started = environment(args)
    block = block_target_available()
    print(f"target {BLOCK_TARGET}: {'measured' if block else 'not available'}", file=sys.stderr)
    rows = []
    with tempfile.TemporaryDirectory(prefix="onnxfuse-latency-") as tmp:
        for model, exporter, opset in BENCH_EXPORTS:
            spec = BENCH_MODELS_BY_NAME[model]
            label = export_name(spec, exporter, opset)
            if args.models and model not in args.models and label not in args.models:
                continue
            if not args.models and model in SKIPPED_BY_DEFAULT:
                continue
            export = get_export(spec, exporter, opset)
            rows.append(measure_model(label, export.path, export.feeds, args, block, Path(tmp)))
    if args.json:
        # the optimizer runs as a fresh CLI per model: commits made meanwhile are in later rows
        started["commit_end"] = environment(args)["commit"]
        result = {"environment": started, "block_target": block, "models": rows}
        args.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
