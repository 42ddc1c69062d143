"""support/workers on the session's local Ray: the results of local runs, a job's own
exception, and a worker killed in the middle of its job loses nothing."""

from __future__ import annotations

import sys
import time

import pytest
from helpers import kill_a_busy_worker

from onnxfuse.support import workers

ON_RAY = workers.Workers(ray=workers.LOCAL)


@pytest.fixture(autouse=True)
def jobs_by_value(local_ray):
    """The jobs here are this test module's functions, which Ray's workers cannot import
    (tests/ is not on their path): they travel by value."""
    local_ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


def square(job: int) -> int:
    if job < 0:
        raise ValueError(f"negative job {job}")
    return job * job


def slow_square(job: int) -> int:
    time.sleep(1.0)
    return job * job


def test_the_results_of_a_local_run(local_ray):
    jobs = list(range(9))
    assert sorted(workers.run_jobs(square, iter(jobs), ON_RAY)) == [(i, i * i) for i in jobs]
    assert local_ray.is_initialized()  # joined the session's Ray: left running


def test_a_jobs_exception_reaches_the_caller(local_ray):
    with pytest.raises(ValueError, match="negative job -4"):
        list(workers.run_jobs(square, [1, -4], ON_RAY))


def test_a_killed_worker_loses_no_job(local_ray):
    killed: list[int] = []
    hunter = kill_a_busy_worker(killed)
    results = sorted(workers.run_jobs(slow_square, range(6), ON_RAY))
    hunter.join()
    assert killed, "no busy worker was found to kill"
    assert results == [(i, i * i) for i in range(6)]  # the killed job ran again
