"""Loaded rule packs and targets kept on disk between runs.

Parsing and checking the built-in rules takes ~0.6 s of every command, against
~0.1 s to read them back pickled. An entry's name is a digest of everything a
load reads: the rule and target files (built-in ones by size and modification
time, as Python's own bytecode cache does; a user's by content, since they are
edited and reloaded within one clock tick in scripts), the engine's source
files, the Python version and the installed onnx, onnx_ir, onnxruntime, numpy
and PyYAML (their schemas decide which ops a rule may name). Anything that
changes makes another name; a load that fails is never kept, so its error
repeats word for word.

``ONNXFUSE_CACHE_DIR`` moves the cache (default ``$XDG_CACHE_HOME/onnxfuse`` or
``~/.cache/onnxfuse``); ``ONNXFUSE_NO_CACHE=1`` turns it off. An entry that
cannot be read, or that another user could have written, is ignored and remade.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import pickle
import sys
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TypeVar, cast

T = TypeVar("T")

_DEPENDENCIES = ("onnx", "onnx_ir", "onnxruntime", "numpy", "yaml")
_SUFFIX = ".pickle"
_KEEP = 8  # entries kept per kind; older ones go when a new one is written


def cache_dir() -> Path | None:
    """Where entries live, or None when caching is off."""
    if os.environ.get("ONNXFUSE_NO_CACHE"):
        return None
    configured = os.environ.get("ONNXFUSE_CACHE_DIR")
    if configured:
        return Path(configured)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "onnxfuse"


def cached(kind: str, key: Callable[[], bytes], load: Callable[[], T]) -> T:
    """``load()``'s result, read back from the entry ``key()`` names when there is one.

    ``key()`` names the files the load reads; it is asked again after a load, and
    a result whose files changed meanwhile is not kept. A file it cannot read makes
    the load run uncached (its error is the load's to report). Entries are pruned per
    ``kind``: loading many rule files of one's own does not push out the built-in rules.
    """
    folder = cache_dir()
    if folder is None:
        return load()
    try:
        named = key()
    except OSError:
        return load()
    digest = hashlib.blake2b(_environment() + named, digest_size=16).hexdigest()
    entry = folder / f"{kind}-{digest}{_SUFFIX}"
    found = _read(entry)
    if found is not None:
        return cast(T, found)  # what this kind's load() returned when the entry was written
    result = load()
    try:
        unchanged = key() == named
    except OSError:
        unchanged = False
    if unchanged:
        _write(folder, entry, result, kind)
    return result


def stat_key(paths: Iterable[Path]) -> bytes:
    """Files named by path, size and modification time: for installed files."""
    parts = []
    for path in paths:
        status = path.stat()
        parts.append(f"{path}\0{status.st_size}\0{status.st_mtime_ns}")
    return "\n".join(parts).encode()


def content_key(paths: Iterable[Path]) -> bytes:
    """Files named by path and content: for a user's files."""
    return b"".join(file_key(path, path.read_bytes()) for path in paths)


def file_key(path: Path, content: bytes) -> bytes:
    """One file by path and content, the content already read."""
    return f"{path}\0".encode() + hashlib.blake2b(content, digest_size=32).digest()


@functools.cache
def _environment() -> bytes:
    engine = Path(__file__).resolve().parents[1]  # the onnxfuse package
    parts = [
        sys.version.encode(),
        pickle.format_version.encode(),  # type: ignore[attr-defined]  # typeshed omits it
        stat_key(sorted(engine.rglob("*.py"))),
    ]
    for name in _DEPENDENCIES:
        spec = importlib.util.find_spec(name)
        origin = Path(spec.origin) if spec is not None and spec.origin else None
        parts.append(stat_key([origin]) if origin is not None else f"no {name}".encode())
    return b"\n".join(parts)


def _read(entry: Path) -> object | None:
    try:
        with open(entry, "rb") as file:
            status = os.fstat(file.fileno())
            if not _own_and_private(status):
                return None
            return pickle.loads(file.read())
    except Exception:  # missing, damaged, or of another version: remade, never fatal
        return None


def _own_and_private(status: os.stat_result) -> bool:
    # Unpickling runs code named in the file: only an entry this user alone could write.
    if not hasattr(os, "getuid"):
        return True
    return status.st_uid == os.getuid() and not status.st_mode & 0o022


def _write(folder: Path, entry: Path, value: object, kind: str) -> None:
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        data = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
        handle, temporary = tempfile.mkstemp(prefix=".", suffix=_SUFFIX, dir=folder)
    except (OSError, pickle.PicklingError, TypeError, AttributeError, RecursionError):
        return  # a read-only home, an unpicklable or too deep rule: load as if uncached
    try:
        with os.fdopen(handle, "wb") as file:
            file.write(data)
        os.replace(temporary, entry)  # readers see the whole entry or none
    except OSError:
        Path(temporary).unlink(missing_ok=True)
        return
    _prune(folder, kind, keep=entry)


def _prune(folder: Path, kind: str, keep: Path) -> None:
    try:
        entries = [p for p in folder.glob(f"{kind}-*{_SUFFIX}") if p != keep]
        entries.sort(key=lambda p: p.stat().st_mtime_ns, reverse=True)
        for old in entries[_KEEP - 1 :]:
            old.unlink(missing_ok=True)
    except OSError:
        pass  # another process pruned first
