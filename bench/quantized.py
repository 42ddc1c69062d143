"""Quantized models: onnxfuse beside onnxruntime's and onnxscript's optimizers, in one run.

    python bench/quantized.py [--models NAME ...] [--runs N] [--threads T]
                              [--markdown [FILE]] [--json FILE]

The models are tests/exports/quantize.py's: CORPUS (the test-size exports quantized QDQ
S8S8 per channel, QDQ U8S8, QOperator, dynamic and int4 weight-only, the set
tests/models/test_quantized_corpus.py asserts on) and BENCH_CORPUS (ResNet and
MobileNetV2 on one 224x224 image, S8S8 and U8S8), all made by onnxruntime.quantization and
cached. For each, in one process:

- node counts of the original, onnxfuse for cpu, cpu:layout=nhwc and qnn, onnxruntime's session
  optimizer at ORT_ENABLE_EXTENDED and at ORT_ENABLE_ALL (the saved optimized models),
  and onnxscript (optimizer, then its ORT fusions);
- the quantized ops (QLinear*, QGemm, MatMulInteger*, DynamicQuantizeMatMul,
  MatMulNBits, ConvInteger) of onnxfuse's cpu result and of ORT_ENABLE_EXTENDED's;
- how far each result's outputs move from the original's (both run at ORT_DISABLE_ALL),
  in quantization steps of each output (the scale of the DequantizeLinear it is read
  from), or, for an output computed in float, in units of the float tolerance; and how
  far the original's and onnxfuse's cpu result move when run at ORT_ENABLE_ALL;
- latency under onnxruntime (CPU, T threads): onnxfuse's cpu result at ORT_DISABLE_ALL
  and at ORT_ENABLE_ALL, its cpu:layout=nhwc result (channels-last QLinearConv, what
  onnxruntime adds at ORT_ENABLE_ALL) at ORT_DISABLE_ALL, and ORT_ENABLE_EXTENDED's
  saved result at ORT_DISABLE_ALL,
  each relative to the original at ORT_ENABLE_ALL: median of N round-robin runs
  (tests/exports/anchors.py `round_robin`).

`--markdown` writes the table as the "Quantized models" section of docs/parity.md (or
FILE), replacing that section if there is one (bench/parity.py keeps it when it rewrites
the rest).
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

import onnx  # noqa: E402
import onnxruntime as ort  # noqa: E402
from environment import environment  # noqa: E402
from exports.anchors import compare, count_nodes, op_histogram, round_robin  # noqa: E402
from exports.anchors import run as run_unoptimized  # noqa: E402
from exports.anchors import session as saving_session  # noqa: E402
from exports.quantize import (  # noqa: E402
    BENCH_CORPUS,
    CORPUS,
    differences,
    get_quantized,
    output_steps,
)
from latency import session  # noqa: E402

from onnxfuse.api import select_rules  # noqa: E402

ALL, NONE = ort.GraphOptimizationLevel.ORT_ENABLE_ALL, ort.GraphOptimizationLevel.ORT_DISABLE_ALL
SECTION = "## Quantized models"
QUANTIZED_OPS = ("QLinear", "QGemm", "Integer", "DynamicQuantizeMatMul", "MatMulNBits")
# The results whose outputs are compared with the original's, in table order.
STEPPED = (
    "onnxfuse",
    "onnxfuse-nhwc",
    "onnxfuse-qnn",
    "ort-extended",
    "ort-all",
    "orig-all",
    "fuse-all",
)
# The timed variants; the first is the baseline.
TIMED = ("orig-all", "fuse-none", "nhwc-none", "fuse-all", "ext-none")
# onnxfuse for cpu with channels-last convolutions (the nhwc pack), as onnxruntime's
# NhwcTransformer makes QLinearConv at ORT_ENABLE_ALL.
NHWC = "cpu:layout=nhwc"


def quantized_ops(ops: collections.Counter) -> str:
    found = {k.split("::")[-1]: v for k, v in ops.items() if any(q in k for q in QUANTIZED_OPS)}
    return ", ".join(f"{k} {v}" for k, v in sorted(found.items())) or "-"


def measure(name: str, rules, runs: int, threads: int, work: Path) -> dict:
    quantized = get_quantized(name)
    feeds = quantized.feeds
    workdir = work / name
    workdir.mkdir()
    results = compare(
        quantized.path,
        workdir,
        None,
        feeds,
        rules,
        ("onnxfuse", "ort-extended", "onnxscript"),
        ("qnn", NHWC),
    )
    ort_all = workdir / "ort-all.onnx"
    saving_session(quantized.path, ALL, saved=ort_all)
    original = onnx.load(quantized.path)
    steps = output_steps(original)
    want = run_unoptimized(quantized.path, feeds)
    row: dict = {
        "model": name,
        "nodes": {"original": count_nodes(original.graph)},
        "quantized_ops": {},
        "steps": {},
        "errors": {},
    }
    paths = {
        "onnxfuse": results["onnxfuse"].path,
        "onnxfuse-nhwc": results[f"onnxfuse-{NHWC}"].path,
        "onnxfuse-qnn": results["onnxfuse-qnn"].path,
        "ort-extended": results["ort-extended"].path,
        "ort-all": ort_all,
        "onnxscript": results["onnxscript"].path,
    }
    for tool, path in paths.items():
        result = results.get(f"onnxfuse-{NHWC}" if tool == "onnxfuse-nhwc" else tool)
        if path is None or not path.exists():
            row["errors"][tool] = result.error if result is not None else "no result"
            continue
        graph = onnx.load(path, load_external_data=False).graph
        row["nodes"][tool] = count_nodes(graph)
        if tool in ("onnxfuse", "ort-extended"):
            row["quantized_ops"][tool] = quantized_ops(op_histogram(graph))
        try:
            moved = differences(run_unoptimized(path, feeds), want, steps)
        except Exception as exc:  # a result that does not run is a finding, not a crash
            row["errors"][tool] = f"does not run: {str(exc).strip().splitlines()[0][:200]}"
            continue
        row["steps"][tool] = max(moved, default=0.0)
    row["stepped"] = all(s is not None for s in steps)
    timed = {
        "orig-all": (quantized.path, ALL),
        "fuse-none": (paths["onnxfuse"], NONE),
        "nhwc-none": (paths["onnxfuse-nhwc"], NONE),
        "fuse-all": (paths["onnxfuse"], ALL),
        "ext-none": (paths["ort-extended"], NONE),
    }
    sessions = {
        key: session(path, level, threads)
        for key, (path, level) in timed.items()
        if path is not None and path.exists()
    }
    # As a user runs them: onnxruntime's own fusions on, against the unoptimized original.
    for key in ("orig-all", "fuse-all"):
        sess = sessions[key]
        got = sess.run(None, {i.name: feeds[i.name] for i in sess.get_inputs()})
        row["steps"][f"{key}"] = max(differences(got, want, steps), default=0.0)
    times = round_robin(sessions, feeds, runs, warmup=2)
    medians = {key: statistics.median(t) for key, t in times.items()}
    base = medians["orig-all"]
    row["ms"] = medians
    row["ratio"] = {key: m / base for key, m in medians.items()}
    print(json.dumps({k: row[k] for k in ("model", "nodes", "ratio")}), flush=True)
    return row


def _steps(row: dict, tool: str) -> str:
    if tool not in row["steps"]:
        return "✗"
    value = row["steps"][tool]
    return f"{value:.2f}" if row["stepped"] else f"{value:.2f}†"


def table(rows: list[dict]) -> list[str]:
    tools = ("onnxfuse", "onnxfuse-nhwc", "onnxfuse-qnn", "ort-extended", "ort-all", "onnxscript")
    header = (
        "| model | original | onnxfuse cpu | onnxfuse cpu nhwc | onnxfuse qnn | ORT ext "
        "| ORT all | onnxscript | quantized ops, onnxfuse cpu | quantized ops, ORT ext "
        "| steps onnxfuse cpu | steps onnxfuse cpu nhwc | steps onnxfuse qnn | steps ORT ext "
        "| steps ORT all | steps orig@all | steps fuse@all "
        "| fuse@none | fuse nhwc@none | fuse@all | ORT ext@none | ms orig@all |"
    )
    out = [header, "|" + "---|" * 22]
    for row in rows:
        nodes = [str(row["nodes"].get(t, "✗")) for t in tools]
        ratios = [f"{row['ratio'][k]:.2f}" if k in row["ratio"] else "-" for k in TIMED[1:]]
        cells = [
            row["model"],
            str(row["nodes"]["original"]),
            *nodes,
            row["quantized_ops"].get("onnxfuse", "✗"),
            row["quantized_ops"].get("ort-extended", "✗"),
            *(_steps(row, t) for t in STEPPED),
            *ratios,
            f"{row['ms']['orig-all']:.3f}",
        ]
        out.append("| " + " | ".join(cells) + " |")
    return out


def section(rows: list[dict], record: dict) -> list[str]:
    behind = [
        r["model"]
        for r in rows
        if r["nodes"].get("onnxfuse", 10**9) > r["nodes"].get("ort-extended", 10**9)
    ]
    errors = [f"- {r['model']}: {t}: {e}" for r in rows for t, e in r["errors"].items()]
    return [
        SECTION,
        "",
        f"Generated by `{record['command']}` on {record['date']} (commit {record['commit']}, "
        f"{record['machine']}, {record['threads']} thread(s), onnxruntime "
        f"{record['versions']['onnxruntime']}, onnxscript {record['versions']['onnxscript']}).",
        "",
        "Exports quantized by onnxruntime.quantization (tests/exports/quantize.py): `qdq-s8s8-pc` "
        "QDQ with int8 activations and per-channel int8 weights, `qdq-u8s8` QDQ with uint8 "
        "activations and per-tensor int8 weights, `qoperator-u8s8` QLinear ops, `dynamic` "
        "DynamicQuantizeLinear + MatMulInteger, `int4-qdq` int4 weight-only DequantizeLinear "
        "-> MatMul. Node counts of each result (subgraphs included). `steps`: the largest "
        "difference of any output from the original's, both run with optimizations off, in "
        "quantization steps of that output († : an output computed in float, in units of the "
        "float tolerance 1e-4 relative, 1e-5 absolute); `steps orig@all`, `steps fuse@all`: "
        "the original and onnxfuse's cpu result run at ORT_ENABLE_ALL, against the original "
        "run with optimizations off. `onnxfuse cpu nhwc`: onnxfuse for `cpu:layout=nhwc` "
        "(channels-last QLinearConv, as onnxruntime's NhwcTransformer makes at ORT_ENABLE_ALL). "
        "`fuse@none`, `fuse nhwc@none`, `fuse@all`: onnxfuse's cpu result at ORT_DISABLE_ALL, "
        "its cpu:layout=nhwc result at ORT_DISABLE_ALL and its cpu result at "
        "ORT_ENABLE_ALL, `ORT ext@none`: onnxruntime's "
        "ORT_ENABLE_EXTENDED result saved and run at ORT_DISABLE_ALL, each as a ratio to the "
        "original at ORT_ENABLE_ALL (`ms orig@all`, median; below 1: faster). The `-bench` "
        "models are one 224x224 image; the others are test-size, where latency is mostly "
        "per-node overhead.",
        "",
        f"onnxfuse for cpu has more nodes than ORT_ENABLE_EXTENDED on {len(behind)} of "
        f"{len(rows)}: {', '.join(behind) or 'none'}.",
        "",
        *table(rows),
        "",
        *(["Results that failed:", "", *errors, ""] if errors else []),
    ]


def write_section(path: Path, lines: list[str]) -> None:
    """Put the section ``lines`` (a ``## `` heading first) in ``path``, in place of the
    section of that heading, or at the end."""
    text = path.read_text() if path.exists() else ""
    old = text.rstrip("\n").split("\n") if text else []
    if lines[0] in old:
        start = old.index(lines[0])
        end = next((i for i in range(start + 1, len(old)) if old[i].startswith("## ")), len(old))
        old[start:end] = lines
    else:
        old += ["", *lines] if old else lines
    path.write_text("\n".join(old).rstrip("\n") + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", help="corpus names (default: all)")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--markdown", nargs="?", const=str(ROOT / "docs" / "parity.md"))
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    names = args.models or [*CORPUS, *BENCH_CORPUS]
    unknown = [n for n in names if n not in (*CORPUS, *BENCH_CORPUS)]
    if unknown:
        parser.error(f"unknown model(s): {', '.join(unknown)}")
    record = environment(
        "quantized.py", ["onnxruntime", "onnxscript", "onnx"], runs=args.runs, threads=args.threads
    )
    rules = select_rules()
    with tempfile.TemporaryDirectory() as tmp:
        rows = [measure(n, rules, args.runs, args.threads, Path(tmp)) for n in names]
    if args.json:
        args.json.write_text(json.dumps({**record, "rows": rows}, indent=1))
    lines = section(rows, record)
    if args.markdown:
        write_section(Path(args.markdown), lines)
    else:
        print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
