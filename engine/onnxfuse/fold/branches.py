"""Control flow decided before run time: an If whose condition is constant is its branch.

The taken branch's nodes and initializers move into the If's graph, in the If's place,
reading the values they read before (outer-scope values are the same objects); the If's
outputs become the branch's outputs. Names need no change: a valid model's names are
unique across all its graphs. The branch not taken is emptied, so that the values it read
are no longer used by it.
"""

from __future__ import annotations

from collections.abc import Callable

import onnx_ir as ir

from onnxfuse.graph.names import NameSource

ConstantOf = Callable[[ir.Value | None], "ir.TensorProtocol | None"]


def inline_taken_branch(
    node: ir.Node, constant_of: ConstantOf, names: NameSource
) -> list[ir.Node] | None:
    """Replace the If ``node`` by the branch its constant condition takes; the moved nodes
    in order, or None (the condition is not constant, or the If cannot be inlined)."""
    graph = node.graph
    branch = _taken_branch(node, constant_of)
    if graph is None or branch is None or len(branch.outputs) != len(node.outputs):
        return None
    if isinstance(graph, ir.Function) and branch.initializers:
        return None  # a function body holds no initializers
    moved = list(branch)
    results = list(branch.outputs)
    branch.outputs.clear()
    for value in list(branch.initializers.values()):
        assert value.name is not None  # an initializer is registered by its name
        branch.initializers.pop(value.name)
        owner = graph.graph if isinstance(graph, ir.Function) else graph
        if value.name in owner.initializers:
            value.name = names.fresh(value.name)
        owner.register_initializer(value)
    branch.remove(moved, safe=False)
    graph.insert_before(node, moved)
    for old, new in zip(node.outputs, results):
        _take_place(graph, node, old, new, moved, names)
    for attribute in node.attributes.values():
        if attribute.type == ir.AttributeType.GRAPH and attribute.as_graph() is not branch:
            _empty(attribute.as_graph())
    graph.remove(node, safe=True)
    return moved


def _taken_branch(node: ir.Node, constant_of: ConstantOf) -> ir.Graph | None:
    if not node.inputs:
        return None
    tensor = constant_of(node.inputs[0])
    if tensor is None or tensor.size != 1:
        return None
    taken = "then_branch" if bool(tensor.numpy().reshape(-1)[0]) else "else_branch"
    attribute = node.attributes.get(taken)
    if attribute is None or attribute.type != ir.AttributeType.GRAPH:
        return None
    return attribute.as_graph()


def _take_place(
    graph: ir.Graph | ir.Function,
    node: ir.Node,
    old: ir.Value,
    new: ir.Value,
    moved: list[ir.Node],
    names: NameSource,
) -> None:
    """``new`` is read wherever the If's output ``old`` was. A graph output keeps its name:
    ``new`` takes it where the branch computed it; otherwise (a value from outside the
    branch, or one already an output) an Identity carries it under the old name."""
    if not old.is_graph_output():
        old.replace_all_uses_with(new)
        return
    produced_here = new.producer() in moved and not new.is_graph_output()
    if produced_here:
        name = old.name
        old.name = names.fresh(f"{old.name}__if")
        new.name = name
        if new.type is None:
            new.type, new.shape = old.type, old.shape
        old.replace_all_uses_with(new, replace_graph_outputs=True)
        return
    identity = ir.Node("", "Identity", [new], name=names.fresh(f"{node.name or 'If'}_output"))
    carried = identity.outputs[0]
    name = old.name
    old.name = names.fresh(f"{old.name}__if")
    carried.name, carried.type, carried.shape = name, old.type, old.shape
    graph.insert_before(node, identity)
    old.replace_all_uses_with(carried, replace_graph_outputs=True)


def _empty(graph: ir.Graph) -> None:
    """Drop every node of a branch not taken, nested ones included: each stops reading
    its inputs first, so that a weight only it read is unused (and goes) afterwards."""
    graph.outputs.clear()
    for node in ir.traversal.RecursiveGraphIterator(graph):
        for index in range(len(node.inputs)):
            node.replace_input_with(index, None)
    graph.remove(list(graph), safe=False)
