"""The main graph of a model as the page draws it: its nodes, their edges, the rule each
created node names (provenance), and the repeated blocks (layers) a big graph is folded into."""

from __future__ import annotations

import ast
import json
import re
from collections import Counter
from dataclasses import dataclass, field

import onnx_ir as ir

from onnxfuse.rewrite.apply import PROVENANCE_REPLACED, PROVENANCE_RULE

# Below this many nodes a graph is drawn whole: folding it would hide more than it helps.
FOLD_FROM_NODES = 200
# A top level of more nodes than this is cut into runs of CHUNK_NODES, each a block.
DRAWN_WHOLE_MAX = 600
CHUNK_NODES = 250
# The scopes the dynamo exporter records per node (['', 'model', 'model.encoder', ...]).
_TORCH_SCOPES = "pkg.torch.onnx.name_scopes"
# A scope that is one of a numbered series: layer.3, layers_17, h.0, block1.
_NUMBERED = re.compile(r"^(.*?\D)?[._]?(\d+)$")


@dataclass
class Node:
    name: str
    op: str  # "Conv", or "com.microsoft::Attention" outside the default domain
    kind: str = "node"  # "node", "input" or "output" (a graph input or output)
    scopes: tuple[str, ...] = ()  # where the exporter put it, outermost first
    rule: str | None = None  # the rule that created it (provenance)
    replaced: list[str] = field(default_factory=list)  # the input's nodes it stands for
    block: str = ""  # the folded block it belongs to ("": none)


@dataclass
class GraphView:
    nodes: list[Node]
    edges: list[tuple[int, int]]  # (producer, consumer) indices into nodes, once each

    def index(self) -> dict[str, int]:
        return {node.name: i for i, node in enumerate(self.nodes) if node.kind == "node"}


def graph_view(model: ir.Model) -> GraphView:
    """The main graph of ``model``: its nodes, then a node per graph input and output.
    Weights are not drawn: an edge from an initializer would only add clutter."""
    graph = model.graph
    nodes: list[Node] = []
    position: dict[int, int] = {}  # id(ir.Node) -> index
    for node in graph:
        position[id(node)] = len(nodes)
        nodes.append(
            Node(
                name=node.name or "",
                op=node.op_type
                if node.domain in ("", "ai.onnx")
                else f"{node.domain}::{node.op_type}",
                scopes=_scopes(node),
                rule=node.metadata_props.get(PROVENANCE_RULE),
                replaced=_replaced(node),
            )
        )
    inputs: dict[int, int] = {}
    for graph_input in graph.inputs:
        inputs[id(graph_input)] = len(nodes)
        nodes.append(Node(name=graph_input.name or "", op="input", kind="input"))
    edges: dict[tuple[int, int], None] = {}
    for node in graph:
        consumer = position[id(node)]
        for value in node.inputs:
            producer = _producer(value, position, inputs)
            if producer is not None:
                edges[(producer, consumer)] = None
    for output in graph.outputs:
        consumer = len(nodes)
        nodes.append(Node(name=output.name or "", op="output", kind="output"))
        producer = _producer(output, position, inputs)
        if producer is not None:
            edges[(producer, consumer)] = None
    return GraphView(nodes, list(edges))


def _producer(
    value: ir.Value | None, position: dict[int, int], inputs: dict[int, int]
) -> int | None:
    if value is None:
        return None
    producer = value.producer()
    if producer is not None:
        return position.get(id(producer))
    return inputs.get(id(value))


def _replaced(node: ir.Node) -> list[str]:
    recorded = node.metadata_props.get(PROVENANCE_REPLACED)
    if recorded is None:
        return []
    try:
        names = json.loads(recorded)
    except ValueError:
        return []
    return [n for n in names if isinstance(n, str)] if isinstance(names, list) else []


def _scopes(node: ir.Node) -> tuple[str, ...]:
    """The modules a node was exported from: the dynamo exporter's recorded scopes, else
    the path in its name (the legacy exporter's /model/encoder/layer.0/attention/MatMul,
    or a dotted block1.1.conv). Its own name is not a scope."""
    recorded = node.metadata_props.get(_TORCH_SCOPES)
    if recorded is not None:
        try:
            scopes = ast.literal_eval(recorded)
        except (ValueError, SyntaxError):
            scopes = None
        if isinstance(scopes, list) and len(scopes) > 1 and isinstance(scopes[-2], str):
            return _merged(scopes[-2].split("."))
    name = node.name or ""
    parts = name.split("/") if "/" in name else name.split(".")
    return _merged([p for p in parts[:-1] if p])


def _merged(parts: list[str]) -> tuple[str, ...]:
    """A bare index joins the scope it numbers: model.encoder.layer.1 is layer.1."""
    merged: list[str] = []
    for part in parts:
        if part.isdigit() and merged:
            merged[-1] = f"{merged[-1]}.{part}"
        elif part:
            merged.append(part)
    return tuple(merged)


def assign_blocks(view: GraphView, inputs: GraphView | None = None) -> None:
    """Fold a big graph into its repeated blocks: a node belongs to the first scope of
    its path that is one of a numbered series of two or more (layer.0 ... layer.11). A
    node a rule created belongs where most of the nodes it replaced were (``inputs``:
    the model those names are from), so both sides fold the same way. What is left at
    the top level of the input, if still too big, is cut into runs of nodes."""
    if sum(node.kind == "node" for node in view.nodes) < FOLD_FROM_NODES and (
        inputs is None or sum(node.kind == "node" for node in inputs.nodes) < FOLD_FROM_NODES
    ):
        return
    others = inputs.nodes if inputs is not None else []
    series = _numbered_series([n.scopes for n in [*view.nodes, *others]])
    blocks = {n.name: n.block for n in others if n.kind == "node"}
    for node in view.nodes:
        node.block = blocks[node.name] if node.name in blocks else _block_of(node.scopes, series)
        if node.rule is not None:
            # Where most of what it replaced was, a block before the top level: a rule
            # that read the model's shared mask computation still fused one layer.
            found = Counter(blocks[n] for n in node.replaced if blocks.get(n))
            if found:
                node.block = found.most_common(1)[0][0]
    _join_readers(view)
    if inputs is None:
        _chunk_top_level(view)


def _chunk_top_level(view: GraphView) -> None:
    """A top level still too big to draw at once (names that say nothing of the
    structure) is cut into runs of consecutive nodes, each a block: dot took 224 s on
    5,000 nodes in one view, and no reader follows that many."""
    top = [n for n in view.nodes if n.kind == "node" and not n.block]
    if len(top) <= DRAWN_WHOLE_MAX:
        return
    for start in range(0, len(top), CHUNK_NODES):
        run = top[start : start + CHUNK_NODES]
        for node in run:
            node.block = f"nodes {start + 1}-{start + len(run)}"


def _join_readers(view: GraphView) -> None:
    """A node that reads nothing (a Constant, which legacy exports name outside any
    scope) goes into the block of its readers when they are all in one."""
    fed = {b for _, b in view.edges}
    readers: dict[int, set[str]] = {}
    for a, b in view.edges:
        if a not in fed:
            readers.setdefault(a, set()).add(view.nodes[b].block)
    for a, blocks in readers.items():
        node = view.nodes[a]
        if node.kind == "node" and not node.block and len(blocks) == 1:
            node.block = next(iter(blocks))


def _numbered_series(paths: list[tuple[str, ...]]) -> set[tuple[tuple[str, ...], str]]:
    """(prefix, stem) of each numbered scope that occurs with two or more numbers."""
    numbers: dict[tuple[tuple[str, ...], str], set[str]] = {}
    for path in paths:
        for depth, scope in enumerate(path):
            found = _NUMBERED.match(scope)
            if found:
                numbers.setdefault((path[:depth], found.group(1) or ""), set()).add(found.group(2))
    return {key for key, seen in numbers.items() if len(seen) > 1}


def _block_of(path: tuple[str, ...], series: set[tuple[tuple[str, ...], str]]) -> str:
    for depth, scope in enumerate(path):
        found = _NUMBERED.match(scope)
        if found and (path[:depth], found.group(1) or "") in series:
            return "/".join(path[: depth + 1])
    return ""
