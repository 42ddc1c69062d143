"""The YAML parser behind ``yaml_lines.load_yaml``: libyaml's (or PyYAML's) parser,
the data built with the line of every value."""

from __future__ import annotations

import functools
import operator
from typing import Any

import yaml

from onnxfuse.errors import SourceError
from onnxfuse.language.yaml_lines import LineList, LineMap

# libyaml's parser when the installed PyYAML has it: several times faster.
_BaseLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


# The resolver both loaders use; the loader's own methods go through _tag.
_RESOLVER = yaml.resolver.Resolver()


@functools.lru_cache(maxsize=65536)
def _tag(kind: type, value: Any, implicit: Any) -> str:
    """A node's tag from its kind, text and implicit flags (nothing else counts without
    path resolvers, which no loader here has). Cached: rule and target files repeat
    most of their scalars, and the resolver tries its regular expressions on each."""
    return _RESOLVER.resolve(kind, value, implicit)


class _Loader(_BaseLoader):  # type: ignore[misc, valid-type]
    # libyaml's composer calls these three for every node: C callables rather than
    # Python methods (0.05 s over the built-in rules and targets). Without path
    # resolvers the resolver's path bookkeeping does nothing.
    resolve = staticmethod(_tag)
    descend_resolver = operator.is_  # (parent, index) -> ignored
    ascend_resolver = tuple  # () -> ignored


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


def parse(text: str) -> Any:
    """Parse YAML text; raise SourceError with a 1-based line on malformed input."""
    try:
        try:
            return _load_fast(text)
        except (_Unusual, yaml.constructor.ConstructorError):
            # PyYAML's constructor gives the data, or the error, of anything unusual,
            # from a fresh parse (merging mapping keys changes the node tree).
            return yaml.load(text, Loader=_Loader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else None
        problem = exc.problem or exc.context or "malformed YAML"
        raise SourceError(f"malformed YAML: {problem}", line=line) from None
    except yaml.YAMLError as exc:
        raise SourceError(f"malformed YAML: {exc}") from None


def _load_fast(text: str) -> Any:
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        return None if node is None else _FastBuilder(loader).build(node)
    finally:
        loader.dispose()


_TAG = "tag:yaml.org,2002:"
_STR, _MAP, _SEQ = _TAG + "str", _TAG + "map", _TAG + "seq"
# Scalars PyYAML's safe constructors build by themselves (no state, no generators).
_PLAIN_SCALARS = frozenset(_TAG + t for t in ("int", "float", "bool", "null"))
# Mapping keys flatten_mapping acts on: merges (<<) and values (=).
_MERGING_TAGS = frozenset((_TAG + "merge", _TAG + "value"))


class _Unusual(Exception):
    """Something the fast builder leaves to PyYAML: other tags, recursion, odd keys."""


class _FastBuilder:
    """The data ``yaml.load`` with ``_Loader`` would build from a composed node tree,
    without PyYAML's general constructor machinery (it cost more than the parse:
    ~0.25 s for the built-in rule packs). Only strings, numbers, booleans, nulls,
    mappings and sequences; anything else raises _Unusual. An alias is the same
    object as its anchor, as with PyYAML."""

    def __init__(self, loader: _Loader):
        self.loader = loader
        self.built: dict[int, Any] = {}
        self.building: set[int] = set()

    def build(self, node: yaml.Node) -> Any:
        # Most nodes are plain strings: no bookkeeping (an equal string is as good).
        if node.tag == _STR and type(node) is yaml.ScalarNode:
            return node.value
        key = id(node)
        if key in self.built:
            return self.built[key]
        tag = node.tag
        if tag in _PLAIN_SCALARS and isinstance(node, yaml.ScalarNode):
            data: Any = self.loader.yaml_constructors[tag](self.loader, node)
        elif key in self.building:
            raise _Unusual("recursive node")
        elif tag == _MAP and isinstance(node, yaml.MappingNode):
            self.building.add(key)
            data = self._mapping(node)
        elif tag == _SEQ and isinstance(node, yaml.SequenceNode):
            self.building.add(key)
            data = self._sequence(node)
        else:
            raise _Unusual(tag)
        self.building.discard(key)
        self.built[key] = data
        return data

    def _mapping(self, node: yaml.MappingNode) -> LineMap:
        """As _construct_mapping, which stays the reference (errors come from it)."""
        pairs = node.value
        if any(key.tag in _MERGING_TAGS for key, _ in pairs):
            self.loader.flatten_mapping(node)  # does nothing without those keys
            pairs = node.value
        result = LineMap()
        result.line = node.start_mark.line + 1
        lines = result.value_lines
        item = self._item
        for key_node, value_node in pairs:
            if type(key_node) is not yaml.ScalarNode:
                raise _Unusual("mapping key")
            key = key_node.value if key_node.tag == _STR else self.build(key_node)
            if key in result:
                raise _Unusual("duplicate key")
            result[key], lines[str(key)] = item(value_node)
        return result

    def _sequence(self, node: yaml.SequenceNode) -> LineList:
        item = self._item
        items = [item(child) for child in node.value]
        result = LineList([value for value, _ in items])
        result.line = node.start_mark.line + 1
        result.item_lines = [line for _, line in items]
        return result

    def _item(self, node: yaml.Node) -> tuple[Any, int]:
        """A value and the line of its text (as _text_start)."""
        line = node.start_mark.line + 1
        if isinstance(node, yaml.ScalarNode):
            if node.style == "|" or node.style == ">":
                line += 1
            if node.tag == _STR:
                return node.value, line
        return self.build(node), line
