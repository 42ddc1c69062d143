"""Every graph of a model: the main graph, If/Loop/Scan bodies, model-local functions."""

from __future__ import annotations

from typing import NamedTuple

import onnx_ir as ir


class OwnedGraph(NamedTuple):
    """A graph, the opset imports its nodes run at, and the function it belongs to (None:
    the main graph or one of its subgraphs)."""

    graph: ir.Graph
    opsets: dict[str, int]
    function: ir.Function | None


def all_graphs(model: ir.Model) -> list[ir.Graph]:
    graphs = [model.graph, *subgraphs(model.graph)]
    for function in model.functions.values():
        graphs.append(function.graph)
        graphs.extend(subgraphs(function.graph))
    return graphs


_GRAPH_ATTRIBUTES = (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS)


def subgraphs(graph: ir.Graph) -> list[ir.Graph]:
    """``graph.subgraphs()``, answered at once for a graph no attribute of which holds a
    graph (the common case): onnx_ir's recursive walk costs far more than this scan."""
    if any(attr.type in _GRAPH_ATTRIBUTES for node in graph for attr in node.attributes.values()):
        return list(graph.subgraphs())
    return []


def owned_graphs(model: ir.Model) -> list[OwnedGraph]:
    """Every graph with its opsets and owner: a function body runs at the function's own
    opset imports, not the model's."""
    main = dict(model.opset_imports)
    found = [OwnedGraph(g, main, None) for g in (model.graph, *subgraphs(model.graph))]
    for function in model.functions.values():
        opsets = dict(function.opset_imports)
        found.extend(
            OwnedGraph(g, opsets, function) for g in (function.graph, *subgraphs(function.graph))
        )
    return found
