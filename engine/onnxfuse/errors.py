"""Errors a user can cause: the CLI prints them as one line and exits with code 2."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TypeVar


def one_line(text: str) -> str:
    """Messages are printed as one line: fold line breaks, show control characters."""
    folded = " ".join(text.split())
    return "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in folded)


class OnnxfuseError(Exception):
    """A problem with the user's input (model, rule file, arguments)."""


_Error = TypeVar("_Error", bound="SourceError")


class SourceError(OnnxfuseError):
    """A problem at a place in a user's file (rule file, pack manifest, capability
    file, verification domain): ``path:line: message``, ``path: message`` without a
    line, the message alone without a path.

    Code that reads a part of a file raises it with what it knows (often a line but
    no path); the code that knows more adds it with ``located``.
    """

    def __init__(
        self, message: str, path: str | os.PathLike | None = None, line: int | None = None
    ):
        super().__init__(message, path, line)  # args as given: the error pickles
        self.message = message
        self.path = str(path) if path else None
        self.line = line

    def __str__(self) -> str:
        place = self._place()
        message = one_line(self.message)
        return f"{place}: {message}" if place else message

    def _place(self) -> str | None:
        if self.path is None:
            return None
        return self.path if self.line is None else f"{self.path}:{self.line}"

    def located(
        self: _Error, path: str | os.PathLike | None = None, line: int | None = None
    ) -> _Error:
        """This error placed at ``path`` (and ``line``) unless it names a file already.
        What it says itself wins: an error naming a file keeps its path and line; one
        with only a line (of the file being read) keeps that line and takes ``path``."""
        if self.path is not None:
            return type(self)(self.message, self.path, self.line)
        return type(self)(self.message, path, self.line if self.line is not None else line)

    def prefixed(self: _Error, context: str) -> _Error:
        """This error with ``context: `` before its message (the part it was found in)."""
        return type(self)(f"{context}: {self.message}", self.path, self.line)


# Where a rule error names no file: rules built in code, a built-in pack that does not exist.
NO_RULE_FILE = "<rules>"


class RuleError(SourceError):
    """A rule file or pack is malformed; one without a path is placed in NO_RULE_FILE."""

    def _place(self) -> str:
        where = self.path or NO_RULE_FILE
        return where if self.line is None else f"{where}:{self.line}"


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
