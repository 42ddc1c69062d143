"""The fixpoint driver: a worklist over every graph, rules dispatched by anchor op.

Each node is looked up by (domain, op type) among the rules that can anchor there;
a cheap structure pre-check rejects most of them, the matcher tries the rest in
priority order, and the first match that applies is rewritten. After a rewrite only
its neighbourhood is queued again. A firing seen twice on an unchanged region is an
oscillation; caps on iterations and rewrites bound the rest (``StopReason``).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import onnx_ir as ir

from onnxfuse.fold.folder import Folder
from onnxfuse.graph.names import NameSource, node_label, region_hash
from onnxfuse.graph.traversal import owned_graphs
from onnxfuse.language.rule import Rule
from onnxfuse.rewrite.apply import (
    Blocked,
    IllTyped,
    apply_match,
    fold_and_type,
    removable_unused,
)
from onnxfuse.rewrite.conditions import RuleMatcher
from onnxfuse.rewrite.matcher import Match, ModelContext, StructureMemo
from onnxfuse.rewrite.report import Report, StopKind, StopReason, TraceStep
from onnxfuse.targets.capabilities import Target
from onnxfuse.targets.profile import Profile, match_facts

DEFAULT_MAX_ITERATIONS = 10


@dataclass(frozen=True)
class Limits:
    """What bounds a run: the target gating it, its caps, where progress is shown."""

    target: Target | None = None  # None: no gating (every op allowed)
    max_iterations: int = DEFAULT_MAX_ITERATIONS
    max_rewrites: int | None = None  # default: 5 per node of the input, at least 1,000
    progress: Callable[[str], None] | None = None
    # Called with each match about to be rewritten (calibration collects them there).
    observe: Callable[[Match], None] | None = None
    # False: rules fire whatever the target's profile says or lacks (the proofs check
    # numerics, calibration times the rules a profile would skip).
    gate_by_profile: bool = True


def order_rules(rules: list[Rule]) -> list[Rule]:
    """Deterministic priority: higher benefit first, then the order rules were given."""
    return [r for _, r in sorted(enumerate(rules), key=lambda p: (-p[1].benefit, p[0]))]


def _remove_dead_nodes(graph: ir.Graph) -> None:
    """Remove the nodes none of whose outputs is used (consumers first), so that the next
    pass over the graph does not see their reads as uses outside a match: a computation a
    rewrite or a fold left behind (a Shape whose result was folded) would otherwise block
    the fusions of the values it reads until the final cleanup. Nodes with subgraphs
    stay for the cleanup."""
    for node in reversed(list(graph)):
        if removable_unused(node):
            graph.remove(node, safe=True)


def _step(
    match: Match, anchor: ir.Node, created: list[ir.Node], left: list[ir.Node], main: ir.Graph
) -> TraceStep:
    """A rewrite as the trace shows it; the nodes of the match a ``keep`` left in the graph
    are not replaced."""
    graph = created[0].graph if created else None
    return TraceStep(
        rule=match.rule.name,
        anchor=node_label(anchor),
        replaced=tuple(node_label(n) for n in match.nodes if n.graph is None),
        created=tuple(node_label(n) for n in left),
        folded=len(created) - len(left),
        graph="" if graph is None or graph is main else (graph.name or "<subgraph>"),
    )


class MatcherCache:
    """One matcher per rule and model context, reused by every fixpoint pass and phase
    (a matcher keeps only per-pattern caches, the target's verdicts and the last
    mismatch between matches)."""

    def __init__(self, target: Target | None):
        self.target = target
        self._made: dict[tuple[int, int, tuple[tuple[str, int], ...]], RuleMatcher] = {}
        self._rules: list[Rule] = []  # keeps the ids in the keys alive

    def get(self, rule: Rule, context: ModelContext) -> RuleMatcher:
        key = (id(rule), context.ir_version, tuple(sorted(context.opsets.items())))
        found = self._made.get(key)
        if found is None:
            found = self._made[key] = RuleMatcher(rule, context, self.target)
            self._rules.append(rule)
        return found


class Driver:
    """Worklist fixpoint over every graph and function of a model."""

    def __init__(
        self,
        model: ir.Model,
        rules: list[Rule],
        limits: Limits,
        report: Report,
        names: NameSource,
        folder: Folder,
    ):
        self.model = model
        self.limits = limits
        self.report = report
        self.names = names
        self.folder = folder
        self.by_anchor: dict[tuple[str, str], list[Rule]] = {}
        params = limits.target.params if limits.target is not None else {}
        for rule in rules:
            if rule.refused_by(params) is not None:
                continue  # a layout or block-size rule of another target configuration
            for key in sorted(rule.anchor_keys):
                self.by_anchor.setdefault(key, []).append(rule)
        self.max_rewrites = limits.max_rewrites or max(1_000, 5 * report.nodes_before)
        self.signatures: set[tuple[object, ...]] = set()
        # Deep enough to see a whole source or replacement pattern below its inputs.
        self.region_depth = 1 + max(
            (len(p.nodes) for r in rules for p in (*r.sources, r.replacement)), default=1
        )
        self.states: dict[int, int] = {}  # structural hash -> position in history
        self.history: list[str] = []
        self.blocked_at: dict[tuple[str, int], ir.Node] = {}
        self.last_progress = time.perf_counter()
        self._owners: dict[int, tuple[ir.Graph, ir.Function]] | None = None

    def run(self, matchers: MatcherCache | None = None) -> None:
        if not self.by_anchor:
            return
        matchers = matchers or MatcherCache(self.limits.target)
        for iteration in range(1, self.limits.max_iterations + 1):
            self.report.iterations = iteration
            changed = False
            for graph, context in self._graphs():
                if iteration > 1:
                    _remove_dead_nodes(graph)
                changed |= self._fixpoint(graph, context, matchers)
                if self.report.stopped:
                    return
            if not changed:
                return
        self.report.stopped = StopReason(StopKind.ITERATION_CAP, self.limits.max_iterations)

    def _graphs(self) -> list[tuple[ir.Graph, ModelContext]]:
        ir_version = self.model.ir_version or 10
        return [(g, ModelContext(ir_version, opsets)) for g, opsets, _ in owned_graphs(self.model)]

    def _fixpoint(self, graph: ir.Graph, context: ModelContext, made: MatcherCache) -> bool:
        matchers: dict[int, RuleMatcher] = {}  # on first use: most rules never meet their anchor
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
                    refused = matcher.mismatch
                    if refused is not None and refused.blocks:
                        self._block(rule, node, refused.reason)
                    continue
                stats.matched += 1
                created = self._apply(match, context, node)
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

    def _apply(self, match: Match, context: ModelContext, anchor: ir.Node) -> list[ir.Node] | None:
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
                self.report.stopped = StopReason(StopKind.OSCILLATION, rules=tuple(involved))
                return None
        if self.report.rewrites >= self.max_rewrites:
            self.report.stopped = StopReason(StopKind.REWRITE_CAP, self.max_rewrites)
            return None
        try:
            skipped = self._not_paying(match)
            if skipped is not None:
                raise Blocked(skipped)
            if self.limits.observe is not None:
                self.limits.observe(match)
            created = apply_match(match, context, self.names)
        except Blocked as exc:
            self._block(match.rule, match.nodes[0], str(exc))
            if isinstance(exc, IllTyped):
                stats = self.report.rules[match.rule.name]
                stats.ill_typed = stats.ill_typed or str(exc)
            return None  # nothing changed: not part of any cycle
        self.history.append(match.rule.name)
        self.signatures.add(signature)
        if state is not None:
            self.states[state] = len(self.history) - 1
        self._add_opset_imports(match.rule, created)
        self.report.rewrites += 1
        left = fold_and_type(created, context, self.folder)
        if self.report.trace is not None:
            self.report.trace.append(_step(match, anchor, created, left, self.model.graph))
        return left

    def _block(self, rule: Rule, node: ir.Node, reason: str) -> None:
        """Count a rewrite left undone, once per rule and node however often the node is
        tried again (every fixpoint pass tries it)."""
        key = (rule.name, id(node))
        if key in self.blocked_at:
            return
        self.blocked_at[key] = node  # kept alive: its id names no other node
        stats = self.report.rules[rule.name]
        stats.blocked += 1
        stats.blocked_reason = stats.blocked_reason or reason

    def _not_paying(self, match: Match) -> str | None:
        """Why the target's profile says this rewrite does not pay (measured slower, or
        not measured for a rule that needs a measurement there), or None."""
        target, rule = self.limits.target, match.rule
        if target is None or not self.limits.gate_by_profile:
            return None
        profile = target.params.get("profile")
        needs = target.name in rule.needs_profile
        if not isinstance(profile, Profile):
            if needs:
                return (
                    f"on '{target.name}' it fires only where a target profile measured it "
                    "faster (onnxfuse targets calibrate)"
                )
            return None
        alternative = next(i for i, s in enumerate(rule.sources) if s is match.source)
        facts = match_facts(match.values, match.source.input_names())
        measured = profile.lookup(rule.name, alternative, facts)
        if measured is None:
            return f"not measured in the profile {profile}" if needs else None
        return f"{measured.verdict()} (profile {profile})" if measured.slower else None

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
            self._owners = {id(g): (g, f) for g, _, f in owned_graphs(self.model) if f is not None}
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
        if self.limits.progress is None:
            return
        now = time.perf_counter()
        if now - self.last_progress >= 2.0:
            self.last_progress = now
            self.limits.progress(
                f"rewriting: {self.report.rewrites} rewrites, {pending} nodes queued"
            )
