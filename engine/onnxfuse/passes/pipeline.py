"""The optimization pipeline: normalize, rewrite to a fixpoint, clean up, check."""

from __future__ import annotations

import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field

import onnx_ir as ir
import onnx_ir.passes.common as common_passes

from onnxfuse.errors import InvariantError
from onnxfuse.fold.folder import DEFAULT_FOLD_LIMIT_BYTES, FoldContext, Folder
from onnxfuse.graph.names import NameSource, all_graphs, region_hash, subgraphs
from onnxfuse.language.rule import PHASES, Rule
from onnxfuse.ops.inference import InferredTypes, infer_shapes
from onnxfuse.rewrite.apply import Blocked, apply_match, fold_and_type
from onnxfuse.rewrite.matcher import Match, Matcher, ModelContext, StructureMemo
from onnxfuse.targets.capabilities import Target

DEFAULT_MAX_ITERATIONS = 10


@dataclass
class RuleStats:
    matched: int = 0
    applied: int = 0
    seconds: float = 0.0


@dataclass
class Report:
    nodes_before: int = 0
    nodes_after: int = 0
    iterations: int = 0
    rewrites: int = 0
    folded: int = 0
    seconds: float = 0.0
    stopped: str | None = None
    rules: dict[str, RuleStats] = field(default_factory=dict)
    ops_before: dict[str, int] = field(default_factory=dict)
    ops_after: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, object]:
        return {
            "nodes_before": self.nodes_before,
            "nodes_after": self.nodes_after,
            "iterations": self.iterations,
            "rewrites": self.rewrites,
            "folded": self.folded,
            "seconds": round(self.seconds, 6),
            "stopped": self.stopped,
            "rules": {
                name: {
                    "matched": s.matched,
                    "applied": s.applied,
                    "seconds": round(s.seconds, 6),
                }
                for name, s in self.rules.items()
            },
            "ops_before": self.ops_before,
            "ops_after": self.ops_after,
        }


@dataclass
class Options:
    target: Target | None = None  # None: no gating (every op allowed)
    max_iterations: int = DEFAULT_MAX_ITERATIONS
    max_rewrites: int | None = None  # default: 5 per node of the input, at least 1,000
    fold_limit_bytes: int = DEFAULT_FOLD_LIMIT_BYTES
    progress: Callable[[str], None] | None = None


def count_nodes(model: ir.Model) -> int:
    return sum(len(graph) for graph in all_graphs(model))


def op_histogram(model: ir.Model) -> dict[str, int]:
    counts: Counter[str] = Counter()
    for graph in all_graphs(model):
        for node in graph:
            counts[f"{node.domain}::{node.op_type}" if node.domain else node.op_type] += 1
    return dict(sorted(counts.items()))


def order_rules(rules: list[Rule]) -> list[Rule]:
    """Deterministic priority: higher benefit first, then the order rules were given."""
    return [r for _, r in sorted(enumerate(rules), key=lambda p: (-p[1].benefit, p[0]))]


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
    options = options or Options()
    started = time.perf_counter()
    report = Report(nodes_before=count_nodes(model), ops_before=op_histogram(model))
    report.rules = {rule.name: RuleStats() for rule in rules}
    _adopt_ir4_initializers(model)
    interface = _interface(model)
    names = NameSource(model)
    folder = normalize(model, names, options.fold_limit_bytes, inferred)

    # Phases run in order, each to its own fixpoint (layout after fusion).
    matchers = _Matchers(options.target)
    for phase in PHASES:
        phase_rules = [r for r in rules if r.runs_in(phase)]
        if phase_rules and not report.stopped:
            driver = _Driver(model, order_rules(phase_rules), options, report, names, folder)
            driver.run(matchers)

    for graph in all_graphs(model):
        folder.fold_graph(graph)
    _cleanup(model, final_inference)
    _restore_interface(model, interface)
    report.folded = folder.folded
    report.nodes_after = count_nodes(model)
    report.ops_after = op_histogram(model)
    report.seconds = time.perf_counter() - started
    return report


class _Matchers:
    """One matcher per rule and model context, reused by every fixpoint pass and phase
    (a matcher keeps only per-pattern caches and the last failure between matches)."""

    def __init__(self, target: Target | None):
        self.target = target
        self._made: dict[tuple[int, int, tuple[tuple[str, int], ...]], Matcher] = {}
        self._rules: list[Rule] = []  # keeps the ids in the keys alive

    def get(self, rule: Rule, context: ModelContext) -> Matcher:
        key = (id(rule), context.ir_version, tuple(sorted(context.opsets.items())))
        found = self._made.get(key)
        if found is None:
            found = self._made[key] = Matcher(rule, context, self.target)
            self._rules.append(rule)
        return found


class _Driver:
    """Worklist fixpoint over every graph and function of a model."""

    def __init__(
        self,
        model: ir.Model,
        rules: list[Rule],
        options: Options,
        report: Report,
        names: NameSource,
        folder: Folder,
    ):
        self.model = model
        self.options = options
        self.report = report
        self.names = names
        self.folder = folder
        self.by_anchor: dict[tuple[str, str], list[Rule]] = {}
        params = options.target.params if options.target is not None else {}
        for rule in rules:
            if rule.refused_by(params) is not None:
                continue  # a layout or block-size rule of another target configuration
            for key in sorted(rule.anchor_keys):
                self.by_anchor.setdefault(key, []).append(rule)
        self.max_rewrites = options.max_rewrites or max(1_000, 5 * report.nodes_before)
        self.signatures: set[tuple[object, ...]] = set()
        # Deep enough to see a whole source or target pattern below its inputs.
        self.region_depth = 1 + max(
            (len(p.nodes) for r in rules for p in (*r.sources, r.target)), default=1
        )
        self.states: dict[int, int] = {}  # structural hash -> position in history
        self.history: list[str] = []
        self.last_progress = time.perf_counter()
        self._owners: dict[int, tuple[ir.Graph, ir.Function]] | None = None

    def run(self, matchers: _Matchers | None = None) -> None:
        if not self.by_anchor:
            return
        matchers = matchers or _Matchers(self.options.target)
        for iteration in range(1, self.options.max_iterations + 1):
            self.report.iterations = iteration
            changed = False
            for graph, context in self._graphs():
                changed |= self._fixpoint(graph, context, matchers)
                if self.report.stopped:
                    return
            if not changed:
                return
        self.report.stopped = (
            f"iteration cap reached ({self.options.max_iterations}); "
            "the result is valid but may not be a fixpoint"
        )

    def _graphs(self) -> list[tuple[ir.Graph, ModelContext]]:
        ir_version = self.model.ir_version or 10
        main = ModelContext(ir_version, dict(self.model.opset_imports))
        found = [(self.model.graph, main)]
        found.extend((g, main) for g in subgraphs(self.model.graph))
        for function in self.model.functions.values():
            context = ModelContext(ir_version, dict(function.opset_imports))
            found.append((function.graph, context))
            found.extend((g, context) for g in subgraphs(function.graph))
        return found

    def _fixpoint(self, graph: ir.Graph, context: ModelContext, made: _Matchers) -> bool:
        matchers: dict[int, Matcher] = {}  # on first use: most rules never meet their anchor
        queue: deque[ir.Node] = deque(graph)
        queued = {id(n) for n in queue}
        changed = False
        while queue:
            node = queue.popleft()
            queued.discard(id(node))
            if node.graph is not graph:
                continue
            structures: StructureMemo = {}  # shared by the rules tried here (no rewrite yet)
            for rule in self.by_anchor.get((node.domain, node.op_type), ()):
                matcher = matchers.get(id(rule))
                if matcher is None:
                    matcher = matchers[id(rule)] = made.get(rule, context)
                if not matcher.could_match(node, structures):
                    continue  # match() would fail too
                stats = self.report.rules[rule.name]
                started = time.perf_counter()
                match = matcher.match(node)
                if match is None:
                    stats.seconds += time.perf_counter() - started
                    continue
                stats.matched += 1
                created = self._apply(match, context)
                stats.seconds += time.perf_counter() - started
                if created is None:
                    continue
                stats.applied += 1
                changed = True
                if self.report.stopped:
                    return changed
                for touched in self._neighbourhood(created, match):
                    if id(touched) not in queued and touched.graph is graph:
                        queue.append(touched)
                        queued.add(id(touched))
                break
            self._show_progress(len(queue))
        return changed

    def _apply(self, match: Match, context: ModelContext) -> list[ir.Node] | None:
        signature = match.signature()
        state = None
        if signature in self.signatures:
            # The same rule on the same inputs again: progress (a chain shrinking)
            # or a cycle. A local state seen before, in a graph of the same size,
            # proves a cycle (a shrinking chain looks the same locally).
            roots = [v for v in match.values.values() if v is not None]
            graph = match.nodes[0].graph
            size = len(graph) if graph is not None else 0
            state = hash((signature, size, region_hash(roots, self.region_depth)))
            if state in self.states:
                involved = sorted(set(self.history[self.states[state] :]))
                self.report.stopped = (
                    "rules oscillate (they undo each other's rewrites): " + ", ".join(involved)
                )
                return None
        if self.report.rewrites >= self.max_rewrites:
            self.report.stopped = f"rewrite cap reached ({self.max_rewrites})"
            return None
        try:
            created = apply_match(match, context, self.names)
        except Blocked:
            return None  # nothing changed: not part of any cycle
        self.history.append(match.rule.name)
        self.signatures.add(signature)
        if state is not None:
            self.states[state] = len(self.history) - 1
        self._add_opset_imports(match.rule, created)
        self.report.rewrites += 1
        return fold_and_type(created, context, self.folder.fold_nodes)

    def _add_opset_imports(self, rule: Rule, created: list[ir.Node]) -> None:
        owner = self._owner(created[0].graph) if created else None
        for node in created:
            version = self.model.opset_imports.setdefault(
                node.domain, rule.imports.get(node.domain, 1)
            )
            # A function body needs its own import, even when the model already has one.
            if owner is not None:
                owner.opset_imports.setdefault(node.domain, version)

    def _owner(self, graph: ir.Graph | None) -> ir.Function | None:
        """The function whose body holds ``graph`` (None: the main graph or its subgraphs).
        Found once per driver, not per rewrite: rewrites create no graphs."""
        if self._owners is None:
            self._owners = {}
            for function in self.model.functions.values():
                for g in (function.graph, *subgraphs(function.graph)):
                    self._owners.setdefault(id(g), (g, function))
        found = self._owners.get(id(graph))
        return found[1] if found is not None and found[0] is graph else None

    def _neighbourhood(self, created: list[ir.Node], match: Match) -> list[ir.Node]:
        """Nodes whose matches a rewrite may have changed."""
        touched: list[ir.Node] = list(created)
        frontier = [o for n in created for o in n.outputs]
        # A bound value computed by the graph may have lost a consumer, which can unblock
        # a match that treats it as an intermediate. Constants and graph inputs are never
        # intermediates: re-queueing their consumers (every layer's use of a shared epsilon
        # or mask) would make each rewrite cost time in the size of the graph.
        frontier.extend(
            v
            for v in match.values.values()
            if v is not None and (p := v.producer()) is not None and p.op_type != "Constant"
        )
        for value in frontier:
            producer = value.producer()
            if producer is not None:
                touched.append(producer)
            touched.extend(value.consumers())
        # Patterns anchored further down may now reach the new nodes.
        for _ in range(2):
            next_level = [c for n in touched for o in n.outputs for c in o.consumers()]
            touched.extend(next_level)
        return touched

    def _show_progress(self, pending: int) -> None:
        if self.options.progress is None:
            return
        now = time.perf_counter()
        if now - self.last_progress >= 2.0:
            self.last_progress = now
            self.options.progress(
                f"rewriting: {self.report.rewrites} rewrites, {pending} nodes queued"
            )


def _adopt_ir4_initializers(model: ir.Model) -> None:
    """IR < 4 lists every initializer as a graph input, by convention only: those
    are constants. Drop them from the inputs and write IR 4, where an initializer
    that is also an input would be an overridable default instead."""
    if (model.ir_version or 10) >= 4:
        return
    common_passes.RemoveInitializersFromInputsPass()(model)
    model.ir_version = 4
    # Typed as the input was declared (maybe loosely, ["N", 3]): a constant's type and
    # shape are its tensor's, as loading the protobuf made IR 4 gives them.
    for graph in all_graphs(model):
        for value in graph.initializers.values():
            tensor = value.const_value
            if tensor is not None:
                value.type = ir.TensorType(tensor.dtype)
                value.shape = tensor.shape


def normalize(
    model: ir.Model,
    names: NameSource | None = None,
    fold_limit_bytes: int = DEFAULT_FOLD_LIMIT_BYTES,
    inferred: InferredTypes | None = None,
) -> Folder:
    """Constants as initializers, constant subgraphs folded, shapes inferred
    (``inferred``: onnx's inference of the model as loaded, if unchanged since)."""
    _adopt_ir4_initializers(model)
    _LiftConstants(lift_all_constants=True, size_limit=0)(model)
    _small_constants_in_memory(model)
    infer_shapes(model, inferred)
    function_graphs = frozenset(
        id(g)
        for function in model.functions.values()
        for g in (function.graph, *subgraphs(function.graph))
    )
    folder = Folder(
        FoldContext(model.ir_version or 10, dict(model.opset_imports), fold_limit_bytes),
        names or NameSource(model),
        function_graphs,
    )
    for graph in all_graphs(model):
        folder.fold_graph(graph)
    # Rules then see one node where exporters wrote the same computation twice.
    _merge_duplicates(model)
    # No second inference here: folded values are initializers with exact shapes.
    return folder


# Constants this small are read again and again by guards (shape arithmetic, axes).
_SMALL_CONSTANT_ELEMENTS = 64
_PLAIN_DTYPES = frozenset(
    ir.DataType[name]
    for name in (
        "FLOAT",
        "DOUBLE",
        "FLOAT16",
        "BOOL",
        "INT8",
        "INT16",
        "INT32",
        "INT64",
        "UINT8",
        "UINT16",
        "UINT32",
        "UINT64",
    )
)


def _small_constants_in_memory(model: ir.Model) -> None:
    """Small initializers still backed by their protobuf become plain arrays: reading a
    protobuf tensor decodes it anew each time (~50 us), and guards read the same shape
    constants at every candidate node (BERT-base legacy: ~1,000 reads)."""
    for graph in all_graphs(model):
        for value in graph.initializers.values():
            tensor = value.const_value
            if (
                type(tensor) is ir.serde.TensorProtoTensor
                and tensor.size <= _SMALL_CONSTANT_ELEMENTS
                and tensor.dtype in _PLAIN_DTYPES
            ):
                value.const_value = ir.Tensor(
                    tensor.numpy(),
                    name=tensor.name,
                    doc_string=tensor.doc_string,
                    metadata_props=dict(tensor.metadata_props),
                )


class _LiftConstants(common_passes.LiftConstantsToInitializersPass):
    """onnx_ir's pass, without a runtime Protocol check per Constant: a TENSOR attribute
    holds a tensor (the IR's own invariant), and the check cost 0.1-0.2 ms each (BERT's
    297 Constants: ~30 ms)."""

    def _constant_node_attribute_to_tensor(
        self, node: ir.Node, attr_name: str, attr_value: ir.Attr, initializer_name: str
    ) -> ir.TensorProtocol | None:
        if attr_name == "value" and attr_value.type == ir.AttributeType.TENSOR:
            tensor = attr_value.value
            return tensor if tensor.size >= self.size_limit else None
        return super()._constant_node_attribute_to_tensor(
            node, attr_name, attr_value, initializer_name
        )


def _merge_duplicates(model: ir.Model) -> None:
    """Equal small initializers first, so that CSE sees their users as equal."""
    common_passes.DeduplicateInitializersPass()(model)
    common_passes.CommonSubexpressionEliminationPass()(model)


def _cleanup(model: ir.Model, infer: bool) -> None:
    common_passes.RemoveUnusedNodesPass()(model)
    _merge_duplicates(model)
    common_passes.RemoveUnusedNodesPass()(model)
    common_passes.RemoveUnusedOpsetsPass()(model)
    common_passes.TopologicalSortPass()(model)
    if infer:
        infer_shapes(model)  # through onnxruntime's ai.onnx extension ops too


@dataclass
class _Interface:
    inputs: list[tuple[str, object, object]]
    outputs: list[tuple[str, object, object]]


def _interface(model: ir.Model) -> _Interface:
    def describe(values: list[ir.Value]) -> list[tuple[str, object, object]]:
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
