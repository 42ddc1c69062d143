"""The optimization pipeline: onnx_ir passes in one Sequential.

normalize ─▶ rewrite (one pass per phase) ─▶ fold ─▶ cleanup, with the model's
interface (input and output names, types, shapes) kept across the whole run.
``OptimizePass`` is the pipeline as one onnx_ir pass, so that it runs between
onnx_ir's and onnxscript's own passes.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import overload

import onnx
import onnx_ir as ir

from onnxfuse.errors import InvariantError, OnnxfuseError
from onnxfuse.fold.folder import DEFAULT_FOLD_LIMIT_BYTES
from onnxfuse.graph.names import NameSource
from onnxfuse.graph.traversal import all_graphs
from onnxfuse.language.rule import PHASES, Rule
from onnxfuse.ops.inference import InferredTypes
from onnxfuse.passes.cleanup import CleanupPass
from onnxfuse.passes.coverage import CoveragePass
from onnxfuse.passes.normalize import NormalizePass, adopt_ir4_initializers
from onnxfuse.passes.rewrite import FoldPass, RewritePass
from onnxfuse.passes.state import RunState
from onnxfuse.rewrite.apply import strip_provenance
from onnxfuse.rewrite.driver import DEFAULT_MAX_ITERATIONS, Limits, MatcherCache
from onnxfuse.rewrite.matcher import Match
from onnxfuse.rewrite.report import REPAIRS_META, Report, RuleStats
from onnxfuse.targets.capabilities import Target


@dataclass
class Options:
    target: Target | None = None  # None: no gating (every op allowed)
    max_iterations: int = DEFAULT_MAX_ITERATIONS
    max_rewrites: int | None = None  # default: 5 per node of the input, at least 1,000
    fold_limit_bytes: int = DEFAULT_FOLD_LIMIT_BYTES
    progress: Callable[[str], None] | None = None
    # Fold DequantizeLinear of constant weights into float weights: only for a target
    # that runs no quantized op (check_dequantize), never by default.
    dequantize: bool = False
    # Each created node names its rule and the nodes it replaced (rewrite.apply).
    provenance: bool = True
    trace: bool = False  # keep each rewrite in the report's ``trace``
    # Called with each match about to be rewritten (``targets calibrate`` collects them).
    observe: Callable[[Match], None] | None = None
    # False: rewrites fire whatever the target's profile says or lacks (Limits).
    gate_by_profile: bool = True

    def limits(self) -> Limits:
        return Limits(
            self.target,
            self.max_iterations,
            self.max_rewrites,
            self.progress,
            self.observe,
            self.gate_by_profile,
        )


def check_dequantize(target: Target | None) -> None:
    """Dequantizing weights is allowed only for a target that runs no quantized op: any
    other would lose the quantized kernels the model was made for."""
    if target is None:
        raise OnnxfuseError("--dequantize needs a target that runs no quantized op, not none")
    found = target.quantized_ops()
    if found:
        raise OnnxfuseError(
            f"--dequantize: target '{target.name}' runs quantized ops "
            f"({', '.join(found[:3])}): its weights stay quantized"
        )


def count_nodes(model: ir.Model) -> int:
    return sum(len(graph) for graph in all_graphs(model))


def op_histogram(model: ir.Model) -> dict[str, int]:
    counts: Counter[str] = Counter()
    for graph in all_graphs(model):
        for node in graph:
            counts[f"{node.domain}::{node.op_type}" if node.domain else node.op_type] += 1
    return dict(sorted(counts.items()))


def passes(
    state: RunState, rules: list[Rule], options: Options, final_inference: bool = True
) -> ir.passes.Sequential:
    """The pipeline's passes, in order, sharing ``state``."""
    limits = options.limits()
    # What the target cannot run, on the model as normalized and as left at the end.
    measured = [CoveragePass(state, options.target)] if options.target is not None else []
    return ir.passes.Sequential(
        NormalizePass(state),
        *measured,
        *(RewritePass(state, phase, rules, limits) for phase in PHASES),
        FoldPass(state),
        CleanupPass(infer=final_inference, keeps_qdq_units=state.keeps_qdq_units),
        *measured,
    )


def optimize(
    model: ir.Model,
    rules: list[Rule],
    options: Options | None = None,
    inferred: InferredTypes | None = None,
    final_inference: bool = True,
) -> Report:
    """Optimize ``model`` in place with ``rules``; return what happened. ``inferred``:
    onnx's inference of the model's types as loaded (``load_model_and_types``), if the
    model is unchanged since. ``final_inference``: False leaves the last shape inference
    to the caller (``save_model(..., infer=True)`` makes it on the protobuf it writes)."""
    if not isinstance(model, ir.Model):
        raise OnnxfuseError(
            f"optimize runs on an onnx_ir.Model, not {type(model).__name__} "
            "(onnxfuse.optimize and OptimizePass also take an onnx.ModelProto)"
        )
    options = options or Options()
    started = time.perf_counter()
    report = Report(nodes_before=count_nodes(model), ops_before=op_histogram(model))
    report.rules = {rule.name: RuleStats() for rule in rules}
    report.repairs = list(model.meta.get(REPAIRS_META, ()))  # made when it was read
    report.trace = [] if options.trace else None
    adopt_ir4_initializers(model)  # before the interface is read: those inputs go
    interface = _interface(model)
    if options.dequantize:
        check_dequantize(options.target)
    state = RunState(
        report,
        NameSource(model),
        MatcherCache(options.target),
        options.fold_limit_bytes,
        inferred,
        options.dequantize,
    )
    try:
        passes(state, rules, options, final_inference)(model)
    except ir.passes.PassError as exc:
        # A user's error inside a pass is still one line: not onnx_ir's wrapper.
        cause = exc.__cause__
        while isinstance(cause, ir.passes.PassError) and cause.__cause__ is not None:
            cause = cause.__cause__
        if isinstance(cause, OnnxfuseError):
            raise cause from None
        raise
    _restore_interface(model, interface)
    if not options.provenance:
        strip_provenance(list(all_graphs(model)))
    report.folded = state.require_folder().folded
    report.nodes_after = count_nodes(model)
    report.ops_after = op_histogram(model)
    report.seconds = time.perf_counter() - started
    return report


class OptimizePass(ir.passes.InPlacePass):
    """The whole pipeline as one onnx_ir pass; the last run's Report is ``self.report``.

    Called on an ``onnx_ir.Model`` it optimizes it in place and returns a PassResult,
    as every onnx_ir pass does; called on an ``onnx.ModelProto`` it returns a new,
    optimized ModelProto and leaves the argument as it was (as ``onnxfuse.optimize``).
    """

    def __init__(self, rules: list[Rule], options: Options | None = None):
        super().__init__()
        self.rules = rules
        self.options = options
        self.report: Report | None = None

    @overload
    def __call__(self, model_or_result: onnx.ModelProto, /) -> onnx.ModelProto: ...

    @overload
    def __call__(
        self, model_or_result: ir.Model | ir.passes.PassResult, /
    ) -> ir.passes.PassResult: ...

    def __call__(self, model_or_result, /):
        if isinstance(model_or_result, onnx.ModelProto):
            model = ir.from_proto(model_or_result)  # a copy: the argument is not touched
            super().__call__(model)
            return ir.to_proto(model)
        if not isinstance(model_or_result, (ir.Model, ir.passes.PassResult)):
            raise OnnxfuseError(
                f"OptimizePass runs on an onnx_ir.Model or an onnx.ModelProto, "
                f"not {type(model_or_result).__name__}"
            )
        return super().__call__(model_or_result)

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        self.report = optimize(model, self.rules, self.options)
        return ir.passes.PassResult(model, modified=self.report.rewrites + self.report.folded > 0)


@dataclass
class _Interface:
    inputs: list[tuple[str, ir.TypeProtocol | None, ir.Shape | None]]
    outputs: list[tuple[str, ir.TypeProtocol | None, ir.Shape | None]]


def _interface(model: ir.Model) -> _Interface:
    def describe(
        values: list[ir.Value],
    ) -> list[tuple[str, ir.TypeProtocol | None, ir.Shape | None]]:
        return [(v.name or "", v.type, v.shape) for v in values]

    return _Interface(describe(list(model.graph.inputs)), describe(list(model.graph.outputs)))


def _restore_interface(model: ir.Model, before: _Interface) -> None:
    """Graph inputs and outputs keep their names, types and shapes."""
    for kind, values, expected in (
        ("input", model.graph.inputs, before.inputs),
        ("output", model.graph.outputs, before.outputs),
    ):
        if [v.name for v in values] != [name for name, _, _ in expected]:
            raise InvariantError(f"graph {kind} names changed during optimization")
        for value, (_, value_type, shape) in zip(values, expected):
            value.type = value_type
            value.shape = shape
