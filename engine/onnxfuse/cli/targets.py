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
    add_calibrate_command(targets_sub)


def add_calibrate_command(targets_sub: Any) -> None:
    from onnxfuse.cli.arguments import positive_int

    calibrate = targets_sub.add_parser(
        "calibrate",
        help="time each fused op against the pattern it replaces, on this machine; write "
        "a target profile",
    )
    calibrate.add_argument("target", help="a built-in target name or a capability file")
    calibrate.add_argument(
        "models",
        nargs="*",
        metavar="MODEL",
        help="models whose matches to time, at their shapes (none: shapes drawn from each "
        "rule's verify: domain)",
    )
    calibrate.add_argument("-o", "--output", help="the profile to write (default: stdout)")
    calibrate.add_argument(
        "--dim",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="bind a symbolic dim of the models' inputs (default: 1 for a name holding "
        "'batch', 128 for any other)",
    )
    calibrate.add_argument(
        "--rule",
        action="append",
        default=[],
        metavar="NAME",
        help="time this rule (repeatable; default: every rule creating a fused op, one "
        "outside ONNX's domains)",
    )
    calibrate.add_argument(
        "--rules",
        action="append",
        default=[],
        metavar="PATH",
        help="extra rule file or pack folder (repeatable)",
    )
    calibrate.add_argument(
        "--no-builtin", action="store_true", help="do not load the built-in rule packs"
    )
    calibrate.add_argument(
        "--runs",
        type=positive_int,
        default=30,
        help="alternating timed rounds per match (default 30)",
    )
    calibrate.add_argument(
        "--warmup",
        type=positive_int,
        default=3,
        help="untimed runs of each model first (default 3)",
    )
    calibrate.add_argument(
        "--threads", type=positive_int, default=1, help="onnxruntime intra-op threads (default 1)"
    )
    calibrate.add_argument(
        "--level",
        choices=("disable", "basic", "extended", "all"),
        default="disable",
        help="onnxruntime's graph optimization level while timing (default disable: "
        "the fused op against the very pattern it replaces)",
    )
    calibrate.add_argument("-q", "--quiet", action="store_true", help="no progress lines")
    calibrate.set_defaults(handler=_run_calibrate)


def _run_calibrate(args: argparse.Namespace) -> int:
    import sys
    from pathlib import Path

    from onnxfuse import api
    from onnxfuse.cli.plan import parse_dims
    from onnxfuse.files.model_io import load_model
    from onnxfuse.files.output_paths import check_output, write_text
    from onnxfuse.proof.calibrate import Settings, calibrate, fused_op_rules, input_dim_names
    from onnxfuse.targets.profile import dump_profile

    target = load_target(args.target)
    if "profile" in target.params:
        raise OnnxfuseError("targets calibrate writes a profile: give the target without one")
    rules = api.select_rules(args.rules, None, builtin=not args.no_builtin, target=target)
    names = {r.name for r in rules}
    unknown = [name for name in args.rule if name not in names]
    if unknown:
        raise OnnxfuseError(f"--rule: no rule named {', '.join(unknown)} for '{target.name}'")
    wanted = set(args.rule) or {r.name for r in fused_op_rules(rules)}
    dims = parse_dims(args.dim)
    if args.output is not None:
        check_output(args.output)
    models, names = [], set()
    for path in args.models:
        names.update(input_dim_names(load_model(path)))  # a bad model: one line, now
        models.append((Path(path).name, lambda path=path: load_model(path)))
    unknown = sorted(set(dims) - names)
    if unknown:
        listed = ", ".join(sorted(names)) or "none"
        raise OnnxfuseError(
            f"--dim {unknown[0]}: not a dim of the models' inputs (they have: {listed})"
        )
    settings = Settings(args.runs, args.warmup, args.threads, args.level)

    def progress(line: str) -> None:
        print(f"onnxfuse: {line}", file=sys.stderr, flush=True)

    profile, not_measured = calibrate(
        target, rules, wanted, models, dims, settings, None if args.quiet else progress
    )
    for line in not_measured:
        print(f"onnxfuse: {line}", file=sys.stderr)
    text = dump_profile(profile)
    if args.output is None:
        print(text, end="")
    else:
        write_text(args.output, text)
        if not args.quiet:
            slower = sum(m.slower for m in profile.measurements)
            print(
                f"{len(profile.measurements)} measurements ({slower} slower) written to "
                f"{args.output}"
            )
    return 0


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
