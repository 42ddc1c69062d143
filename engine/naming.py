"""Model-wide unique names for the values and nodes rewrites create."""

from __future__ import annotations

import onnx_ir as ir


class NameSource:
    """Fresh, model-wide unique names for values and nodes."""

    def __init__(self, model: ir.Model):
        self.used: set[str] = set()
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
        counter = 1
        while candidate in self.used:
            candidate = f"{base}_{counter}"
            counter += 1
        self.used.add(candidate)
        return candidate


def all_graphs(model: ir.Model) -> list[ir.Graph]:
    graphs = [model.graph, *model.graph.subgraphs()]
    for function in model.functions.values():
        graphs.append(function.graph)
        graphs.extend(function.graph.subgraphs())
    return graphs
