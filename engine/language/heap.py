"""Loading without the cyclic garbage collector's passes over the whole heap."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def collector_paused() -> Iterator[None]:
    """No cyclic garbage collection while loading modules, rules or targets.

    Loading the built-in rules keeps ~65k objects; the collections they started
    included full passes over the whole heap (onnx, numpy, sympy, ...): 0.3 s of
    1.3 s. Paused, and what was made moved to the oldest generation before the
    collector resumes, no pass looks at those objects until a full one (the young
    pass that would have followed took 0.06 s). Loading makes next to no garbage
    cycles. A collector the caller disabled stays disabled; with objects the caller
    froze, nothing is moved (moving unfreezes).
    """
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        if not gc.get_freeze_count():
            # freeze() then unfreeze(): every tracked object to the oldest generation,
            # in two list splices, without a pass over any of them.
            gc.freeze()
            gc.unfreeze()
        gc.enable()
