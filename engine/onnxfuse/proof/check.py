"""Proving a rule on generated instances: it must fire, and keep the numerics.

``check_rule`` runs hypothesis over instances drawn from the rule's
verification domain. For each instance: the source must run (else the
instance is discarded), the rule must fire (a guard that rejects it discards
it too; any other reason to not match is a failure), the result must pass the
ONNX checker and give the source's outputs within the domain's tolerances on
plain and special-valued inputs. Then the derived negative cases must not fire
(or, at the domain's boundary, fire only where still exact). A failure is
shrunk by hypothesis to a small instance.
"""

from __future__ import annotations

import base64
import shlex
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
from onnx import helper, numpy_helper

from onnxfuse.errors import InvariantError, OnnxfuseError
from onnxfuse.language.rule import Rule
from onnxfuse.proof.domain import Domain, VerifyError, parse_domain
from onnxfuse.proof.draw import Drawer, HypothesisDrawer, RandomDrawer, Reject
from onnxfuse.proof.instance import (
    DTYPE_NAMES,
    DomainError,
    Instance,
    build_model,
    generate,
    make_feeds,
)
from onnxfuse.proof.negatives import Mutation, derive
from onnxfuse.proof.reference_ops import missing_definitions
from onnxfuse.proof.runtime import (
    ORT,
    Runner,
    RuntimeFailure,
    choose_runner,
    compare,
    first_line,
)
from onnxfuse.rewrite.report import RuleStats
from onnxfuse.targets.capabilities import Target, load_target
from onnxfuse.targets.params import parse_params

# Matcher failures that mean "the guards (or the target) reject this instance".
_REJECTING = ("guard '", "let ", "target '")
# Normalization folded the anchor away (a Shape of a static shape): nothing to prove there.
_FOLDED_AWAY = "the source folds to constants before rules run"
META = "onnxfuse.check."


@dataclass
class Failure:
    rule: str
    kind: str
    message: str
    instance: str
    model: onnx.ModelProto
    feeds: dict[str, np.ndarray] | None = None
    expect: str = "match"  # "match": fire and keep numerics; "no-fire"
    mutation: str | None = None
    runtime: str | None = None

    def format(self) -> str:
        lines = [f"{self.kind}: {self.message}"]
        if self.mutation:
            lines.append(f"negative case: {self.mutation}")
        if self.runtime:
            lines.append(f"runtime: {self.runtime}")
        lines.append("instance: " + self.instance)
        if self.feeds:
            for name, value in self.feeds.items():
                lines.append(f"  input {name}: {_show_array(value)}")
        return "\n".join(lines)


@dataclass
class RuleReport:
    rule: str
    examples: int = 0
    fired: int = 0
    rejected: Counter[str] = field(default_factory=Counter)
    runtimes: Counter[str] = field(default_factory=Counter)
    negatives: Counter[str] = field(default_factory=Counter)  # kind -> checked (did not fire)
    boundary_exact: Counter[str] = field(default_factory=Counter)  # fired, and still exact
    # Values a graph input holds that the domain excludes, on which the result changed
    # as the domain's reason says it may: "description: reason" -> cases.
    expected_failures: Counter[str] = field(default_factory=Counter)
    skipped: Counter[str] = field(default_factory=Counter)
    failure: Failure | None = None
    error: str | None = None  # the domain is missing, malformed, or never fires
    # Why this machine cannot run the domain's instances (nothing was checked).
    unavailable: str | None = None

    @property
    def ok(self) -> bool:
        return self.failure is None and self.error is None

    def summary(self) -> str:
        if self.unavailable is not None:
            return f"not checked here: {self.unavailable}"
        parts = [f"fired on {self.fired} instance(s)"]
        if self.runtimes:
            parts.append(", ".join(f"{k} {v}" for k, v in sorted(self.runtimes.items())))
        if self.negatives:
            parts.append(f"{sum(self.negatives.values())} negative cases held")
        if self.boundary_exact:
            parts.append(f"{sum(self.boundary_exact.values())} boundary cases fired and were exact")
        if self.expected_failures:
            top = "; ".join(f"{case} ({n}x)" for case, n in self.expected_failures.most_common(2))
            parts.append(
                f"{sum(self.expected_failures.values())} expected failure(s) on values the "
                f"domain excludes: {top}"
            )
        if self.rejected:
            top = ", ".join(f"{r} ({n})" for r, n in self.rejected.most_common(2))
            parts.append(f"{sum(self.rejected.values())} discarded: {top}")
        return "; ".join(parts)


class _Found(Exception):
    def __init__(self, failure: Failure):
        super().__init__(failure.message)
        self.failure = failure


# -- one instance ----------------------------------------------------------------------


def optimize_with(
    model: onnx.ModelProto, rule: Rule, target: Target | None, check: bool = True
) -> tuple[int, onnx.ModelProto]:
    """Apply ``rule`` alone; return how often it fired and the result (checked if ``check``)."""
    stats, result = _optimize_alone(model, rule, target, check)
    return stats.applied, result


def _optimize_alone(
    model: onnx.ModelProto, rule: Rule, target: Target | None, check: bool = True
) -> tuple[RuleStats, onnx.ModelProto]:
    """``optimize_with``, with the rule's statistics (why its rewrites were blocked)."""
    from onnxfuse.files.model_io import check_model
    from onnxfuse.passes.pipeline import Options, optimize

    ir_model = ir.from_proto(model)
    # Numerics are proven whether or not a target profile would let the rule fire.
    report = optimize(ir_model, [rule], Options(target=target, gate_by_profile=False))
    if check:
        check_model(ir_model)
    return report.rules[rule.name], ir.serde.serialize_model(ir_model)


def why_not(
    model: onnx.ModelProto, rule: Rule, target: Target | None, node: str | None = None
) -> str:
    """The matcher's reason for not matching at ``node`` (default: every anchor node)."""
    from onnxfuse.api import explain

    try:
        found = explain(ir.from_proto(model), rule, node, target)
    except OnnxfuseError:  # no node of that name is left after normalization
        return _FOLDED_AWAY
    reasons = [e.reason or "matched, but the rewrite was blocked" for e in found]
    if not reasons:
        return "no node can anchor the rule"
    for reason in reasons:
        if reason.startswith(_REJECTING):
            return reason
    return reasons[0]


def anchor_name(instance: Instance) -> str | None:
    anchor = instance.source.anchor.index
    for node in instance.spec.nodes:
        if node.pattern_index == anchor:
            return node.name
    return None


def _fire(
    instance: Instance, model: onnx.ModelProto, rule: Rule, target: Target | None
) -> onnx.ModelProto:
    """The rewritten model; Reject if guards reject the instance, _Found on a failure."""
    try:
        stats, result = _optimize_alone(model, rule, target)
    except InvariantError as exc:
        raise _Found(
            Failure(rule.name, "invalid-result", str(exc), instance.describe(), model)
        ) from None
    except Exception as exc:  # an engine error: report, do not crash the run
        raise _Found(
            Failure(
                rule.name,
                "engine-error",
                f"{type(exc).__name__}: {first_line(exc)}",
                instance.describe(),
                model,
            )
        ) from None
    if stats.applied:
        return result
    if stats.ill_typed is not None:
        # The engine kept the model valid, but the rule is wrong wherever this happens.
        message = f"the rule's rewrite is blocked: {stats.ill_typed}"
        raise _Found(Failure(rule.name, "ill-typed", message, instance.describe(), model))
    reason = why_not(model, rule, target, anchor_name(instance))
    if reason.startswith(_REJECTING) or reason.startswith("matched, but") or reason == _FOLDED_AWAY:
        raise Reject(reason)
    if "has no producer" in reason and _count_nodes(_baseline(model, target)) < _count_nodes(model):
        # A shape computation of the pattern folded (a Shape of a static shape): the
        # instance no longer holds the pattern, as when the anchor itself folds.
        raise Reject(f"{_FOLDED_AWAY}: {reason}")
    raise _Found(
        Failure(
            rule.name,
            "no-match",
            f"the rule did not match an instance of its own source pattern: {reason}",
            instance.describe(),
            model,
        )
    )


def _value_types(model: onnx.ModelProto) -> dict[str, str]:
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:
        return {}
    found = {}
    for value in [*inferred.graph.value_info, *inferred.graph.output, *inferred.graph.input]:
        code = value.type.tensor_type.elem_type
        if code in DTYPE_NAMES:
            found[value.name] = DTYPE_NAMES[code]
    return found


def _run_source(model: onnx.ModelProto, feeds: list[dict[str, np.ndarray]]):
    runner = choose_runner(model)
    try:
        return runner, runner.run(model, feeds)
    except RuntimeFailure as exc:
        raise Reject(f"the source does not run: {exc}") from None


def _compare_runs(
    instance: Instance,
    domain: Domain,
    runner: Runner,
    source: onnx.ModelProto,
    result: onnx.ModelProto,
    feeds: list[dict[str, np.ndarray]],
    expected: list[list[np.ndarray]],
    mutation: str | None = None,
) -> None:
    rule = instance.rule.name
    if [o.name for o in result.graph.output] != [o.name for o in source.graph.output]:
        raise _Found(
            Failure(
                rule,
                "interface",
                "graph output names changed",
                instance.describe(),
                source,
                mutation=mutation,
            )
        )
    try:
        actual = runner.run(result, feeds)
    except RuntimeFailure as exc:
        raise _Found(
            Failure(
                rule,
                "not-runnable",
                f"the rewritten model does not run where the source does: {exc}"
                + missing_definitions(result, str(exc)),
                instance.describe(),
                source,
                feeds[0],
                mutation=mutation,
                runtime=runner.name,
            )
        ) from None
    names = [o.name for o in source.graph.output]
    for feed, want, got in zip(feeds, expected, actual):
        mismatch = compare(want, got, names, domain.tolerance)
        if mismatch is not None:
            raise _Found(
                Failure(
                    rule,
                    "numerics",
                    mismatch.message,
                    instance.describe(),
                    source,
                    feed,
                    mutation=mutation,
                    runtime=runner.name,
                )
            )


def check_instance(
    instance: Instance,
    domain: Domain,
    target: Target | None,
    report: RuleReport,
    *,
    positive: bool = True,
    negative: bool = True,
    negatives_per_instance: int | None = None,
) -> None:
    """Check one instance; Reject if it is discarded, _Found on a failure."""
    rule = instance.rule
    try:
        model = build_model(instance.spec)
        feeds = make_feeds(instance.spec, instance.data_seed)
    except (ValueError, TypeError, OverflowError, MemoryError) as exc:  # a negative dim, ...
        raise _domain_error(rule, exc) from None
    if positive:
        runner, expected = _run_source(model, feeds)
        result = _fire(instance, model, rule, target)
        _compare_runs(instance, domain, runner, model, result, feeds, expected)
        report.runtimes[runner.name] += 1
    else:
        _fire(instance, model, rule, target)
    report.fired += 1
    if not negative:
        return
    mutations, _ = derive(instance, domain, _value_types(model))
    if negatives_per_instance is not None:
        mutations = sample_mutations(mutations, negatives_per_instance, instance.data_seed)
    for mutation in mutations:
        _check_mutation(instance, domain, target, mutation, report)


def sample_mutations(mutations: list[Mutation], limit: int, seed: int) -> list[Mutation]:
    """At most ``limit`` of ``mutations``: every declared negative, then the other kinds
    taken in turn, each kind's cases in a seeded random order.

    A pattern of fifty nodes derives ~150 cases per instance; taking kinds in turn keeps
    every kind covered when only a few can be afforded (the domain's own negatives always).
    """
    if len(mutations) <= limit:
        return mutations
    rng = np.random.default_rng(seed)
    chosen = [m for m in mutations if m.kind == "declared"]
    by_kind: dict[str, list[Mutation]] = {}
    for mutation in mutations:
        if mutation.kind != "declared":
            by_kind.setdefault(mutation.kind, []).append(mutation)
    queues = [[group[i] for i in rng.permutation(len(group))] for group in by_kind.values()]
    while len(chosen) < limit and any(queues):
        for queue in queues:
            if queue and len(chosen) < limit:
                chosen.append(queue.pop(0))
    return chosen


def _check_mutation(
    instance: Instance,
    domain: Domain,
    target: Target | None,
    mutation: Mutation,
    report: RuleReport,
) -> None:
    rule = instance.rule
    shown = mutation.instance(instance)  # what a failure prints: the model it saves
    try:
        model = build_model(
            mutation.spec, check=not mutation.must_not_fire, fallback_dtype=instance.dtype
        )
    except Reject as exc:
        report.skipped[f"{mutation.kind}: {exc}"] += 1
        return
    try:
        applied, result = optimize_with(model, rule, target, check=not mutation.must_not_fire)
    except InvariantError as exc:
        raise _Found(
            Failure(
                rule.name,
                "invalid-result",
                str(exc),
                shown.describe(),
                model,
                mutation=mutation.description,
            )
        ) from None
    except Exception as exc:
        raise _Found(
            Failure(
                rule.name,
                "engine-error",
                f"{type(exc).__name__}: {first_line(exc)}",
                shown.describe(),
                model,
                mutation=mutation.description,
            )
        ) from None
    if mutation.must_not_fire:
        if applied:
            raise _Found(
                Failure(
                    rule.name,
                    "fired-on-negative",
                    f"the rule fired on a negative case ({mutation.kind}) where it must not",
                    shown.describe(),
                    model,
                    expect="no-fire",
                    mutation=mutation.description,
                )
            )
        if _count_nodes(result) != _count_nodes(model) and _count_nodes(result) != _count_nodes(
            _baseline(model, target)
        ):
            raise _Found(
                Failure(
                    rule.name,
                    "fired-on-negative",
                    "the rule did not fire, but the node count changed",
                    shown.describe(),
                    model,
                    expect="no-fire",
                    mutation=mutation.description,
                )
            )
        report.negatives[mutation.kind] += 1
        return
    if not applied:
        report.negatives[mutation.kind] += 1
        return
    # Outside the declared domain only onnxruntime is trusted as the oracle
    # (onnx.reference gets some old op versions wrong, e.g. BatchNormalization-9).
    feeds = make_feeds(mutation.spec, instance.data_seed)
    runner = choose_runner(model)
    if runner.name != ORT:
        report.skipped[f"{mutation.kind}: onnxruntime cannot run the source"] += 1
        return
    try:
        expected = runner.run(model, feeds)
    except RuntimeFailure as exc:
        report.skipped[f"{mutation.kind}: {exc}"] += 1
        return
    try:
        _compare_runs(shown, domain, runner, model, result, feeds, expected, mutation.description)
    except _Found as found:
        if mutation.kind != "excluded":
            raise
        if mutation.expected:
            report.expected_failures[f"{mutation.description}: {mutation.reason}"] += 1
            return
        # NaN or an infinity in a constant: a guard could see it (all_finite), and let
        # the rule change the result there.
        found.failure.message = (
            f"the rule fires on a constant holding values its domain excludes "
            f"({mutation.reason}) and changes the result (a guard can test a constant: "
            f"all_finite(...)): {found.failure.message}"
        )
        raise
    report.boundary_exact[mutation.kind] += 1


def _baseline(model: onnx.ModelProto, target: Target | None) -> onnx.ModelProto:
    """The model optimized without any rule: normalization and cleanup alone (CSE...)."""
    from onnxfuse.passes.pipeline import Options, optimize

    ir_model = ir.from_proto(model)
    optimize(ir_model, [], Options(target=target))
    return ir.serde.serialize_model(ir_model)


def _count_nodes(model: onnx.ModelProto) -> int:
    return sum(1 for n in model.graph.node if n.op_type != "Constant")


# -- a whole rule ----------------------------------------------------------------------


def check_rule(
    rule: Rule,
    *,
    examples: int = 100,
    target: Target | str | None = "cpu",
    seed: int | None = 0,
    positive: bool = True,
    negative: bool = True,
    negatives_per_instance: int | None = None,
    shrink_seconds: float = 20.0,
    keep: list[Instance] | None = None,
) -> RuleReport:
    """Prove ``rule`` on ``examples`` instances of its domain (hypothesis).

    ``negatives_per_instance`` caps the negative and boundary cases derived from each
    instance (None: all of them; see ``sample_mutations``). A failure is shrunk for at
    most ``shrink_seconds``; the smallest failing instance found by then is reported.
    ``keep`` collects the instances that passed (for ``check_negatives``).
    """
    from hypothesis import HealthCheck, Verbosity, given, reject, settings
    from hypothesis import seed as hypothesis_seed
    from hypothesis import strategies as st
    from hypothesis.errors import Unsatisfiable

    report = RuleReport(rule.name)
    try:
        domain = parse_domain(rule)
    except VerifyError as exc:
        report.error = str(exc)
        return report
    if isinstance(target, str):
        target = load_target(target)
    report.unavailable = unavailable_here(target, domain)
    if report.unavailable is not None:
        return report
    target = with_domain_params(target, domain)
    failing_since: list[float] = []

    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
        report_multiple_bugs=False,
        verbosity=Verbosity.quiet,
        print_blob=False,
    )
    @given(st.data())
    def prove(data):
        if failing_since and time.monotonic() - failing_since[0] > shrink_seconds:
            return  # shrinking took long enough: keep the smallest failure so far
        report.examples += 1
        try:
            instance = _generate(rule, domain, HypothesisDrawer(data))
            check_instance(
                instance,
                domain,
                target,
                report,
                positive=positive,
                negative=negative,
                negatives_per_instance=negatives_per_instance,
            )
        except Reject as exc:
            report.rejected[str(exc)] += 1
            reject()
        except _Found as found:
            # While shrinking, every new failure is smaller than the last one.
            report.failure = found.failure
            if not failing_since:
                failing_since.append(time.monotonic())
            raise
        if keep is not None:
            keep.append(instance)

    if seed is not None:
        prove = hypothesis_seed(seed)(prove)
    try:
        prove()
    except _Found as found:
        report.failure = found.failure
    except Unsatisfiable:
        pass
    except Exception:  # hypothesis calls a shrink cut short "flaky": the failure stands
        if report.failure is None:
            raise
    if report.failure is None and report.fired == 0:
        report.error = coverage_message(rule.name, report.examples, report.rejected)
    return report


def check_negatives(
    rule: Rule,
    instances: Sequence[Instance],
    *,
    target: Target | str | None = "cpu",
    negatives_per_instance: int | None = None,
) -> RuleReport:
    """The negative and boundary cases derived from ``instances``, which already fired
    and kept the numerics (a ``check_rule(keep=...)`` run's): what
    ``check_rule(positive=False)`` checks on its own draws, without drawing and firing
    them again. No shrinking: rerun ``check_rule`` for a smaller failing instance."""
    report = RuleReport(rule.name)
    domain = parse_domain(rule)
    if isinstance(target, str):
        target = load_target(target)
    target = with_domain_params(target, domain)
    for instance in instances:
        report.examples += 1
        report.fired += 1
        model = build_model(instance.spec)
        mutations, _ = derive(instance, domain, _value_types(model))
        if negatives_per_instance is not None:
            mutations = sample_mutations(mutations, negatives_per_instance, instance.data_seed)
        try:
            for mutation in mutations:
                _check_mutation(instance, domain, target, mutation, report)
        except _Found as found:
            report.failure = found.failure
            break
    return report


def _generate(rule: Rule, domain: Domain, drawer: Drawer) -> Instance:
    try:
        return generate(rule, domain, drawer)
    # A domain can ask for what no array or model can be: a negative or huge dim, a
    # value of another type, an opset onnx does not know.
    except (DomainError, ValueError, TypeError, OverflowError, IndexError, MemoryError) as exc:
        raise _domain_error(rule, exc) from None


def _domain_error(rule: Rule, exc: Exception) -> _Found:
    placeholder = helper.make_model(helper.make_graph([], "none", [], []))
    message = f"the verification domain cannot be evaluated: {exc}"
    return _Found(Failure(rule.name, "domain-error", message, "", placeholder))


def with_domain_params(target: Target | None, domain: Domain) -> Target | None:
    """The target with the parameters the domain names (`verify: target_params`); the
    domain's own target (`verify: target`) where it names one: a rule creating ops
    that only another provider runs is proven for that provider's capabilities."""
    target = _domain_target(target, domain)
    if target is None or not domain.target_params:
        return target
    return target.with_params({**target.params, **resolved_domain_params(target, domain)})


def unavailable_here(target: Target | None, domain: Domain) -> str | None:
    """Why this machine cannot run the domain's instances, or None: a target parameter
    it names is off here (`block: auto` on a CPU without NCHWc kernels)."""
    target = _domain_target(target, domain)
    if target is None or not domain.target_params:
        return None
    resolved = resolved_domain_params(target, domain)
    off = [f"{key}={value}" for key, value in domain.target_params.items() if key not in resolved]
    if not off:
        return None
    return f"target parameter {', '.join(off)} is off on this machine"


def _domain_target(target: Target | None, domain: Domain) -> Target | None:
    if target is not None and domain.target is not None:
        return load_target(domain.target)
    return target


def resolved_domain_params(target: Target, domain: Domain) -> dict[str, object]:
    """The domain's parameters read as the command line reads them (`block: auto` is
    this machine's NCHWc block size: the one onnxruntime's kernels run here)."""
    spec = ",".join(f"{key}={value}" for key, value in domain.target_params.items())
    return parse_params(target.name, spec)


def coverage_message(name: str, tried: int, rejected: Counter[str]) -> str:
    reasons = "; ".join(f"{r} ({n}x)" for r, n in rejected.most_common(3))
    return (
        f"rule '{name}': its verification domain produced no firing instance in {tried} "
        f"tries" + (f"; discarded because: {reasons}" if reasons else "")
    )


def find_firing_instance(
    rule: Rule, domain: Domain, target: Target | None, tries: int = 100, seed: int = 0
) -> tuple[Instance | None, Counter[str]]:
    """Sample (without hypothesis) until an instance fires: the coverage check."""
    rejected: Counter[str] = Counter()
    target = with_domain_params(target, domain)
    for attempt in range(tries):
        try:
            instance = generate(rule, domain, RandomDrawer(seed + attempt))
            model = build_model(instance.spec)
            _fire(instance, model, rule, target)
            return instance, rejected
        except Reject as exc:
            rejected[str(exc)] += 1
        except _Found as found:
            rejected[f"{found.failure.kind}: {found.failure.message}"] += 1
    return None, rejected


# -- counterexamples -------------------------------------------------------------------


def save_counterexample(
    failure: Failure, directory: Path, rules_path: str, target: str
) -> tuple[Path, str]:
    """Write the failing model (inputs in its metadata) and its one-line repro command."""
    directory.mkdir(parents=True, exist_ok=True)
    model = onnx.ModelProto()
    model.CopyFrom(failure.model)
    entries = {
        "rule": failure.rule,
        "expect": failure.expect,
        "kind": failure.kind,
        "message": failure.message,
    }
    for key, value in entries.items():
        model.metadata_props.add(key=META + key, value=value)
    for name, array in (failure.feeds or {}).items():
        tensor = numpy_helper.from_array(np.asarray(array), name)
        model.metadata_props.add(
            key=f"{META}input.{name}", value=base64.b64encode(tensor.SerializeToString()).decode()
        )
    path = directory / f"{failure.rule}.onnx"
    onnx.save(model, path)
    command = shlex.join(
        [
            "onnxfuse",
            "check",
            rules_path,
            "--rule",
            failure.rule,
            "--target",
            target,
            "--replay",
            str(path),
        ]
    )
    (directory / f"{failure.rule}.repro").write_text(command + "\n", encoding="utf-8")
    return path, command


def load_counterexample(
    path: str | Path,
) -> tuple[onnx.ModelProto, dict[str, str], dict[str, np.ndarray]]:
    model = onnx.load(str(path))
    meta = {p.key[len(META) :]: p.value for p in model.metadata_props if p.key.startswith(META)}
    feeds = {}
    for key, value in list(meta.items()):
        if key.startswith("input."):
            tensor = onnx.TensorProto()
            tensor.ParseFromString(base64.b64decode(value))
            feeds[key[len("input.") :]] = numpy_helper.to_array(tensor)
    return model, meta, feeds


def replay(
    model: onnx.ModelProto,
    expect: str,
    feeds: dict[str, np.ndarray],
    rule: Rule,
    target: Target | None,
) -> str | None:
    """Re-run a saved case; the failure it still shows, or None."""
    try:
        domain = parse_domain(rule)
        tolerance = domain.tolerance
        target = with_domain_params(target, domain)
    except VerifyError:
        tolerance = Domain(rule.name, [], []).tolerance
    try:
        stats, result = _optimize_alone(model, rule, target)
    except Exception as exc:
        return f"the optimizer fails: {type(exc).__name__}: {first_line(exc)}"
    if expect == "no-fire":
        return "the rule fires on this negative case" if stats.applied else None
    if stats.ill_typed is not None:
        return f"the rule's rewrite is blocked: {stats.ill_typed}"
    if not stats.applied:
        return "the rule does not fire on this model"
    runner = choose_runner(model)
    try:
        expected = runner.run(model, [feeds])[0]
        actual = runner.run(result, [feeds])[0]
    except RuntimeFailure as exc:
        return str(exc)
    mismatch = compare(expected, actual, [o.name for o in model.graph.output], tolerance)
    return None if mismatch is None else f"{mismatch.message} (runtime: {runner.name})"


def _show_array(value: np.ndarray, limit: int = 8) -> str:
    array = np.asarray(value)
    flat = array.reshape(-1)
    shown = ", ".join(repr(x.item()) if hasattr(x, "item") else repr(x) for x in flat[:limit])
    more = ", ..." if flat.size > limit else ""
    return f"{array.dtype}{list(array.shape)} [{shown}{more}]"


def run_job(job: tuple[Rule, dict]) -> RuleReport:
    """check_rule for one rule and its options (a worker's unit of work: the rule and
    the target travel with it, so a worker reads no file)."""
    from onnxfuse.support.every_module import load_every_module

    # The same modules loaded wherever the job runs: hypothesis draws some values from
    # their constants (see load_every_module).
    load_every_module()
    rule, options = job
    return check_rule(rule, **options)


def check_rules(rules: Sequence[Rule], **options) -> list[RuleReport]:
    return [check_rule(rule, **options) for rule in rules]
