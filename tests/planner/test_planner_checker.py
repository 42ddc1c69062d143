"""The checker catches corrupted plans; the arena executor catches them by running."""

from __future__ import annotations

from dataclasses import replace

import pytest
from planner_graphs import matmul_chain, two_branches

from onnxfuse.planner import PlanError, check_plan, plan_model, verify_plan


def _corrupt(plan, name, **changes):
    tensors = [replace(t, **changes) if t.name == name else t for t in plan.tensors]
    return replace(plan, tensors=tensors)


def test_overlap_of_live_tensors_is_caught():
    plan = plan_model(matmul_chain())
    placed = {t.name: t for t in plan.tensors}
    # b is alive with a (step 1): move it onto a.
    bad = _corrupt(plan, "b", offset=placed["a"].offset)
    with pytest.raises(PlanError, match=r"'a' \[0, 128\) and 'b' \[0, 64\) overlap.*step 1"):
        check_plan(bad)


def test_sharing_bytes_at_different_times_is_fine():
    plan = plan_model(matmul_chain())
    placed = {t.name: t for t in plan.tensors}
    assert placed["a"].offset == placed["c"].offset  # a dies at step 1, c is born at 2
    check_plan(plan, matmul_chain())


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"offset": 32}, "not a multiple of 64"),
        ({"size": 32}, "below its 96 bytes"),
        ({"offset": 1024}, "past the arena's end"),
        ({"last": 2}, r"planned as steps 2\.\.2"),
    ],
)
def test_malformed_entries_are_caught(changes, message):
    model = matmul_chain()
    bad = _corrupt(plan_model(model), "c", **changes)
    with pytest.raises(PlanError, match=message):
        check_plan(bad, model)


def test_a_shortened_lifetime_is_caught_against_the_model():
    # A plan claiming a dies at step 0 would let b take its bytes: only the model knows.
    model = matmul_chain()
    plan = plan_model(model)
    bad = _corrupt(_corrupt(plan, "a", last=0), "b", offset=0)
    bad = _corrupt(bad, "c", offset=64)
    check_plan(bad)  # self-consistent on its own
    with pytest.raises(PlanError, match=r"'a': planned as steps 0\.\.0"):
        check_plan(bad, model)


def test_a_false_inplace_claim_is_caught():
    model = matmul_chain()
    plan = plan_model(model)
    bad = _corrupt(plan, "b", inplace_of="a", offset=0, size=128, nbytes=128)
    with pytest.raises(PlanError, match="in place of 'a'"):
        check_plan(bad)


def test_verify_matches_and_catches_a_corrupted_plan():
    model = two_branches()
    plan = plan_model(model)
    assert verify_plan(model, plan).ok
    placed = {t.name: t for t in plan.tensors}
    # b1 is written while a1 is still to be read: put them on the same bytes.
    bad = _corrupt(plan, "b1", offset=placed["a1"].offset)
    result = verify_plan(model, bad)
    assert not result.ok and result.mismatched == ["y"]
