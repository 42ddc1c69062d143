"""`onnxfuse fuzz graphs|rules|replay ...`: the fuzzers of ``onnxfuse.fuzz``, their own
command line (saving failures in ./fuzz-corpus by default)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def add_fuzz_command(sub: argparse._SubParsersAction) -> None:
    # Listed in `onnxfuse --help` only: `main` hands `onnxfuse fuzz ...` to the fuzzers'
    # own parser before this one would read its arguments.
    sub.add_parser(
        "fuzz",
        help="random models through the optimizer and mutated rule files, against "
        "onnxruntime (`onnxfuse fuzz graphs --help`)",
        add_help=False,
    )


def run_fuzz(argv: Sequence[str]) -> int:
    try:
        import hypothesis  # noqa: F401 (the fuzzers draw with it)
    except ImportError:
        print(
            "onnxfuse: error: onnxfuse fuzz needs hypothesis: pip install hypothesis",
            file=sys.stderr,
        )
        return 2
    from onnxfuse.fuzz.command import main

    return main(list(argv))
