"""`onnxfuse fuzz ... --ray` on the session's local Ray: the same seed gives the verdicts
of a local run, chunk by chunk; a worker killed mid-campaign loses no model; failures
found on the workers land in the driver's corpus."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import NEARLY_RIGHT, kill_a_busy_worker

from onnxfuse.fuzz import graph_runner
from onnxfuse.fuzz.command import main as fuzz_main
from onnxfuse.support import workers

SEED, CHUNKS, SIZE = 11, 4, 8
JOBS = [(SEED, k, SIZE, ("cpu", "onnx"), None, 8, 0.0, "", (), False) for k in range(CHUNKS)]


def verdicts(tally: graph_runner.Tally) -> tuple:
    return (
        tally.passed,
        tally.failed,
        tally.discarded,
        tally.duplicates,
        dict(tally.failures),
        {target: dict(counts) for target, counts in tally.fired.items()},
        dict(tally.discard_reasons),
    )


def campaign(where: workers.Workers) -> list[tuple]:
    found = dict(workers.run_jobs(graph_runner.run_job, JOBS, where))
    return [verdicts(found[k]) for k in range(CHUNKS)]


@pytest.fixture(scope="module")
def here() -> list[tuple]:
    return campaign(workers.Workers())


def test_the_same_seed_gives_the_same_verdicts_here_in_processes_and_on_ray(local_ray, here):
    assert sum(v[0] + v[1] for v in here) == CHUNKS * SIZE
    assert any(v[5] for v in here)  # rules fired: the chunks checked something
    assert campaign(workers.Workers(ray=workers.LOCAL)) == here
    assert campaign(workers.Workers(jobs=2)) == here


def _last_line(capsys) -> str:
    return capsys.readouterr().out.strip().splitlines()[-1]


def test_a_worker_killed_mid_campaign_loses_no_model(local_ray, here, capsys):
    killed: list[int] = []
    hunter = kill_a_busy_worker(killed)
    argv = ["graphs", "--iterations", str(CHUNKS * SIZE), "--chunk-size", str(SIZE)]
    code = fuzz_main([*argv, "--seed", str(SEED), "--no-save", "--ray"])
    hunter.join()
    assert killed, "no busy worker was found to kill"
    passed, failed = sum(v[0] for v in here), sum(v[1] for v in here)
    assert _last_line(capsys) == f"{passed} passed, {failed} failed"
    assert code == (1 if failed else 0)


def test_a_failure_found_on_a_worker_is_saved_in_the_drivers_corpus(local_ray, tmp_path, capsys):
    rules = tmp_path / "wrong.yaml"
    rules.write_text(NEARLY_RIGHT)
    corpus = tmp_path / "corpus"
    argv = ["graphs", "--each-rule", "2", "--rule", "div-sqrt2-as-rounded-mul"]
    argv += ["--rules", str(rules), "--target", "cpu", "--corpus", str(corpus), "--ray"]
    assert fuzz_main(argv) == 1
    captured = capsys.readouterr()
    assert captured.out.strip().endswith("failed") and "new failure saved" in captured.err
    (sidecar,) = corpus.glob("*.json")
    data = json.loads(sidecar.read_text())
    assert data["failure"]["kind"] == "mismatch" and Path(sidecar.with_name(data["file"])).is_file()


def test_rule_mutants_on_ray_meet_the_verdicts_of_a_local_run(local_ray, capsys):
    argv = ["rules", "--iterations", "30", "--seed", "2", "--no-save"]
    fuzz_main(argv)
    here = capsys.readouterr()
    fuzz_main([*argv, "--ray"])
    there = capsys.readouterr()
    assert there.out == here.out

    def mutants(err: str) -> list[str]:
        return [line for line in err.splitlines() if line.startswith("mutants:")]

    assert mutants(here.err) and mutants(there.err) == mutants(here.err)
