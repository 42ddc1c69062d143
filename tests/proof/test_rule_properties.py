"""Every rule of every pack in rules/, proven on instances drawn from its verification domain.

For each rule (test ids are rule names):
  - its ``verify:`` domain parses and agrees with the rule;
  - the domain yields a firing instance (coverage);
  - on hypothesis-drawn instances the rule fires and onnxruntime's outputs
    before and after agree within torch.testing's per-dtype tolerances, on
    plain and special-valued inputs;
  - derived negative cases (extra uses, intermediates as outputs, changed
    literals, unnamed attributes, the domain's own negatives) do not fire, and
    boundary cases (another dtype, a constant made an input) fire only where exact.

The negative test takes its instances from the positive test of the same rule when that
ran first in this process (the same seed draws the same instances), rather than drawing
and firing them again; run alone, or to shrink a failure, it draws its own.

Example counts follow the hypothesis profile (HYPOTHESIS_PROFILE=ci|thorough|dev);
ONNXFUSE_PROOF_SEED picks other instances (default 0: the same ones every run).
"""

from __future__ import annotations

import os

import pytest
from conftest import NEGATIVES_PER_INSTANCE, REPO_ROOT
from hypothesis import settings

from onnxfuse.language.packs import builtin_pack_names, load_builtin_rules, load_pack
from onnxfuse.proof.check import (
    RuleReport,
    check_negatives,
    check_rule,
    find_firing_instance,
    unavailable_here,
)
from onnxfuse.proof.domain import parse_domain
from onnxfuse.targets.capabilities import load_target

PACK_DIRS = sorted(
    p for p in (REPO_ROOT / "rules").iterdir() if p.is_dir() and any(p.glob("*.yaml"))
)
RULES = [rule for pack in PACK_DIRS for rule in load_pack(pack)]
EXAMPLES = settings.default.max_examples
NEGATIVE_EXAMPLES = max(5, EXAMPLES // 2)
SEED = int(os.environ.get("ONNXFUSE_PROOF_SEED", "0"))
SHRINK_SECONDS = 10.0
TARGET = load_target("cpu")

every_rule = pytest.mark.parametrize("rule", RULES, ids=[rule.name for rule in RULES])

# Instances each rule's positive test fired on and kept the numerics of, for its negative
# test: drawn from the same seed, that test would draw and fire the same ones again.
FIRED: dict[str, list] = {}


def _skip_where_it_cannot_run(rule) -> None:
    """The nchwc rules' instances run at this machine's block size (`block: auto`):
    where the CPU has no NCHWc kernels there is none."""
    reason = unavailable_here(TARGET, parse_domain(rule))
    if reason is not None:
        pytest.skip(f"rule '{rule.name}': {reason}")


def _explain(report: RuleReport, rule) -> str:
    lines = [f"rule '{rule.name}' ({rule.origin}), seed {SEED}:"]
    if report.error:
        lines.append(report.error)
    if report.failure:
        lines.append(report.failure.format())
    path = rule.origin.rsplit(":", 1)[0]
    lines.append(f"reproduce: onnxfuse check {path} --rule {rule.name} --seed {SEED}")
    return "\n".join(lines)


def test_every_pack_in_rules_is_enumerated():
    names = [rule.name for rule in RULES]
    assert len(names) == len(set(names))
    assert {p.name for p in PACK_DIRS} == set(builtin_pack_names())
    assert sorted(names) == sorted(rule.name for rule in load_builtin_rules())
    assert len(RULES) >= 35


@every_rule
def test_rule_declares_a_verification_domain(rule):
    parse_domain(rule)  # VerifyError names the rule, the file and what is wrong


@every_rule
def test_domain_yields_a_firing_instance(rule):
    _skip_where_it_cannot_run(rule)
    domain = parse_domain(rule)
    instance, rejected = find_firing_instance(rule, domain, TARGET, tries=200, seed=SEED)
    reasons = "; ".join(f"{r} ({n}x)" for r, n in rejected.most_common(3))
    assert instance is not None, (
        f"rule '{rule.name}': no firing instance in 200 draws from its domain: {reasons}"
    )


@every_rule
def test_rule_fires_and_keeps_numerics(rule):
    _skip_where_it_cannot_run(rule)
    report = check_rule(
        rule,
        examples=EXAMPLES,
        target=TARGET,
        seed=SEED,
        negative=False,
        shrink_seconds=SHRINK_SECONDS,
        keep=(kept := []),
    )
    assert report.ok, _explain(report, rule)
    assert report.fired >= 1
    FIRED[rule.name] = kept[:NEGATIVE_EXAMPLES]


@every_rule
def test_rule_spares_negative_cases(rule):
    _skip_where_it_cannot_run(rule)
    fired = FIRED.pop(rule.name, None)
    report = None
    if fired:
        report = check_negatives(
            rule, fired, target=TARGET, negatives_per_instance=NEGATIVES_PER_INSTANCE
        )
    if report is None or not report.ok:
        # Not run after the positive test (another -k, or it failed), or a failure to
        # shrink: draw the instances here.
        shrunk = check_rule(
            rule,
            examples=NEGATIVE_EXAMPLES,
            target=TARGET,
            seed=SEED,
            positive=False,
            negatives_per_instance=NEGATIVES_PER_INSTANCE,
            shrink_seconds=SHRINK_SECONDS,
        )
        report = shrunk if report is None or not shrunk.ok else report
    assert report.ok, _explain(report, rule)
    checked = sum(report.negatives.values()) + sum(report.boundary_exact.values())
    assert checked >= 1, (
        f"rule '{rule.name}': no negative case could be derived or checked "
        f"(skipped: {dict(report.skipped)})"
    )
