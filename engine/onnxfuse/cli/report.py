"""The terminal report of an optimization run, the warnings of a model's repairs, and
`onnxfuse report REPORT.json --html OUT`: the page of a run from its JSON report."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable

from onnxfuse.rewrite.report import Repair, Report


def warn_repairs(repairs: Iterable[Repair]) -> None:
    """One line on stderr per repair made in the model as read."""
    for repair in repairs:
        print(f"onnxfuse: warning: {repair}", file=sys.stderr)


def format_report(report: Report, source: str, output: str | None) -> str:
    lines = [f"onnxfuse optimize {source}"]
    lines.extend(f"  {repair}" for repair in report.repairs)
    tried = [(name, s) for name, s in report.rules.items() if s.tried]
    if tried:
        width = max(len(name) for name, _ in tried)
        lines.append("")
        lines.append(
            f"  {'rule':<{width}}  {'matched':>7}  {'applied':>7}  {'blocked':>7}  {'ms':>8}"
        )
        for name, stats in sorted(tried, key=lambda p: (-p[1].applied, -p[1].blocked, p[0])):
            lines.append(
                f"  {name:<{width}}  {stats.matched:>7}  {stats.applied:>7}  {stats.blocked:>7}"
                f"  {stats.seconds * 1000:>8.1f}"
            )
    if not any(s.applied for _, s in tried):
        lines.append("  no rule fired")
    blocked = sorted((name, s) for name, s in report.rules.items() if s.blocked)
    for name, stats in blocked:
        lines.append(f"  blocked: {name} ({stats.blocked}x): {stats.blocked_reason}")
    if report.trace is not None:
        lines.append("")
        lines.append(f"  trace ({len(report.trace)} rewrites):")
        lines.extend(f"  {k:>4}. {step}" for k, step in enumerate(report.trace, 1))
    lines.append("")
    change = report.nodes_after - report.nodes_before
    lines.append(
        f"  nodes {report.nodes_before} -> {report.nodes_after} ({change:+d}), "
        f"{report.rewrites} rewrites, {report.folded} constants folded, "
        f"{report.iterations} iteration(s), {report.seconds:.3f} s"
    )
    before, after = report.ops_before, report.ops_after
    changed_ops = sorted(op for op in set(before) | set(after) if before.get(op) != after.get(op))
    if changed_ops:
        lines.append(
            "  ops: "
            + ", ".join(f"{op} {before.get(op, 0)}->{after.get(op, 0)}" for op in changed_ops)
        )
    lines.extend(coverage_lines(report))
    if report.bytes_before is not None and report.bytes_after is not None:
        old_size, new_size = _megabytes(report.bytes_before), _megabytes(report.bytes_after)
        lines.append(f"  size {old_size} -> {new_size}")
        for reason in report.larger_because:
            lines.append(f"  larger: {reason}")
    lines.append(f"  written to {output}" if output else "  (no -o given: nothing written)")
    return "\n".join(lines)


def _megabytes(count: int) -> str:
    return f"{count / 1e6:.2f} MB" if count >= 10_000 else f"{count} B"


def coverage_lines(report: Report) -> list[str]:
    """What the target cannot run, before and after, and the fused ops it runs only by
    inlining their function body again."""
    before, after = report.coverage_before, report.coverage_after
    if before is None or after is None:
        return []
    lines = [
        f"  coverage on {after.target}: before {before.summary()}",
        f"  coverage on {after.target}: after {after.summary()}",
    ]
    if after.uncovered:
        shown = ", ".join(f"'{u.node}' ({u.reason})" for u in after.uncovered[:_SHOWN])
        more = len(after.uncovered) - _SHOWN
        lines.append(f"  not covered after: {shown}" + (f" and {more} more" if more > 0 else ""))
    for op, count in report.inlined_created().items():
        lines.append(
            f"  warning: {op} ({count} created) runs on {after.target} only as its ONNX "
            "function body: onnxruntime inlines it again when it loads the model"
        )
    return lines


# Uncovered nodes the terminal report names; the JSON report lists them all.
_SHOWN = 5


def add_report_command(sub: argparse._SubParsersAction) -> None:
    report = sub.add_parser(
        "report",
        help="write the HTML page of a run from its JSON report (optimize --report-json)",
    )
    report.add_argument("report", help="the JSON report of a run")
    report.add_argument("--html", required=True, metavar="FILE", help="where to write the page")
    report.set_defaults(handler=_run_report)


def _run_report(args: argparse.Namespace) -> int:
    from onnxfuse.errors import OnnxfuseError
    from onnxfuse.files.output_paths import check_distinct, check_output
    from onnxfuse.report.layout import require_dot
    from onnxfuse.report.page import write_page

    check_distinct({"REPORT": args.report, "--html": args.html})
    check_output(args.html)
    require_dot()
    try:
        with open(args.report, encoding="utf-8") as file:
            data = json.load(file)
    except ValueError as exc:
        raise OnnxfuseError(f"{args.report}: not a JSON report ({exc})") from None
    if not isinstance(data, dict):
        raise OnnxfuseError(f"{args.report}: not a JSON report of onnxfuse optimize")
    write_page(data, args.html)
    return 0
