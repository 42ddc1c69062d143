"""YAML loading that remembers where each mapping and value came from."""

from __future__ import annotations

from typing import Any

import yaml


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


# libyaml's parser when the installed PyYAML has it: several times faster.
_BaseLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _Loader(_BaseLoader):  # type: ignore[misc, valid-type]
    pass


def _text_start(node: yaml.Node) -> int:
    """1-based line of a value's first text line (block scalars start below the indicator)."""
    line = node.start_mark.line + 1
    if isinstance(node, yaml.ScalarNode) and node.style in ("|", ">"):
        line += 1
    return line


def _construct_mapping(loader: _Loader, node: yaml.MappingNode) -> LineMap:
    loader.flatten_mapping(node)
    result = LineMap()
    result.line = node.start_mark.line + 1
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        if not isinstance(key, (str, int, float, bool)) and key is not None:
            raise yaml.constructor.ConstructorError(
                None, None, "mapping keys must be plain values", key_node.start_mark
            )
        if key in result:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark
            )
        result[key] = loader.construct_object(value_node, deep=True)
        result.value_lines[str(key)] = _text_start(value_node)
    return result


def _construct_sequence(loader: _Loader, node: yaml.SequenceNode) -> LineList:
    result = LineList(loader.construct_object(child, deep=True) for child in node.value)
    result.line = node.start_mark.line + 1
    result.item_lines = [_text_start(child) for child in node.value]
    return result


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)
_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_SEQUENCE_TAG, _construct_sequence)


class YamlError(Exception):
    def __init__(self, message: str, line: int | None):
        super().__init__(message)
        self.line = line


def load_yaml(text: str) -> Any:
    """Parse YAML text; raise YamlError with a 1-based line on malformed input."""
    try:
        return yaml.load(text, Loader=_Loader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else None
        problem = exc.problem or exc.context or "malformed YAML"
        raise YamlError(f"malformed YAML: {problem}", line) from None
    except yaml.YAMLError as exc:
        raise YamlError(f"malformed YAML: {exc}", None) from None
