"""Typed outcomes: why a run stopped, why a rule did not match."""

from __future__ import annotations

from onnxfuse.rewrite.matcher import Mismatch, Rank
from onnxfuse.rewrite.report import Report, StopKind, StopReason


def test_a_stop_reason_says_itself_in_words_and_in_json():
    stop = StopReason(StopKind.OSCILLATION, rules=("a", "b"))
    assert str(stop) == "rules oscillate (they undo each other's rewrites): a, b"
    assert stop.to_json() == {
        "kind": "oscillate",
        "limit": None,
        "rules": ["a", "b"],
        "message": str(stop),
    }
    assert str(StopReason(StopKind.ITERATION_CAP, 10)).startswith("iteration cap reached (10)")


def test_a_report_at_a_fixpoint_has_no_stop_reason():
    assert Report().to_json()["stopped"] is None


def test_a_whole_match_failure_ranks_above_any_structural_one():
    deep = Rank(whole_match=False, nodes=50, values=400)
    assert Rank(whole_match=True) > deep
    assert Rank(False, 3, 0) > Rank(False, 2, 99)
    assert str(Mismatch("guard 'x' is false", Rank(True))) == "guard 'x' is false"
