"""The fuzz corpus, replayed forever; and a tiny run of both fuzzers.

Every minimized failure the fuzzers saved under fuzz/corpus/ must pass once
its bug is fixed; a case whose bug is still open carries an ``xfail`` reason
in its sidecar and is expected to fail (strictly: when the bug is fixed the
test reports XPASS as a failure, and the reason must be removed).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import fuzz_summary

from onnxfuse.fuzz import corpus, graph_runner
from onnxfuse.fuzz import rules as rule_fuzzer
from onnxfuse.targets.cpu_features import detect_block_size

ROOT = Path(__file__).resolve().parents[2]

CORPUS = ROOT / "fuzz" / "corpus"  # the clone's, which `python -m fuzz` saves in
ENTRIES = corpus.entries(CORPUS)


def _cases(kind: str) -> list:
    params = []
    for entry in ENTRIES:
        if entry.kind != kind:
            continue
        marks = [pytest.mark.xfail(strict=True, reason=entry.xfail)] if entry.xfail else []
        params.append(pytest.param(entry, id=entry.sidecar.stem, marks=marks))
    return params


@pytest.mark.parametrize("entry", _cases("graph"))
def test_graph_case(entry: corpus.Entry) -> None:
    outcome = graph_runner.replay_entry(entry)
    assert not outcome.failed, f"{outcome.kind}: {outcome.message}"


@pytest.fixture(scope="module")
def rule_worker():
    worker = rule_fuzzer.Worker(apply=True)
    yield worker
    worker.stop()


@pytest.mark.parametrize("entry", _cases("rule"))
def test_rule_case(entry: corpus.Entry, rule_worker) -> None:
    problem = rule_fuzzer.replay_entry(entry, worker=rule_worker)
    assert problem is None, problem


def test_corpus_sidecars_are_complete() -> None:
    for entry in ENTRIES:
        assert entry.payload.exists(), f"{entry.sidecar.name}: {entry.payload.name} is missing"
        assert entry.signature, f"{entry.sidecar.name}: no failure signature"
        if entry.kind == "graph":
            assert entry.data.get("target"), f"{entry.sidecar.name}: no target"
        assert "seed" in entry.data, f"{entry.sidecar.name}: no seed"


def _fuzz(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "engine"), str(ROOT)])}
    return subprocess.run(
        [sys.executable, "-m", "fuzz", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_graph_fuzz_smoke() -> None:
    """20 models for every target: no failure the corpus does not know as an open bug."""
    result = _fuzz("graphs", "--iterations", "20", "--seed", "0", "--no-save")
    passed, failed = fuzz_summary(result)
    assert passed + failed == 20
    assert result.returncode == 0, result.stderr[-3000:]
    discarded = int(re.search(r"discarded (\d+) generated models", result.stderr).group(1))
    assert discarded <= 2, result.stderr[-3000:]


def test_rule_fuzz_smoke() -> None:
    """50 rule mutants: each a clear error or a valid rule (known open bugs aside)."""
    result = _fuzz("rules", "--iterations", "50", "--seed", "0", "--no-save")
    passed, failed = fuzz_summary(result)
    assert passed + failed == 50
    assert result.returncode == 0, result.stderr[-3000:]


# Rules whose embedding needs what --each-rule's embedding provides: a computed index
# input in range and symbolic dims (else the source folds), typed outputs of ops of other
# domains and a target parameter (block), a consumer of the output (a Cast between a
# graph input and a graph output cannot go), a documented NaN difference (special inputs).
EACH_RULE_CASES = [
    ("ort-embed-layer-norm", "cpu"),
    ("nchwc-global-maxpool", "cpu:block=auto"),
    ("nchwc-conv-add", "cpu:block=auto"),
    ("cast-noop", "cpu"),
]


@pytest.mark.parametrize(("name", "target"), EACH_RULE_CASES)
def test_each_rule_embedding_fires(name: str, target: str) -> None:
    """The plain embedding of `python -m fuzz graphs --each-rule` fires, and passes."""
    from onnxfuse.fuzz import each_rule

    if name.startswith("nchwc") and detect_block_size() is None:
        pytest.skip("this CPU has no NCHWc kernels: the blocked rules cannot run here")
    rule, domain = next((r, d) for r, d in each_rule._rules() if r.name == name)
    blocked = "cpu:block=auto"  # this machine's block size, as the rules' domains say
    coverage = each_rule.check_rule(rule, domain, 0, 2, [target, blocked], 0, None, "")
    # Enabled where the verify domain's target parameters hold: blocked rules only there.
    enabled = [blocked] if target == blocked else [target, blocked]
    assert coverage.targets == enabled
    assert coverage.failed == 0, coverage.failures
    assert coverage.embedded == 2 and coverage.fired >= 1, (coverage.not_fired, coverage.not_drawn)
