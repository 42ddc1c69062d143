"""The differential oracle: optimize a model for a target, run both in onnxruntime, compare.

A model onnxruntime cannot check or run *before* optimization is the
generator's fault: ``validate`` says so (a discard, not a finding). After
optimization anything else is a failure of onnxfuse: a crash (any exception),
an error on a valid model, a rewrite stopped by a cap or an oscillation, a
result that fails onnx's full checker, changed graph input/output names, a
model onnxruntime cannot load or run, or outputs that differ beyond the
per-dtype tolerances of the proofs (``proof.domain.DEFAULT_TOLERANCES``, as
tests/helpers.py's), beyond the original's own rounding noise and, in a QDQ model,
beyond the steps its units may round differently (``noise.quantization_floor``); and
for a target that consumes QDQ node units, a unit of the input that is no longer one.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import signal
import traceback
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
from onnx import helper, numpy_helper

from onnxfuse.files.repair import repair_attributes
from onnxfuse.fuzz.noise import NOISE_FACTOR, noise_floor, quantization_floor
from onnxfuse.ops import element_types
from onnxfuse.proof.reference_ops import with_reference_definitions_bytes
from onnxfuse.rewrite.report import StopReason

if TYPE_CHECKING:
    from onnxfuse.proof.domain import Domain

ort.set_default_logger_severity(4)
OPTIMIZE_TIMEOUT_SECONDS = 60.0
_FEEDS_PER_CASE = ("normal", "special")


@functools.cache
def tolerances() -> dict[np.dtype, tuple[float, float]]:
    """The per-dtype (rtol, atol) of the proofs: one source of truth."""
    from onnxfuse.proof.domain import DEFAULT_TOLERANCES

    return {element_types.to_numpy(name): tol for name, tol in DEFAULT_TOLERANCES.items()}


# The user's rule files a run fuzzes beside the built-in packs (``use_rules``).
_rule_files: tuple[str, ...] = ()


def use_rules(files: Sequence[str | Path]) -> None:
    """Fuzz with these rule files or pack folders too (set in every process of a run)."""
    global _rule_files
    _rule_files = tuple(str(Path(f).resolve()) for f in files)


def rule_files() -> tuple[str, ...]:
    return _rule_files


def run_rules() -> tuple:
    """The rules a run optimizes with: the built-in packs and the ``use_rules`` files."""
    return _loaded_rules(_rule_files)


@functools.cache
def _loaded_rules(files: tuple[str, ...]) -> tuple:
    from onnxfuse.api import select_rules

    return tuple(select_rules(list(files)))


@functools.cache
def target(name: str):
    from onnxfuse.targets.capabilities import load_target

    return load_target(name)


@dataclass
class Outcome:
    """What happened to one model for one target."""

    status: str  # "pass", "discard" or "fail"
    kind: str = ""  # failure kind: crash, error, stopped, checker, interface, unit, ort-load, ...
    message: str = ""
    where: str = ""  # for crashes: exception type and innermost onnxfuse frame
    applied: list[str] = field(default_factory=list)  # rules that fired

    @property
    def failed(self) -> bool:
        return self.status == "fail"

    def same_failure(self, other: Outcome) -> bool:
        return self.failed and other.failed and (self.kind, self.where) == (other.kind, other.where)


# -- feeds ---------------------------------------------------------------------------


def make_feeds(
    model: onnx.ModelProto,
    seed: int,
    special: bool,
    override: bool = False,
    overridable: Sequence[str] = (),
) -> dict[str, np.ndarray]:
    """Inputs for every graph input; NaN/inf/-0.0 in float inputs if ``special``;
    other values for initializers that are graph inputs if ``override``."""
    rng = np.random.default_rng(seed)
    initializers = {t.name: t for t in model.graph.initializer}
    feeds: dict[str, np.ndarray] = {}
    for value in model.graph.input:
        tensor_type = value.type.tensor_type
        dtype = helper.tensor_dtype_to_np_dtype(tensor_type.elem_type)
        if value.name in initializers:
            if not override or value.name not in overridable:
                continue
            base = numpy_helper.to_array(initializers[value.name])
            noise = rng.standard_normal(base.shape) * 0.5 + 0.25
            feeds[value.name] = np.asarray(base + noise).astype(dtype)
            continue
        shape = [
            d.dim_value if d.HasField("dim_value") else int(d.dim_param.rsplit("_", 1)[-1])
            for d in tensor_type.shape.dim
        ]
        if np.issubdtype(dtype, np.floating):
            array = rng.standard_normal(shape).astype(dtype)
            if special and array.size:
                flat = array.reshape(-1)
                count = max(1, flat.size // 6)
                where = rng.choice(flat.size, size=count, replace=False)
                values = np.array([np.nan, np.inf, -np.inf, -0.0, 0.0], dtype=dtype)
                flat[where] = values[rng.integers(0, len(values), size=count)]
                array = flat.reshape(shape)
        elif dtype == np.bool_:
            array = np.asarray(rng.random(shape) > 0.5)
        else:
            array = rng.integers(-3, 4, shape).astype(dtype)
        feeds[value.name] = np.asarray(array)
    return feeds


def feeds_for(case) -> list[tuple[str, dict[str, np.ndarray]]]:
    """The feed sets one case runs with: random normal, and special values if drawn."""
    result = [
        (
            "normal",
            make_feeds(case.model, case.feed_seed, False, case.override, case.overridable),
        )
    ]
    if case.special:
        result.append(
            (
                "special",
                make_feeds(case.model, case.feed_seed + 1, True, case.override, case.overridable),
            )
        )
    return result


# -- running -------------------------------------------------------------------------


def session(model_bytes: bytes) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 4
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    # Ops with no CPU kernel run as their reference definition (proof.reference_ops).
    model_bytes = with_reference_definitions_bytes(model_bytes)
    return ort.InferenceSession(model_bytes, options, providers=["CPUExecutionProvider"])


def run_all(model_bytes: bytes, feed_sets) -> list[list[np.ndarray]]:
    sess = session(model_bytes)
    return [[np.asarray(o) for o in sess.run(None, feeds)] for _, feeds in feed_sets]


def reference_outputs(model: onnx.ModelProto, feed_sets) -> list[list[np.ndarray]]:
    from onnx.reference import ReferenceEvaluator

    evaluator = ReferenceEvaluator(model)
    return [[np.asarray(o) for o in evaluator.run(None, feeds)] for _, feeds in feed_sets]


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return f"{type(exc).__name__}: {text.splitlines()[0][:400]}"


def _crash_site(exc: BaseException) -> str:
    """Exception type and the innermost frame inside onnxfuse (or the innermost frame)."""
    frames = traceback.extract_tb(exc.__traceback__)
    chosen = None
    for frame in frames:
        if "/engine/" in frame.filename or "/onnxfuse/" in frame.filename:
            chosen = frame
    if chosen is None and frames:
        chosen = frames[-1]
    if chosen is None:
        return type(exc).__name__
    return f"{type(exc).__name__}@{Path(chosen.filename).name}:{chosen.name}"


class _Timeout(Exception):
    pass


@contextlib.contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Raise _Timeout after ``seconds`` (main thread only; elsewhere no limit)."""

    def handler(signum, frame):
        raise _Timeout()

    try:
        previous = signal.signal(signal.SIGALRM, handler)
    except ValueError:  # not the main thread
        yield
        return
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


# -- checking ------------------------------------------------------------------------


@dataclass
class Original:
    """A model that passed validation, with its outputs on each feed set."""

    model: onnx.ModelProto
    feed_sets: list
    outputs: list[list[np.ndarray]]
    # Per graph output: the float types it is computed in, and their default tolerance.
    float_types: list[frozenset[np.dtype]]
    tolerances: list[tuple[float, float]]
    # Results onnxruntime already ran and matched: many targets optimize a model to the
    # same bytes, and the same bytes give the same outputs.
    matched: set[bytes] = field(default_factory=set)


_FLOAT_TYPES = (
    onnx.TensorProto.FLOAT,
    onnx.TensorProto.FLOAT16,
    onnx.TensorProto.DOUBLE,
    onnx.TensorProto.BFLOAT16,
)


def _subgraphs(node: onnx.NodeProto) -> list[onnx.GraphProto]:
    graphs: list[onnx.GraphProto] = []
    for attr in node.attribute:
        if attr.type == onnx.AttributeProto.GRAPH:
            graphs.append(attr.g)
        elif attr.type == onnx.AttributeProto.GRAPHS:
            graphs.extend(attr.graphs)
    return graphs


def output_tolerances(float_types: list[frozenset[np.dtype]]) -> list[tuple[float, float]]:
    """Per graph output, the tolerance of the least precise float type it is computed in.

    A float32 result cast to float64 carries float32 rounding: it is compared
    with the float32 tolerance, not the float64 one.
    """
    table = tolerances()
    return [max([(0.0, 0.0), *(table.get(t, (0.0, 0.0)) for t in found)]) for found in float_types]


def output_float_types(model: onnx.ModelProto) -> list[frozenset[np.dtype]]:
    """Per graph output, the float types of the values it is computed from."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:
        inferred = model
    types: dict[str, int] = {}

    def collect(graph: onnx.GraphProto) -> None:
        for info in (*graph.input, *graph.output, *graph.value_info):
            types[info.name] = info.type.tensor_type.elem_type
        for init in graph.initializer:
            types[init.name] = init.data_type
        for node in graph.node:
            for sub in _subgraphs(node):
                collect(sub)

    collect(inferred.graph)
    producers: dict[str, onnx.NodeProto] = {}

    def index(graph: onnx.GraphProto) -> None:
        for node in graph.node:
            for out in node.output:
                producers[out] = node
            for sub in _subgraphs(node):
                index(sub)

    index(inferred.graph)
    memo: dict[str, frozenset[int]] = {}

    def ancestry(name: str) -> frozenset[int]:
        if name in memo:
            return memo[name]
        memo[name] = frozenset()  # cycle guard
        found = {types.get(name, 0)}
        node = producers.get(name)
        if node is not None:
            names = list(node.input)
            for sub in _subgraphs(node):
                names += [o.name for o in sub.output]
            for other in names:
                if other:
                    found |= ancestry(other)
        memo[name] = frozenset(found)
        return memo[name]

    return [
        frozenset(
            np.dtype(helper.tensor_dtype_to_np_dtype(elem))
            for elem in ancestry(output.name)
            if elem in _FLOAT_TYPES
        )
        for output in model.graph.output
    ]


def validate(model: onnx.ModelProto, feed_sets) -> Original | Outcome:
    """The unoptimized model must pass the checker and run: else it is a discard."""
    try:
        onnx.checker.check_model(model, full_check=True)
    except Exception as exc:
        return Outcome("discard", "checker", _first_line(exc))
    try:
        outputs = run_all(model.SerializeToString(), feed_sets)
    except Exception as exc:
        return Outcome("discard", "ort", _first_line(exc))
    float_types = output_float_types(model)
    return Original(model, feed_sets, outputs, float_types, output_tolerances(float_types))


def check(original: Original, target_name: str, rules: Sequence | None = None) -> Outcome:
    """Optimize for ``target_name`` with ``rules`` (default: ``run_rules()``); compare."""
    from onnxfuse.errors import OnnxfuseError
    from onnxfuse.passes.pipeline import Options, optimize

    rules = list(run_rules() if rules is None else rules)
    # Mended as a file's load mends it (the checker would misread such attributes once
    # a rewrite makes shapes known).
    source = onnx.ModelProto()
    source.CopyFrom(original.model)
    repair_attributes(source)
    model = ir.from_proto(source)
    applied: list[str] = []
    try:
        with time_limit(OPTIMIZE_TIMEOUT_SECONDS):
            report = optimize(model, rules, Options(target=target(target_name)))
    except _Timeout:
        return Outcome("fail", "hang", f"optimize did not finish in {OPTIMIZE_TIMEOUT_SECONDS}s")
    except OnnxfuseError as exc:
        return Outcome("fail", "error", _first_line(exc), type(exc).__name__)
    except Exception as exc:
        return Outcome("fail", "crash", _first_line(exc), _crash_site(exc))
    applied = sorted(name for name, stats in report.rules.items() if stats.applied)
    outcome = _check_result(original, model, target_name, applied)
    if outcome.failed or not report.stopped:
        return outcome
    # An early stop leaves a valid model; it is reported once the result passed every check.
    stop = report.stopped
    return Outcome("fail", "stopped", str(stop), _stop_reason(stop), applied)


def _check_result(
    original: Original, model: ir.Model, target_name: str, applied: list[str]
) -> Outcome:
    """The optimized model must pass the checker, keep its interface and match numerically."""
    from onnxfuse.errors import OnnxfuseError
    from onnxfuse.files.model_io import check_model

    try:
        check_model(model)
    except OnnxfuseError as exc:
        return Outcome("fail", "checker", _first_line(exc), "", applied)
    except Exception as exc:
        return Outcome("fail", "crash", _first_line(exc), _crash_site(exc), applied)
    if target(target_name).keeps_qdq_units:
        broken = broken_unit(original.model, model)
        if broken:
            return Outcome("fail", "unit", broken, "", applied)
    try:
        proto = ir.serde.serialize_model(model)
    except Exception as exc:
        return Outcome("fail", "crash", _first_line(exc), _crash_site(exc), applied)
    for kind in ("input", "output"):
        before = [v.name for v in getattr(original.model.graph, kind)]
        after = [v.name for v in getattr(proto.graph, kind)]
        if kind == "input":  # initializers listed as inputs (IR < 4) may be dropped
            inits = {t.name for t in original.model.graph.initializer}
            before = [n for n in before if n not in inits or original.model.ir_version >= 4]
            after = [n for n in after if n in before or original.model.ir_version >= 4]
        if before != after:
            message = f"graph {kind}s {before} became {after}"
            return Outcome("fail", "interface", message, "", applied)
    data = proto.SerializeToString()
    digest = hashlib.sha256(data).digest()
    if digest in original.matched:
        return Outcome("pass", applied=applied)
    try:
        outputs = run_all(data, original.feed_sets)
        expected = original.outputs
    except Exception as exc:
        message = _first_line(exc)
        if target_name == "cpu" or "NOT_IMPLEMENTED" not in message:
            kind = "ort-load" if "InferenceSession" in message or "Load" in message else "ort-run"
            return Outcome("fail", kind, message, "", applied)
        if any(n.domain not in ("", "ai.onnx") for n in proto.graph.node):
            # A kernel only the target has (cuda's float16 com.microsoft Gelu): there is
            # no oracle on this machine; the checker passed and the target allowed it.
            return Outcome("pass", applied=applied)
        # Other targets may use standard ops onnxruntime's CPU provider lacks a kernel
        # for: compare both models with onnx's reference evaluator instead.
        try:
            expected = reference_outputs(original.model, original.feed_sets)
            outputs = reference_outputs(proto, original.feed_sets)
        except Exception as ref_exc:
            message = f"{message}; reference: {_first_line(ref_exc)}"
            return Outcome("fail", "ort-load", message, "", applied)
    feed_sets = original.feed_sets
    if nonfinite_deviations(applied):
        # A rule that fired says (its verify domain's special_values: differs) that it
        # changes NaN or infinite inputs' results, as onnxruntime's own rewrite does:
        # compare the plain set only. Every other rule is exact on them.
        keep = [i for i, (label, _) in enumerate(feed_sets) if label != "special"]
        feed_sets = [feed_sets[i] for i in keep]
        outputs, expected = [outputs[i] for i in keep], [expected[i] for i in keep]
    steps = quantization_steps(applied)
    allowed = rule_tolerances(original, applied)
    values = list(proto.graph.output)
    problem = compare(outputs, expected, feed_sets, values, allowed, steps=steps)
    if problem:
        problem = beyond_rounding_noise(
            original, outputs, expected, values, feed_sets, allowed, steps
        )
    if problem:
        return Outcome("fail", "mismatch", problem, "", applied)
    if expected is original.outputs:  # onnxruntime ran it (not the reference evaluator)
        original.matched.add(digest)
    return Outcome("pass", applied=applied)


def broken_unit(before: onnx.ModelProto, after: ir.Model) -> str | None:
    """The first QDQ node unit of ``before`` that is no longer one in ``after``, described.

    A target that consumes units itself (``quantization: qdq_units``: qnn, nnapi, ...)
    must get every unit of its input back: its op, by name, still between DQs and Qs.
    A unit no graph output is computed from is dead code, and may go.
    """
    from onnxfuse.rewrite.qdq_units import is_unit_op

    nodes = {node.name: node for node in after.graph if node.name}
    graph = ir.from_proto(before).graph
    live = _live(graph)
    for node in graph:
        if not node.name or not is_unit_op(node) or node not in live:
            continue
        kept = nodes.get(node.name)
        if kept is None or kept.op_type != node.op_type:
            return f"the QDQ node unit of {node.op_type} '{node.name}' is gone"
        if not is_unit_op(kept):
            return f"{node.op_type} '{node.name}' is no longer between DQ and Q nodes"
    return None


def _live(graph: ir.Graph) -> set[ir.Node]:
    """The nodes some graph output is computed from."""
    live: set[ir.Node] = set()
    todo = [v.producer() for v in graph.outputs]
    while todo:
        node = todo.pop()
        if node is None or node in live:
            continue
        live.add(node)
        todo.extend(v.producer() for v in node.inputs if v is not None)
    return live


@functools.cache
def _rule_domain(rule_name: str, files: tuple[str, ...]) -> Domain | None:
    """The verify domain of a rule of the run, None if it has no usable one."""
    from onnxfuse.proof.domain import VerifyError, parse_domain

    rule = next((r for r in _loaded_rules(files) if r.name == rule_name), None)
    if rule is None:
        return None
    try:
        return parse_domain(rule)
    except VerifyError:
        return None


def _nonfinite_deviation(rule_name: str) -> bool:
    domain = _rule_domain(rule_name, _rule_files)
    if domain is None:
        return False
    return domain.special_differs and not {"nan", "inf"} <= set(domain.special_inputs)


def nonfinite_deviations(applied: Sequence[str]) -> list[str]:
    """The rules among ``applied`` whose verify domain says they differ on NaN or infinite
    inputs (``special_values: {differs: true}``: a blocked max pool that does not
    propagate NaN, as onnxruntime's own NCHWc rewrite). A domain that only leaves NaN
    out is no excuse: the rule must be exact on what the fuzzer feeds."""
    return [name for name in applied if _nonfinite_deviation(name)]


def _applied_domains(applied: Sequence[str]) -> list[Domain]:
    return [d for name in applied if (d := _rule_domain(name, _rule_files)) is not None]


def quantization_steps(applied: Sequence[str]) -> int:
    """The quantization steps an integer output may move by: the most any rule among
    ``applied`` declares (``tolerance: {steps: N}``, a fused kernel that requantizes once
    where the unit rounds twice, as onnxruntime's own fusion does)."""
    return max((d.steps for d in _applied_domains(applied)), default=0)


def rule_tolerances(original: Original, applied: Sequence[str]) -> list[tuple[float, float]]:
    """Per graph output, its default tolerance loosened to what the rules among
    ``applied`` declare for the float types it is computed in (``tolerance:`` of their
    verify domains, each with its reason: the float16 fold that rounds its weights once
    more). The proofs check each rule within the same bounds."""
    domains = _applied_domains(applied)
    result = []
    for found, default in zip(original.float_types, original.tolerances, strict=True):
        declared = [
            d.tolerances[name]
            for d in domains
            for t in found
            if (name := element_types.from_numpy(t)) in d.tolerances
        ]
        result.append(max([default, *declared]))
    return result


def beyond_rounding_noise(
    original: Original, outputs, expected, values, feed_sets, allowed, steps: int
) -> str | None:
    """The mismatch that remains once the original's own rounding noise is allowed for,
    and in a QDQ model, where a rule that fired requantizes (``steps``), each unit
    rounding up to that many steps differently (``noise.quantization_floor``)."""

    def run(data: bytes) -> list[list[np.ndarray]]:
        return run_all(data, feed_sets)

    floors = noise_floor(original.model, run)
    allowance = None if floors is None else [[NOISE_FACTOR * f for f in s] for s in floors]
    beyond = f"{NOISE_FACTOR:g}x the original's rounding noise"
    quantized = quantization_floor(original.model, steps, run)
    if quantized is not None:
        beyond += f" and {steps} step(s) at each of its quantized units"
        if allowance is None:
            allowance = quantized
        else:
            allowance = [[f + q for f, q in zip(*pair)] for pair in zip(allowance, quantized)]
    problem = compare(outputs, expected, feed_sets, values, allowed, allowance, steps=steps)
    return problem and f"{problem} (beyond {beyond})"


def compare(
    actual_sets, expected_sets, feed_sets, outputs, output_tolerances, allowance=None, steps=0
) -> str | None:
    """The first difference beyond tolerance, described; None if all outputs agree.

    ``allowance``, per feed set and output, adds an elementwise absolute slack;
    ``steps``: how far an integer output may move.
    """
    for set_index, ((label, _), actual, expected) in enumerate(
        zip(feed_sets, actual_sets, expected_sets)
    ):
        if len(actual) != len(expected):
            return f"{len(actual)} outputs, expected {len(expected)}"
        for out_index, (value, a, e, (rtol, atol)) in enumerate(
            zip(outputs, actual, expected, output_tolerances)
        ):
            if allowance is not None:
                atol = atol + allowance[set_index][out_index]
            where = f"output '{value.name}' ({label} inputs)"
            if a.shape != e.shape or a.dtype != e.dtype:
                return f"{where}: {a.dtype}{list(a.shape)} != expected {e.dtype}{list(e.shape)}"
            if e.dtype.kind in "fc":
                bad = ~_close(a, e, rtol, atol)
            elif steps and e.dtype.kind in "iu":
                bad = np.abs(a.astype(np.int64) - e.astype(np.int64)) > steps
            else:
                bad = a != e
            if np.any(bad):
                index = tuple(int(i) for i in np.argwhere(bad)[0])
                count = int(np.count_nonzero(bad))
                return (
                    f"{where}: {count} of {e.size} elements differ; at {list(index)} "
                    f"got {a[index]!r}, expected {e[index]!r}"
                )
    return None


def _close(a: np.ndarray, e: np.ndarray, rtol: float, atol: float) -> np.ndarray:
    """Elementwise closeness; NaN equals NaN, inf equals inf of the same sign.

    Near the end of the float range (within a factor 2**10 of the largest
    value), a rewrite that reassociates a sum (a scale folded into weights)
    moves where partial sums overflow: there, a huge value, an infinity and a
    NaN (inf - inf) are all accepted for one another.
    """
    a64 = a.astype(np.float64)
    e64 = e.astype(np.float64)
    both_nan = np.isnan(a64) & np.isnan(e64)
    with np.errstate(invalid="ignore", over="ignore"):
        close = np.abs(a64 - e64) <= atol + rtol * np.abs(e64)
        limit = float(np.finfo(e.dtype).max) / 2**10
        near_limit = (np.abs(a64) >= limit) | (np.abs(e64) >= limit)
        overflowing = near_limit & (~np.isfinite(a64) | ~np.isfinite(e64) | (a64 * e64 > 0))
    same_inf = np.isinf(a64) & np.isinf(e64) & (np.sign(a64) == np.sign(e64))
    return both_nan | close | same_inf | overflowing


# -- diagnosis -----------------------------------------------------------------------


def diagnose(original: Original, target_name: str, failure: Outcome) -> str:
    """The smallest set of rules that reproduces ``failure`` ('pipeline' for none)."""
    rules = run_rules()
    by_name = {r.name: r for r in rules}

    def reproduces(names: Sequence[str]) -> bool:
        outcome = check(original, target_name, [by_name[n] for n in names])
        return outcome.same_failure(failure)

    if reproduces([]):
        return "pipeline"
    candidates = list(failure.applied)
    if failure.kind in ("crash", "hang", "error", "stopped") or not candidates:
        candidates = [r.name for r in rules]
    for name in candidates:
        if reproduces([name]):
            return name
    if not reproduces(candidates):
        return "unknown"
    kept = list(candidates)
    for name in list(kept):
        trial = [n for n in kept if n != name]
        if trial and reproduces(trial):
            kept = trial
    return "+".join(sorted(kept))


def _stop_reason(stop: StopReason) -> str:
    """'oscillate:<rules named>', 'rewrite-cap' or 'iteration-cap'."""
    if stop.rules:
        return f"{stop.kind.value}:{','.join(stop.rules)}"
    return stop.kind.value


def signature(failure: Outcome, culprit: str) -> str:
    """What makes two failures the same bug: kind, culprit rules, and where it happened.

    Early stops are told apart by what stopped them and the rules named (the
    rules that reproduce them vary with the model around the cycle)."""
    if failure.kind == "stopped":
        return f"stopped:{failure.where}"
    parts = [failure.kind, culprit]
    if failure.where:
        parts.append(failure.where)
    return ":".join(parts)
