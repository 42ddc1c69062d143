"""``python -m fuzz graphs|rules|replay ...`` from a clone's root: ``onnxfuse fuzz``
with this clone's corpus (fuzz/corpus/, which the test suite replays)."""

from __future__ import annotations

import sys
from pathlib import Path

from onnxfuse.fuzz.command import main

if __name__ == "__main__":
    sys.exit(main(prog="python -m fuzz", default_corpus=Path(__file__).resolve().parent / "corpus"))
