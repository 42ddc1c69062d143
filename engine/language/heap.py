"""Loading without full passes of the cyclic garbage collector over the whole heap."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def old_objects_frozen() -> Iterator[None]:
    """Leave the objects alive now (onnx, numpy, sympy and the rest of the imports) out
    of the collector's passes while loading: loading the built-in rules makes enough
    objects to start several full passes, and each walked the whole heap (0.3 s of the
    1.3 s). Objects made meanwhile are collected as usual. A caller's own freeze, or a
    disabled collector, is left alone."""
    if gc.get_freeze_count() or not gc.isenabled():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
