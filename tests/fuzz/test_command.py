"""`onnxfuse fuzz`: the fuzzers from an installed package, with a user's own rules,
run outside any clone."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from helpers import NEARLY_RIGHT, fuzz_summary, mish_rule

ENGINE = Path(__file__).resolve().parents[2] / "engine"

MISH = mish_rule("my-mish")


def _onnxfuse_fuzz(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    # Only the package on the path: no clone's top-level fuzz/ to lean on.
    env = {**os.environ, "PYTHONPATH": str(ENGINE)}
    return subprocess.run(
        [sys.executable, "-m", "onnxfuse", "fuzz", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_graphs_with_a_users_rules_run_outside_the_repository(tmp_path: Path):
    (tmp_path / "mine.yaml").write_text(MISH)
    result = _onnxfuse_fuzz(
        tmp_path, "graphs", "--iterations", "5", "--seed", "1", "--rules", "mine.yaml"
    )
    assert fuzz_summary(result) == (5, 0), result.stderr[-3000:]
    assert result.returncode == 0
    assert "[graphs cpu,onnx] 5/5" in result.stderr  # the progress line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine.yaml"]  # nothing left


def test_each_rule_embeds_a_users_rule(tmp_path: Path):
    (tmp_path / "mine.yaml").write_text(MISH)
    result = _onnxfuse_fuzz(
        tmp_path,
        "graphs",
        "--each-rule",
        "2",
        "--rule",
        "my-mish",
        "--rules",
        "mine.yaml",
        "--target",
        "cpu",
    )
    assert fuzz_summary(result) == (2, 0), result.stderr[-3000:]
    assert "1 rules: 1 fired" in result.stderr, result.stderr[-3000:]


def test_a_bad_rule_file_is_one_line_and_exit_2(tmp_path: Path):
    (tmp_path / "bad.yaml").write_text("rules: [{name: x}]\n")
    result = _onnxfuse_fuzz(tmp_path, "graphs", "--iterations", "1", "--rules", "bad.yaml")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "bad.yaml" in result.stderr.splitlines()[-1]


def test_rules_mutates_the_installed_packs(tmp_path: Path):
    result = _onnxfuse_fuzz(tmp_path, "rules", "--iterations", "5", "--seed", "0", "--no-save")
    assert fuzz_summary(result) == (5, 0), result.stderr[-3000:]
    assert not (tmp_path / "fuzz-corpus").exists()
    assert not (tmp_path / ".hypothesis").exists()


def test_a_wrong_rule_of_yours_is_saved_and_replayed_with_its_file(tmp_path: Path):
    (tmp_path / "wrong.yaml").write_text(NEARLY_RIGHT)
    found = _onnxfuse_fuzz(
        tmp_path,
        "graphs",
        "--each-rule",
        "2",
        "--rule",
        "div-sqrt2-as-rounded-mul",
        "--rules",
        "wrong.yaml",
        "--target",
        "cpu",
    )
    _, failed = fuzz_summary(found)
    assert failed >= 1 and found.returncode == 1, found.stderr[-3000:]
    (sidecar,) = (tmp_path / "fuzz-corpus").glob("*.json")
    data = json.loads(sidecar.read_text())
    assert data["found_by"].startswith("onnxfuse fuzz graphs --each-rule 2")
    assert data["rules"] == [str((tmp_path / "wrong.yaml").resolve())]
    replayed = _onnxfuse_fuzz(tmp_path, "replay")
    assert replayed.stdout.splitlines()[-1] == "0 passed, 1 failed", replayed.stdout
    assert "mismatch" in replayed.stdout.splitlines()[0]


def test_a_job_that_crashes_its_worker_is_a_failure_the_campaign_reports():
    from onnxfuse.fuzz import each_rule
    from onnxfuse.fuzz.command import _chunk_crashed, _exit_status, _rule_job_crashed

    job = ("relu-relu", 0, 100, ("cpu", "onnx"), 7, False, "command", ())
    coverage = _rule_job_crashed(job, "job 0 killed the process running it")
    tally = each_rule.to_tally([coverage], ["cpu", "onnx"])
    assert tally.failed == 1 and list(tally.failures) == ["crash:worker-died:relu-relu"]
    chunk = _chunk_crashed((7, 3, 25, ("cpu",), None, 8, 0.0, "command", ()), "message")
    assert chunk.failures == {"crash:worker-died": 1}
    assert "graph chunk 3 of seed 7" in chunk.notes[0]
    assert _exit_status(chunk.failures, set(), strict=False) == 1
