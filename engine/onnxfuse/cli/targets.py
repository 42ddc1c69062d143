"""`onnxfuse targets list`, `onnxfuse targets show NAME [--op OP]` and `onnxfuse targets
coverage MODEL [--target T]`."""

from __future__ import annotations

import argparse
import re
from typing import Any

from onnxfuse.cli.arguments import add_rule_options
from onnxfuse.errors import OnnxfuseError
from onnxfuse.targets.capabilities import OpSupport, Target, builtin_target_names, load_target
from onnxfuse.targets.params import describe_parameters


def add_targets_command(sub: Any) -> None:
    targets = sub.add_parser("targets", help="inspect capability files")
    targets_sub = targets.add_subparsers(
        dest="targets_command", required=True, parser_class=type(targets)
    )
    listing = targets_sub.add_parser("list", help="the built-in targets")
    listing.set_defaults(handler=_run_list)
    show = targets_sub.add_parser("show", help="what a target runs")
    show.add_argument("target", help="a built-in target name or a capability file (.yaml)")
    show.add_argument(
        "--op", help="only this op (`Conv`, or `com.microsoft::FusedConv`), with its notes"
    )
    show.set_defaults(handler=_run_show)
    covered = targets_sub.add_parser(
        "coverage", help="what a target cannot run of a model, before and after optimizing"
    )
    covered.add_argument("model", help="input .onnx model")
    add_rule_options(covered)
    covered.add_argument("--json", metavar="FILE", help="also write both coverages as JSON")
    covered.set_defaults(handler=_run_coverage)


def _run_list(args: argparse.Namespace) -> int:
    targets = [load_target(name) for name in builtin_target_names()]
    width = max(len(t.name) for t in targets)
    print(f"{'target':<{width}}  {'ops':>5}  source / description")
    for target in targets:
        count = "all" if target.all_ops_of else str(target.op_count)
        print(f"{target.name:<{width}}  {count:>5}  {target.description}")
        print(f"{'':<{width}}  {'':>5}  from {_short_source(target.source)}")
    print(f"{len(targets)} targets")
    return 0


def _run_coverage(args: argparse.Namespace) -> int:
    """The model is optimized in memory (nothing written) to see both coverages."""
    from onnxfuse import api
    from onnxfuse.cli.optimize import write_json
    from onnxfuse.cli.report import warn_repairs
    from onnxfuse.files.model_io import load_model
    from onnxfuse.files.output_paths import check_output

    target = load_target(args.target)
    rules = api.select_rules(args.rules, builtin=not args.no_builtin, target=target)
    if args.json is not None:
        check_output(args.json)
    model = load_model(args.model, target=target)
    _, report = api.optimize(model, target, rules, builtin=False, return_report=True)
    before, after = report.coverage_before, report.coverage_after
    assert before is not None and after is not None  # measured for every target
    for when, found in (("before", before), ("after", after)):
        print(f"{when} optimizing: {found.summary()}")
        for item in found.uncovered:
            where = f" in graph '{item.graph}'" if item.graph else ""
            print(f"  not covered: {item.op} '{item.node}'{where}: {item.reason}")
        for size, first, last in found.partitions:
            print(f"  partition of {size} node(s): '{first}' .. '{last}'")
        for op, count in found.inlined.items():
            print(f"  runs only as its ONNX function body: {op} ({count} node(s))")
    for op, count in report.inlined_created().items():
        print(
            f"warning: {op} ({count} created by the rules) runs on {target.spec} only as its "
            "ONNX function body: onnxruntime inlines it again when it loads the model"
        )
    if args.json is not None:
        write_json(args.json, {"before": before.to_json(), "after": after.to_json()})
    warn_repairs(report.repairs)
    return 0


def _short_source(source: str) -> str:
    """Commits shortened, parenthetical extras dropped: one readable line."""
    source = re.sub(r"\b([0-9a-f]{7})[0-9a-f]{33}\b", r"\1", source)
    return re.sub(r"\s*\(\+[^)]*\)", "", source)


def _run_show(args: argparse.Namespace) -> int:
    target = load_target(args.target)
    if args.op:
        return _show_op(target, args.op)
    print(f"{target.name}: {target.description}")
    if target.provider:
        print(f"provider: {target.provider}")
    print(f"source: {target.source}")
    for note in target.notes:
        print(f"note: {note}")
    if target.keeps_qdq_units:
        print("quantization: qdq_units (consumes QDQ node units itself: every unit is kept intact)")
    for line in describe_parameters(target.name):
        print(f"parameter: {line}")
    if target.params:
        print(f"with parameters: {target.spec}")
    if target.all_ops_of:
        domains = ", ".join(d or "ai.onnx" for d in sorted(target.all_ops_of))
        print(f"every standard op of the model's opset in: {domains}")
    for key in sorted(target.ops):
        print("  " + _summary(target.ops[key]))
    print(f"{target.op_count} ops")
    return 0


def _show_op(target: Target, wanted: str) -> int:
    domain, _, op_type = wanted.rpartition("::")
    found = [
        entries
        for (d, op), entries in sorted(target.ops.items())
        if op == op_type and (not domain or d == ("" if domain == "ai.onnx" else domain))
    ]
    if not found:
        if target.supports("" if not domain or domain == "ai.onnx" else domain, op_type, 10**6):
            print(f"{target.name}: {wanted} is supported as a standard op at the model's opset")
            return 0
        raise OnnxfuseError(f"target '{target.name}' does not list op '{wanted}'")
    for entries in found:
        for entry in entries:
            print(_describe(entry))
    return 0


def _label(entry: OpSupport) -> str:
    return f"{entry.domain}::{entry.op_type}" if entry.domain else entry.op_type


def _opsets(entry: OpSupport) -> str:
    return f"{entry.since}+" if entry.until is None else f"{entry.since}-{entry.until}"


def _summary(entries: list[OpSupport]) -> str:
    ranges = ", ".join(_opsets(e) for e in entries)
    limited = " (limits)" if any(e.limits.describe() for e in entries) else ""
    return f"{_label(entries[0])}  opsets {ranges}{limited}"


def _describe(entry: OpSupport) -> str:
    lines = [f"{_label(entry)}  opsets {_opsets(entry)}"]
    for variable, allowed in sorted(entry.types.items()):
        lines.append(f"  {variable}: {', '.join(allowed)}")
    if not entry.types:
        lines.append("  types: not stated (not checked)")
    for key, value in entry.limits.describe().items():
        lines.append(f"  limit {key}: {value}")
    if entry.notes:
        lines.append(f"  notes: {entry.notes}")
    return "\n".join(lines)
