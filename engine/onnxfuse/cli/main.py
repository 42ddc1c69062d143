"""The `onnxfuse` command line."""

from __future__ import annotations

import argparse
import atexit
import contextlib
import json
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from onnxfuse.cli.arguments import positive_int
from onnxfuse.errors import InvariantError, OnnxfuseError, creating, one_line
from onnxfuse.support.deferred_imports import defer_unused_imports
from onnxfuse.support.heap import collector_paused


class _Parser(argparse.ArgumentParser):
    """argparse that reports bad arguments as one line and exit code 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"onnxfuse: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    from onnxfuse.cli.check import add_check_command
    from onnxfuse.cli.plan import add_plan_command
    from onnxfuse.cli.targets import add_targets_command

    parser = _Parser(
        prog="onnxfuse",
        description="An ONNX graph optimizer whose fusions and foldings are declarative rules.",
    )
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    optimize = sub.add_parser("optimize", help="optimize a model with rule packs")
    optimize.add_argument(
        "model", nargs="?", help="input .onnx model (default: the bundled sample ResNet)"
    )
    optimize.add_argument("-o", "--output", help="where to write the optimized model")
    _add_rule_options(optimize)
    optimize.add_argument(
        "--disable",
        action="append",
        default=[],
        metavar="RULE",
        help="leave out this rule or op-set family (repeatable)",
    )
    optimize.add_argument(
        "--max-iterations",
        type=positive_int,
        default=None,
        help="cap on full passes over the graph (default 10)",
    )
    optimize.add_argument("--max-rewrites", type=positive_int, default=None, help="cap on rewrites")
    optimize.add_argument(
        "--fold-limit",
        type=positive_int,
        default=None,
        metavar="BYTES",
        help="largest constant that folding may create (default 256 MiB)",
    )
    optimize.add_argument("--report-json", metavar="FILE", help="write the report as JSON")
    optimize.add_argument("-q", "--quiet", action="store_true", help="no terminal report")
    optimize.set_defaults(handler=_run_optimize)

    explain = sub.add_parser("explain", help="why a rule does or does not match")
    explain.add_argument("model", help="input .onnx model")
    explain.add_argument("--rule", required=True, help="rule or op-set family name")
    explain.add_argument("--node", help="only this node (by name)")
    _add_rule_options(explain)
    explain.set_defaults(handler=_run_explain)

    rules = sub.add_parser("rules", help="inspect rule packs")
    rules_sub = rules.add_subparsers(dest="rules_command", required=True, parser_class=_Parser)
    listing = rules_sub.add_parser("list", help="list rules")
    _add_rule_options(listing)
    listing.set_defaults(handler=_run_rules_list)

    add_targets_command(sub)
    add_plan_command(sub)
    add_check_command(sub)
    return parser


def _add_rule_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--rules",
        action="append",
        default=[],
        metavar="PATH",
        help="extra rule file or pack folder (repeatable)",
    )
    parser.add_argument(
        "--no-builtin", action="store_true", help="do not load the built-in rule packs"
    )
    parser.add_argument(
        "--target",
        default="cpu",
        help=(
            "execution provider (a name in targets/ or a capability file; default cpu), "
            "optionally with parameters: cpu:block=8|16|auto enables the NCHWc layout"
        ),
    )


def _run_optimize(args: argparse.Namespace) -> int:
    from onnxfuse import api
    from onnxfuse.cli.report import format_report
    from onnxfuse.files.output_paths import (
        check_distinct,
        check_output,
        model_file,
        refuse_overwriting,
        refuse_overwriting_read,
    )
    from onnxfuse.language.packs import files_read
    from onnxfuse.passes.pipeline import Options
    from onnxfuse.rewrite.driver import DEFAULT_MAX_ITERATIONS
    from onnxfuse.targets.capabilities import load_target
    from onnxfuse.targets.params import split_spec

    target = load_target(args.target)
    rules = api.select_rules(args.rules, args.disable, builtin=not args.no_builtin, target=target)
    model_path = Path(args.model) if args.model is not None else api.sample_model_path()
    if args.model is None and not args.quiet:
        print(f"No model given: optimizing the bundled sample model {model_path.name}")
    options = Options(
        target=target,
        max_iterations=args.max_iterations or DEFAULT_MAX_ITERATIONS,
        max_rewrites=args.max_rewrites,
        progress=None if args.quiet else _progress,
    )
    if args.fold_limit:
        options.fold_limit_bytes = args.fold_limit
    check_distinct({"-o": args.output, "--report-json": args.report_json})
    outputs = [path for path in (args.output, args.report_json) if path is not None]
    if args.report_json is not None:
        check_output(args.report_json)
        refuse_overwriting([args.report_json], model_file(model_path))
    rule_files = [file for path in args.rules for file in files_read(Path(path))]
    refuse_overwriting_read(outputs, rule_files, "the rule file")
    base, _ = split_spec(args.target)
    if Path(base).suffix in (".yaml", ".yml"):
        refuse_overwriting_read(outputs, [Path(base)], "the capability file")
    also = [args.report_json] if args.report_json is not None else []
    report = api.optimize_file(model_path, args.output, rules, options, also_writes=also)
    if args.report_json:
        _write_json(args.report_json, report.to_json())
    if not args.quiet:
        print(format_report(report, str(model_path), args.output))
    if report.stopped:
        print(f"onnxfuse: warning: {report.stopped}", file=sys.stderr)
    return 0


def _progress(message: str) -> None:
    print(f"onnxfuse: {message}", file=sys.stderr, flush=True)


def _write_json(path: str, data: object) -> None:
    from onnxfuse.files.output_paths import temporary_prefix

    target = Path(path)
    temporary = target.with_name(f"{temporary_prefix(target)}tmp")
    with creating(path):
        try:
            temporary.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
        except OSError:
            temporary.unlink(missing_ok=True)
            raise
    os.replace(temporary, target)


def _run_explain(args: argparse.Namespace) -> int:
    from onnxfuse import api
    from onnxfuse.files.model_io import load_model
    from onnxfuse.targets.capabilities import load_target

    target = load_target(args.target)
    rules = api.select_rules(args.rules, builtin=not args.no_builtin, target=target)
    # An op-set family's name (transpose-unary) explains each of its members.
    chosen = [r for r in rules if args.rule in (r.name, r.family)]
    if not chosen:
        raise OnnxfuseError(f"no rule named '{args.rule}' (see `onnxfuse rules list`)")
    model = load_model(args.model, target=target)
    for rule in chosen:
        prefix = f"{rule.name}: " if len(chosen) > 1 else ""
        results = api.explain(model, rule, args.node, target)
        if not results:
            print(f"{rule.name}: no node in the model can anchor this rule")
        for item in results:
            where = f"{item.op_type} '{item.node}'" + (
                f" in graph '{item.graph}'" if item.graph else ""
            )
            verdict = "matches" if item.matched else f"no match: {item.reason}"
            print(f"{prefix}{where}: {verdict}")
    return 0


def _run_rules_list(args: argparse.Namespace) -> int:
    from onnxfuse import api

    rules = api.select_rules(args.rules, builtin=not args.no_builtin, target=args.target)
    width = max((len(r.name) for r in rules), default=4)
    print(f"{'rule':<{width}}  {'pack':<10} benefit  description")
    for rule in rules:
        summary = " ".join(rule.description.split())
        print(f"{rule.name:<{width}}  {rule.pack:<10} {rule.benefit:>7}  {summary}")
    print(f"{len(rules)} rules")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    # Library warnings (onnx_ir's initializer notes, ...) are not the user's concern.
    logging.getLogger("onnx_ir").setLevel(logging.ERROR)
    with collector_paused():  # the commands' modules, imported here, live until exit
        parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.handler(args) or 0)
    except InvariantError as exc:
        # Not the user's input: a rule or onnxfuse itself produced an invalid model.
        print(f"onnxfuse: internal error (please report): {one_line(str(exc))}", file=sys.stderr)
        return 1
    except OnnxfuseError as exc:
        print(f"onnxfuse: error: {one_line(str(exc))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("onnxfuse: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader left (`onnxfuse rules list | head`): stop quietly, as other tools do.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except OSError as exc:
        # The system refused a read or a write (a full disk, a file gone): one line.
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"onnxfuse: error: {one_line(where + str(exc.strerror or exc))}", file=sys.stderr)
        return 2


def run() -> None:
    """The command line: ``main``, then exit without tearing the interpreter down.
    Freeing the rules, onnx_ir and sympy object by object at exit took 0.4-0.7 s, longer
    than optimizing a small model. Exit handlers (temporary directories, logging) still
    run; argparse's own exits (--help, usage errors) and tracebacks take the usual way.
    sympy, which onnx_ir imports and optimizing never reads, is imported only if read."""
    defer_unused_imports()
    code = main()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError):  # a closed pipe: nothing more to say
            stream.flush()
    atexit._run_exitfuncs()
    os._exit(code)


if __name__ == "__main__":
    run()
