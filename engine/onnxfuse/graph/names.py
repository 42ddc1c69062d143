"""Names and identities: unique names for new values, structural hashes of graphs."""

from __future__ import annotations

import onnx_ir as ir

from onnxfuse.graph.traversal import all_graphs


class NameSource:
    """Fresh, model-wide unique names for values and nodes."""

    def __init__(self, model: ir.Model):
        self.used: set[str] = set()
        self.counters: dict[str, int] = {}  # base -> first suffix not yet known to be taken
        for graph in all_graphs(model):
            for value in (*graph.inputs, *graph.outputs, *graph.initializers.values()):
                if value.name:
                    self.used.add(value.name)
            for node in graph:
                if node.name:
                    self.used.add(node.name)
                for output in node.outputs:
                    if output.name:
                        self.used.add(output.name)

    def fresh(self, base: str) -> str:
        base = base or "v"
        candidate = base
        # Names are never released, so the first free suffix only grows: resume the
        # search where the last one for this base ended (many unnamed values share one).
        counter = self.counters.get(base, 1)
        while candidate in self.used:
            candidate = f"{base}_{counter}"
            counter += 1
        self.counters[base] = counter
        self.used.add(candidate)
        return candidate


def node_label(node: ir.Node) -> str:
    """How reports name a node: its name, or (unnamed) its first output's, as Netron
    shows it (a model read from a file has every node named: files/repair.py)."""
    if node.name:
        return node.name
    return next((o.name for o in node.outputs if o.name), f"<unnamed {node.op_type}>")


def region_hash(roots: list[ir.Value], depth: int) -> int:
    """A hash of what the nodes within ``depth`` steps downstream of ``roots`` compute.

    Values produced outside the region are identified by object identity, values
    inside by their structure: two visits to a region that a rule set rewrote
    back to an earlier state hash equal, whatever new names and nodes it holds.
    """
    region: set[int] = set()
    frontier = [n for v in roots for n in v.consumers()]
    for _ in range(depth):
        next_frontier: list[ir.Node] = []
        for node in frontier:
            if id(node) not in region:
                region.add(id(node))
                next_frontier.extend(c for o in node.outputs for c in o.consumers())
        frontier = next_frontier
    memo: dict[int, int] = {}

    def value_hash(value: ir.Value | None) -> int:
        if value is None:
            return 0
        stack = [value]
        while stack:
            top = stack[-1]
            if id(top) in memo:
                stack.pop()
                continue
            producer = top.producer()
            if producer is None or id(producer) not in region:
                memo[id(top)] = hash(("leaf", id(top)))
                stack.pop()
                continue
            pending = [i for i in producer.inputs if i is not None and id(i) not in memo]
            if pending:
                stack.extend(pending)
                continue
            attributes = tuple(sorted((k, repr(a.value)) for k, a in producer.attributes.items()))
            inputs = tuple(0 if i is None else memo[id(i)] for i in producer.inputs)
            key = hash((producer.domain, producer.op_type, attributes, inputs))
            for index, output in enumerate(producer.outputs):
                memo[id(output)] = hash((key, index))
            stack.pop()
        return memo[id(value)]

    nodes = {id(n): n for v in roots for n in _downstream(v, region)}
    return hash(tuple(sorted(value_hash(n.outputs[0]) for n in nodes.values() if n.outputs)))


def _downstream(value: ir.Value, region: set[int]) -> list[ir.Node]:
    found, stack, seen = [], list(value.consumers()), set()
    while stack:
        node = stack.pop()
        if id(node) in seen or id(node) not in region:
            continue
        seen.add(id(node))
        found.append(node)
        stack.extend(c for o in node.outputs for c in o.consumers())
    return found
