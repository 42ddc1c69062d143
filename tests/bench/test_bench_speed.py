"""bench/speed.py: each tool's timed run and the whole-command rows work on the sample."""

from __future__ import annotations

import sys
from pathlib import Path

from onnxfuse.api import sample_model_path

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import speed  # noqa: E402  (bench/speed.py)


def test_each_tool_optimizes_the_sample_in_a_timed_run(tmp_path: Path):
    for tool in ("onnxfuse", "onnxscript"):
        result = speed._run_one(
            tool, str(sample_model_path()), str(tmp_path / f"{tool}.onnx"), 0, 0, ""
        )
        assert result["seconds"] > 0 and result["cpu_seconds"] > 0, tool
        assert 0 < result["nodes"] < 33, tool  # the sample has 33 nodes; both remove some


def test_whole_commands_time_both_tools_and_a_first_run_with_nothing_cached(tmp_path: Path):
    sample = speed.Model("sample", sample_model_path(), None, "sample")
    [row] = speed.commands([sample], 1, tmp_path)
    assert row["model"] == "sample"
    assert row["first_run"]["seconds"] > 0
    assert row["onnxscript"]["seconds"] > 0
    ours = row["onnxfuse"]
    assert ours["seconds"] > 0
    assert set(ours) == {"seconds", "import", "rules", "target", "optimize_file"}
    # The timed runs read the cache the untimed one filled.
    assert list((tmp_path / "load-cache").glob("builtin-rules-*.pickle"))
