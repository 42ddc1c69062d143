"""support/workers: the same results in this process and in worker processes; without
Ray, `--ray` says how to get it (exit 2)."""

from __future__ import annotations

import os
import signal
import sys

import pytest

from onnxfuse.cli.main import main as onnxfuse_main
from onnxfuse.errors import OnnxfuseError
from onnxfuse.fuzz.command import main as fuzz_main
from onnxfuse.support import workers


def square(job: int) -> int:
    if job < 0:
        raise ValueError(f"negative job {job}")
    return job * job


def test_every_job_once_with_its_index_in_this_process_and_in_processes():
    jobs = list(range(7))
    here = list(workers.run_jobs(square, jobs, workers.Workers()))
    assert here == [(i, i * i) for i in jobs]  # in this process: in order
    spread = list(workers.run_jobs(square, iter(jobs), workers.Workers(jobs=2)))
    assert sorted(spread) == here


def test_a_jobs_exception_reaches_the_caller_from_a_process():
    with pytest.raises(ValueError, match="negative job -1"):
        list(workers.run_jobs(square, [1, -1, 2], workers.Workers(jobs=2)))


def crash_on_three(job: int) -> int:
    if job == 3:  # as onnxruntime crashing on a generated model
        os.kill(os.getpid(), signal.SIGSEGV)
    return job * job


def test_a_job_that_kills_its_process_gives_its_crash_result_and_the_others_finish():
    found = dict(
        workers.run_jobs(
            crash_on_three, range(7), workers.Workers(jobs=2), on_crash=lambda job, _: -job
        )
    )
    assert found == {0: 0, 1: 1, 2: 4, 3: -3, 4: 16, 5: 25, 6: 36}


def test_without_a_crash_result_the_crash_is_one_error_naming_the_job():
    with pytest.raises(OnnxfuseError, match="job 3 killed the process running it"):
        list(workers.run_jobs(crash_on_three, range(5), workers.Workers(jobs=2)))


def test_jobs_below_one_is_bad_input():
    class Args:
        jobs, ray = 0, None

    with pytest.raises(OnnxfuseError, match="--jobs must be >= 1"):
        workers.from_arguments(Args())


@pytest.fixture
def no_ray(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError


def test_fuzz_with_ray_but_without_it_says_how_to_install_it(no_ray, capsys):
    with pytest.raises(SystemExit) as exit_:
        fuzz_main(["graphs", "--iterations", "1", "--no-save", "--ray"])
    assert exit_.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.endswith("--ray needs Ray: pip install 'onnxfuse[ray]'")


def test_check_with_ray_but_without_it_says_how_to_install_it(no_ray, capsys):
    code = onnxfuse_main(["check", "rules/core", "--rule", "relu-relu", "--ray", "auto"])
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["onnxfuse: error: --ray needs Ray: pip install 'onnxfuse[ray]'"]


def test_zoo_with_ray_but_without_it_says_how_to_install_it(no_ray, tmp_path, capsys):
    (tmp_path / "m.onnx").write_bytes(b"")
    assert onnxfuse_main(["zoo", str(tmp_path), "--ray"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["onnxfuse: error: --ray needs Ray: pip install 'onnxfuse[ray]'"]


def test_without_ray_the_jobs_still_run_here(no_ray):
    assert list(workers.run_jobs(square, [3], workers.Workers(jobs=1))) == [(0, 9)]
