"""Optimizers side by side in one run: onnxfuse, onnxscript and onnxruntime.

    python bench/optimize.py [--repeat N] [--json FILE] [--no-verify] [MODEL.onnx ...]

Models: the nine `light` models of the onnx package (IR 3, ConstantOfShape weights),
the bundled sample ResNet, and any models named on the command line.

Every tool is timed file to file, the same job for each:

- onnxfuse:   `onnxfuse.api.optimize_file` with every built-in rule (load with the full
              checker, optimize, check the result, save atomically); rules are loaded once,
              outside the timing.
- onnxscript: `onnx.load`, `onnxscript.optimizer.optimize` (defaults) on the ModelProto,
              `onnx.save`.
- ort-basic / ort-ext: an onnxruntime CPU session created with ORT_ENABLE_BASIC or
              ORT_ENABLE_EXTENDED and `optimized_model_filepath` (includes kernel setup).

Each tool runs N times per model (round robin, so drift hits all tools alike); the
table shows the median. Ratios are other tool's time / onnxfuse's time (above 1:
onnxfuse is faster). Unless --no-verify, every tool's output is loaded by onnxruntime
(ORT_DISABLE_ALL) once, untimed, and compared with the original's output; the `ok`
column shows which tools' outputs matched within float32 tolerance.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import onnxscript.optimizer
from onnx import helper

from onnxfuse import api
from onnxfuse.zoo.peers import count_nodes

LIGHT_DIR = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
TOOLS = ("onnxfuse", "onnxscript", "ort-basic", "ort-ext")
RTOL, ATOL = 1.3e-6, 1e-5  # float32, as the tests use


def node_count(path: Path) -> int:
    return count_nodes(onnx.load(path, load_external_data=False).graph)


def _session(path: Path, level: ort.GraphOptimizationLevel, saved: Path | None = None):
    options = ort.SessionOptions()
    options.graph_optimization_level = level
    options.log_severity_level = 3
    if saved is not None:
        options.optimized_model_filepath = str(saved)
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def make_tools(rules) -> dict[str, Callable[[Path, Path], None]]:
    def run_onnxfuse(source: Path, out: Path) -> None:
        api.optimize_file(source, out, rules)

    def run_onnxscript(source: Path, out: Path) -> None:
        onnx.save(onnxscript.optimizer.optimize(onnx.load(source)), out)

    def run_ort(level: ort.GraphOptimizationLevel) -> Callable[[Path, Path], None]:
        return lambda source, out: _session(source, level, out) and None

    return {
        "onnxfuse": run_onnxfuse,
        "onnxscript": run_onnxscript,
        "ort-basic": run_ort(ort.GraphOptimizationLevel.ORT_ENABLE_BASIC),
        "ort-ext": run_ort(ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED),
    }


def random_feeds(model: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    initializers = {t.name for t in model.graph.initializer}
    feeds = {}
    for value in model.graph.input:
        if value.name in initializers:
            continue
        tensor_type = value.type.tensor_type
        shape = [d.dim_value if d.HasField("dim_value") else 1 for d in tensor_type.shape.dim]
        dtype = helper.tensor_dtype_to_np_dtype(tensor_type.elem_type)
        feeds[value.name] = rng.standard_normal(shape).astype(dtype)
    return feeds


def verify(source: Path, outputs: dict[str, Path]) -> dict[str, str]:
    """Per tool: 'ok (error at N x tolerance)', or why its output does not match."""
    feeds = random_feeds(onnx.load(source, load_external_data=False))
    level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    expected = _session(source, level).run(None, feeds)
    verdicts = {}
    for tool, path in outputs.items():
        try:
            actual = _session(path, level).run(None, feeds)
        except Exception as exc:  # a tool wrote a model onnxruntime rejects
            message = str(exc).strip().splitlines()[0]
            verdicts[tool] = "fails in onnxruntime: " + (
                message if len(message) <= 110 else message[:110] + "..."
            )
            continue
        worst = max(
            float(np.max(np.abs(a - e) / (ATOL + RTOL * np.abs(e)), initial=0.0))
            for a, e in zip(actual, expected)
        )
        verdict = "ok" if worst <= 1.0 else "mismatch"
        verdicts[tool] = f"{verdict} (worst error {worst:.2f} x tolerance)"
    return verdicts


def bench_model(
    source: Path, tools: dict[str, Callable[[Path, Path], None]], repeat: int, work: Path
) -> dict:
    outputs = {tool: work / f"{source.stem}.{tool}.onnx" for tool in tools}
    times: dict[str, list[float]] = {tool: [] for tool in tools}
    for _ in range(repeat):
        for tool, function in tools.items():
            started = time.perf_counter()
            function(source, outputs[tool])
            times[tool].append(time.perf_counter() - started)
    row = {
        "model": source.stem.removeprefix("light_"),
        "nodes_before": node_count(source),
        "nodes_after": {tool: node_count(path) for tool, path in outputs.items()},
        "seconds": {tool: statistics.median(t) for tool, t in times.items()},
        "all_seconds": times,
    }
    base = row["seconds"]["onnxfuse"]
    row["ratio_vs_onnxfuse"] = {
        tool: row["seconds"][tool] / base for tool in tools if tool != "onnxfuse"
    }
    return row


def format_table(rows: list[dict], verified: bool) -> str:
    others = [t for t in TOOLS if t != "onnxfuse"]
    header = (
        ["model", "before"]
        + [f"{t} nodes" for t in TOOLS]
        + [f"{t} ms" for t in TOOLS]
        + [f"{t}/fuse" for t in others]
        + (["ok"] if verified else [])
    )
    body = []
    for row in rows:
        cells = [row["model"], str(row["nodes_before"])]
        cells += [str(row["nodes_after"][t]) for t in TOOLS]
        cells += [f"{1000 * row['seconds'][t]:.0f}" for t in TOOLS]
        cells += [f"{row['ratio_vs_onnxfuse'][t]:.2f}" for t in others]
        if verified:
            bad = [t for t, v in row["verify"].items() if not v.startswith("ok")]
            cells.append("all" if not bad else "not " + ",".join(bad))
        body.append(cells)
    geomean = ["geomean", ""] + [""] * (2 * len(TOOLS))
    geomean += [
        f"{statistics.geometric_mean(r['ratio_vs_onnxfuse'][t] for r in rows):.2f}" for t in others
    ]
    body.append(geomean + ([""] if verified else []))
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(cells) + " |" for cells in body]
    return "\n".join(lines)


def format_failures(rows: list[dict]) -> str:
    """One line per tool whose output failed the check: the models, the first reason."""
    lines = []
    for tool in TOOLS:
        failed = [
            (row["model"], row["verify"][tool])
            for row in rows
            if not row.get("verify", {}).get(tool, "ok").startswith("ok")
        ]
        if failed:
            models = ", ".join(model for model, _ in failed)
            lines.append(f"{tool}: output not usable for {models}; e.g. {failed[0][1]}")
    if not lines:
        return "every tool's output matched the original"
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="*", help="extra .onnx models to include")
    parser.add_argument("--repeat", type=int, default=3, help="runs per tool and model")
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    parser.add_argument("--no-verify", action="store_true", help="skip the output check")
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    logging.disable(logging.WARNING)  # onnx_ir's notes about IR-3 initializer inputs
    ort.set_default_logger_severity(3)

    started = time.perf_counter()
    rules = api.select_rules()
    rules_seconds = time.perf_counter() - started
    sources = [*sorted(LIGHT_DIR.glob("*.onnx")), api.sample_model_path()]
    sources += [Path(m) for m in args.models]
    tools = make_tools(rules)
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-optimize-") as folder:
        for source in sources:
            print(f"{source.name} ...", file=sys.stderr, flush=True)
            row = bench_model(source, tools, args.repeat, Path(folder))
            if not args.no_verify:
                outputs = {t: Path(folder) / f"{source.stem}.{t}.onnx" for t in tools}
                row["verify"] = verify(source, outputs)
            rows.append(row)
            for output in Path(folder).iterdir():
                output.unlink()
    print(
        f"onnxfuse: {len(rules)} built-in rules (loaded in {1000 * rules_seconds:.0f} ms); "
        f"onnxruntime {ort.__version__}, onnxscript {onnxscript.__version__}, "
        f"onnx {onnx.__version__}; median of {args.repeat} runs, file to file"
    )
    print(format_table(rows, verified=not args.no_verify))
    if not args.no_verify:
        print(format_failures(rows))
    if args.json:
        data = {
            "repeat": args.repeat,
            "rules": len(rules),
            "versions": {
                "onnxruntime": ort.__version__,
                "onnxscript": onnxscript.__version__,
                "onnx": onnx.__version__,
            },
            "models": rows,
        }
        Path(args.json).write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
