"""The `onnxfuse` command line: one module per command, put together here."""

from __future__ import annotations

import argparse
import atexit
import contextlib
import logging
import os
import sys
from collections.abc import Sequence

from onnxfuse.cli.arguments import Parser
from onnxfuse.errors import InvariantError, OnnxfuseError, one_line
from onnxfuse.support.deferred_imports import defer_unused_imports
from onnxfuse.support.heap import collector_paused


def build_parser() -> argparse.ArgumentParser:
    from onnxfuse.cli.check import add_check_command
    from onnxfuse.cli.explain import add_explain_command
    from onnxfuse.cli.fuzz import add_fuzz_command
    from onnxfuse.cli.optimize import add_optimize_command
    from onnxfuse.cli.plan import add_plan_command
    from onnxfuse.cli.report import add_report_command
    from onnxfuse.cli.rules import add_rules_command
    from onnxfuse.cli.targets import add_targets_command
    from onnxfuse.cli.zoo import add_zoo_command

    parser = Parser(
        prog="onnxfuse",
        description="An ONNX graph optimizer whose fusions and foldings are declarative rules.",
    )
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    add_optimize_command(sub)
    add_explain_command(sub)
    add_rules_command(sub)
    add_targets_command(sub)
    add_plan_command(sub)
    add_check_command(sub)
    add_fuzz_command(sub)
    add_report_command(sub)
    add_zoo_command(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    # Library warnings (onnx_ir's initializer notes, ...) are not the user's concern.
    logging.getLogger("onnx_ir").setLevel(logging.ERROR)
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["fuzz"]:  # the fuzzers parse their own arguments
        from onnxfuse.cli.fuzz import run_fuzz

        return run_fuzz(argv[1:])
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
