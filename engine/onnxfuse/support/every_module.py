"""Import every onnxfuse module, so that what hypothesis draws depends on the seed alone."""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path


def load_every_module() -> None:
    """Import every onnxfuse module now (the fuzzers' and the commands' too).

    Hypothesis draws some values from constants it finds in the local modules
    loaded so far (sys.modules). Modules imported lazily during a run would
    make the cases of a job depend on what ran before it in the process (and on
    which process, or machine, runs it): with everything loaded up front, they
    depend on the seed (and the code) only.
    """
    package = str(Path(__file__).resolve().parents[1])  # onnxfuse/, this module's package's
    names = ["onnxfuse.builtin_rules", "onnxfuse.builtin_targets"]
    names += [m.name for m in pkgutil.walk_packages([package], "onnxfuse.")]
    for name in sorted(names):
        if name.endswith("__main__"):
            continue
        try:
            importlib.import_module(name)
        except Exception:
            continue
