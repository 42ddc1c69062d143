"""What the commands share: the parser that fails in one line, argument types, rule options."""

from __future__ import annotations

import argparse


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


class Parser(argparse.ArgumentParser):
    """argparse that reports bad arguments as one line and exit code 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"onnxfuse: error: {message}\n")


def add_rule_options(parser: argparse.ArgumentParser) -> None:
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
