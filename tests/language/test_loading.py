"""Loading rule and target files: the shortcuts taken for speed keep PyYAML's and the
rule checker's results and errors."""

from __future__ import annotations

import dataclasses
import re

import pytest
import yaml

from onnxfuse.errors import RuleError, SourceError
from onnxfuse.language.rule import _assigns
from onnxfuse.language.rulefile import parse_rule_text
from onnxfuse.language.yaml_lines import LineList, LineMap, load_yaml
from onnxfuse.language.yaml_parse import _Loader

RELU = "f (X) => (Y) { Y = Relu(X) }"


def _rule(name: str, extra: str) -> str:
    return f"""
  - name: {name}
    source: |
      {RELU}
    target: |
      {RELU}
{extra}"""


def test_a_shared_guard_text_is_checked_against_each_rules_names() -> None:
    """Guard texts are parsed once; which names they may read stays per rule."""
    with_let = _rule("has-k", "    let: {k: rank(X)}\n    where: &guard [k == 4]\n")
    without = _rule("lacks-k", "    where: *guard\n")
    with pytest.raises(RuleError, match=r":8: where: unknown name 'k' in guard 'k == 4'"):
        parse_rule_text("rules:" + with_let + without)
    both = parse_rule_text(
        "rules:" + with_let + _rule("also-k", "    let: {k: rank(X)}\n    where: *guard\n")
    )
    assert [[g.names for g in r.guards] for r in both] == [[frozenset({"k"})]] * 2
    # The other order: the rule without the name comes first (nothing cached yet).
    first = _rule("lacks-k", "    where: &guard [k == 4]\n")
    with pytest.raises(RuleError, match=r"unknown name 'k' in guard 'k == 4'"):
        parse_rule_text(
            "rules:" + first + _rule("has-k", "    let: {k: rank(X)}\n    where: *guard\n")
        )


YAML_CASES = [
    "a: 1\nb: [x, 2.5, true, null, ~]\nc: {d: -0x1f}",
    "a: |\n  block\nb: >\n  folded\nc:\n  - |\n    item\n  - plain",
    "base: &b {x: 1, y: [1, 2]}\nuse: {<<: *b, z: 3}\nlist: [*b, *b]",
    "m1: &m1 {x: 1}\nm2: &m2 {y: 2}\nboth: {<<: [*m1, *m2], z: 3}",
    "=: value key\nother: 1",
    "a: 2020-01-01",
    "a: !!binary aGVsbG8=",
    "a: !!set {x}",
    "a: !!str 12\nb: !!int '7'\nc: !!float 1",
    "1: a\n2.5: b\nnull: c\ntrue: d",
    "",
    "# only a comment",
    "- a\n- [b, c]\n- {d: e}",
    "a: 1\na: 2",
    "base: &b {x: 1}\nuse: {<<: *b, x: 2}",
    "? [a]\n: 1",
    "a: &x [*x]",
    "a: &x {b: *x}",
    "c: {<<: 1}",
    "c: {<<: [1]}",
    "a: !foo x",
    "a: [1, 2",
    "a: b: c",
]


def _same(fast: object, slow: object) -> bool:
    if type(fast) is not type(slow):
        return False
    if isinstance(fast, LineMap):
        assert isinstance(slow, LineMap)
        return (
            fast.line == slow.line
            and fast.value_lines == slow.value_lines
            and list(fast) == list(slow)
            and all(_same(fast[k], slow[k]) for k in fast)
        )
    if isinstance(fast, LineList):
        assert isinstance(slow, LineList)
        return (
            fast.line == slow.line
            and fast.item_lines == slow.item_lines
            and len(fast) == len(slow)
            and all(_same(a, b) for a, b in zip(fast, slow))
        )
    return fast == slow


def _reference(text: str) -> object:
    """PyYAML's own construction with the line-keeping constructors."""
    try:
        return yaml.load(text, Loader=_Loader)
    except yaml.YAMLError as exc:
        return f"error: {getattr(exc, 'problem', None) or exc}"


@pytest.mark.parametrize("text", YAML_CASES)
def test_yaml_loading_builds_what_pyyaml_builds(text: str) -> None:
    expected = _reference(text)
    try:
        found: object = load_yaml(text)
    except SourceError as exc:
        assert isinstance(expected, str), f"{exc} but PyYAML loads {expected!r}"
        assert str(exc) == f"malformed YAML: {expected[len('error: ') :]}"
        return
    assert _same(found, expected), (found, expected)


def test_an_alias_is_its_anchors_object() -> None:
    data = load_yaml("a: &x {k: [1]}\nb: *x\nc: [*x]")
    assert data["b"] is data["a"] and data["c"][0] is data["a"]


@pytest.mark.parametrize(
    "line, name",
    [
        ("  Y = Relu(X)", "Y"),
        ("  Y, Z = Split(X)", "Z"),
        ("  A,B=Split(X)", "B"),
        ("  XY = Relu(X)", "Y"),
        ("  Y\t=Relu(X)", "Y"),
        ("Y = Relu(X)", "Y"),
        ("  Y.1 = Relu(X)", "1"),
        ("  Y  ", "Y"),
        ("  Y == 1", "Y"),
        ("\u00a0Y\u2003= Relu(X)", "Y"),
        ("  Y = Relu(Y, X)", "X"),
    ],
)
def test_an_assigned_name_is_found_as_the_regular_expression_finds_it(line: str, name: str) -> None:
    expected = bool(re.search(rf"(^|[\s,]){re.escape(name)}\s*(,|=)", line))
    assert _assigns(line, name) == expected


def test_malformed_yaml_is_a_source_error_with_its_line_and_no_path() -> None:
    with pytest.raises(SourceError) as raised:
        load_yaml("a: 1\nb: [\n")
    assert raised.value.path is None and raised.value.line is not None


def test_an_error_inside_a_rule_is_placed_at_its_own_line_in_the_file() -> None:
    text = "rules:" + _rule("bad-guard", "    where: [nope(X)]\n")
    with pytest.raises(RuleError) as raised:
        parse_rule_text(text, "a.yaml")
    # The line of its `where:`, not the rule's first line (2).
    assert (raised.value.path, raised.value.line) == ("a.yaml", 7)
    assert str(raised.value).startswith("a.yaml:7: where: unknown function 'nope'")


def test_a_rules_place_is_the_file_and_line_of_its_origin() -> None:
    rule = parse_rule_text("rules:" + _rule("relu-relu", ""), "rules/a.yaml")[0]
    assert rule.place == ("rules/a.yaml", 2)
    assert dataclasses.replace(rule, origin="python:relu-relu").place == ("python:relu-relu", None)
    assert dataclasses.replace(rule, origin="").place == (None, None)
