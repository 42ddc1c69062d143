"""onnxfuse beside onnxruntime's, onnxscript's and onnxslim's optimizers, model by model.

    python bench/parity.py [--exports ci|all|none] [--only NAME ...] [--runs N] [--no-peer]
                           [--markdown [FILE]] [--jobs N | --ray [ADDRESS]]
    python bench/parity.py --peer-only [--markdown [FILE]]

Two model sets:

- the torch/transformers exports of tests/exports (BERT and its family, GPT-2, ViT, Swin,
  T5, Llama, Whisper, wav2vec2, small CNNs...; legacy exporter at opsets 14/17, dynamo at
  18/20; cached in ~/.cache/onnxfuse-exports). They run through `onnxfuse zoo`'s runner
  (onnxfuse.zoo.run): the run writes them as a zoo manifest in the export cache,
  `parity-all.yaml` (`-ci`, `-only` for those selections: each file, its stored inputs,
  what onnxruntime's transformers optimizer is told of it), and `onnxfuse zoo <that file>
  --every-pack --every-fusion --peers ort,ort-transformers,onnxscript,onnxslim` runs the
  same jobs. Every tool runs on each (onnxfuse.zoo.peers): node count of its result,
  whether the result runs in onnxruntime and computes the original's outputs (within 1e-4
  relative), and the latency of each valid result under onnxruntime with graph
  optimizations disabled: median of N runs, the models' runs alternating, same process,
  one thread. `--jobs N` or `--ray` spread the exports over workers (for node counts;
  latency is best measured with one job).
- the peer models of tests/data/ort-fusion (onnxruntime's own fusion test models):
  onnxfuse's and onnxscript's node counts beside onnxruntime's (from manifest.json,
  ORT_ENABLE_EXTENDED), the ops onnxruntime creates that onnxfuse's result lacks, and
  whether onnxfuse meets the parity criterion of tests/peer_parity.py (which
  tests/models/test_peer_models.py asserts). These only count ops: nothing is run.

`--markdown` writes the tables to docs/parity.md (or FILE) with the command and date on top.
`--peer-only` runs only the peer models and, with `--markdown`, replaces only the peer
summary line and the peer section of an existing file (the exports are not re-run).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

import numpy as np  # noqa: E402
import onnx  # noqa: E402
import onnxruntime as ort  # noqa: E402
import onnxscript  # noqa: E402
import yaml  # noqa: E402
from exports.anchors import op_histogram, quiet  # noqa: E402
from peer_parity import KNOWN_GAPS, parity_failures  # noqa: E402

from onnxfuse.api import optimize_file, select_rules  # noqa: E402
from onnxfuse.errors import OnnxfuseError  # noqa: E402
from onnxfuse.passes.pipeline import Options  # noqa: E402
from onnxfuse.support import workers  # noqa: E402
from onnxfuse.targets.capabilities import load_target  # noqa: E402
from onnxfuse.zoo import table  # noqa: E402
from onnxfuse.zoo.run import Settings, jobs_of, run_job  # noqa: E402
from onnxfuse.zoo.table import SHORT, best_peer, short_reason  # noqa: E402

PEER_DIR = ROOT / "tests" / "data" / "ort-fusion"
ANCHORS = ("ort-extended", "ort-transformers", "onnxscript", "onnxslim")
TOOLS = ("onnxfuse", *ANCHORS)


def export_manifest(names: list[str] | None, which: str) -> Path:
    """The run's exports (made now where not cached) as a zoo manifest in the export cache."""
    from exports.export import ALL_EXPORTS, cache_dir, get_export

    try:
        from test_exports import CI_EXPORTS
    except Exception:  # the test module skips itself without torch; the bench then cannot run
        CI_EXPORTS = ()
    entries = []
    for name, (spec, exporter, opset) in ALL_EXPORTS.items():
        if names and name not in names and spec.name not in names:
            continue
        if not names and which == "ci" and name not in CI_EXPORTS:
            continue
        print(f"  {name}", file=sys.stderr, flush=True)
        export = get_export(spec, exporter, opset)
        feeds = export.path.with_suffix(".feeds.npz")
        if not feeds.exists():
            np.savez(feeds, **export.feeds)
        entry: dict[str, Any] = {
            "name": name,
            "file": export.path.name,
            "feeds": feeds.name,
            "description": f"{spec.name}, {exporter} exporter, opset {opset}",
        }
        if (transformer := spec.transformer) is not None:
            entry["transformer"] = {
                "model_type": transformer.ort_model_type,
                "num_heads": transformer.num_heads,
                "hidden_size": transformer.hidden_size,
            }
        entries.append(entry)
    # One manifest per selection, written whole: runs of other selections keep theirs.
    manifest = cache_dir() / f"parity-{'only' if names else which}.yaml"
    partial = manifest.with_suffix(".partial")
    partial.write_text(yaml.safe_dump({"models": entries}, sort_keys=False))
    os.replace(partial, manifest)
    return manifest


def export_rows(
    names: list[str] | None, which: str, runs: int, run_on: workers.Workers
) -> list[dict]:
    """A zoo row per export (onnxfuse.zoo.run), with the test's known gap."""
    try:
        from test_exports import KNOWN_GAPS as EXPORT_GAPS
    except Exception:
        EXPORT_GAPS = {}
    manifest = export_manifest(names, which)
    print(f"manifest: {manifest}", file=sys.stderr)
    # As tests/models/test_exports.py compares: every pack, every fusion, beside the anchors.
    settings = Settings(
        target="cpu", every_pack=True, every_fusion=True, peers=ANCHORS, latency_runs=runs
    )
    rows = []
    for row in workers.in_order(workers.run_jobs(run_job, jobs_of(manifest, settings), run_on)):
        if "error" in row:  # the original itself does not run: nothing to compare
            raise SystemExit(f"{row['model']}: {row['error']}")
        row["known_gap"] = EXPORT_GAPS.get(row["model"])
        rows.append(row)
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
                # As the test compares: also the fusions a profile gates on this CPU.
                optimize_file(path, out, rules, Options(target=target, gate_by_profile=False))
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


def export_table(rows: list[dict]) -> list[str]:
    head = ["export", "original"] + [SHORT[t] for t in TOOLS] + ["best anchor", "parity"]
    head += [f"ms {SHORT.get(t, t)}" for t in ("original", *TOOLS)]
    head += ["best anchor's ops onnxfuse lacks"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        results = row["tools"]
        best = best_peer(row, list(ANCHORS))
        ours = results["onnxfuse"]
        if not ours["valid"]:
            verdict = "onnxfuse invalid"
        elif best is None:
            verdict = "no valid anchor"
        else:
            diff = ours["nodes"] - results[best]["nodes"]
            verdict = "yes" if diff <= 0 else f"+{diff}"
        cells = [row["model"], str(row["nodes"])]
        cells += [table.node_cell(results[t]) for t in TOOLS]
        cells += [f"{SHORT[best]} {results[best]['nodes']}" if best else "-", verdict]
        latency = row.get("latency", {})
        for tool in ("original", *TOOLS):
            cells.append(f"{latency[tool]:.3f}" if tool in latency else "-")
        lacks = []
        if best and ours["valid"]:
            lacks = sorted(k for k in results[best]["all_ops"] if k not in ours["all_ops"])
        cells.append(", ".join(lacks))
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def export_notes(rows: list[dict]) -> list[str]:
    notes = []
    for row in rows:
        for tool, result in row["tools"].items():
            if result["error"] and not table.not_applicable(result):
                notes.append(f"- {row['model']}, {SHORT[tool]}: {short_reason(result['error'])}")
    return notes


def gap_notes(rows: list[dict]) -> list[str]:
    """KNOWN_GAPS grouped by reason, in the order the exports appear."""
    by_reason: dict[str, list[str]] = {}
    for row in rows:
        if row["known_gap"]:
            by_reason.setdefault(row["known_gap"], []).append(row["model"])
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

        def at_or_below(row: dict, tool: str | None) -> bool:
            ours, results = row["tools"]["onnxfuse"], row["tools"]
            return bool(tool and ours["valid"] and ours["nodes"] <= results[tool]["nodes"])

        at = sum(at_or_below(r, best_peer(r, list(ANCHORS))) for r in export)
        lines.append(
            f"- Exports: onnxfuse at or below the best anchor's node count on {at} "
            f"of {len(export)}."
        )
        for t in ANCHORS:
            valid = [r for r in export if r["tools"][t]["valid"]]
            beat = sum(at_or_below(r, t) for r in valid)
            lines.append(
                f"  - vs {SHORT[t]}: at or below on {beat} of the {len(valid)} exports where "
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
        "# Parity: onnxfuse beside onnxruntime, onnxscript and onnxslim",
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
    workers.add_arguments(parser, jobs_help="exports at once, in worker processes")
    args = parser.parse_args(argv)
    try:
        run_on = workers.from_arguments(args)
    except OnnxfuseError as exc:
        raise SystemExit(str(exc)) from None
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
        export = export_rows(args.only, args.exports, args.runs, run_on)
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
