"""The tables of a zoo run, in Markdown, built from its JSON lines (one row a model).

Each table is one pass over the file (``rows`` reads it again), so a run of any size is
rendered without holding its rows in memory.
"""

from __future__ import annotations

import collections
import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

SHORT = {
    "onnxfuse": "onnxfuse",
    "ort-extended": "ORT ext",
    "ort-transformers": "ORT transformers",
    "onnxscript": "onnxscript",
    "onnxslim": "onnxslim",
}

Rows = Callable[[], Iterator[dict[str, Any]]]


def reader(path: Path) -> Rows:
    def rows() -> Iterator[dict[str, Any]]:
        with path.open(encoding="utf-8") as lines:
            for line in lines:
                if line.strip():
                    yield json.loads(line)

    return rows


def tools_of(rows: Rows) -> list[str]:
    """onnxfuse, then the peers, as the rows list them."""
    for row in rows():
        if "tools" in row:
            return list(row["tools"])
    return ["onnxfuse"]


def _peers(tools: list[str]) -> list[str]:
    return [t for t in tools if t != "onnxfuse"]


def best_peer(row: dict[str, Any], peers: list[str]) -> str | None:
    valid = [t for t in peers if row["tools"][t]["valid"]]
    return min(valid, key=lambda t: row["tools"][t]["nodes"]) if valid else None


def not_applicable(tool: dict[str, Any]) -> bool:
    """A peer that does not apply to the model (ort-transformers on a CNN): no result."""
    return bool(tool["error"]) and tool["error"].startswith("n/a")


def node_cell(tool: dict[str, Any]) -> str:
    if tool["nodes"] is None:
        return "n/a" if not_applicable(tool) else "fails"
    return str(tool["nodes"]) if tool["valid"] else f"{tool['nodes']} ✗"


def _mb(size: int | None) -> str:
    return "-" if size is None else f"{size / 1e6:.2f}"


def _left(ours: dict[str, Any], best: dict[str, Any]) -> str:
    """Op types onnxfuse's result has more of than the best peer's, most first."""
    extra = collections.Counter(ours["all_ops"]) - collections.Counter(best["all_ops"])
    return ", ".join(f"{op} +{n}" for op, n in extra.most_common(6))


def _head(cells: list[str]) -> list[str]:
    return ["| " + " | ".join(cells) + " |", "|" + "---|" * len(cells)]


def _line(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def _measured(rows: Rows) -> Iterator[dict[str, Any]]:
    return (row for row in rows() if "error" not in row)


def node_table(rows: Rows) -> Iterator[str]:
    tools = tools_of(rows)
    peers = _peers(tools)
    head = ["model", "opset", "original", *(SHORT.get(t, t) for t in tools)]
    if peers:
        head += ["best peer", "parity", "onnxfuse has more of"]
    yield from _head(head)
    for row in _measured(rows):
        results = row["tools"]
        cells = [row["model"], str(row["opset"]), str(row["nodes"])]
        cells += [node_cell(results[t]) for t in tools]
        if peers:
            ours, best = results["onnxfuse"], best_peer(row, peers)
            if not ours["valid"]:
                verdict, left = "onnxfuse invalid", ""
            elif best is None:
                verdict, left = "no valid peer", ""
            else:
                diff = ours["nodes"] - results[best]["nodes"]
                verdict = "yes" if diff <= 0 else f"+{diff}"
                left = _left(ours, results[best]) if diff > 0 else ""
            cells += [f"{SHORT.get(best, best)} {results[best]['nodes']}" if best else "-"]
            cells += [verdict, left]
        yield _line(cells)


def size_table(rows: Rows) -> Iterator[str]:
    tools = tools_of(rows)
    head = ["model", "original MB", *(f"{SHORT.get(t, t)} MB" for t in tools)]
    yield from _head([*head, "onnxfuse / original"])
    for row in _measured(rows):
        cells = [row["model"], _mb(row["size"])]
        cells += [_mb(row["tools"][t]["size"]) for t in tools]
        ours = row["tools"]["onnxfuse"]["size"]
        cells.append("-" if ours is None else f"{ours / row['size']:.4f}")
        yield _line(cells)


def error_time_table(rows: Rows) -> Iterator[str]:
    tools = tools_of(rows)
    short = [SHORT.get(t, t) for t in tools]
    yield from _head(["model", *(f"err {s}" for s in short), *(f"s {s}" for s in short)])
    for row in _measured(rows):
        cells = [row["model"]]
        for tool in tools:
            error = row["tools"][tool]["max_error"]
            cells.append("-" if error is None else f"{error:.3g}")
        for tool in tools:
            seconds = row["tools"][tool]["seconds"]
            cells.append("-" if seconds is None else f"{seconds:.2f}")
        yield _line(cells)


def latency_rules_table(rows: Rows) -> Iterator[str]:
    """Per model: how it was fed, the median milliseconds of the original and of each
    valid result, onnxfuse's over the original's, the rules fired."""
    timed = ["original", *tools_of(rows)]
    head = ["model", "inputs", *(f"ms {SHORT.get(t, t)}" for t in timed), "latency ratio"]
    yield from _head([*head, "rules fired (rewrites)"])
    for row in _measured(rows):
        latency = row.get("latency", {})
        cells = [row["model"], row["inputs"]]
        cells += [f"{latency[t]:.3f}" if t in latency else "-" for t in timed]
        cells.append(f"{latency['ratio']:.3f}" if latency else "-")
        fired = ", ".join(f"{name} {n}" for name, n in row["fired"].items()) or "none"
        yield _line([*cells, fired])


def summary(rows: Rows) -> Iterator[str]:
    peers = _peers(tools_of(rows))
    total = accepted = smaller = at_best = 0
    valid: collections.Counter[str] = collections.Counter()
    beat: collections.Counter[str] = collections.Counter()
    for row in rows():
        total += 1
        if "error" in row:
            continue
        ours = row["tools"]["onnxfuse"]
        accepted += ours["valid"]
        size = ours["size"]
        smaller += size is not None and size <= row["size"]
        best = best_peer(row, peers)
        at_best += bool(ours["valid"] and best and ours["nodes"] <= row["tools"][best]["nodes"])
        for peer in peers:
            other = row["tools"][peer]
            valid[peer] += other["valid"]
            beat[peer] += bool(ours["valid"] and other["valid"] and ours["nodes"] <= other["nodes"])
    line = f"- onnxfuse's result is valid (runs, same outputs) on {accepted} of {total} models; "
    if peers:
        line += f"its node count is at or below the best valid peer's on {at_best}; "
    yield line + f"its file is no larger than the original on {smaller}."
    for peer in peers:
        yield (
            f"  - vs {SHORT.get(peer, peer)}: at or below on {beat[peer]} of the {valid[peer]} "
            "models where its result is valid."
        )


def failures(rows: Rows) -> Iterator[str]:
    """A line per model whose original does not run or whose onnxfuse result is not
    valid, with the command that reproduces it."""
    for row in rows():
        if row["ok"]:
            continue
        why = row.get("error") or row["tools"]["onnxfuse"]["error"]
        yield f"- {row['model']}: {why}; reproduce: `{row['repro']}`"


def notes(rows: Rows) -> Iterator[str]:
    """The results (of any tool) that do not count, and why."""
    for row in _measured(rows):
        for tool, result in row["tools"].items():
            if result["error"] and not not_applicable(result):
                yield f"- {row['model']}, {SHORT.get(tool, tool)}: {short_reason(result['error'])}"


def short_reason(message: str) -> str:
    """One readable line: no temporary paths, no source locations, at most 160 characters."""
    message = re.sub(r"/\S*/([^/\s]+\.onnx)", r"\1", message)
    message = re.sub(r"/onnxruntime_src/\S+ ", "", message)
    message = re.sub(r"\[ONNXRuntimeError\] : \d+ : \w+ : ", "", message)
    message = re.sub(
        r"Non-zero status code returned while running (\w+) node\. Name:'[^']*' Status Message: ",
        r"\1: ",
        message,
    )
    message = re.sub(r"onnxruntime::[\w:]+\([^)]*\) ", "", message)
    return message if len(message) <= 160 else message[:157] + "..."


def markdown(rows: Rows, title: str, command: str) -> str:
    """The whole report of a run: summary, nodes, sizes, error and time, latency and
    rules, failures with their repro commands."""
    out = [f"# {title}", "", f"Generated by `{command}`.", "", "## Summary", ""]
    out += [*summary(rows), "", "## Nodes", "", *node_table(rows), ""]
    out += ["## File sizes", "", *size_table(rows), "", "## Output error and time", ""]
    out += [*error_time_table(rows), "", "## Latency and rules fired", ""]
    out += [*latency_rules_table(rows), ""]
    failed = list(failures(rows))
    if failed:
        out += ["## Failures", "", *failed, ""]
    dropped = list(notes(rows))
    if dropped:
        out += ["Results that do not count:", "", *dropped, ""]
    return "\n".join(out).rstrip("\n") + "\n"
