"""Errors a user can cause: the CLI prints them as one line and exits with code 2."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager


def one_line(text: str) -> str:
    """Messages are printed as one line: fold line breaks, show control characters."""
    folded = " ".join(text.split())
    return "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in folded)


class OnnxfuseError(Exception):
    """A problem with the user's input (model, rule file, arguments)."""


class RuleError(OnnxfuseError):
    """A rule file is malformed; the message names file and line where known."""

    def __init__(self, message: str, path: str | None = None, line: int | None = None):
        where = path or "<rules>"
        if line is not None:
            where = f"{where}:{line}"
        super().__init__(f"{where}: {one_line(message)}")
        self.path = path
        self.line = line


class ModelError(OnnxfuseError):
    """A model file is missing, unreadable or invalid."""


class InvariantError(OnnxfuseError):
    """The optimized model broke an invariant: a bug in a rule or in onnxfuse."""


@contextmanager
def creating(path: str | os.PathLike) -> Iterator[None]:
    """The file system refusing to create an output (a read-only or foreign directory)
    as one line naming the output, not the temporary file made first."""
    try:
        yield
    except OSError as exc:
        raise OnnxfuseError(f"{path}: cannot write it ({exc.strerror or exc})") from None
