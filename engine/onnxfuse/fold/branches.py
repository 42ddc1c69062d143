"""Control flow decided before run time: an If whose condition is constant is its branch;
a Loop that runs its body once is that body, and one that never runs is its inputs.

The taken branch's nodes and initializers move into the If's graph, in the If's place,
reading the values they read before (outer-scope values are the same objects); the If's
outputs become the branch's outputs. Names need no change: a valid model's names are
unique across all its graphs. The branch not taken is emptied, so that the values it read
are no longer used by it. A Loop's body moves the same way, its inputs replaced by the
iteration number 0, the loop's condition and the initial loop-carried values, and each
scan output stacked as one slice (Unsqueeze on axis 0).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
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


def inline_decided_loop(
    node: ir.Node, constant_of: ConstantOf, names: NameSource, opset: int
) -> list[ir.Node] | None:
    """Replace a Loop whose trip count is a constant 0 or 1 (and whose condition is absent
    or a constant true) by what it computes; the nodes now in its place, or None."""
    graph = node.graph
    body_attr = node.attributes.get("body")
    if graph is None or isinstance(graph, ir.Function) or body_attr is None:
        return None
    body = body_attr.as_graph()
    inputs = list(node.inputs)
    trips = _scalar(constant_of(inputs[0])) if inputs and inputs[0] is not None else None
    runs = inputs[1] if len(inputs) > 1 else None
    carried = inputs[2:]
    if trips not in (0, 1) or (runs is not None and _scalar(constant_of(runs)) is not True):
        return None
    if len(body.inputs) != 2 + len(carried) or len(body.outputs) != 1 + len(node.outputs):
        return None
    scans = len(node.outputs) - len(carried)
    initial = [v for v in carried if v is not None]
    if len(initial) != len(carried) or scans < 0:
        return None
    if trips == 0:
        if scans:
            return None  # empty scan outputs need their element shapes: left to run
        for old, start in zip(node.outputs, initial):
            _take_place(graph, node, old, start, [], names)
        _empty(body)
        graph.remove(node, safe=True)
        return []
    iteration = _constant(graph, names, f"{node.name or 'Loop'}_iteration", 0, body.inputs[0])
    condition = runs if runs is not None else _constant(graph, names, "true", True, None)
    replacement: dict[ir.Value, ir.Value] = dict(zip(body.inputs, [iteration, condition, *initial]))
    results = [replacement.get(v, v) for v in body.outputs[1:]]
    body.outputs.clear()  # a loop-carried value the body passes through is one of them
    for value, new in replacement.items():
        value.replace_all_uses_with(new)
    moved = _move_body(graph, node, body, names)
    for index, (old, new) in enumerate(zip(node.outputs, results)):
        if index >= len(carried):
            stacked = _unsqueeze_first_axis(graph, node, new, names, opset)
            moved.append(stacked.producer())  # type: ignore[arg-type]
            new = stacked
        _take_place(graph, node, old, new, moved, names)
    graph.remove(node, safe=True)
    return moved


def _scalar(tensor: ir.TensorProtocol | None) -> int | bool | None:
    if tensor is None or tensor.size != 1:
        return None
    item = tensor.numpy().reshape(-1)[0].item()
    return item if isinstance(item, (bool, int)) else None


def _constant(
    graph: ir.Graph, names: NameSource, hint: str, value: int | bool, like: ir.Value | None
) -> ir.Value:
    """A scalar initializer: the iteration number (of the body's declared type) or true."""
    dtype = like.dtype if like is not None else None
    array = np.array(value) if dtype is None else np.array(value, dtype=dtype.numpy())
    return _initializer(graph, names, hint, array)


def _initializer(graph: ir.Graph, names: NameSource, hint: str, array: np.ndarray) -> ir.Value:
    name = names.fresh(hint)
    value = ir.Value(
        name=name,
        type=ir.TensorType(ir.DataType.from_numpy(array.dtype)),
        shape=ir.Shape(array.shape),
        const_value=ir.Tensor(array, name=name),
    )
    graph.register_initializer(value)
    return value


def _move_body(graph: ir.Graph, node: ir.Node, body: ir.Graph, names: NameSource) -> list[ir.Node]:
    moved = list(body)
    body.outputs.clear()
    for value in list(body.initializers.values()):
        assert value.name is not None
        body.initializers.pop(value.name)
        if value.name in graph.initializers:
            value.name = names.fresh(value.name)
        graph.register_initializer(value)
    body.remove(moved, safe=False)
    graph.insert_before(node, moved)
    return moved


def _unsqueeze_first_axis(
    graph: ir.Graph, node: ir.Node, value: ir.Value, names: NameSource, opset: int
) -> ir.Value:
    """One iteration's scan output as the stacked [1, ...] tensor the Loop returns."""
    base = names.fresh(f"{node.name or 'Loop'}_scan")
    if opset >= 13:
        axes = _initializer(graph, names, f"{base}_axes", np.array([0], np.int64))
        unsqueeze = ir.Node("", "Unsqueeze", [value, axes], name=base)
    else:
        unsqueeze = ir.Node("", "Unsqueeze", [value], [ir.AttrInt64s("axes", [0])], name=base)
    graph.insert_before(node, unsqueeze)
    stacked = unsqueeze.outputs[0]
    stacked.name = names.fresh(f"{base}_out")
    if value.type is not None:
        stacked.type = value.type
        if value.shape is not None:
            stacked.shape = ir.Shape([1, *value.shape])
    return stacked


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
