"""Coverage: which nodes of a model a target cannot run, and the partitions they cut
the graph into, as onnxruntime's partitioner and polygraphy's `inspect capability`
show a user; and the nodes it runs only by inlining their ONNX function body.

"Can this target run this node" is ``Target.check_node``, the gate every rewrite
passes: coverage asks it of the model's own nodes.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Hashable
from dataclasses import dataclass

import onnx_ir as ir

from onnxfuse.graph.names import node_label
from onnxfuse.graph.traversal import owned_graphs
from onnxfuse.targets.capabilities import Target
from onnxfuse.targets.facts import NodeFacts, value_facts


@dataclass(frozen=True)
class Uncovered:
    node: str
    op: str  # ``Op``, or ``domain::Op`` outside ai.onnx
    reason: str  # what the target cannot run: ``Mish for T=double``
    graph: str = ""  # "" for the main graph

    def to_json(self) -> dict[str, str]:
        return {"node": self.node, "op": self.op, "reason": self.reason, "graph": self.graph}


@dataclass(frozen=True)
class Coverage:
    """What ``target`` runs of a model. ``partitions``: the main graph's runs of nodes
    the target runs, each (node count, first node, last node) in execution order;
    ``inlined``: per op, the nodes run only as their function body."""

    target: str
    nodes: int
    uncovered: tuple[Uncovered, ...]
    partitions: tuple[tuple[int, str, str], ...]
    inlined: dict[str, int]

    @property
    def uncovered_ops(self) -> dict[str, int]:
        return dict(sorted(Counter(u.op for u in self.uncovered).items()))

    def summary(self) -> str:
        """One line: ``12 nodes, 2 not covered (Mish 2), 3 partitions (5, 4, 1 nodes)``."""
        line = f"{self.nodes} nodes"
        if self.uncovered:
            ops = ", ".join(f"{op} {count}" for op, count in self.uncovered_ops.items())
            line += f", {len(self.uncovered)} not covered ({ops})"
        else:
            line += ", all covered"
        sizes = ", ".join(str(size) for size, _, _ in self.partitions)
        count = len(self.partitions)
        line += f", {count} partition{'s' if count != 1 else ''}"
        return line + (f" ({sizes} nodes)" if count else "")

    def to_json(self) -> dict[str, object]:
        return {
            "target": self.target,
            "nodes": self.nodes,
            "uncovered": [u.to_json() for u in self.uncovered],
            "uncovered_ops": self.uncovered_ops,
            "partitions": [
                {"nodes": size, "first": first, "last": last}
                for size, first, last in self.partitions
            ],
            "inlined": self.inlined,
        }


def node_facts(node: ir.Node, opset: int, ir_version: int) -> NodeFacts:
    """What a target's gate reads of a graph node (an unused output counts as absent)."""
    return NodeFacts(
        node.domain,
        node.op_type,
        opset,
        [value_facts(v, ir_version) for v in node.inputs],
        [
            value_facts(v, ir_version) if v.uses() or v.is_graph_output() else None
            for v in node.outputs
        ],
        {name: attr.value for name, attr in node.attributes.items()},
    )


def coverage(model: ir.Model, target: Target) -> Coverage:
    """The nodes of every graph ``target`` cannot run (a call of a model-local function
    stands for its body, which is checked instead), and the main graph's partitions."""
    version = model.ir_version or 10
    local = set(model.functions)
    uncovered: list[Uncovered] = []
    inlined: Counter[str] = Counter()
    runs: dict[int, bool] = {}
    # Verdicts by facts: a model repeats its layers, so most nodes are a lookup.
    verdicts: dict[Hashable, tuple[str | None, bool]] = {}
    count = 0
    for graph, opsets, _ in owned_graphs(model):
        where = "" if graph is model.graph else (graph.name or "<subgraph>")
        for node in graph:
            if (node.domain, node.op_type, node.overload) in local:
                runs[id(node)] = True
                continue
            count += 1
            facts = node_facts(node, opsets.get(node.domain, 1), version)
            key = _facts_key(facts)
            verdict = verdicts.get(key) if key is not None else None
            if verdict is None:
                problem = target.check_node(facts)
                verdict = (problem, problem is None and target.runs_inlined(facts))
                if key is not None:
                    verdicts[key] = verdict
            problem, only_inlined = verdict
            runs[id(node)] = problem is None
            if problem is not None:
                uncovered.append(Uncovered(node_label(node), facts.label(), problem, where))
            elif only_inlined:
                inlined[facts.label()] += 1
    return Coverage(
        target.spec,
        count,
        tuple(uncovered),
        _partitions(model.graph, runs),
        dict(sorted(inlined.items())),
    )


def _facts_key(facts: NodeFacts) -> Hashable | None:
    """``facts`` as a key (None: an attribute holds an unhashable value). A tensor or a
    graph hashes by identity: equal keys then are the same object, never a wrong hit."""
    attributes = tuple(
        (name, tuple(value) if isinstance(value, list) else value)
        for name, value in sorted(facts.attributes.items())
    )
    key = (facts.domain, facts.op_type, facts.opset, *facts.inputs, None, *facts.outputs)
    try:
        hash(attributes)
    except TypeError:
        return None
    return (key, attributes)


def _partitions(graph: ir.Graph, runs: dict[int, bool]) -> tuple[tuple[int, str, str], ...]:
    """The runs of nodes the target runs, as onnxruntime's partitioner groups them
    (CreateSupportedPartitions): nodes are taken in a topological order that keeps to
    runnable ones while any is ready, and a node the target cannot run ends the run.
    No run then depends on itself through such a node."""
    nodes = list(graph)
    index = {id(n): k for k, n in enumerate(nodes)}
    consumers: list[list[int]] = [[] for _ in nodes]
    waiting = [0] * len(nodes)  # inputs whose producer is not taken yet
    for k, node in enumerate(nodes):
        for value in node.inputs:
            producer = value.producer() if value is not None else None
            if producer is not None and id(producer) in index:
                consumers[index[id(producer)]].append(k)
                waiting[k] += 1
    ready: dict[bool, deque[int]] = {True: deque(), False: deque()}
    for k, node in enumerate(nodes):
        if not waiting[k]:
            ready[runs[id(node)]].append(k)
    groups: list[list[int]] = []
    current: list[int] = []
    while ready[True] or ready[False]:
        runnable = bool(ready[True])
        k = ready[runnable].popleft()
        if runnable:
            current.append(k)
        elif current:
            groups.append(current)
            current = []
        for consumer in consumers[k]:
            waiting[consumer] -= 1
            if not waiting[consumer]:
                ready[runs[id(nodes[consumer])]].append(consumer)
    if current:
        groups.append(current)
    return tuple((len(g), node_label(nodes[g[0]]), node_label(nodes[g[-1]])) for g in groups)
