"""Where an output may be written: a new name or a regular file in an existing
directory, never a file the input is read from, never one name for two outputs.

Outputs are written to a temporary file and renamed into place, so a name that is a
device, a pipe or a socket would be replaced by a file, not written to.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from onnxfuse.errors import OnnxfuseError, creating
from onnxfuse.files.input_files import InputFiles

# Room left in a 255-byte file name for a temporary name's dot, random part and suffix.
_TEMPORARY_NAME_ROOM = 200


def temporary_prefix(path: Path) -> str:
    """The prefix of a temporary file or directory made beside ``path``: its name, so a
    leftover says what it was for, unless that would make the name too long."""
    if len(os.fsencode(path.name)) > _TEMPORARY_NAME_ROOM:
        return ".onnxfuse-"
    return f".{path.name}."


def write_text(path: str | os.PathLike, text: str) -> None:
    """Write a text output (a JSON or HTML report) whole: beside it first, then renamed."""
    target = Path(path)
    temporary = target.with_name(f"{temporary_prefix(target)}tmp")
    with creating(path):
        try:
            temporary.write_text(text, encoding="utf-8")
        except OSError:
            temporary.unlink(missing_ok=True)
            raise
    os.replace(temporary, target)


def check_output(path: str | os.PathLike) -> None:
    """Raise unless ``path`` can take an output written whole."""
    if not os.fspath(path):
        raise OnnxfuseError("an output needs a file name, not an empty one")
    if os.fspath(path).endswith(("/", os.sep)):
        raise OnnxfuseError(f"{path}: names a directory, not a file")
    path = Path(path)
    if path.is_dir():
        raise OnnxfuseError(f"{path}: is a directory")
    if path.parent.exists() and not path.parent.is_dir():
        raise OnnxfuseError(f"{path.parent}: not a directory")
    if not path.parent.is_dir():
        raise OnnxfuseError(f"{path.parent}: output directory does not exist")
    if path.exists() and not path.is_file():
        raise OnnxfuseError(f"{path}: not a regular file (an output replaces a file whole)")


def check_distinct(outputs: dict[str, str | None]) -> None:
    """Raise if two of ``outputs`` (option -> path, None: not asked for) name one file."""
    seen: dict[str, str] = {}
    for option, path in outputs.items():
        if not path:
            continue
        written = _written_at(Path(path))
        if written in seen:
            raise OnnxfuseError(f"{path}: named by both {seen[written]} and {option}")
        seen[written] = option


def model_file(path: str | os.PathLike) -> InputFiles:
    """The model file alone: what is known of an input before it is loaded."""
    return InputFiles(os.path.realpath(path), frozenset())


def refuse_overwriting(destinations: Iterable[str | os.PathLike], files: InputFiles | None) -> None:
    """Raise if writing any of ``destinations`` would replace a file of the input.
    A destination is compared by the name it is written at: writers rename a new file
    onto it, which replaces a symlink there, not the file it points to."""
    if files is None:
        return
    for destination in destinations:
        written = _written_at(Path(destination))
        if written == files.model:
            raise OnnxfuseError(f"{destination}: refusing to overwrite the input model")
        if written in files.data:
            raise OnnxfuseError(
                f"{destination}: refusing to overwrite the input model's external data"
            )


def refuse_overwriting_read(
    destinations: Iterable[str | os.PathLike], read: Iterable[Path], what: str
) -> None:
    """Raise if writing any of ``destinations`` would replace one of the files ``read``
    (rule files, a capability file), named ``what`` in the message."""
    files = {os.path.realpath(path): path for path in read}
    for destination in destinations:
        found = files.get(_written_at(Path(destination)))
        if found is not None:
            raise OnnxfuseError(f"{destination}: refusing to overwrite {what} {found}")


def _written_at(path: Path) -> str:
    """The name a rename onto ``path`` replaces: its directory resolved, not itself."""
    return os.path.join(os.path.realpath(path.parent), path.name)
