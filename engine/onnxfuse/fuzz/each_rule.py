"""Rule coverage: every rule embedded K times in random graphs, checked by the oracle.

A graph run draws one random rule per embedding step, so in a few hundred
models some rules are never embedded, or never fire. Here every rule (every
member of an op-set family) is embedded ``K`` times. Embedding ``k`` of a rule
draws an instance from its ``verify:`` domain at an opset the domain allows,
splices it into a graph built from seeded random choices (``k`` = 0: the
instance alone, with no distractor; then up to two random steps before and
after it, distractors included) and checks the model with the differential
oracle for one target, round-robin over the targets where the rule is enabled
(the domain's target parameters and target, and the ops the rule creates).

Per rule the report says how often it was embedded, fired and passed. When an
embedding does not fire, the reason is kept: another rule rewrote the pattern
first (the rule alone fires on the same model), or the matcher's own reason for
the rule alone (a guard, a target gate, a folded pattern).
"""

from __future__ import annotations

import dataclasses
import random
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx

from onnxfuse.fuzz import corpus, oracle
from onnxfuse.fuzz.graph_runner import Tally, _Failure, _Record, corpus_case, derive_seed
from onnxfuse.fuzz.graphs import _BY_NAME, _MENU, OPSETS, GraphCase, _RandomBuilder, assemble
from onnxfuse.language.rule import Rule
from onnxfuse.proof.domain import Domain
from onnxfuse.support.every_module import load_every_module

ATTEMPTS = 4  # draws per embedding before it counts as not embeddable
_IR_FOR = dict(OPSETS)
# Random steps around an instance: every plain and rule-source step except another
# random rule instance (the rule under test is the point) and nested graphs.
_STEPS = [name for name in _MENU if name not in ("rule_instance", "if", "function")]


@dataclass
class RuleCoverage:
    """What happened to one rule's embeddings."""

    rule: str
    targets: list[str] = field(default_factory=list)  # where it is enabled
    embedded: int = 0
    fired: int = 0
    passed: int = 0
    failed: int = 0
    not_drawn: Counter = field(default_factory=Counter)  # why no model could be built
    not_fired: Counter = field(default_factory=Counter)  # why an embedding did not fire
    fired_on: Counter = field(default_factory=Counter)  # target -> embeddings that fired
    failures: list[str] = field(default_factory=list)  # signatures
    cases: list[corpus.Case] = field(default_factory=list)  # new failures, to save


def _rules() -> list[tuple[Rule, Domain]]:
    from onnxfuse.fuzz.rule_instances import _rules_with_domains

    return list(_rules_with_domains())


def enabled_targets(rule, domain, targets: Sequence[str], opset: int) -> list[str]:
    """The targets among ``targets`` where ``rule`` may fire at ``opset``: the domain's
    target parameters, read on this machine (`block: auto`), match the target's, the
    domain's own target (if it names one) is that target, and the target runs the ops
    the rule creates."""
    from onnxfuse.errors import OnnxfuseError
    from onnxfuse.proof.check import resolved_domain_params, unavailable_here
    from onnxfuse.rewrite.plan import plan_replacement

    found = []
    for name in targets:
        target = oracle.target(name)
        if domain.target is not None and oracle.target(domain.target).name != target.name:
            continue
        try:
            if unavailable_here(target, domain) is not None:
                continue  # a parameter is off on this machine
            wanted = resolved_domain_params(target, domain) if domain.target_params else {}
        except OnnxfuseError:
            continue  # a parameter this target does not take
        if any(target.params.get(k) != v for k, v in wanted.items()):
            continue
        plan = plan_replacement(rule, set(), {"": opset, "com.microsoft": 1})
        if target.unsupported(plan.kernels()):
            continue
        found.append(name)
    return found


def enabled_anywhere(targets: Sequence[str]) -> list[str]:
    """The rules (with a verify domain) enabled on one of ``targets`` at some opset."""
    return [
        rule.name
        for rule, domain in _rules()
        if any(enabled_targets(rule, domain, targets, o) for o in domain.opsets)
    ]


def pick_opset(domain, seed: int) -> int:
    """An opset of the domain, one the graph fuzzer builds models at if it can."""
    opsets = [o for o in domain.opsets if o in _IR_FOR] or list(domain.opsets)
    return random.Random(seed).choice(sorted(opsets))


def build_case(
    rule, domain, seed: int, opset: int, extra_steps: int, fire_target=None
) -> tuple[GraphCase | None, str]:
    """A model embedding an instance of ``rule`` at ``opset`` (None and the reason if none
    could be built).

    ``extra_steps`` = 0: the instance alone (one the rule alone fires on for
    ``fire_target``), no distractor, its outputs consumed. Otherwise up to that many
    random steps before and after it.
    """
    choices = random.Random(seed)
    ir_version = _IR_FOR.get(opset) or onnx.helper.find_min_ir_version_for(
        [onnx.helper.make_opsetid("", opset)]
    )
    b = _RandomBuilder(choices, opset, ir_version, np.random.default_rng(seed))
    plain = extra_steps == 0
    b.symbolic_inputs = not plain
    if not plain:
        b.unnamed_nodes = b.flag(0.15)
        b.value_info = b.flag(0.25)
        if b.flag(0.2):
            b.prefix = "/model/layers.0/"
    narrowed = dataclasses.replace(domain, opsets=[opset])
    try:
        for _ in range(choices.randint(0, extra_steps)):
            name = choices.choice(_STEPS)
            b.steps.append(name)
            _BY_NAME[name](b)
        from onnxfuse.fuzz.rule_instances import embed_instance

        if embed_instance(b, rule, narrowed, not plain, fire_target) is None:
            if fire_target is not None:
                return None, f"no drawn instance at opset {opset} fires alone"
            return None, f"no runnable instance at opset {opset}"
        for _ in range(choices.randint(0, extra_steps)):
            name = choices.choice(_STEPS)
            b.steps.append(name)
            _BY_NAME[name](b)
        model = assemble(b)
    except Exception as exc:  # a generator bug: reported as the reason, the run goes on
        return None, f"generator: {type(exc).__name__}: {str(exc)[:100]}"
    override = bool(b.overridable) and choices.random() < 0.5
    case = GraphCase(
        model=model,
        feed_seed=choices.randint(0, 2**16),
        special=not plain and choices.random() < 0.5,
        override=override,
        overridable=list(b.overridable),
        steps=list(b.steps),
    )
    return case, ""


def why_not_fired(original: oracle.Original, rule, target_name: str, applied: list[str]) -> str:
    """Why ``rule`` did not fire on an embedding (it passed the oracle otherwise)."""
    from onnxfuse.proof.check import why_not

    alone = oracle.check(original, target_name, [rule])
    if rule.name in alone.applied:
        others = ", ".join(a for a in applied if a != rule.name) or "cleanup"
        return f"preempted: another rewrite took the pattern first ({others})"
    try:
        return why_not(original.model, rule, oracle.target(target_name))[:160]
    except Exception as exc:  # explaining is best effort
        return f"(no explanation: {type(exc).__name__}: {str(exc)[:100]})"


def check_rule(
    rule,
    domain,
    index: int,
    repeats: int,
    targets: Sequence[str],
    fuzz_seed: int,
    save: bool,
    command: str,
) -> RuleCoverage:
    """``repeats`` embeddings of ``rule``, round-robin over the targets where it is enabled.
    With ``save``, the first failure of each signature is kept in ``cases`` (to save)."""
    coverage = RuleCoverage(rule.name)
    opsets = sorted(domain.opsets)
    coverage.targets = sorted(
        {t for o in opsets for t in enabled_targets(rule, domain, targets, o)}, key=targets.index
    )
    if not coverage.targets:
        coverage.not_drawn["enabled on none of the targets"] += repeats
        return coverage
    known: set[str] = set()
    for k in range(repeats):
        case, why, target_name = None, "", ""
        for attempt in range(ATTEMPTS * (2 if k == 0 else 1)):
            seed = derive_seed(fuzz_seed, "each-rule", rule.name, k, attempt)
            opset = pick_opset(domain, seed)
            enabled = enabled_targets(rule, domain, targets, opset)
            if not enabled:
                why = f"enabled on no target at opset {opset}"
                continue
            target_name = enabled[(index + k) % len(enabled)]
            fire_target = oracle.target(target_name) if k == 0 else None
            case, why = build_case(rule, domain, seed, opset, min(k, 2), fire_target)
            if case is None:
                continue
            original = oracle.validate(case.model, oracle.feeds_for(case))
            if isinstance(original, oracle.Outcome):
                case, why = None, f"discarded: {original.kind}: {original.message[:100]}"
                continue
            break
        if case is None:
            coverage.not_drawn[why] += 1
            continue
        assert isinstance(original, oracle.Original)  # a case is kept only with one
        coverage.embedded += 1
        outcome = oracle.check(original, target_name)
        fired = rule.name in outcome.applied
        if fired:
            coverage.fired += 1
            coverage.fired_on[target_name] += 1
        if outcome.failed:
            coverage.failed += 1
            culprit = oracle.diagnose(original, target_name, outcome)
            signature = oracle.signature(outcome, culprit)
            coverage.failures.append(f"{target_name}: {signature}: {outcome.message[:200]}")
            if save and signature not in known:
                known.add(signature)
                record = _Record(0, "fail", target_name, outcome, signature, culprit)
                failure = _Failure("", record, case)
                coverage.cases.append(corpus_case(case, failure, fuzz_seed, k, 0, command))
            continue
        coverage.passed += 1
        if not fired:
            coverage.not_fired[why_not_fired(original, rule, target_name, outcome.applied)] += 1
    return coverage


def run_job(job: tuple) -> RuleCoverage:
    """check_rule for the rule named in ``job`` (a process pool's unit of work)."""
    name, index, repeats, targets, fuzz_seed, save, command, rules = job
    oracle.use_rules(rules)
    load_every_module()
    rule, domain = next((r, d) for r, d in _rules() if r.name == name)
    return check_rule(rule, domain, index, repeats, targets, fuzz_seed, save, command)


def rule_names() -> list[str]:
    return [rule.name for rule, _ in _rules()]


def to_tally(results: Sequence[RuleCoverage], targets: Sequence[str]) -> Tally:
    """The campaign's counts in the graph runner's form (exit status, corpus xfails)."""
    tally = Tally()
    for c in results:
        tally.passed += c.passed
        tally.failed += c.failed
        for failure in c.failures:
            tally.failures[failure.split(": ", 2)[1]] += 1
        tally.cases.extend(c.cases)
        for t, n in c.fired_on.items():
            tally.fired.setdefault(t, Counter())[c.rule] += n
    return tally


def summary(results: Sequence[RuleCoverage], say: Callable[[str], None]) -> None:
    """Per rule: what did not fire or failed, and why; then the totals."""
    never = [c for c in results if c.embedded and not c.fired]
    unembedded = [c for c in results if not c.embedded]
    failing = [c for c in results if c.failed]
    for c in unembedded:
        reasons = "; ".join(f"{r} ({n}x)" for r, n in c.not_drawn.most_common(2))
        say(f"  not embedded: {c.rule}: {reasons}")
    for c in never:
        reasons = "; ".join(f"{r} ({n}x)" for r, n in c.not_fired.most_common(2))
        say(f"  never fired: {c.rule} [{', '.join(c.targets)}] {c.embedded}x: {reasons}")
    for c in failing:
        for failure in c.failures:
            say(f"  FAILED: {c.rule}: {failure}")
    fired = sum(1 for c in results if c.fired)
    say(
        f"{len(results)} rules: {fired} fired, {len(never)} embedded but never fired, "
        f"{len(unembedded)} not embedded, {len(failing)} with failures; "
        f"{sum(c.embedded for c in results)} models"
    )


def write_table(results: Sequence[RuleCoverage], path: Path) -> None:
    """A tab-separated table, one rule a line (for a closer look)."""
    lines = ["rule\ttargets\tembedded\tfired\tpassed\tfailed\tnot fired because\tnot embedded"]
    for c in results:
        lines.append(
            "\t".join(
                [
                    c.rule,
                    ",".join(c.targets),
                    str(c.embedded),
                    str(c.fired),
                    str(c.passed),
                    str(c.failed),
                    "; ".join(f"{r} ({n}x)" for r, n in c.not_fired.most_common()),
                    "; ".join(f"{r} ({n}x)" for r, n in c.not_drawn.most_common()),
                ]
            )
        )
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
