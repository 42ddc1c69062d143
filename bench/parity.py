"""onnxfuse beside onnxruntime's and onnxscript's optimizers, model by model, in one run.

    python bench/parity.py [--exports ci|all|none] [--only NAME ...] [--runs N] [--no-peer]
                           [--markdown [FILE]]
    python bench/parity.py --peer-only [--markdown [FILE]]

Two model sets:

- the torch/transformers exports of tests/exports (BERT, GPT-2, ViT, T5, Llama, small CNNs;
  legacy exporter at opsets 14/17, dynamo at 18/20; cached in ~/.cache/onnxfuse-exports).
  Every tool runs on each (see tests/exports/anchors.py): node count of its result, whether
  the result runs in onnxruntime and computes the original's outputs (within 1e-4
  relative), and the latency of each valid result under onnxruntime with graph
  optimizations disabled: median of N runs, the models' runs alternating, same process,
  one thread.
- the peer models of tests/data/ort-fusion (onnxruntime's own fusion test models):
  onnxfuse's and onnxscript's node counts beside onnxruntime's (from manifest.json,
  ORT_ENABLE_EXTENDED), the ops onnxruntime creates that onnxfuse's result lacks, and
  whether onnxfuse meets the parity criterion of tests/peer_parity.py (which
  tests/models/test_peer_models.py asserts).

`--markdown` writes the tables to docs/parity.md (or FILE) with the command and date on top.
`--peer-only` runs only the peer models and, with `--markdown`, replaces only the peer
summary line and the peer section of an existing file (the exports are not re-run).
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

import onnx  # noqa: E402
import onnxruntime as ort  # noqa: E402
import onnxscript  # noqa: E402
from exports.anchors import (  # noqa: E402
    ANCHORS,
    TOOLS,
    Result,
    best_anchor,
    compare,
    count_nodes,
    latency_ms,
    op_histogram,
    quiet,
)
from peer_parity import KNOWN_GAPS, parity_failures  # noqa: E402

from onnxfuse.api import optimize_file, select_rules  # noqa: E402
from onnxfuse.errors import OnnxfuseError  # noqa: E402
from onnxfuse.passes.pipeline import Options  # noqa: E402
from onnxfuse.targets.capabilities import load_target  # noqa: E402
from onnxfuse.zoo.table import short_reason  # noqa: E402

PEER_DIR = ROOT / "tests" / "data" / "ort-fusion"
SHORT = {
    "onnxfuse": "onnxfuse",
    "ort-extended": "ORT ext",
    "ort-transformers": "ORT transformers",
    "onnxscript": "onnxscript",
    "onnxslim": "onnxslim",
}


def export_rows(names: list[str] | None, which: str, runs: int, rules) -> list[dict]:
    from exports.export import EXPORTERS, export_name, get_export
    from exports.models import MODELS

    try:
        from test_exports import CI_EXPORTS, KNOWN_GAPS
    except Exception:  # the test module skips itself without torch; the bench then cannot run
        CI_EXPORTS, KNOWN_GAPS = (), {}
    rows = []
    for spec in MODELS:
        for exporter, opset in EXPORTERS:
            name = export_name(spec, exporter, opset)
            if names and name not in names and spec.name not in names:
                continue
            if not names and which == "ci" and name not in CI_EXPORTS:
                continue
            print(f"  {name}", file=sys.stderr, flush=True)
            export = get_export(spec, exporter, opset)
            with tempfile.TemporaryDirectory() as tmp:
                results = compare(export.path, Path(tmp), spec, export.feeds, rules)
                paths = {"original": export.path}
                paths |= {t: r.path for t, r in results.items() if r.valid and r.path}
                with quiet():
                    latency = latency_ms(paths, export.feeds, runs)
            original = count_nodes(onnx.load(export.path, load_external_data=False).graph)
            rows.append(
                {
                    "name": name,
                    "original": original,
                    "results": results,
                    "latency": latency,
                    "known_gap": KNOWN_GAPS.get(name),
                }
            )
    return rows


def peer_rows(rules) -> list[dict]:
    import onnx_ir as ir
    import onnxscript.optimizer
    from onnxscript.rewriter import ort_fusions

    manifest = json.loads((PEER_DIR / "manifest.json").read_text())
    rows = []
    target = load_target("cpu")
    for entry in manifest:
        ort_ops = entry["ops_after_ort_cpu_extended"]
        if ort_ops is None:
            continue
        path = PEER_DIR / entry["model"]
        row = {
            "name": entry["model"],
            "original": entry["nodes_before"],
            "before": entry["ops_before"],
            "ort": ort_ops,
        }
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "out.onnx"
            try:
                optimize_file(path, out, rules, Options(target=target))
                row["ours"] = op_histogram(onnx.load(out).graph)
                row["failed"] = parity_failures(
                    entry["model"], entry["ops_before"], ort_ops, row["ours"]
                )
            except OnnxfuseError as exc:
                row["ours"] = None
                message = str(exc).splitlines()[0]
                row["refused"] = short_reason(message.split(f"{path}: ", 1)[-1])
            try:
                with quiet():
                    model = ir.load(str(path))
                    onnxscript.optimizer.optimize(model)
                    model, _ = ort_fusions.optimize_for_ort(model)
                row["onnxscript"] = sum(1 for _ in model.graph)
            except Exception as exc:
                row["onnxscript"] = None
                row["onnxscript_error"] = f"{type(exc).__name__}"
        rows.append(row)
    return rows


def _nodes(result: Result) -> str:
    if result.nodes is None:
        return "n/a" if result.error and result.error.startswith("n/a") else "fails"
    return str(result.nodes) if result.valid else f"{result.nodes} ✗"


def export_table(rows: list[dict]) -> list[str]:
    head = ["export", "original"] + [SHORT[t] for t in TOOLS] + ["best anchor", "parity"]
    head += [f"ms {SHORT.get(t, t)}" for t in ("original", *TOOLS)]
    head += ["best anchor's ops onnxfuse lacks"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        results = row["results"]
        best = best_anchor(results)
        ours = results["onnxfuse"]
        if not ours.valid:
            verdict = "onnxfuse invalid"
        elif best is None:
            verdict = "no valid anchor"
        else:
            diff = ours.nodes - best.nodes
            verdict = "yes" if diff <= 0 else f"+{diff}"
        cells = [row["name"], str(row["original"])]
        cells += [_nodes(results[t]) for t in TOOLS]
        cells += [f"{SHORT[best.tool]} {best.nodes}" if best else "-", verdict]
        for tool in ("original", *TOOLS):
            value = row["latency"].get(tool)
            cells.append(f"{value:.3f}" if value is not None else "-")
        lacks = sorted(k for k in best.ops if k not in ours.ops) if best and ours.valid else []
        cells.append(", ".join(lacks))
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def export_notes(rows: list[dict]) -> list[str]:
    notes = []
    for row in rows:
        for tool, result in row["results"].items():
            if result.error and not result.error.startswith("n/a"):
                notes.append(f"- {row['name']}, {SHORT[tool]}: {short_reason(result.error)}")
    return notes


def gap_notes(rows: list[dict]) -> list[str]:
    """KNOWN_GAPS grouped by reason, in the order the exports appear."""
    by_reason: dict[str, list[str]] = {}
    for row in rows:
        if row["known_gap"]:
            by_reason.setdefault(row["known_gap"], []).append(row["name"])
    return [f"- {', '.join(names)}: {reason}" for reason, names in by_reason.items()]


def peer_table(rows: list[dict]) -> list[str]:
    head = [
        "model",
        "original",
        "onnxfuse",
        "ORT ext",
        "onnxscript",
        "ops ORT creates that onnxfuse lacks",
        "parity",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        ours = row["ours"]
        ort_nodes = sum(row["ort"].values())
        if ours is None:
            ours_cell, lacks, parity = f"refused ({row['refused']})", "", ""
        else:
            ours_cell = str(sum(ours.values()))
            if sum(ours.values()) > ort_nodes:
                ours_cell += " ▲"
            created = (k for k in row["ort"] if k not in row["before"])
            lacks = ", ".join(sorted(k for k in created if k not in ours))
            parity = "; ".join(sorted(row["failed"])) + " (known gap)" if row["failed"] else "✓"
        script = row["onnxscript"] if row["onnxscript"] is not None else "fails"
        cells = [
            row["name"],
            str(row["original"]),
            ours_cell,
            str(ort_nodes),
            str(script),
            lacks,
            parity,
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def summary(export: list[dict], peer: list[dict]) -> list[str]:
    lines = []
    if export:
        at = sum(
            1
            for r in export
            if r["results"]["onnxfuse"].valid
            and (b := best_anchor(r["results"])) is not None
            and r["results"]["onnxfuse"].nodes <= b.nodes
        )
        beat = {
            t: sum(
                1
                for r in export
                if r["results"]["onnxfuse"].valid
                and r["results"][t].valid
                and r["results"]["onnxfuse"].nodes <= r["results"][t].nodes
            )
            for t in ANCHORS
        }
        valid = {t: sum(1 for r in export if r["results"][t].valid) for t in ANCHORS}
        lines.append(
            f"- Exports: onnxfuse at or below the best anchor's node count on {at} "
            f"of {len(export)}."
        )
        for t in ANCHORS:
            lines.append(
                f"  - vs {SHORT[t]}: at or below on {beat[t]} of the {valid[t]} exports where "
                "its result is valid."
            )
    if peer:
        lines.append(peer_summary(peer))
    return lines


def peer_summary(peer: list[dict]) -> str:
    accepted = [r for r in peer if r["ours"] is not None]
    ok = sum(1 for r in accepted if not r["failed"])
    gaps = sum(1 for r in accepted if r["failed"])
    return (
        f"- Peer models: onnxfuse meets onnxruntime's ORT_ENABLE_EXTENDED result (no more "
        f"nodes, the ops onnxruntime creates unless onnxfuse fused further, the models meant "
        f"not to fuse left with onnxruntime's ops: `tests/peer_parity.py`) on {ok} of the "
        f"{len(accepted)} it accepts; {gaps} known gaps, each with its reason below; "
        f"{len(peer) - len(accepted)} refused as invalid ONNX."
    )


def peer_gap_notes(rows: list[dict]) -> list[str]:
    """Peer models that miss parity, grouped by the reason KNOWN_GAPS gives."""
    by_reason: dict[str, list[str]] = {}
    for row in rows:
        if row["ours"] is not None and row["failed"]:
            reason = KNOWN_GAPS.get(row["name"], (None, "not a known gap"))[1]
            by_reason.setdefault(reason, []).append(row["name"])
    return [f"- {', '.join(names)}: {reason}" for reason, names in by_reason.items()]


def peer_section(peer: list[dict]) -> list[str]:
    out = [
        "## Peer models (`tests/data/ort-fusion`)",
        "",
        "onnxruntime's own fusion test models, node counts only: onnxruntime's are from",
        "`manifest.json` (onnxruntime 1.32, CPU, ORT_ENABLE_EXTENDED). `ops ORT creates that",
        "onnxfuse lacks`: op types onnxruntime's result has and the original has not (the",
        "fused ops) that onnxfuse's result lacks. `parity`: the checks of",
        "`tests/peer_parity.py` onnxfuse fails (`more nodes`, `lacks fused ops`, `not left as",
        "onnxruntime leaves it`), or ✓.",
        "",
        *peer_table(peer),
        "",
    ]
    gaps = peer_gap_notes(peer)
    if gaps:
        out += ["Known gaps (asserted by `tests/models/test_peer_models.py`):", "", *gaps, ""]
    return out


def replace_peer_part(text: str, peer: list[dict], command: str) -> str:
    """``text`` (a parity.md) with its peer summary line and peer section regenerated."""
    lines = text.rstrip("\n").split("\n")
    heading = "## Peer models (`tests/data/ort-fusion`)"
    if heading not in lines:
        raise SystemExit(f"no '{heading}' section to replace")
    start = lines.index(heading)
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    section = peer_section(peer)
    section[1:1] = ["", f"This section and the peer summary line: `{command}` on {now}."]
    lines[start:end] = section
    first = next(i for i, line in enumerate(lines) if line.startswith("- Peer models:"))
    last = first + 1
    while last < len(lines) and lines[last].startswith("  "):
        last += 1  # the old line's continuation, if it was wrapped
    lines[first:last] = [peer_summary(peer)]
    return "\n".join(lines).rstrip("\n") + "\n"


def markdown(command: str, export: list[dict], peer: list[dict], runs: int) -> str:
    import onnx_ir  # noqa: F401  (version below)

    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    versions = (
        f"onnxruntime {ort.__version__}, onnxscript {onnxscript.__version__}, "
        f"onnx {onnx.__version__}"
    )
    try:
        import torch
        import transformers

        versions += f", torch {torch.__version__}, transformers {transformers.__version__}"
    except ImportError:
        pass
    out = [
        "# Parity: onnxfuse beside onnxruntime and onnxscript",
        "",
        f"Generated by `{command}` on {now} ({platform.machine()}, {versions}).",
        "Regenerate with the same command; the tables below are that run's output.",
        "",
        "## Summary",
        "",
        *summary(export, peer),
        "",
    ]
    if export:
        out += [
            "## Exports",
            "",
            "Node counts of each tool's result (every node, subgraphs included); `✗`: the result",
            "does not run in onnxruntime or its outputs differ from the original's by more than",
            "1e-4 relative (see the notes), and it does not count as an anchor. `parity`: onnxfuse",
            "at or below the best valid anchor, or how many nodes it has more. `ms`: median",
            f"latency of {runs} runs under onnxruntime, graph optimizations disabled, one thread,",
            "the models' runs alternating in one process (`-`: no valid result). ORT transformers",
            "is `onnxruntime.transformers.optimizer.optimize_model` at opt_level 1 and 99 (the",
            "better valid one); `n/a` for the CNNs, which it does not target. Latencies of",
            "these tiny models are dominated by per-node overhead and vary with the machine's",
            "load: compare within a row.",
            "",
            *export_table(export),
            "",
        ]
        notes = export_notes(export)
        if notes:
            out += ["Notes:", "", *notes, ""]
        gaps = gap_notes(export)
        if gaps:
            out += ["Known gaps (asserted by `tests/models/test_exports.py`):", "", *gaps, ""]
    if peer:
        out += peer_section(peer)
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--exports", choices=("ci", "all", "none"), default="all")
    parser.add_argument("--only", nargs="+", help="export or model names")
    parser.add_argument("--runs", type=int, default=50, help="latency runs per model")
    parser.add_argument("--no-peer", action="store_true")
    parser.add_argument("--markdown", nargs="?", const=str(ROOT / "docs" / "parity.md"))
    parser.add_argument(
        "--peer-only",
        action="store_true",
        help="only the peer models; --markdown then replaces only their part of the file",
    )
    args = parser.parse_args(argv)
    rules = select_rules()
    command = "python bench/parity.py " + " ".join(sys.argv[1:] if argv is None else argv)
    if args.peer_only:
        peer = peer_rows(rules)
        if args.markdown:
            path = Path(args.markdown)
            path.write_text(replace_peer_part(path.read_text(), peer, command.strip()))
            print(f"updated the peer part of {args.markdown}", file=sys.stderr)
        else:
            print("\n".join([peer_summary(peer), "", *peer_section(peer)]))
        return 0
    export: list[dict] = []
    if args.exports != "none" or args.only:
        print("exports:", file=sys.stderr)
        export = export_rows(args.only, args.exports, args.runs, rules)
    peer = [] if args.no_peer or args.only else peer_rows(rules)
    text = markdown(command.strip(), export, peer, args.runs)
    print(text)
    if args.markdown:
        path = Path(args.markdown)
        kept = kept_sections(path.read_text()) if path.exists() else []
        path.write_text("\n".join([text, *kept]).rstrip("\n") + "\n")
        print(f"wrote {args.markdown}", file=sys.stderr)
    return 0


# Sections of docs/parity.md other benchmarks write (bench/quantized.py, bench/llm.py); a
# run of this one keeps them as they are.
OTHER_SECTIONS = ("## Quantized models", "## Decoders with a KV cache")


def kept_sections(text: str) -> list[str]:
    """The lines of ``text``'s OTHER_SECTIONS, each from its heading to the next one."""
    lines = text.rstrip("\n").split("\n")
    kept: list[str] = []
    for heading in OTHER_SECTIONS:
        if heading in lines:
            start = lines.index(heading)
            end = next(
                (i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines)
            )
            kept += ["", *lines[start:end]]
    return kept


if __name__ == "__main__":
    sys.exit(main())
