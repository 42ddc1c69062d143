"""Where models whose large weights are placeholders are checked by path.

onnx's checker verifies that an external tensor's file exists beside the model, and
only when it is given the model's path. One private directory per process holds the
empty placeholder file those tensors name; each check writes its model there under a
name of its own. Making and removing a directory per check cost about 2 ms, twice per
optimized model.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

import onnx

_lock = threading.Lock()
_made: dict[int, Path] = {}  # process id -> its directory (a forked child makes its own)


def check_by_path(
    model: onnx.ModelProto, placeholder: str, check: Callable[[Path], str | None]
) -> str | None:
    """``check`` of ``model`` written in the directory that holds ``placeholder``."""
    fd, name = tempfile.mkstemp(suffix=".onnx", dir=_directory(placeholder))
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(model.SerializeToString())
        return check(Path(name))
    finally:
        Path(name).unlink(missing_ok=True)


def _directory(placeholder: str) -> Path:
    with _lock:
        pid = os.getpid()
        found = _made.get(pid)
        if found is None or not (found / placeholder).is_file():  # a temp cleaner ran
            found = Path(tempfile.mkdtemp(prefix="onnxfuse-check-"))
            (found / placeholder).touch()
            _made[pid] = found
            atexit.register(_remove, found, pid)
        return found


def _remove(directory: Path, pid: int) -> None:
    if os.getpid() == pid:  # not a forked child's exit: the directory is its parent's
        shutil.rmtree(directory, ignore_errors=True)
