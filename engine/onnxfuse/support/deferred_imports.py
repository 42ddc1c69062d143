"""Modules the command line imports only when something first reads them.

onnx_ir imports sympy when it is imported, for arithmetic on symbolic dimensions
(``SymbolicDim("N") + 1``) that optimizing, planning and checking never do: 0.25 s and
34 MB of a 0.6-0.8 s command. The command line puts a stand-in in ``sys.modules``
for sympy and for onnx_ir's one module that reads sympy while it is imported; the first
attribute asked of a stand-in imports the real module, so a program that does use them
sees no difference but the wait.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import sys
import threading
import types
from typing import Any

# sympy, and the onnx_ir module that reads sympy's attributes while it is imported
# (the only one: the others read them when called).
_DEFERRED = ("sympy", "onnx_ir._symbolic_shapes")

_lock = threading.Lock()


class _StandIn(types.ModuleType):
    """In ``sys.modules`` in place of a module not yet run. It has the real module's
    spec (``import`` then takes it as loaded) and nothing else: the first attribute it
    lacks imports the real module and is read from there, as are all later ones."""

    def __getattr__(self, name: str) -> Any:
        return getattr(_real_module(self), name)


def _real_module(stand_in: _StandIn) -> types.ModuleType:
    with _lock:
        if sys.modules.get(stand_in.__name__) is stand_in:
            del sys.modules[stand_in.__name__]
    return importlib.import_module(stand_in.__name__)


def defer_unused_imports() -> list[str]:
    """Put stand-ins for ``_DEFERRED`` in ``sys.modules``; return the names deferred.
    Nothing is deferred once onnx_ir or sympy is imported, or when a module is not found
    (its import then fails or succeeds as it would have)."""
    if "onnx_ir" in sys.modules or "sympy" in sys.modules:
        return []
    deferred = []
    for name in _DEFERRED:
        spec = _find_without_importing(name)
        if spec is None:
            continue
        stand_in = _StandIn(name)
        stand_in.__spec__ = spec
        stand_in.__loader__ = spec.loader
        stand_in.__file__ = spec.origin
        if spec.submodule_search_locations is not None:
            stand_in.__path__ = list(spec.submodule_search_locations)
        sys.modules[name] = stand_in
        deferred.append(name)
    return deferred


def _find_without_importing(name: str) -> importlib.machinery.ModuleSpec | None:
    """``name``'s spec; for a submodule, found in its package's folder without running
    the package (``importlib.util.find_spec`` would import it)."""
    package, _, _ = name.rpartition(".")
    try:
        if not package:
            return importlib.util.find_spec(name)
        parent = importlib.util.find_spec(package)
        if parent is None or parent.submodule_search_locations is None:
            return None
        return importlib.machinery.PathFinder.find_spec(name, parent.submodule_search_locations)
    except (ImportError, ValueError):
        return None
