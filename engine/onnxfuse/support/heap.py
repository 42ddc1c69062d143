"""Loading and optimizing without the cyclic garbage collector's passes over the whole heap."""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator
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


@contextmanager
def long_lived_objects_frozen() -> Iterator[Callable[[], None]]:
    """Leave the long-lived objects (the rules, then the loaded model) out of the cyclic
    garbage collector's passes: each full pass over them cost more than the optimization
    of a small model (sample: 0.3 -> 0.1 s CPU). The collector is paused until the caller
    calls what this yields once the model is loaded (all the load makes is the model:
    BERT-base's load had a 66 ms pass), which freezes it too. Objects made after are
    collected as usual. A caller's own freeze, or a disabled collector, is left alone."""
    if gc.get_freeze_count() or not gc.isenabled():
        yield lambda: None
        return
    paused = True

    def loaded() -> None:
        nonlocal paused
        if paused:
            paused = False
            gc.freeze()  # before enabling: the next allocation would start a pass over it
            gc.enable()

    gc.freeze()
    gc.disable()
    try:
        yield loaded
    finally:
        loaded()
        gc.unfreeze()
