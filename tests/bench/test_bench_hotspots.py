"""bench/hotspots.py: its phases name engine functions that exist, and a run adds up."""

from __future__ import annotations

import importlib
import inspect
import json
import subprocess
import sys
from pathlib import Path

import pytest

from onnxfuse.api import sample_model_path

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import hotspots  # noqa: E402  (bench/hotspots.py)


def _defines(module, function: str) -> bool:
    """``function`` is a function of ``module`` or a method of one of its classes."""
    owners = [module, *(c for _, c in inspect.getmembers(module, inspect.isclass))]
    return any(
        inspect.isfunction(getattr(owner, function, None))
        and getattr(owner, function).__module__ == module.__name__
        for owner in owners
    )


@pytest.mark.parametrize("phase, module, function", hotspots.PHASES)
def test_every_phase_names_an_engine_function(phase: str, module: str, function: str):
    engine_module = importlib.import_module(f"onnxfuse.{module}")
    assert _defines(engine_module, function), f"{phase}: onnxfuse.{module}.{function} is gone"


def test_a_profiled_run_gives_every_sample_to_one_phase(tmp_path: Path):
    pytest.importorskip("pyinstrument")
    output = tmp_path / "out.onnx"
    done = subprocess.run(
        [sys.executable, str(BENCH / "hotspots.py"), "--run-one", str(sample_model_path()), output],
        capture_output=True,
        text=True,
        check=True,
    )
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert output.exists()
    assert result["seconds"] > 0
    assert set(result["phases"]) <= set(hotspots.PHASE_NAMES)
    # The self times of the whole tree add up to the run, once each.
    assert sum(result["phases"].values()) == pytest.approx(result["seconds"], rel=1e-6)
    assert sum(result["hot"].values()) == pytest.approx(result["seconds"], rel=1e-6)
    assert result["phases"].get("match", 0) > 0  # a third of the sample's run


def test_summary_gives_shares_of_the_whole(tmp_path: Path):
    from collections import Counter

    row = {
        "seconds": 2.0,
        "runs": 2,
        "phases": Counter({"match": 3.0, "fold": 1.0}),
        "hot": Counter({"a:f": 2.0, "b:g": 1.5, "c:h": 0.5}),
    }
    found = hotspots.summary(row, top=2)
    assert found["phases"]["match"] == 0.75
    assert found["phases"]["other"] == 0.0
    assert list(found["phases"]) == list(hotspots.PHASE_NAMES)
    assert [h["function"] for h in found["hot"]] == ["a:f", "b:g"]
    assert found["hot"][0]["share"] == 0.5
