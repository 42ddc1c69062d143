"""Matching a rule's source patterns at a graph node: structure only.

The matcher anchors a pattern on the producer of its first output and walks
backwards through producers; pattern roots not reached that way are found
among the consumers of values already bound. Commutative inputs are tried in
every order by backtracking, so a rule is never copied per input order. It
yields each structural match (op types, attributes, constants, the safety rule
on intermediates); guards, lets and the target's capabilities are the job of
``conditions``. Why nothing matched is a ``Mismatch``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx_ir as ir

from onnxfuse.language.guards import constant_tensor
from onnxfuse.language.pattern import AttrLiteral, AttrRef, Pattern, PatternNode, PatternValue
from onnxfuse.language.rule import Rule
from onnxfuse.ops import schemas

# Marks an attribute bound by the pattern but absent on the node, without a default.
ABSENT = type("Absent", (), {"__repr__": lambda self: "<absent>"})()

# Relative tolerance for constants, by element type, when a rule names none.
_CONSTANT_RTOL = {
    ir.DataType.FLOAT: 1e-6,
    ir.DataType.FLOAT16: 1e-3,
    ir.DataType.BFLOAT16: 1e-2,
    ir.DataType.DOUBLE: 1e-12,
}

# could_match's memo: (pattern structure number, id(graph node)) -> whether it fits.
StructureMemo = dict[tuple[int, int], bool]


@dataclass(frozen=True)
class ModelContext:
    """What matching needs to know about the model around a graph."""

    ir_version: int
    opsets: dict[str, int]

    def opset(self, domain: str) -> int:
        return self.opsets.get(domain, 1)


@dataclass(frozen=True, order=True)
class Rank:
    """How far a match got before it failed: whole-match checks (the safety rule,
    guards, lets, the target) rank after every structural failure, and a structural
    failure that matched more nodes, then bound more values, ranks higher."""

    whole_match: bool = False
    nodes: int = 0
    values: int = 0


@dataclass
class Mismatch:
    """Why a rule did not match at a node: the failure that got furthest (``rank``)."""

    said: str | Callable[[], str]  # a callable: the message is built only when read
    rank: Rank = Rank()
    # The whole pattern matched, but the rewrite may not be made here: the target cannot
    # run what it creates, or an intermediate is used outside the match.
    blocks: bool = False

    @property
    def reason(self) -> str:
        if not isinstance(self.said, str):
            self.said = self.said()
        return self.said

    def __str__(self) -> str:
        return self.reason


_WHOLE_MATCH = Rank(whole_match=True)


@dataclass
class _State:
    nodes: dict[int, ir.Node] = field(default_factory=dict)
    claimed: dict[int, int] = field(default_factory=dict)  # id(ir.Node) -> pattern index
    values: dict[str, ir.Value | None] = field(default_factory=dict)
    attrs: dict[str, Any] = field(default_factory=dict)

    def copy(self) -> _State:
        return _State(dict(self.nodes), dict(self.claimed), dict(self.values), dict(self.attrs))


@dataclass
class Match:
    rule: Rule
    source: Pattern
    nodes: list[ir.Node]
    values: dict[str, ir.Value | None]
    attrs: dict[str, Any]
    outputs: list[ir.Value]
    copied: dict[str, dict[str, ir.Attr]] = field(default_factory=dict)

    def signature(self) -> tuple[Any, ...]:
        """Identifies a firing by its rule and what it consumed, to detect oscillation."""
        bound = tuple(id(self.values[name]) for name in self.source.input_names())
        attrs = tuple(sorted((k, repr(v)) for k, v in self.attrs.items()))
        return (self.rule.name, bound, attrs)


class Matcher:
    """Finds the structural matches of one rule; ``mismatch`` says why the last search
    found none that was accepted."""

    def __init__(self, rule: Rule, context: ModelContext):
        self.rule = rule
        self.context = context
        self.mismatch: Mismatch | None = None
        self._rank = Rank()
        self._anchors = [source.anchor for source in rule.sources]
        # Pattern nodes that accept any further attributes, which the target copies.
        self.open_nodes: dict[int, str] = {}
        for source_name, target_name in rule.copy_attributes.items():
            for source in rule.sources:
                producer = source.values[source_name].producer
                assert producer is not None
                self.open_nodes[id(producer)] = target_name

    def _fail(self, reason: str | Callable[[], str], blocks: bool = False) -> None:
        # Keep the failure that got furthest into the pattern: the informative one.
        # Hot paths pass a callable: the message is built only when it is kept, and at
        # once (the callables read loop variables).
        if self.mismatch is None or self._rank > self.mismatch.rank:
            self.mismatch = Mismatch(
                reason if isinstance(reason, str) else reason(), self._rank, blocks
            )

    def refuse(self, reason: str | Callable[[], str], blocks: bool = False) -> None:
        """A structural match that a condition refused (a guard, a let, the target);
        a callable ``reason`` is called only if the message is read."""
        self._rank = _WHOLE_MATCH
        if self.mismatch is None or self._rank > self.mismatch.rank:
            self.mismatch = Mismatch(reason, self._rank, blocks)

    def _advance(self, state: _State) -> None:
        self._rank = Rank(False, len(state.nodes), len(state.values))

    def opset_allows(self) -> bool:
        for domain, (low, high) in self.rule.opset.items():
            version = self.context.opsets.get(domain)
            if version is None:
                self._fail(f"model does not import domain '{domain or 'ai.onnx'}'")
                return False
            if (low is not None and version < low) or (high is not None and version > high):
                self._fail(
                    f"model opset {version} for '{domain or 'ai.onnx'}' is outside "
                    f"[{low}, {high if high is not None else '∞'}]"
                )
                return False
        return True

    def could_match(self, node: ir.Node, memo: StructureMemo | None = None) -> bool:
        """A cheap necessary condition for ``match(node)``: the op types, constants and
        output positions below some source's anchor are there, however variables bind.
        Most nodes a rule is tried on fail here; callers that need no failure message
        skip ``match`` for them. ``memo`` may be shared by the rules tried on one node
        while the graph does not change: equal pattern structures are checked once."""
        memo = {} if memo is None else memo
        return any(self._structure_fits(anchor, node, memo) for anchor in self._anchors)

    def _structure_fits(self, pnode: PatternNode, node: ir.Node, memo: StructureMemo) -> bool:
        # The hottest loop of a run (every rule at every node it anchors on): plain
        # loops, no generators.
        number, orders = pnode.structure
        seen = (number, id(node))
        found = memo.get(seen)
        if found is not None:
            return found
        found = False
        if node.op_type == pnode.op_type and node.domain == pnode.domain:
            inputs = node.inputs
            count = len(inputs)
            for order in orders:
                for position, producer_pattern, output_index in order:
                    value = inputs[position] if position < count else None
                    if value is None:
                        break
                    if producer_pattern is None:  # a constant
                        if constant_tensor(value, self.context.ir_version) is None:
                            break
                        continue
                    producer = value.producer()
                    if (
                        producer is None
                        or value.index() != output_index
                        or not self._structure_fits(producer_pattern, producer, memo)
                    ):
                        break
                else:
                    found = True
                    break
        memo[seen] = found
        return found

    def candidates(self, node: ir.Node) -> Iterator[Match]:
        """Each structural match anchored at ``node``, in backtracking order."""
        self.mismatch = None
        self._rank = Rank()
        if not self.opset_allows():
            return
        for source in self.rule.sources:
            if source.anchor.key != (node.domain, node.op_type):
                self._fail(f"anchor op is {source.anchor.op_type}, node is {node.op_type}")
                continue
            for state in self._match_node(source.anchor, node, _State(), node.graph):
                for complete in self._complete(source, state, node.graph):
                    found = self._accept(source, complete)
                    if found is not None:
                        yield found

    # -- structure -----------------------------------------------------------

    def _complete(self, source: Pattern, state: _State, graph: Any) -> Iterator[_State]:
        """Match pattern nodes not reachable backwards from the anchor (other roots)."""
        pending = next((p for p in source.nodes if p.index not in state.nodes), None)
        if pending is None:
            yield state
            return
        candidates: list[ir.Node] = []
        for pvalue in pending.inputs:
            bound = self._bound_graph_value(pvalue, state)
            if bound is None:
                continue
            for consumer in bound.consumers():
                if consumer not in candidates and id(consumer) not in state.claimed:
                    candidates.append(consumer)
        if not candidates:
            self._fail(f"no candidate for pattern node {pending.describe()}")
        for candidate in candidates:
            for extended in self._match_node(pending, candidate, state, graph):
                yield from self._complete(source, extended, graph)

    def _bound_graph_value(self, pvalue: PatternValue | None, state: _State) -> ir.Value | None:
        if pvalue is None:
            return None
        if pvalue.kind == "input":
            return state.values.get(pvalue.name)
        if pvalue.kind == "node" and pvalue.producer is not None:
            node = state.nodes.get(pvalue.producer.index)
            if node is not None and pvalue.output_index < len(node.outputs):
                return node.outputs[pvalue.output_index]
        return None

    def _match_node(
        self, pnode: PatternNode, node: ir.Node, state: _State, graph: Any
    ) -> Iterator[_State]:
        self._advance(state)
        if (node.domain, node.op_type) != pnode.key:
            self._fail(lambda: f"expected {pnode.describe()}, found {node.op_type} '{node.name}'")
            return
        if node.graph is not graph:
            self._fail(f"'{node.name}' is in another graph")
            return
        claimed = state.claimed.get(id(node))
        if claimed is not None:
            if claimed == pnode.index:
                yield state
            else:
                self._fail(f"'{node.name}' is already matched by another pattern node")
            return
        if pnode.index in state.nodes:
            self._fail(f"{pnode.describe()} is already matched to another node")
            return
        if len(node.outputs) < len([o for o in pnode.outputs if o is not None]):
            self._fail(f"'{node.name}' has fewer outputs than {pnode.describe()}")
            return
        state = state.copy()
        if not self._match_attributes(pnode, node, state):
            return
        state.nodes[pnode.index] = node
        state.claimed[id(node)] = pnode.index
        graph_inputs = list(node.inputs)
        width = max(len(pnode.inputs), len(graph_inputs))
        orders = pnode.input_orders
        if len(orders) > 1:
            # Try only the orders whose inputs could match at a glance; when none could,
            # the first one still runs, so the failure is reported where it happens.
            orders = [o for o in orders if self._plausible(o, graph_inputs)] or orders[:1]
        for order in orders:
            pairs: list[tuple[PatternValue | None, ir.Value | None, int]] = []
            for position in range(width):
                pvalue = order[position] if position < len(order) else None
                gvalue = graph_inputs[position] if position < len(graph_inputs) else None
                pairs.append((pvalue, gvalue, position))
            yield from self._match_pairs(pnode, pairs, state, graph)

    def _plausible(
        self, order: list[PatternValue | None], graph_inputs: Sequence[ir.Value | None]
    ) -> bool:
        """Whether each pattern input could match the graph input in its place (op types,
        constness and presence only): prunes input orders of commutative nodes cheaply."""
        for position, pvalue in enumerate(order):
            gvalue = graph_inputs[position] if position < len(graph_inputs) else None
            if pvalue is None or pvalue.kind == "input":
                continue
            if gvalue is None:
                return False
            if pvalue.kind == "constant":
                if constant_tensor(gvalue, self.context.ir_version) is None:
                    return False
                continue
            producer = gvalue.producer()
            assert pvalue.producer is not None
            if producer is None or (producer.domain, producer.op_type) != pvalue.producer.key:
                return False
        return True

    def _match_pairs(
        self,
        pnode: PatternNode,
        pairs: list[tuple[PatternValue | None, ir.Value | None, int]],
        state: _State,
        graph: Any,
    ) -> Iterator[_State]:
        if not pairs:
            yield state
            return
        (pvalue, gvalue, position), rest = pairs[0], pairs[1:]
        for next_state in self._match_value(pnode, position, pvalue, gvalue, state, graph):
            yield from self._match_pairs(pnode, rest, next_state, graph)

    def _match_value(
        self,
        pnode: PatternNode,
        position: int,
        pvalue: PatternValue | None,
        gvalue: ir.Value | None,
        state: _State,
        graph: Any,
    ) -> Iterator[_State]:

        def where() -> str:
            return f"input {position} of {pnode.describe()}"

        self._advance(state)
        if pvalue is None:
            if gvalue is None:
                yield state
            else:
                self._fail(
                    lambda: f"{where()}: pattern requires it absent, graph has '{gvalue.name}'"
                )
            return
        if pvalue.kind == "input":
            if gvalue is None and pvalue.name not in self.rule.optional:
                self._fail(
                    lambda: f"{where()}: absent in the graph, '{pvalue.name}' is not optional"
                )
                return
            if pvalue.name in state.values:
                if state.values[pvalue.name] is gvalue:
                    yield state
                else:
                    self._fail(lambda: f"{where()}: '{pvalue.name}' is bound to another value")
                return
            bound = state.copy()
            bound.values[pvalue.name] = gvalue
            yield bound
            return
        if gvalue is None:
            self._fail(lambda: f"{where()}: absent in the graph")
            return
        if pvalue.kind == "constant":
            if self._constant_matches(pvalue, gvalue, where):
                if pvalue.name in state.values:
                    yield state
                else:
                    bound = state.copy()
                    bound.values[pvalue.name] = gvalue  # guards may inspect it
                    yield bound
            return
        producer = gvalue.producer()
        if producer is None:
            self._fail(
                lambda: f"{where()}: '{gvalue.name}' has no producer (expected {pvalue.name})"
            )
            return
        assert pvalue.producer is not None
        if gvalue.index() != pvalue.output_index:
            self._fail(
                lambda: f"{where()}: '{gvalue.name}' is output {gvalue.index()} of its producer"
            )
            return
        yield from self._match_node(pvalue.producer, producer, state, graph)

    def _constant_matches(
        self, pvalue: PatternValue, gvalue: ir.Value, where: Callable[[], str]
    ) -> bool:
        tensor = constant_tensor(gvalue, self.context.ir_version)
        if tensor is None:
            self._fail(lambda: f"{where()}: '{gvalue.name}' is not a constant")
            return False
        expected = pvalue.constant
        assert expected is not None
        if pvalue.scalar or expected.size == 1:
            if tensor.size != 1:
                self._fail(lambda: f"{where()}: constant '{gvalue.name}' is not a scalar")
                return False
        elif tuple(tensor.shape) != expected.shape:
            self._fail(
                lambda: f"{where()}: constant '{gvalue.name}' has shape {tuple(tensor.shape)}"
            )
            return False
        actual = tensor.numpy()
        if actual.dtype.kind in "fc" or str(actual.dtype) == "bfloat16":
            rtol = self.rule.tolerance
            if rtol is None:
                rtol = _CONSTANT_RTOL.get(tensor.dtype, 1e-6)
            a = actual.astype(np.float64).reshape(expected.shape)
            e = expected.astype(np.float64)
            ok = bool(np.all((a == e) | (np.abs(a - e) <= rtol * np.abs(e))))
        else:
            ok = bool(np.array_equal(actual.reshape(expected.shape), expected))
        if not ok:
            self._fail(
                lambda: f"{where()}: constant '{gvalue.name}' differs from {expected.tolist()}"
            )
        return ok

    # -- attributes ----------------------------------------------------------

    def _match_attributes(self, pnode: PatternNode, node: ir.Node, state: _State) -> bool:
        opset = self.context.opset(node.domain)
        for name, spec in pnode.attributes.items():
            actual = _node_attribute(node, name, opset)
            if isinstance(spec, AttrLiteral):
                if actual is ABSENT or not attribute_equal(actual, spec.value):
                    self._fail(
                        f"{pnode.describe()}: attribute {name}={_show(actual)}, "
                        f"pattern wants {_show(spec.value)}"
                    )
                    return False
            elif isinstance(spec, AttrRef):
                if spec.var in state.attrs:
                    if not attribute_equal(state.attrs[spec.var], actual):
                        self._fail(f"{pnode.describe()}: attribute @{spec.var} bound differently")
                        return False
                else:
                    state.attrs[spec.var] = actual
        if id(pnode) in self.open_nodes:
            return True
        for name, attr in node.attributes.items():
            if name in pnode.attributes:
                continue
            default = schemas.attribute_default(node.domain, node.op_type, opset, name)
            if not schemas.has_default(default) or not attribute_equal(_attr_python(attr), default):
                self._fail(
                    f"{pnode.describe()}: attribute {name}={_show(_attr_python(attr))} "
                    "is not its default and the pattern does not name it"
                )
                return False
        return True

    # -- whole-match checks ----------------------------------------------------

    def _accept(self, source: Pattern, state: _State) -> Match | None:
        self._rank = _WHOLE_MATCH
        outputs: list[ir.Value] = []
        for pvalue in source.outputs:
            value = self._bound_graph_value(pvalue, state)
            assert value is not None
            outputs.append(value)
        if len({id(v) for v in outputs}) != len(outputs):
            self._fail("two pattern outputs are the same graph value")
            return None
        matched = {id(n) for n in state.nodes.values()}
        replaced = {id(v) for v in outputs}
        for name in source.input_names():
            value = state.values.get(name)
            producer = value.producer() if value is not None else None
            if producer is not None and id(producer) in matched:
                self._fail(f"variable '{name}' is bound to a value computed inside the match")
                return None
        # Kept intermediates may be used outside the match: their nodes stay for those uses.
        kept = {id(self._bound_graph_value(source.values[n], state)) for n in self.rule.keep}
        for node in state.nodes.values():
            for output in node.outputs:
                if id(output) in replaced or id(output) in kept:
                    continue
                if output.is_graph_output():
                    self._fail(f"intermediate '{output.name}' is a graph output", blocks=True)
                    return None
                for consumer in output.consumers():
                    if id(consumer) not in matched:
                        self._fail(
                            f"intermediate '{output.name}' is also used by "
                            f"{consumer.op_type} '{consumer.name}' outside the match",
                            blocks=True,
                        )
                        return None
        copied = {
            self.open_nodes[id(p)]: dict(state.nodes[p.index].attributes)
            for p in source.nodes
            if id(p) in self.open_nodes
        }
        ordered = [state.nodes[p.index] for p in source.nodes]
        return Match(
            self.rule, source, ordered, dict(state.values), dict(state.attrs), outputs, copied
        )


def _node_attribute(node: ir.Node, name: str, opset: int) -> Any:
    attr = node.attributes.get(name)
    if attr is not None:
        return _attr_python(attr)
    default = schemas.attribute_default(node.domain, node.op_type, opset, name)
    return default if schemas.has_default(default) else ABSENT


def _attr_python(attr: ir.Attr) -> Any:
    value = attr.value
    if attr.type == ir.AttributeType.TENSOR:  # not isinstance: Protocol checks are slow
        return value.numpy()
    if isinstance(value, tuple):
        return list(value)
    return value


def attribute_equal(a: Any, b: Any) -> bool:
    if a is ABSENT or b is ABSENT:
        return a is b
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return bool(np.array_equal(np.asarray(a), np.asarray(b)))
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(attribute_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, float) or isinstance(b, float):
        # Attributes are stored as float32: compare at that precision.
        try:
            return bool(np.float32(a) == np.float32(b))
        except (TypeError, ValueError):
            return False
    return bool(a == b)


def _show(value: Any) -> str:
    if isinstance(value, np.ndarray):
        return f"tensor{list(value.shape)}"
    return repr(value)
