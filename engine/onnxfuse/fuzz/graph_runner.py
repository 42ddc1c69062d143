"""The graph fuzzing campaign: generate, check every target, shrink and save failures.

Iterations are split into chunks of fixed size; chunk ``c`` of seed ``S`` is
always the same sequence of models, whichever process runs it. Inside a
chunk, hypothesis generates models from a seed derived from (S, c, run); any
failure ends the run (phases: generate only) and the next run starts from
the next derived seed, so the sequence depends on the seed alone. A failure
whose signature (failure kind + culprit rules) is not in the corpus yet is
then shrunk: the same run is replayed with shrinking on (outcomes of models
already checked come from a cache), and hypothesis shrinks the failing model
while it keeps failing the same way. The minimal model is saved.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections import Counter
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

from hypothesis import HealthCheck, Phase, Verbosity, given, reject, seed, settings

from onnxfuse.fuzz import corpus, oracle
from onnxfuse.fuzz.graphs import GraphCase, graph_cases
from onnxfuse.fuzz.qdq_graphs import qdq_graph_cases
from onnxfuse.support.every_module import load_every_module

CHUNK_SIZE = 50
DEFAULT_SHRINK_SECONDS = 120.0

logging.getLogger("onnx_ir").setLevel(logging.ERROR)


@dataclass
class Tally:
    passed: int = 0
    failed: int = 0
    discarded: int = 0
    duplicates: int = 0
    discard_reasons: Counter = field(default_factory=Counter)
    fired: dict[str, Counter] = field(default_factory=dict)
    failures: Counter = field(default_factory=Counter)  # signature -> count
    cases: list[corpus.Case] = field(default_factory=list)  # new failures, to save
    notes: list[str] = field(default_factory=list)

    def merge(self, other: Tally) -> None:
        self.passed += other.passed
        self.failed += other.failed
        self.discarded += other.discarded
        self.duplicates += other.duplicates
        self.discard_reasons.update(other.discard_reasons)
        for target, counts in other.fired.items():
            self.fired.setdefault(target, Counter()).update(counts)
        self.failures.update(other.failures)
        self.cases.extend(other.cases)
        self.notes.extend(other.notes)


@dataclass
class _Record:
    """The outcome of one generated model, cached for the replay run."""

    run: int
    status: str  # pass / discard / fail
    target: str = ""
    outcome: oracle.Outcome | None = None
    signature: str = ""
    culprit: str = ""


@dataclass
class _Failure:
    key: str
    record: _Record
    case: GraphCase


class _Stop(Exception):
    """Ends a hypothesis run at a failure."""


def derive_seed(*parts: object) -> int:
    text = ":".join(str(p) for p in parts)
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")


def case_key(case: GraphCase) -> str:
    h = hashlib.sha256(case.model.SerializeToString())
    h.update(repr((case.feed_seed, case.special, case.override)).encode())
    return h.hexdigest()


def _settings(max_examples: int, shrink: bool) -> settings:
    phases = (Phase.generate, Phase.shrink) if shrink else (Phase.generate,)
    return settings(
        max_examples=max_examples,
        phases=phases,
        database=None,
        deadline=None,
        derandomize=False,
        report_multiple_bugs=False,
        suppress_health_check=list(HealthCheck),
        verbosity=Verbosity.quiet,
        print_blob=False,
    )


def evaluate(case: GraphCase, targets: Sequence[str], tally: Tally, run: int) -> _Record:
    """Check a generated model for every target; count what happened."""
    if case.error:
        tally.discarded += 1
        tally.discard_reasons[f"generator: {case.error[:120]}"] += 1
        return _Record(run, "discard")
    feed_sets = oracle.feeds_for(case)
    original = oracle.validate(case.model, feed_sets)
    if isinstance(original, oracle.Outcome):
        tally.discarded += 1
        tally.discard_reasons[f"{original.kind}: {original.message[:120]}"] += 1
        return _Record(run, "discard")
    for target_name in targets:
        outcome = oracle.check(original, target_name)
        tally.fired.setdefault(target_name, Counter()).update(outcome.applied)
        if outcome.failed:
            culprit = oracle.diagnose(original, target_name, outcome)
            signature = oracle.signature(outcome, culprit)
            tally.failed += 1
            tally.failures[signature] += 1
            return _Record(run, "fail", target_name, outcome, signature, culprit)
    tally.passed += 1
    return _Record(run, "pass")


class _Shrinker:
    """Decides, during shrinking, whether a smaller model fails the same way."""

    def __init__(self, failure: _Failure, seconds: float):
        self.failure = failure
        self.deadline = time.monotonic() + seconds
        self.best = failure.case
        self.seen: dict[str, bool] = {}

    def __call__(self, case: GraphCase, key: str) -> None:
        if key not in self.seen:
            if time.monotonic() > self.deadline:
                return  # out of time: nothing else fails, shrinking ends
            self.seen[key] = key == self.failure.key or self._fails(case)
        if self.seen[key]:
            # Hypothesis only tries candidates smaller than its current best,
            # so the last failing one is the smallest.
            self.best = case
            raise _Stop()

    def _fails(self, case: GraphCase) -> bool:
        record = self.failure.record
        assert record.outcome is not None
        original = oracle.validate(case.model, oracle.feeds_for(case))
        if isinstance(original, oracle.Outcome):
            reject()
        outcome = oracle.check(original, record.target)
        if not outcome.same_failure(record.outcome):
            return False
        culprit = record.culprit
        if culprit == "unknown":
            return True
        rules = {r.name: r for r in oracle.run_rules()}
        chosen = [] if culprit == "pipeline" else [rules[n] for n in culprit.split("+")]
        return oracle.check(original, record.target, chosen).same_failure(record.outcome)


def run_chunk(
    fuzz_seed: int,
    chunk: int,
    size: int,
    targets: Sequence[str],
    known: Collection[str] | None,
    max_steps: int = 8,
    shrink_seconds: float = DEFAULT_SHRINK_SECONDS,
    progress: Callable[[Tally], None] | None = None,
    command: str = "",
    qdq: bool = False,
) -> Tally:
    """``size`` generated models (discards not counted), every target checked; with
    ``qdq``, whole QDQ models (``qdq_graphs``).

    New failures (signature not in ``known``, the corpus's) are shrunk and returned in
    ``Tally.cases`` for the caller to save; with ``known`` None (no corpus) nothing is
    shrunk.
    """
    load_every_module()
    tally = Tally()
    cache: dict[str, _Record] = {}
    shrink = known is not None
    known = set(known or ())
    strategy = (qdq_graph_cases if qdq else graph_cases)(max_steps=max_steps)
    done = 0
    run = 0
    while done < size:
        budget = size - done
        run_seed = derive_seed(fuzz_seed, chunk, run)
        found: list[_Failure] = []
        counted = [0]
        generate = _generator(cache, tally, targets, run, found, counted, progress)
        _execute(generate, strategy, run_seed, budget, shrink=False)
        done += counted[0]
        if found and shrink and found[0].record.signature not in known:
            failure = found[0]
            best = _shrink(failure, cache, strategy, run_seed, budget, run, shrink_seconds)
            known.add(failure.record.signature)
            tally.cases.append(corpus_case(best, failure, fuzz_seed, chunk, run, command))
        if counted[0] == 0 and not found:
            tally.notes.append(f"chunk {chunk}: hypothesis generated nothing new; stopped early")
            break
        run += 1
    return tally


def run_job(job: tuple, progress: Callable[[Tally], None] | None = None) -> Tally:
    """run_chunk with its arguments in a tuple (a worker's unit of work), with the run's
    rule files."""
    fuzz_seed, chunk, size, targets, known, max_steps, shrink_seconds, command, rules, qdq = job
    oracle.use_rules(rules)
    return run_chunk(
        fuzz_seed,
        chunk,
        size,
        targets,
        known,
        max_steps=max_steps,
        shrink_seconds=shrink_seconds,
        progress=progress,
        command=command,
        qdq=qdq,
    )


def _generator(cache, tally, targets, run, found, counted, progress):
    def generate(case: GraphCase) -> None:
        key = case_key(case)
        previous = cache.get(key)
        if previous is not None:
            if previous.run == run and previous.status == "fail":
                raise _Stop()  # hypothesis replays the failure once more
            tally.duplicates += 1  # a model an earlier run already checked
            reject()
        record = evaluate(case, targets, tally, run)
        cache[key] = record
        if progress is not None:
            progress(tally)
        if record.status == "discard":
            reject()
        counted[0] += 1
        if record.status == "fail":
            found.append(_Failure(key, record, case))
            raise _Stop()

    return generate


def _execute(body, strategy, run_seed: int, budget: int, shrink: bool) -> None:
    test = seed(run_seed)(_settings(budget, shrink)(given(strategy)(body)))
    try:
        test()
    except _Stop:
        pass
    except Exception as exc:  # hypothesis's Flaky / Unsatisfiable and the like
        if not _has_stop(exc):
            raise


def _has_stop(exc: BaseException) -> bool:
    if isinstance(exc, _Stop):
        return True
    children = getattr(exc, "exceptions", ())
    return any(_has_stop(e) for e in children) or isinstance(exc.__cause__, _Stop)


def _shrink(
    failure: _Failure,
    cache: dict[str, _Record],
    strategy,
    run_seed: int,
    budget: int,
    run: int,
    seconds: float,
) -> GraphCase:
    """Replay the run (cached outcomes) up to the failure, then let hypothesis shrink it."""
    shrinker = _Shrinker(failure, seconds)
    shrinking = [False]

    def replay(case: GraphCase) -> None:
        key = case_key(case)
        if shrinking[0]:
            shrinker(case, key)
            return
        record = cache.get(key)
        if record is None or record.run != run:
            reject()  # cannot happen in a deterministic replay; ignore the model
        if key == failure.key:
            shrinking[0] = True
            raise _Stop()
        if record.status == "discard":
            reject()

    try:
        _execute(replay, strategy, run_seed, budget, shrink=True)
    except Exception:  # shrinking is best effort: keep the unshrunk failure
        return shrinker.best
    return shrinker.best


def corpus_case(
    case: GraphCase,
    failure: _Failure,
    fuzz_seed: int,
    chunk: int,
    run: int,
    command: str,
) -> corpus.Case:
    record = failure.record
    assert record.outcome is not None
    # Describe the minimized model's own failure (message, rules) for the sidecar.
    outcome = record.outcome
    original = oracle.validate(case.model, oracle.feeds_for(case))
    if not isinstance(original, oracle.Outcome):
        again = oracle.check(original, record.target)
        if again.same_failure(outcome):
            outcome = again
    data: dict[str, Any] = {
        "target": record.target,
        "seed": fuzz_seed,
        "chunk": chunk,
        "run": run,
        "found_by": command,
        "feeds": {
            "seed": case.feed_seed,
            "special": case.special,
            "override": case.override,
            "overridable": case.overridable,
        },
        "failure": {
            "kind": outcome.kind,
            "culprit": record.culprit,
            "where": outcome.where,
            "signature": record.signature,
            "message": outcome.message,
            "applied": outcome.applied,
        },
        "steps": case.steps,
        "nodes": len(case.model.graph.node),
    }
    if oracle.rule_files():  # a user's rules: replayed with them
        data["rules"] = list(oracle.rule_files())
    return corpus.Case("graph", case.model.SerializeToString(), ".onnx", data)


# -- replay ------------------------------------------------------------------------------


def case_from_entry(entry: corpus.Entry) -> GraphCase:
    feeds = entry.data.get("feeds", {})
    return GraphCase(
        model=corpus.load_model(entry),
        feed_seed=int(feeds.get("seed", 0)),
        special=bool(feeds.get("special", False)),
        override=bool(feeds.get("override", False)),
        overridable=list(feeds.get("overridable", [])),
        steps=list(entry.data.get("steps", [])),
    )


def replay_entry(entry: corpus.Entry) -> oracle.Outcome:
    """Check a corpus model for its target again, with the rule files it was found with."""
    oracle.use_rules(entry.data.get("rules", ()))
    case = case_from_entry(entry)
    original = oracle.validate(case.model, oracle.feeds_for(case))
    if isinstance(original, oracle.Outcome):
        return oracle.Outcome(
            "fail", "invalid-case", f"the saved model no longer runs: {original.message}"
        )
    return oracle.check(original, str(entry.data.get("target", "cpu")))
