"""The fuzzers' command line: ``onnxfuse fuzz graphs|rules|replay ...`` (and a clone's
``python -m fuzz``, whose corpus is the clone's fuzz/corpus/).

Progress goes to stderr; the last line on stdout is ``N passed, M failed``.
Exit status: 0 if nothing failed (or, without --strict, only failures the
corpus already lists as xfail), 1 otherwise, 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import functools
import math
import shlex
import signal
import sys
import time
from collections import Counter
from pathlib import Path

from onnxfuse.errors import OnnxfuseError
from onnxfuse.fuzz import corpus
from onnxfuse.support import workers

DEFAULT_TARGETS = ["cpu", "onnx"]


# Where `onnxfuse fuzz` saves failures by default: a folder of the current directory.
DEFAULT_CORPUS = Path("fuzz-corpus")


def main(
    argv: list[str] | None = None,
    prog: str = "onnxfuse fuzz",
    default_corpus: Path = DEFAULT_CORPUS,
) -> int:
    parser = argparse.ArgumentParser(
        prog=prog, description="Differential graph fuzzing and rule-file mutation."
    )
    sub = parser.add_subparsers(dest="command", required=True)

    graphs = sub.add_parser("graphs", help="differential graph fuzzing against onnxruntime")
    graphs.add_argument("--iterations", type=int, default=100, help="models to check")
    graphs.add_argument("--seed", type=int, default=0)
    graphs.add_argument(
        "--target",
        action="append",
        help="target(s) to optimize for (default: cpu and onnx; `all`: every built-in target)",
    )
    workers.add_arguments(graphs)
    graphs.add_argument("--max-steps", type=int, default=8, help="steps per generated model")
    graphs.add_argument("--chunk-size", type=int, default=None, help=argparse.SUPPRESS)
    graphs.add_argument(
        "--each-rule",
        type=int,
        metavar="K",
        help="instead of --iterations: embed every rule K times (round-robin over the "
        "targets where it is enabled) and report per rule whether it fired and passed",
    )
    graphs.add_argument(
        "--rule", action="append", help="with --each-rule: only this rule (repeatable)"
    )
    graphs.add_argument(
        "--qdq",
        action="store_true",
        help="whole QDQ models: float models quantized by onnxruntime's quantize_static",
    )
    graphs.add_argument(
        "--rules",
        action="append",
        default=[],
        metavar="PATH",
        help="a rule file or pack folder of yours, embedded and applied beside the built-in "
        "packs (repeatable)",
    )
    graphs.add_argument(
        "--table", type=Path, help="with --each-rule: write a per-rule table (TSV) here"
    )
    _common(graphs, default_corpus)

    rules = sub.add_parser("rules", help="mutate rule files: clear errors, no crash, no hang")
    rules.add_argument("--iterations", type=int, default=200, help="mutants to try")
    rules.add_argument("--seed", type=int, default=0)
    rules.add_argument("--timeout", type=float, default=10.0, help="seconds per mutant")
    rules.add_argument(
        "--no-apply", action="store_true", help="only load valid mutants, do not optimize with them"
    )
    workers.add_arguments(rules)
    _common(rules, default_corpus)

    replay = sub.add_parser("replay", help="check corpus cases again and say what happens")
    replay.add_argument("paths", nargs="*", help="sidecar .json files (default: the corpus)")
    replay.add_argument(
        "--corpus", type=Path, default=default_corpus, help="the corpus replayed by default"
    )

    args = parser.parse_args(argv)
    _hypothesis_files_elsewhere()
    # On SIGTERM, unwind normally: the worker pool is terminated on the way out.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    if args.command == "replay":
        return _replay(args)
    if args.iterations < 0:
        parser.error("--iterations must be >= 0")
    if args.command == "graphs" and args.each_rule is not None and args.each_rule < 1:
        parser.error("--each-rule must be >= 1")
    if args.command == "graphs" and args.qdq and args.each_rule is not None:
        parser.error("--qdq generates models for --iterations; --each-rule embeds rules")
    if args.command == "graphs" and args.max_steps < 1:
        parser.error("--max-steps must be >= 1")
    if args.command == "graphs" and args.table:
        table = Path(args.table)
        if table.is_dir() or not table.parent.is_dir():
            parser.error(f"--table {table}: not a file in an existing directory")
    try:
        where = workers.from_arguments(args)
    except OnnxfuseError as exc:
        parser.error(str(exc))
    command = f"{prog} " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
    try:
        if args.command == "graphs":
            return _graphs(args, parser, command, where)
        return _rules(args, command, where)
    except OnnxfuseError as exc:  # Ray could not be started or joined
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2


def _hypothesis_files_elsewhere() -> None:
    """Not in the working directory (this process and every worker: a setting of each)."""
    from onnxfuse.proof.hypothesis_home import keep_hypothesis_files_out_of_the_working_directory

    keep_hypothesis_files_out_of_the_working_directory()


def _common(parser: argparse.ArgumentParser, default_corpus: Path) -> None:
    parser.add_argument(
        "--corpus",
        type=Path,
        default=default_corpus,
        help=f"where minimized failures go (default: {default_corpus})",
    )
    parser.add_argument("--no-save", action="store_true", help="do not write to the corpus")
    parser.add_argument(
        "--strict", action="store_true", help="exit 1 on any failure, even a known (xfail) one"
    )
    parser.add_argument(
        "--shrink-seconds", type=float, default=120.0, help="time to shrink each new failure"
    )


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


class _Progress:
    def __init__(self, label: str, total: int):
        self.label = label
        self.total = total
        self.started = time.monotonic()
        self.last = 0.0

    def show(self, passed: int, failed: int, discarded: int, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self.last < 2.0:
            return
        self.last = now
        done = passed + failed
        rate = 100.0 * discarded / max(1, done + discarded)
        _say(
            f"[{self.label}] {done}/{self.total}  passed {passed}  failed {failed}  "
            f"discarded {discarded} ({rate:.1f}%)  {now - self.started:.0f}s"
        )


def _graphs(args, parser, command: str, where: workers.Workers) -> int:
    from onnxfuse.fuzz import graph_runner, oracle
    from onnxfuse.targets.capabilities import builtin_target_names, load_target

    # By default cpu and onnx (onnxruntime's own kernels, standard ops only), as
    # before there were other targets; `--target all` takes every built-in one.
    # A target may carry parameters (`cpu:block=8`, `cuda:layout=nhwc`).
    targets = args.target or DEFAULT_TARGETS
    if "all" in targets:
        targets = [t for t in targets if t != "all"] + builtin_target_names()
    for name in targets:
        try:
            load_target(name)
        except OnnxfuseError as exc:
            parser.error(str(exc))
    oracle.use_rules(args.rules)
    try:
        oracle.run_rules()  # a bad rule file: one line, before any worker starts
    except OnnxfuseError as exc:
        parser.error(str(exc))
    corpus_dir = None if args.no_save else args.corpus
    if args.each_rule is not None:
        return _each_rule(args, parser, targets, corpus_dir, command, where)
    chunk_size = args.chunk_size or graph_runner.CHUNK_SIZE
    chunks = [
        (k, min(chunk_size, args.iterations - k * chunk_size))
        for k in range(math.ceil(args.iterations / chunk_size))
    ]
    progress = _Progress("graphs " + ",".join(targets), args.iterations)
    total = graph_runner.Tally()
    _say(
        f"graph fuzzing: {args.iterations} {'QDQ ' if args.qdq else ''}models, seed {args.seed}, "
        f"targets {', '.join(targets)}, "
        f"{len(chunks)} chunk(s), {where.describe()}"
    )
    # The corpus's signatures go with each job, read as it is handed out: a worker
    # (perhaps on another machine) shrinks only failures new to the corpus, and this
    # process saves them.
    jobs = (
        (
            args.seed,
            k,
            size,
            tuple(targets),
            _known(corpus_dir, "graph"),
            args.max_steps,
            args.shrink_seconds,
            command,
            oracle.rule_files(),
            args.qdq,
        )
        for k, size in chunks
    )

    def show(running: graph_runner.Tally) -> None:  # in this process: every model
        progress.show(
            total.passed + running.passed,
            total.failed + running.failed,
            total.discarded + running.discarded,
        )

    run = graph_runner.run_job
    if where.in_process:
        run = functools.partial(graph_runner.run_job, progress=show)
    for _, tally in workers.run_jobs(
        run, jobs, where, _hypothesis_files_elsewhere, on_crash=_chunk_crashed
    ):
        _save_new(tally.cases, corpus_dir)
        total.merge(tally)
        progress.show(total.passed, total.failed, total.discarded, force=True)
    progress.show(total.passed, total.failed, total.discarded, force=True)
    _graph_summary(total, targets, args)
    print(f"{total.passed} passed, {total.failed} failed", flush=True)
    return _exit_status(total.failures, corpus.xfail_signatures(args.corpus, "graph"), args.strict)


def _each_rule(
    args, parser, targets: list[str], corpus_dir, command: str, where: workers.Workers
) -> int:
    from onnxfuse.fuzz import each_rule, oracle

    names = each_rule.rule_names()
    if args.rule:
        unknown = [n for n in args.rule if n not in names]
        if unknown:
            parser.error(
                f"--rule: no rule with a usable verify domain named {', '.join(unknown)} "
                "(`onnxfuse check RULES --rule NAME` says what its domain lacks)"
            )
        names = [n for n in names if n in args.rule]
    _say(
        f"rule coverage: {len(names)} rules x {args.each_rule}, seed {args.seed}, "
        f"targets {', '.join(targets)}, {where.describe()}"
    )
    jobs = [
        (
            name,
            i,
            args.each_rule,
            tuple(targets),
            args.seed,
            corpus_dir is not None,
            command,
            oracle.rule_files(),
        )
        for i, name in enumerate(names)
    ]
    progress = _Progress("each-rule", len(names) * args.each_rule)
    # In the order of the rules, whichever worker finishes first.
    found: dict[int, each_rule.RuleCoverage] = {}
    for index, result in workers.run_jobs(
        each_rule.run_job, jobs, where, _hypothesis_files_elsewhere, on_crash=_rule_job_crashed
    ):
        found[index] = result
        _save_new(result.cases, corpus_dir)
        done = found.values()
        progress.show(sum(r.passed for r in done), sum(r.failed for r in done), 0)
    results = [found[i] for i in sorted(found)]
    progress.show(sum(r.passed for r in results), sum(r.failed for r in results), 0, force=True)
    each_rule.summary(results, _say)
    if args.table:
        each_rule.write_table(results, args.table)
        _say(f"per-rule table: {args.table}")
    total = each_rule.to_tally(results, targets)
    print(f"{total.passed} passed, {total.failed} failed", flush=True)
    return _exit_status(total.failures, corpus.xfail_signatures(args.corpus, "graph"), args.strict)


# A job that kills its worker process (onnxruntime crashing on a generated model) is one
# failure with this signature; the campaign goes on, and the note says which job it was.
CRASH_SIGNATURE = "crash:worker-died"


def _chunk_crashed(job: tuple, message: str):
    from onnxfuse.fuzz import graph_runner

    seed, chunk, size = job[0], job[1], job[2]
    tally = graph_runner.Tally(failed=1)
    tally.failures[CRASH_SIGNATURE] += 1
    tally.notes.append(f"graph chunk {chunk} of seed {seed} ({size} models): {message}")
    return tally


def _rule_job_crashed(job: tuple, message: str):
    from onnxfuse.fuzz import each_rule

    name, targets = job[0], job[3]
    failure = f"{','.join(targets)}: {CRASH_SIGNATURE}:{name}: {message}"
    return each_rule.RuleCoverage(rule=name, failed=1, failures=[failure])


def _mutants_crashed(job: tuple, message: str):
    from onnxfuse.fuzz import rules as rule_fuzzer

    seed, start, size = job[0], job[1], job[2]
    tally = rule_fuzzer.Tally(failed=1)
    tally.failures[f"{CRASH_SIGNATURE} (mutants {start}-{start + size - 1} of seed {seed})"] += 1
    return tally


def _known(corpus_dir: Path | None, kind: str) -> list[str] | None:
    """The corpus's signatures now (None: no corpus, so nothing is shrunk)."""
    return None if corpus_dir is None else sorted(corpus.known_signatures(corpus_dir, kind))


def _save_new(cases: list[corpus.Case], corpus_dir: Path | None) -> None:
    """Save the new failures a job found (shrunk where it ran) in this process's corpus."""
    for case in cases:
        assert corpus_dir is not None  # jobs shrink and return cases only with a corpus
        path = corpus.save_case(corpus_dir, case)
        if path is not None:  # None: another job saved that signature first
            _say(f"  new failure saved: {path}")


def _graph_summary(total, targets, args) -> None:
    done = total.passed + total.failed
    rate = 100.0 * total.discarded / max(1, done + total.discarded)
    _say(
        f"discarded {total.discarded} generated models ({rate:.1f}%); "
        f"{total.duplicates} duplicates skipped"
    )
    # Ties in a fixed order: jobs finish in any order, the report is the same.
    for reason, count in _by_count(total.discard_reasons)[:5]:
        _say(f"  {count:5d}  {reason}")
    from onnxfuse.fuzz.each_rule import enabled_anywhere

    for name in targets:
        fired = total.fired.get(name, {})
        never = [r for r in enabled_anywhere([name]) if not fired.get(r)]
        _say(
            f"rules fired for target {name}: {sum(fired.values())} rewrites, "
            f"{len(fired)} distinct rules; never fired: {', '.join(never) or 'none'}"
        )
    for signature, count in _by_count(total.failures):
        _say(f"  failure x{count}: {signature}")
    for note in sorted(total.notes):
        _say(f"  note: {note}")


def _by_count(counts: Counter) -> list[tuple[str, int]]:
    return sorted(counts.items(), key=lambda item: (-item[1], item[0]))


def _exit_status(failures, xfail: set[str], strict: bool) -> int:
    if not failures:
        return 0
    unknown = [s for s in failures if s not in xfail]
    if strict or unknown:
        return 1
    _say("every failure is a known bug (xfail in the corpus); exit status 0 (use --strict)")
    return 0


def _rules(args, command: str, where: workers.Workers) -> int:
    from onnxfuse.fuzz import rules as rule_fuzzer

    progress = _Progress("rules", args.iterations)
    corpus_dir = None if args.no_save else args.corpus
    _say(
        f"rule fuzzing: {args.iterations} mutants, seed {args.seed}, timeout {args.timeout}s, "
        f"{where.describe()}"
    )
    # In this process the campaign is one job (one checking process for every mutant).
    size = max(1, args.iterations) if where.in_process else rule_fuzzer.CHUNK_SIZE
    jobs = (
        (
            args.seed,
            start,
            min(size, args.iterations - start),
            args.timeout,
            _known(corpus_dir, "rule"),
            not args.no_apply,
            args.shrink_seconds,
            command,
        )
        for start in range(0, args.iterations, size)
    )
    tally = rule_fuzzer.Tally()

    def show(running: rule_fuzzer.Tally) -> None:
        progress.show(tally.passed + running.passed, tally.failed + running.failed, 0)

    run = rule_fuzzer.run_job
    if where.in_process:
        run = functools.partial(rule_fuzzer.run_job, progress=show)
    for _, part in workers.run_jobs(
        run, jobs, where, _hypothesis_files_elsewhere, on_crash=_mutants_crashed
    ):
        _save_new(part.cases, corpus_dir)
        tally.merge(part)
        progress.show(tally.passed, tally.failed, 0, force=True)
    progress.show(tally.passed, tally.failed, 0, force=True)
    _say(
        f"mutants: {tally.errors} rejected with a clear error ({tally.without_line} of them "
        f"without a line number), {tally.valid} valid ({tally.applied} applied to models)"
    )
    for signature, count in _by_count(tally.failures):
        _say(f"  failure x{count}: {signature}")
    print(f"{tally.passed} passed, {tally.failed} failed", flush=True)
    return _exit_status(tally.failures, corpus.xfail_signatures(args.corpus, "rule"), args.strict)


def _replay(args) -> int:
    from onnxfuse.errors import OnnxfuseError
    from onnxfuse.fuzz import graph_runner
    from onnxfuse.fuzz import rules as rule_fuzzer

    wanted = {Path(p).resolve() for p in args.paths}
    chosen = corpus.entries(args.corpus)
    if wanted:
        found = {e.sidecar.resolve(): e for p in wanted for e in corpus.entries(p.parent)}
        chosen = [found[p] for p in sorted(wanted) if p in found]
    failed = 0
    for entry in chosen:
        if entry.kind == "graph":
            try:
                outcome = graph_runner.replay_entry(entry)
            except OnnxfuseError as exc:  # a rule file it was found with is gone or broken
                ok, detail = False, f"cannot replay: {exc}"
            else:
                ok = not outcome.failed
                detail = "passes" if ok else f"{outcome.kind}: {outcome.message}"
        else:
            problem = rule_fuzzer.replay_entry(entry)
            ok = problem is None
            detail = "passes" if problem is None else problem
        failed += not ok
        xfail = f" (xfail: {entry.xfail})" if entry.xfail else ""
        print(f"{entry.sidecar.name}: {detail}{xfail}")
    print(f"{len(chosen) - failed} passed, {failed} failed", flush=True)
    return 1 if failed else 0
