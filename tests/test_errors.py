"""SourceError: an error at a place in a user's file, and adding that place later."""

from __future__ import annotations

import pickle
from pathlib import Path

from onnxfuse.errors import OnnxfuseError, RuleError, SourceError
from onnxfuse.proof.domain import VerifyError
from onnxfuse.targets.capabilities import TargetError

# -- formatting ----------------------------------------------------------------------


def test_an_error_with_a_path_and_a_line_reads_path_colon_line_colon_message():
    assert str(SourceError("bad key", "rules/a.yaml", 12)) == "rules/a.yaml:12: bad key"


def test_an_error_with_a_path_and_no_line_reads_path_colon_message():
    assert str(SourceError("cannot read it", "rules/a.yaml")) == "rules/a.yaml: cannot read it"


def test_an_error_without_a_path_reads_as_its_message_even_with_a_line():
    assert str(SourceError("malformed YAML: oops")) == "malformed YAML: oops"
    assert str(SourceError("malformed YAML: oops", line=3)) == "malformed YAML: oops"


def test_the_message_is_printed_as_one_line():
    error = SourceError("two\nlines and a \x07 bell", "a.yaml", 1)
    assert str(error) == "a.yaml:1: two lines and a \\x07 bell"


def test_message_path_and_line_are_attributes_with_the_message_as_written():
    error = SourceError("two\nlines", Path("targets/npu.yaml"), 4)
    assert (error.message, error.path, error.line) == ("two\nlines", "targets/npu.yaml", 4)


def test_an_empty_path_is_no_path():
    assert SourceError("x", "").path is None


def test_a_source_error_is_an_onnxfuse_error_the_command_line_reports():
    assert isinstance(SourceError("x"), OnnxfuseError)


def test_rule_target_and_verify_errors_are_source_errors():
    for kind in (RuleError, TargetError, VerifyError):
        error = kind("bad", "a.yaml", 2)
        assert isinstance(error, SourceError)
        assert str(error) == "a.yaml:2: bad"


def test_a_rule_error_without_a_path_is_placed_in_rules():
    assert str(RuleError("no built-in rule pack 'x'")) == "<rules>: no built-in rule pack 'x'"
    assert str(RuleError("each rule must be a mapping", line=1)) == (
        "<rules>:1: each rule must be a mapping"
    )
    assert RuleError("x").path is None


def test_an_error_survives_pickling():
    error = pickle.loads(pickle.dumps(TargetError("bad", "a.yaml", 3)))
    assert type(error) is TargetError
    assert (str(error), error.message, error.path, error.line) == (
        "a.yaml:3: bad",
        "bad",
        "a.yaml",
        3,
    )


# -- adding a place ------------------------------------------------------------------


def test_located_gives_an_error_without_a_place_the_path_and_line():
    error = SourceError("rule has no 'target'").located("a.yaml", 7)
    assert (error.path, error.line, str(error)) == ("a.yaml", 7, "a.yaml:7: rule has no 'target'")


def test_located_keeps_the_line_an_error_without_a_path_already_has():
    error = SourceError("where: unknown name 'Z'", line=9).located("a.yaml", 7)
    assert str(error) == "a.yaml:9: where: unknown name 'Z'"


def test_located_with_only_a_line_adds_it_where_the_error_has_none():
    assert SourceError("x").located(line=5).line == 5
    assert SourceError("x", line=3).located(line=5).line == 3
    assert SourceError("x").located(line=5).path is None


def test_located_keeps_the_path_and_line_an_error_already_names():
    error = SourceError("x", "b.yaml", 2).located("a.yaml", 7)
    assert (error.path, error.line) == ("b.yaml", 2)


def test_located_adds_no_line_of_another_file_to_an_error_that_names_a_path():
    error = SourceError("x", "b.yaml").located("a.yaml", 7)
    assert (error.path, error.line) == ("b.yaml", None)


def test_located_returns_a_new_error_of_the_same_class_and_leaves_the_original():
    original = RuleError("x", line=3)
    error = original.located("a.yaml")
    assert type(error) is RuleError and error is not original
    assert (original.path, original.line) == (None, 3)
    assert (error.path, error.line) == ("a.yaml", 3)


def test_prefixed_puts_the_context_before_the_message_and_keeps_the_place():
    error = RuleError("unknown op 'Nope'", line=4).prefixed("source")
    assert type(error) is RuleError
    assert (error.message, error.line) == ("source: unknown op 'Nope'", 4)
    assert str(error.located("a.yaml", 1)) == "a.yaml:4: source: unknown op 'Nope'"
