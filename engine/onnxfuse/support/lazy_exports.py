"""Package attributes imported from their modules on first use."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_getattr(
    package: str, exports: Mapping[str, str | tuple[str, str]]
) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package`` that imports each name of ``exports``
    (name -> submodule, or (submodule, its name there)) when it is first asked for."""

    def __getattr__(name: str) -> Any:
        found = exports.get(name)
        if found is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module, attribute = found if isinstance(found, tuple) else (found, name)
        return getattr(importlib.import_module(f"{package}.{module}"), attribute)

    return __getattr__
