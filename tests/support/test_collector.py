"""optimize_file keeps the cyclic garbage collector off the rules and the loaded model,
and leaves the collector as it found it."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path

import pytest

import onnxfuse.api as api
from onnxfuse.api import optimize_file, sample_model_path, select_rules
from onnxfuse.errors import ModelError
from onnxfuse.support.heap import collector_paused

RULES = select_rules()


@pytest.fixture
def collector_restored() -> Iterator[None]:
    """Whatever a test does to the collector is undone after it."""
    enabled = gc.isenabled()
    yield
    gc.unfreeze()
    if enabled:
        gc.enable()
    else:
        gc.disable()


def test_no_collection_while_loading_and_the_collector_restored_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, collector_restored: None
):
    passes: list[tuple[str, int]] = []
    phase = ["before"]

    def count(stage: str, info: dict) -> None:
        if stage == "start":
            passes.append((phase[0], info["generation"]))

    def load(*args, **kwargs):
        phase[0] = "load"
        gc.collect(0)  # an explicit pass still runs: it shows the callback is live
        for _ in range(50_000):  # allocations that would start young passes
            [[]]  # noqa: B018
        try:
            return real_load(*args, **kwargs)
        finally:
            phase[0] = "after"

    real_load = api.load_model_and_types
    monkeypatch.setattr(api, "load_model_and_types", load)
    gc.enable()
    gc.callbacks.append(count)
    try:
        optimize_file(sample_model_path(), tmp_path / "out.onnx", RULES)
    finally:
        gc.callbacks.remove(count)
    in_load = [generation for where, generation in passes if where == "load"]
    assert in_load == [0]  # only the explicit one
    assert gc.isenabled()
    assert gc.get_freeze_count() == 0


def test_a_failed_load_leaves_the_collector_as_it_was(tmp_path: Path, collector_restored: None):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a model")
    gc.enable()
    with pytest.raises(ModelError):
        optimize_file(bad, tmp_path / "out.onnx", RULES)
    assert gc.isenabled()
    assert gc.get_freeze_count() == 0


def test_a_callers_disabled_collector_stays_disabled(tmp_path: Path, collector_restored: None):
    gc.disable()
    optimize_file(sample_model_path(), tmp_path / "out.onnx", RULES)
    assert not gc.isenabled()
    assert gc.get_freeze_count() == 0


def test_a_callers_freeze_is_left_alone(tmp_path: Path, collector_restored: None):
    gc.enable()
    gc.freeze()
    assert gc.get_freeze_count() > 0
    optimize_file(sample_model_path(), tmp_path / "out.onnx", RULES)
    assert gc.isenabled()
    assert gc.get_freeze_count() > 0  # still frozen: optimize_file did not unfreeze


class Loaded:
    """An object made while loading (tracked by the collector)."""


def test_what_a_paused_load_made_goes_to_the_oldest_generation_unwalked(
    collector_restored: None,
):
    gc.enable()
    passes: list[int] = []

    def count(stage: str, info: dict) -> None:
        if stage == "start":
            passes.append(info["generation"])

    gc.callbacks.append(count)
    try:
        with collector_paused():
            made = [Loaded() for _ in range(50_000)]
        young_after = gc.get_count()[0]
    finally:
        gc.callbacks.remove(count)
    assert passes == []  # no pass while loading, and none started by resuming
    assert gc.isenabled()
    assert gc.get_freeze_count() == 0
    assert young_after < 1000
    oldest = {id(o) for o in gc.get_objects(generation=2)}
    assert all(id(o) in oldest for o in made[::1000])


def test_a_paused_load_leaves_a_callers_frozen_objects_frozen(collector_restored: None):
    gc.enable()
    gc.freeze()
    frozen = gc.get_freeze_count()
    with collector_paused():
        made = [Loaded() for _ in range(1000)]
    # None thawed (the count would fall to 0) and none added (it would grow by ~1000);
    # frozen objects of other code may die meanwhile (each lowers the count by one).
    assert frozen - 100 <= gc.get_freeze_count() <= frozen
    assert gc.isenabled()
    assert len(made) == 1000


def test_a_paused_load_leaves_a_disabled_collector_disabled(collector_restored: None):
    gc.disable()
    with collector_paused():
        pass
    assert not gc.isenabled()
