"""YAML loading that remembers where each mapping and value came from."""

from __future__ import annotations

from typing import Any


class LineMap(dict):
    """A mapping that knows its own line and the first line of each value's text."""

    line: int | None = None
    value_lines: dict[str, int]

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.value_lines = {}

    def line_of(self, key: str) -> int | None:
        return self.value_lines.get(key, self.line)


class LineList(list):
    line: int = 0
    item_lines: list[int]


def load_yaml(text: str) -> Any:
    """Parse YAML text; raise SourceError with a 1-based line (and no path) on
    malformed input."""
    # PyYAML is imported when a file is first parsed: runs that read their rules and
    # target from the load cache parse none.
    from onnxfuse.language.yaml_parse import parse

    return parse(text)
