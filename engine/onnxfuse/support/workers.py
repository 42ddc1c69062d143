"""Run a list of seeded jobs: in this process, in local worker processes, or on Ray.

Every command that fans work out (`fuzz graphs`, `fuzz rules`, `check`, `zoo`) cuts it
into jobs whose results depend on the job alone (each carries its seed), so where a job
runs changes nothing but the time. ``run_jobs`` yields ``(index, result)`` as jobs finish:
the caller merges, saves and shows progress on its side, and never needs every result
at once.

A job is a picklable argument of a module-level function (the function travels by
name: every node must have onnxfuse installed, at the same version). On Ray, each job is
a task with retries: a worker killed in the middle of a job has it run again elsewhere,
so a campaign loses nothing. Ray is optional (`pip install 'onnxfuse[ray]'`) and is
imported only when asked for.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from onnxfuse.errors import OnnxfuseError

if TYPE_CHECKING:
    from concurrent.futures import Future

J = TypeVar("J")
R = TypeVar("R")

# `--ray` without an address: start a Ray of this machine's own (never join one found).
LOCAL = "local"
# A task whose worker died is run again this many times before the campaign fails.
RETRIES = 3
RAY_HINT = "--ray needs Ray: pip install 'onnxfuse[ray]'"


@dataclass(frozen=True)
class Workers:
    """Where jobs run: ``ray`` None runs ``jobs`` local processes (1: this process);
    otherwise Ray at that address (``LOCAL``: a new local Ray with ``jobs`` CPUs, all
    of them when ``jobs`` is None; ``auto`` or host:port: an existing cluster)."""

    jobs: int | None = None
    ray: str | None = None

    @property
    def in_process(self) -> bool:
        """Whether jobs run here, one after the other (a callback can watch them)."""
        return self.ray is None and (self.jobs or 1) <= 1

    def describe(self) -> str:
        if self.ray is None:
            return f"{self.jobs or 1} job(s)"
        if self.ray == LOCAL:
            return f"a local Ray ({self.jobs or 'all'} CPU(s))"
        return f"the Ray cluster at {self.ray}"


def add_arguments(parser: Any, jobs_help: str = "worker processes") -> None:
    """``--jobs N`` and ``--ray [ADDRESS]``, the same on every command that fans out."""
    parser.add_argument("--jobs", type=int, default=None, metavar="N", help=jobs_help)
    parser.add_argument(
        "--ray",
        nargs="?",
        const=LOCAL,
        default=None,
        metavar="ADDRESS",
        help="run the jobs on Ray: alone, a new local Ray (--jobs CPUs); `auto` or an "
        "address (host:port, ray://...) joins a cluster (pip install 'onnxfuse[ray]')",
    )


def from_arguments(args: Any) -> Workers:
    if args.jobs is not None and args.jobs < 1:
        raise OnnxfuseError("--jobs must be >= 1")
    workers = Workers(args.jobs, args.ray)
    if workers.ray is not None:
        ray_module()  # no Ray: the hint now, before any work
    return workers


def ray_module() -> Any:
    try:
        import ray
    except ImportError:
        raise OnnxfuseError(RAY_HINT) from None
    return ray


def run_jobs(
    function: Callable[[J], R],
    jobs: Iterable[J],
    workers: Workers,
    setup: Callable[[], None] | None = None,
    on_crash: Callable[[J, str], R] | None = None,
) -> Iterator[tuple[int, R]]:
    """``(index, function(job))`` for every job, in the order they finish.

    ``jobs`` is read lazily, a few jobs ahead of the workers (twice as many as run at
    once): a job built late sees what the results before it changed (the corpus).
    ``setup`` runs in every worker process before its jobs (on Ray, before every job: a
    task cannot tell which process it lands in; it must be cheap).

    A job that kills the process running it (a crash in native code: onnxruntime on a
    fuzzed model) gives ``on_crash(job, message)`` as its result, or raises
    OnnxfuseError naming it; the other jobs go on. In local processes such a job is
    found by running the jobs its crash interrupted again, each alone; on Ray, by the
    task failing on every retry.
    """
    jobs = iter(jobs)
    if workers.in_process:
        for index, job in enumerate(jobs):
            yield index, function(job)
    elif workers.ray is None:
        yield from _on_processes(function, jobs, workers.jobs or 1, setup, on_crash)
    else:
        yield from _on_ray(function, jobs, workers, setup, on_crash)


def in_order(results: Iterable[tuple[int, R]]) -> Iterator[R]:
    """``run_jobs``'s results in the jobs' order: each is held only until those before
    it have come."""
    waiting: dict[int, R] = {}
    following = 0
    for index, result in results:
        waiting[index] = result
        while following in waiting:
            yield waiting.pop(following)
            following += 1


def _run_task(function, setup, job):
    if setup is not None:
        setup()
    return function(job)


def _on_processes(
    function, jobs: Iterator, processes: int, setup, on_crash
) -> Iterator[tuple[int, Any]]:
    # Imported here: every command's parser imports this module.
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    # spawn, not fork: a forked onnxruntime or hypothesis state is not safe to reuse.
    context = multiprocessing.get_context("spawn")
    numbered = enumerate(jobs)
    while True:
        with ProcessPoolExecutor(processes, mp_context=context, initializer=setup) as pool:
            pending: dict[Future, tuple[int, Any]] = {}
            try:
                for index, job in numbered:
                    pending[pool.submit(function, job)] = (index, job)
                    if len(pending) >= 2 * processes:
                        yield from _finished(pending)
                while pending:
                    yield from _finished(pending)
                return
            except BrokenProcessPool:
                # A worker died: every job it interrupted fails alike. Each is run again
                # alone, and the one that kills its own process is the crash.
                interrupted = sorted(pending.values(), key=lambda item: item[0])
                pending.clear()
            finally:
                for future in pending:
                    future.cancel()
        for index, job in interrupted:
            yield index, _alone(function, index, job, context, setup, on_crash)


def _alone(function, index: int, job, context, setup, on_crash) -> Any:
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    with ProcessPoolExecutor(1, mp_context=context, initializer=setup) as pool:
        try:
            return pool.submit(function, job).result()
        except BrokenProcessPool:
            return _crashed(index, job, on_crash)


def _crashed(index: int, job, on_crash) -> Any:
    message = (
        f"job {index} killed the process running it (a crash in native code, such as "
        "onnxruntime's, or a kill)"
    )
    if on_crash is None:
        raise OnnxfuseError(message)
    return on_crash(job, message)


def _finished(pending: dict[Future, tuple[int, Any]]) -> Iterator[tuple[int, Any]]:
    from concurrent.futures import FIRST_COMPLETED, wait

    done, _ = wait(list(pending), return_when=FIRST_COMPLETED)
    for future in done:
        result = future.result()  # a broken pool raises here: the job stays pending
        index, _ = pending.pop(future)
        yield index, result


def _on_ray(
    function, jobs: Iterator, workers: Workers, setup, on_crash
) -> Iterator[tuple[int, Any]]:
    ray = ray_module()
    started = _connect(ray, workers)
    pending: dict[Any, tuple[int, Any]] = {}
    try:
        task = ray.remote(max_retries=RETRIES, retry_exceptions=False)(_run_task)
        # The function and setup go to the object store once, not with every task.
        function_ref, setup_ref = ray.put(function), ray.put(setup)
        ahead = 2 * max(1, int(ray.cluster_resources().get("CPU", 1)))
        for index, job in enumerate(jobs):
            pending[task.remote(function_ref, setup_ref, job)] = (index, job)
            if len(pending) >= ahead:
                yield from _ray_finished(ray, pending, on_crash)
        while pending:
            yield from _ray_finished(ray, pending, on_crash)
    finally:
        for ref in pending:  # stopped early (an error, ^C): the cluster drops the rest
            ray.cancel(ref, force=True)
        if started:
            ray.shutdown()


def _ray_finished(ray, pending: dict[Any, tuple[int, Any]], on_crash) -> Iterator[tuple[int, Any]]:
    done, _ = ray.wait(list(pending), num_returns=1)
    for ref in done:
        index, job = pending.pop(ref)
        try:
            result = ray.get(ref)
        except ray.exceptions.RayTaskError as exc:
            # The job's own exception, as it would be raised in this process.
            raise exc.as_instanceof_cause() from None
        except ray.exceptions.WorkerCrashedError:  # on every retry: the job is the cause
            result = _crashed(index, job, on_crash)
        yield index, result


def _connect(ray, workers: Workers) -> bool:
    """Start or join Ray unless this process is connected already (a test's session Ray);
    True if this call connected, and so disconnects after (a local Ray it started stops)."""
    if ray.is_initialized():
        return False
    options: dict[str, Any] = {
        "include_dashboard": False,
        "log_to_driver": False,
        "configure_logging": False,
    }
    if workers.ray == LOCAL:
        options["num_cpus"] = workers.jobs
    try:
        ray.init(address=workers.ray, **options)
    except (ConnectionError, ValueError, RuntimeError) as exc:
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise OnnxfuseError(f"--ray {workers.ray}: cannot start or join Ray: {message}") from None
    return True
