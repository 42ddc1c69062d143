"""Calibration: each fused op timed against the pattern it replaces, on this machine.

The pairs come from the matches optimize makes in a model (their real shapes and
constants; the inputs' symbolic dims bound by ``--dim`` or ``default_dim``, the dims
inference names inside by one traced run at those sizes) or, without a model,
from an instance drawn from each rule's ``verify:`` domain. A pair is the matched
subgraph as a model of its own, repeated so that one run lasts long enough to dwarf
onnxruntime's per-run overhead (each copy with its own inputs, so that nothing merges
them), normalized as optimize normalizes, then optimized with the rule alone: the same
model before and after. Both run in onnxruntime with the target's provider, warmed up,
then in alternating rounds; the median of the rounds' ratios is what a ``Profile``
records.

Skipping a rule measured slower can expose a rule of lower priority at the same place:
calibrating a model repeats until its run under the profile makes no unmeasured match.
"""

from __future__ import annotations

import math
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import partial

import numpy as np
import onnx
import onnx_ir as ir
from onnx import helper, numpy_helper

from onnxfuse.errors import ModelError, OnnxfuseError
from onnxfuse.language.guards import constant_tensor
from onnxfuse.language.rule import Rule
from onnxfuse.passes.normalize import normalize
from onnxfuse.passes.pipeline import Options, optimize
from onnxfuse.planner.bindings import dim_name, graph_inputs, main_values
from onnxfuse.planner.tensor_info import TensorInfo
from onnxfuse.planner.trace import random_inputs, trace_values
from onnxfuse.proof.check import find_firing_instance, unavailable_here
from onnxfuse.proof.domain import VerifyError, parse_domain
from onnxfuse.proof.instance import Instance, build_model, random_array
from onnxfuse.rewrite.matcher import Match
from onnxfuse.support.ir_types import value_name
from onnxfuse.targets.capabilities import Target
from onnxfuse.targets.cpu_features import cpu_flags, cpu_model
from onnxfuse.targets.facts import dtype_name
from onnxfuse.targets.profile import Measurement, Profile, match_facts, now, value_spelling

# A named dim no --dim binds: batch-like names 1 (one request), any other a typical
# sequence length or image side.
BATCH_DIM, OTHER_DIM = 1, 128
# One timed run of the repeated pattern should last about this long (seconds), with at
# most MAX_COPIES copies of the pattern.
RUN_SECONDS = 2e-3
MAX_COPIES = 32
# Rounds of calibrate-then-optimize-under-the-profile on one model.
MAX_ROUNDS = 4
# Firing instances drawn from a rule's verify: domain, without a model; the largest is timed.
DOMAIN_DRAWS = 4
# Extra SIMD flags worth recording: they pick onnxruntime's (MLAS's) kernels.
_SIMD_FLAGS = (
    "sse4_2",
    "avx",
    "avx2",
    "fma",
    "f16c",
    "avx512f",
    "avx512bw",
    "avx512vl",
    "avx512_vnni",
    "avx512_bf16",
    "avx512_fp16",
    "amx_tile",
    "asimd",
)


def default_dim(name: str) -> int:
    return BATCH_DIM if "batch" in name.lower() else OTHER_DIM


@dataclass(frozen=True)
class Settings:
    runs: int = 30  # alternating rounds of the timed runs
    warmup: int = 3
    threads: int = 1
    level: str = "disable"  # onnxruntime's graph optimization level


@dataclass
class Pair:
    """A match as a model of its own: what a measurement times."""

    rule: Rule
    alternative: int
    facts: dict[str, str]
    at: str
    dims: dict[str, int]
    model: str
    source: onnx.ModelProto
    feeds: dict[str, np.ndarray]
    # Other matches at the same sizes (another layer): their facts and dims.
    aliases: list[tuple[dict[str, str], dict[str, int]]] = field(default_factory=list)
    measured: Measurement | None = None
    emitted: int = 0  # aliases already in the profile


@dataclass
class Known:
    """The matches seen so far: by their facts as spelled, and by the sizes they run at
    (a model's layers spell the same sizes with other dim names: one measurement, made
    once, stands for all of them, so that every layer gets the same verdict)."""

    spelled: set[tuple[str, int, tuple[tuple[str, str], ...]]] = field(default_factory=set)
    by_size: dict[tuple[str, int, tuple[tuple[str, str], ...]], Pair] = field(default_factory=dict)


class _NotMeasurable(Exception):
    pass


# -- pairs from a model ------------------------------------------------------------------


def pairs_in_model(
    model: ir.Model,
    rules: list[Rule],
    wanted: set[str],
    target: Target,
    traced: Traced,
    label: str,
    known: Known,
    skipped: list[str],
) -> list[Pair]:
    """The pairs of the matches of the ``wanted`` rules that optimize with ``rules``
    makes in ``model`` (a private copy: it is rewritten), except those already
    ``known``."""
    found: list[Pair] = []

    def observe(match: Match) -> None:
        rule = match.rule
        if rule.name not in wanted:
            return
        alternative = next(i for i, s in enumerate(rule.sources) if s is match.source)
        facts = match_facts(match.values, match.source.input_names())
        key = (rule.name, alternative, tuple(sorted(facts.items())))
        if key in known.spelled:
            return
        known.spelled.add(key)
        sized = {k: _sized(match.values.get(k), traced.dims) for k in facts}
        size_key = (rule.name, alternative, tuple(sorted(sized.items())))
        same = known.by_size.get(size_key)
        if same is not None:
            same.aliases.append((facts, _used_dims(match, traced.dims)))
            return
        try:
            pair = _pair(match, alternative, facts, model, traced, label)
            known.by_size[size_key] = pair
            found.append(pair)
        except _NotMeasurable as exc:
            skipped.append(f"{rule.name}: not measured at {_facts_text(facts)}: {exc}")

    optimize(model, rules, Options(target=target, observe=observe))
    return found


def _sized(value: ir.Value | None, dims: dict[str, int]) -> str:
    """A value's spelling at the bound sizes (``float[2,32,768]``)."""
    if value is None or value.dtype is None:
        return value_spelling(value)
    try:
        return f"{dtype_name(value.dtype)}{_bind(value, dims)}".replace(" ", "")
    except _NotMeasurable:
        return value_spelling(value)


def _used_dims(match: Match, dims: dict[str, int]) -> dict[str, int]:
    """The bound dims the match's inputs are spelled with."""
    named = [
        text
        for v in match.values.values()
        if v is not None and v.shape is not None
        for d in v.shape
        if (text := dim_name(d)) is not None and text in dims
    ]
    return {text: dims[text] for text in sorted(set(named))}


def _facts_text(facts: dict[str, str]) -> str:
    return ", ".join(f"{k}={v}" for k, v in facts.items())


@dataclass
class Traced:
    """What one run of a model at its bound input sizes says: a size for every dim name
    (``unk__7`` too) and the values of its small integer tensors (shapes, indices),
    which a match's inputs computed in the model then get."""

    dims: dict[str, int]
    values: dict[str, np.ndarray] = field(default_factory=dict)


# Integer tensors up to this many elements keep their traced values.
_KEPT_VALUES = 64


def traced_run(load: Callable[[], ir.Model], given: dict[str, int], label: str = "") -> Traced:
    """The dims and small integer values of the normalized model in one run: its
    inputs' named dims by ``given`` or ``default_dim``, all else as the run gives."""
    model = load()
    dims = {name: given.get(name, default_dim(name)) for name in input_dim_names(model)}
    normalize(model)
    inputs = [
        (value_name(v), TensorInfo(v.dtype, tuple(_input_dim(d, dims) for d in v.shape)))
        for v in graph_inputs(model)
        if v.dtype is not None and v.shape is not None
    ]
    try:
        traced = trace_values(model, random_inputs(model, inputs))
    except ModelError as exc:
        bound = ", ".join(f"{k}={v}" for k, v in dims.items()) or "its static shapes"
        raise OnnxfuseError(
            f"{label or 'the model'} does not run at {bound} (--dim binds them): {exc}"
        ) from None
    for value in main_values(model.graph):
        found = traced.get(value_name(value))
        if found is None or value.shape is None or len(value.shape) != found.ndim:
            continue
        for dim, size in zip(value.shape, found.shape):
            text = dim_name(dim)
            if text is not None:
                dims.setdefault(text, int(size))
    small = {
        name: array
        for name, array in traced.items()
        if array.dtype.kind in "iu" and array.size <= _KEPT_VALUES
    }
    return Traced(dims, small)


def input_dim_names(model: ir.Model) -> list[str]:
    """The names of the symbolic dims of the model's inputs (what --dim binds)."""
    inputs = graph_inputs(model)
    return sorted({t for v in inputs if v.shape is not None for d in v.shape if (t := dim_name(d))})


def _input_dim(dim: int | ir.SymbolicDim, dims: dict[str, int]) -> int:
    if isinstance(dim, int) and dim > 0:
        return dim
    text = dim_name(dim)
    return OTHER_DIM if text is None else dims[text]


def _bind(value: ir.Value, dims: dict[str, int]) -> list[int]:
    """The shape of ``value`` at ``dims``; _NotMeasurable if a dim stays open."""
    if value.shape is None:
        raise _NotMeasurable(f"{value_name(value)!r} has no known shape")
    out = []
    for dim in value.shape:
        text = dim_name(dim)
        size = dim if isinstance(dim, int) else dims.get(text) if text is not None else None
        if size is None or size < 0:
            raise _NotMeasurable(f"{value_name(value)!r} has a dim the bound inputs do not fix")
        out.append(size)
    return out


def _pair(
    match: Match,
    alternative: int,
    facts: dict[str, str],
    model: ir.Model,
    traced: Traced,
    label: str,
) -> Pair:
    """The matched nodes with their real constants; inputs declared as in the model, fed
    at the bound sizes: small integer tensors with their traced values, other integers
    zeros (a valid index), floats random. A pattern whose guards relate a computed shape
    to the model's symbolic dims may not fire on it: it is then reported not measured."""
    dims = traced.dims
    graph = match.nodes[0].graph
    assert graph is not None
    order = {id(n): i for i, n in enumerate(graph)}
    nodes = sorted(match.nodes, key=lambda n: order.get(id(n), 0))
    inside = {id(o) for n in nodes for o in n.outputs}
    seen: set[int] = set()
    inputs: list[onnx.ValueInfoProto] = []
    infos: list[onnx.ValueInfoProto] = []
    initializers: list[onnx.TensorProto] = []
    feeds: dict[str, np.ndarray] = {}
    rng = np.random.default_rng(0)
    ir_version = model.ir_version or 10
    for node in nodes:
        for value in node.inputs:
            if value is None or id(value) in inside or id(value) in seen:
                continue
            seen.add(id(value))
            name = value_name(value)
            constant = constant_tensor(value, ir_version)
            if constant is not None:
                initializers.append(numpy_helper.from_array(constant.numpy(), name))
                continue
            shape, dtype = _bind(value, dims), dtype_name(value.dtype)
            if dtype is None or value.dtype is None:
                raise _NotMeasurable(f"{name!r} has no known element type")
            kept = traced.values.get(name)
            # Declared as in the model, fed at the bound sizes: the pair normalizes as the
            # model did (a static shape would fold the shape computations of a match).
            inputs.append(helper.make_tensor_value_info(name, int(value.dtype), _declared(value)))
            if kept is not None and list(kept.shape) == shape:
                feeds[name] = kept
            else:
                feeds[name] = random_array(rng, dtype, tuple(shape), (0, 0), frozenset())
    for node in nodes:
        for output in node.outputs:
            if output.dtype is not None and output.shape is not None:
                infos.append(
                    helper.make_tensor_value_info(
                        value_name(output), int(output.dtype), _declared(output)
                    )
                )
    outputs = []
    for output in match.outputs:
        known = next((v for v in infos if v.name == value_name(output)), None)
        outputs.append(known or helper.make_value_info(value_name(output), onnx.TypeProto()))
    protos = [ir.serde.serialize_node(n) for n in nodes]
    shapes = {str(list(array.shape)) for array in feeds.values()}
    at = ", ".join(sorted(shapes, key=lambda s: (-len(s), s))) or "constants only"
    built = helper.make_model(
        helper.make_graph(protos, f"calibrate-{match.rule.name}", inputs, outputs, initializers),
        opset_imports=[helper.make_opsetid(d, v) for d, v in sorted(model.opset_imports.items())],
        ir_version=ir_version,
    )
    built.graph.value_info.extend(v for v in infos if v.name not in {o.name for o in outputs})
    used = _used_dims(match, dims)
    return Pair(match.rule, alternative, facts, at, used, label, built, feeds)


def _declared(value: ir.Value) -> list[int | str | None]:
    assert value.shape is not None
    return [d if isinstance(d, int) else dim_name(d) for d in value.shape]


# -- pairs from verification domains ------------------------------------------------------


def pairs_from_domains(
    rules: list[Rule], target: Target, known: Known, skipped: list[str]
) -> list[Pair]:
    """One pair per rule, from the largest of ``DOMAIN_DRAWS`` instances of its
    ``verify:`` domain that fire (the domain's sizes are small, made for proofs: the
    largest is the least dominated by onnxruntime's per-node overhead)."""
    found: list[Pair] = []
    for rule in rules:
        try:
            domain = parse_domain(rule)
        except VerifyError as exc:
            skipped.append(f"{rule.name}: not measured: {exc}")
            continue
        why = unavailable_here(target, domain)
        if why is not None:
            skipped.append(f"{rule.name}: not measured: {why}")
            continue
        drawn = [
            instance
            for draw in range(DOMAIN_DRAWS)
            if (instance := find_firing_instance(rule, domain, target, seed=1000 * draw)[0])
        ]
        if not drawn:
            skipped.append(f"{rule.name}: not measured: no instance of its domain fires")
            continue
        proto = build_model(max(drawn, key=_elements).spec)
        traced = traced_run(partial(ir.from_proto, proto), {})
        found += pairs_in_model(
            ir.from_proto(proto), [rule], {rule.name}, target, traced, "", known, skipped
        )
    return found


def _elements(instance: Instance) -> int:
    return sum(math.prod(t.dims) for t in instance.spec.tensors.values() if t.kind == "input")


# -- timing --------------------------------------------------------------------------------


def _repeated(model: onnx.ModelProto, copies: int) -> onnx.ModelProto:
    """``copies`` copies of the graph side by side, each with its own inputs and outputs
    (initializers shared: each copy reads the same weights, as a model's layers do)."""
    graph = model.graph
    shared = {t.name for t in graph.initializer}

    def name(text: str, k: int) -> str:
        return text if not text or text in shared else f"{text}__{k}"

    nodes: list[onnx.NodeProto] = []
    inputs: list[onnx.ValueInfoProto] = []
    outputs: list[onnx.ValueInfoProto] = []
    infos: list[onnx.ValueInfoProto] = []
    for k in range(copies):
        for node in graph.node:
            copy = onnx.NodeProto()
            copy.CopyFrom(node)
            copy.name = f"{node.name}__{k}"
            copy.input[:] = [name(i, k) for i in node.input]
            copy.output[:] = [name(o, k) for o in node.output]
            nodes.append(copy)
        for source, dest in ((graph.input, inputs), (graph.output, outputs)):
            for info in source:
                renamed = onnx.ValueInfoProto()
                renamed.CopyFrom(info)
                renamed.name = name(info.name, k)
                dest.append(renamed)
        for info in graph.value_info:
            renamed = onnx.ValueInfoProto()
            renamed.CopyFrom(info)
            renamed.name = name(info.name, k)
            infos.append(renamed)
    out = onnx.ModelProto()
    out.CopyFrom(model)
    out.graph.ClearField("node")
    out.graph.node.extend(nodes)
    for field_name, values in (("input", inputs), ("output", outputs), ("value_info", infos)):
        out.graph.ClearField(field_name)
        getattr(out.graph, field_name).extend(values)
    return out


def _feeds(pair: Pair, copies: int) -> dict[str, np.ndarray]:
    return {f"{n}__{k}": v for k in range(copies) for n, v in pair.feeds.items()}


def _optimized(model: onnx.ModelProto, rules: list[Rule], target: Target) -> tuple[int, bytes]:
    ir_model = ir.from_proto(model)
    report = optimize(ir_model, rules, Options(target=target, gate_by_profile=False))
    applied = sum(report.rules[r.name].applied for r in rules)
    return applied, ir.serde.serialize_model(ir_model).SerializeToString()


def _session(data: bytes, provider: str, settings: Settings):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = {
        "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
        "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
        "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
        "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
    }[settings.level]
    options.intra_op_num_threads = settings.threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.log_severity_level = 4
    return ort.InferenceSession(data, options, providers=[provider])


def _run_seconds(session, feeds: dict[str, np.ndarray]) -> float:
    started = time.perf_counter()
    session.run(None, feeds)
    return time.perf_counter() - started


def _alternating(
    sessions: list, feeds: dict[str, np.ndarray], settings: Settings
) -> list[list[float]]:
    """Each session's run times: warm-up, then rounds of one run each, every other round
    starting with the other session (a session's place in a round biases it)."""
    for _ in range(settings.warmup):
        for session in sessions:
            session.run(None, feeds)
    times: list[list[float]] = [[] for _ in sessions]
    for index in range(settings.runs):
        order = range(len(sessions)) if index % 2 == 0 else reversed(range(len(sessions)))
        for which in order:
            times[which].append(_run_seconds(sessions[which], feeds))
    return times


def measure(pair: Pair, target: Target, provider: str, settings: Settings) -> Measurement:
    """Time the pair's replacement against its source; _NotMeasurable if it cannot run."""
    unprofiled = target.with_params({k: v for k, v in target.params.items() if k != "profile"})
    try:
        _, single = _optimized(pair.source, [], unprofiled)
        probe = _session(single, provider, settings)
        once = min(_run_seconds(probe, pair.feeds) for _ in range(1 + settings.warmup))
    except Exception as exc:  # an onnxruntime refusal of this subgraph: reported, not fatal
        raise _NotMeasurable(f"onnxruntime cannot run the pattern: {_first(exc)}") from None
    copies = max(1, min(MAX_COPIES, math.ceil(RUN_SECONDS / max(once, 1e-7))))
    source = _repeated(pair.source, copies)
    _, unfused_model = _optimized(source, [], unprofiled)
    applied, fused_model = _optimized(source, [pair.rule], unprofiled)
    if applied != copies:
        raise _NotMeasurable(f"the rule fired {applied} times on {copies} copies of its match")
    feeds = _feeds(pair, copies)
    try:
        sessions = [_session(m, provider, settings) for m in (unfused_model, fused_model)]
        unfused, fused = _alternating(sessions, feeds, settings)
    except Exception as exc:
        raise _NotMeasurable(f"onnxruntime cannot run it: {_first(exc)}") from None
    return Measurement(
        rule=pair.rule.name,
        alternative=pair.alternative,
        inputs=pair.facts,
        at=pair.at,
        unfused_us=statistics.median(unfused) / copies * 1e6,
        fused_us=statistics.median(fused) / copies * 1e6,
        dims=pair.dims,
        model=pair.model,
        paired_ratio=statistics.median(f / u for f, u in zip(fused, unfused)),
    )


def _first(exc: BaseException) -> str:
    lines = [line for line in str(exc).splitlines() if line.strip()]
    return (lines[0] if lines else type(exc).__name__)[:200]


# -- the whole calibration ------------------------------------------------------------------


def provider_of(target: Target) -> str:
    import onnxruntime as ort

    provider = target.provider or "CPUExecutionProvider"
    if provider not in ort.get_available_providers():
        available = ", ".join(ort.get_available_providers())
        raise OnnxfuseError(
            f"target '{target.name}' runs on {provider}, which this onnxruntime lacks "
            f"(it has: {available})"
        )
    return provider


def machine() -> dict[str, object]:
    flags = cpu_flags() or frozenset()
    return {
        "cpu": cpu_model() or platform.processor() or platform.machine(),
        "flags": [f for f in _SIMD_FLAGS if f in flags],
        "platform": platform.platform(),
    }


def fused_op_rules(rules: list[Rule]) -> list[Rule]:
    """The rules that create an op of a domain other than ONNX's: fused kernels, whose
    speed against the pattern they replace is what calibration measures by default."""
    return [r for r in rules if any(d not in ("", "ai.onnx") for d, _ in r.created_ops())]


def calibrate(
    target: Target,
    rules: list[Rule],
    wanted: set[str],
    models: Sequence[tuple[str, Callable[[], ir.Model]]],
    dims: dict[str, int],
    settings: Settings,
    progress: Callable[[str], None] | None = None,
) -> tuple[Profile, list[str]]:
    """The profile of the ``wanted`` rules on this machine, and one line per match not
    measured. ``models``: (label, loader of a fresh copy) each, optimized with ``rules``;
    none: the wanted rules' verification domains."""
    import onnxruntime as ort

    # Calibration times the rules that would wait for a measurement (needs_profile).
    rules = [replace(r, needs_profile=frozenset()) for r in rules]
    provider = provider_of(target)
    profile = Profile(
        target=target.name,
        measurements=[],
        provider=provider,
        machine=machine(),
        onnxruntime=ort.__version__,
        date=now(),
        settings={
            "threads": settings.threads,
            "level": settings.level,
            "runs": settings.runs,
            "warmup": settings.warmup,
        },
    )
    known = Known()
    skipped: list[str] = []

    def measure_all(pairs: list[Pair]) -> None:
        for pair in pairs:
            try:
                pair.measured = measure(pair, target, provider, settings)
            except _NotMeasurable as exc:
                skipped.append(f"{pair.rule.name}: not measured at {pair.at}: {exc}")
                continue
            profile.measurements.append(pair.measured)
            if progress is not None:
                progress(f"{pair.rule.name}: {pair.measured.verdict()}")

    def add_aliases() -> None:
        for pair in known.by_size.values():
            if pair.measured is None:
                continue
            for facts, used in pair.aliases[pair.emitted :]:
                profile.measurements.append(replace(pair.measured, inputs=facts, dims=used))
            pair.emitted = len(pair.aliases)

    if not models:
        chosen = [r for r in rules if r.name in wanted]
        measure_all(pairs_from_domains(chosen, target, known, skipped))
        return profile, skipped
    for label, load in models:
        traced = traced_run(load, dims, label)
        for _ in range(MAX_ROUNDS):
            under = target.with_params({**target.params, "profile": profile})
            pairs = pairs_in_model(load(), rules, wanted, under, traced, label, known, skipped)
            measure_all(pairs)
            add_aliases()
            if not pairs:
                break
    return profile, skipped
