"""`onnxfuse optimize [IN] [-o OUT]`: optimize a model, print or write its report."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from onnxfuse.cli.arguments import add_rule_options, positive_int
from onnxfuse.errors import creating


def add_optimize_command(sub: argparse._SubParsersAction) -> None:
    optimize = sub.add_parser("optimize", help="optimize a model with rule packs")
    optimize.add_argument(
        "model", nargs="?", help="input .onnx model (default: the bundled sample ResNet)"
    )
    optimize.add_argument("-o", "--output", help="where to write the optimized model")
    add_rule_options(optimize)
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
    optimize.add_argument(
        "--dequantize",
        action="store_true",
        help="fold DequantizeLinear (or Cast to float) of constant 8-bit weights into "
        "float weights (only for a target that runs no quantized op; quantized weights "
        "stay quantized otherwise)",
    )
    optimize.add_argument(
        "--no-provenance",
        action="store_true",
        help="do not record in each created node the rule that created it and the nodes "
        "it replaced (metadata_props onnxfuse.rule and onnxfuse.replaced)",
    )
    optimize.add_argument("--report-json", metavar="FILE", help="write the report as JSON")
    optimize.add_argument("-q", "--quiet", action="store_true", help="no terminal report")
    optimize.set_defaults(handler=_run_optimize)


def _run_optimize(args: argparse.Namespace) -> int:
    from onnxfuse import api
    from onnxfuse.cli.report import format_report, warn_repairs
    from onnxfuse.files.output_paths import (
        check_distinct,
        check_output,
        model_file,
        refuse_overwriting,
        refuse_overwriting_read,
    )
    from onnxfuse.language.packs import files_read
    from onnxfuse.passes.pipeline import Options, check_dequantize
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
        dequantize=args.dequantize,
        provenance=not args.no_provenance,
    )
    if args.dequantize:
        check_dequantize(target)  # before the work: one line, exit 2
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
        write_text(args.report_json, json.dumps(report.to_json(), indent=2) + "\n")
    if not args.quiet:
        print(format_report(report, str(model_path), args.output))
    warn_repairs(report.repairs)
    if report.stopped:
        print(f"onnxfuse: warning: {report.stopped}", file=sys.stderr)
    return 0


def _progress(message: str) -> None:
    print(f"onnxfuse: {message}", file=sys.stderr, flush=True)


def write_text(path: str, text: str) -> None:
    """Write ``text`` to ``path`` atomically (a report, a profile)."""
    from onnxfuse.files.output_paths import temporary_prefix

    target = Path(path)
    temporary = target.with_name(f"{temporary_prefix(target)}tmp")
    with creating(path):
        try:
            temporary.write_text(text, encoding="utf-8")
        except OSError:
            temporary.unlink(missing_ok=True)
            raise
    os.replace(temporary, target)
