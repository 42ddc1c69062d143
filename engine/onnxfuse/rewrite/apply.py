"""Applying a match: build the replacement plan's nodes, rewire uses, remove the source."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir

from onnxfuse.fold.folder import Folder
from onnxfuse.graph.names import NameSource
from onnxfuse.language.guards import constant_tensor
from onnxfuse.ops import element_types, schemas
from onnxfuse.ops.inference import infer_node, schema_dtypes
from onnxfuse.rewrite.matcher import Match, ModelContext
from onnxfuse.rewrite.plan import PlannedAttribute, plan_match

# Provenance in each created node's metadata_props, for any viewer (Netron, onnx, the
# profiler): the rule that created it, and the input model's nodes it stands for (a JSON
# list; a node created from created nodes lists what they stood for).
PROVENANCE_RULE = "onnxfuse.rule"
PROVENANCE_REPLACED = "onnxfuse.replaced"


class Blocked(Exception):
    """The match is valid but rewriting it here would break an invariant."""


class IllTyped(Blocked):
    """The rewrite would give a replaced value another type or shape, or create a node
    onnx finds ill-typed: the rule's own mistake (a missing rank guard), wherever the
    graph lets it fire."""


def apply_match(match: Match, context: ModelContext, names: NameSource) -> list[ir.Node]:
    """Rewrite the matched nodes into the rule's replacement; return the new nodes, their
    outputs typed where they replace typed values or their static type is inferred
    (``fold_and_type`` does the rest, once constant computations are folded). Blocked,
    with nothing changed, where the rewrite would break an invariant."""
    anchor = match.nodes[0]
    for node in match.nodes:
        if node is match.outputs[0].producer():
            anchor = node
    graph = anchor.graph
    assert graph is not None
    replacement = match.rule.replacement
    env: dict[str, ir.Value | None] = {n: match.values.get(n) for n in replacement.input_names()}
    _check_outputs(match, env)
    _check_absent_inputs(match, env, context)
    created = _create_nodes(match, context, names, env, anchor.name or match.rule.name)
    try:
        _check_types(match, created, env, context)
    except Blocked:
        _detach(created)
        raise
    graph.insert_before(anchor, created)

    for old, pvalue in zip(match.outputs, replacement.outputs):
        new = env[pvalue.name]
        assert new is not None
        _keep_type(old, new)
        if old.is_graph_output():
            name = old.name
            old.name = names.fresh(f"{name}__replaced")
            new.name = name
        old.replace_all_uses_with(new, replace_graph_outputs=True)
    _remove_match(match, graph)
    return created


def replaced_sources(nodes: list[ir.Node]) -> list[str]:
    """The names of the input model's nodes that ``nodes`` stand for, in order, once each."""
    names: dict[str, None] = {}
    for node in nodes:
        names.update(dict.fromkeys(_recorded_sources(node) or [node.name or ""]))
    return list(names)


def _recorded_sources(node: ir.Node) -> list[str] | None:
    """What an earlier rewrite recorded; a value written by another tool is not ours."""
    recorded = node.metadata_props.get(PROVENANCE_REPLACED)
    if recorded is None:
        return None
    try:
        sources = json.loads(recorded)
    except ValueError:
        return None
    if not isinstance(sources, list) or not all(isinstance(s, str) for s in sources):
        return None
    return sources


def strip_provenance(graphs: list[ir.Graph]) -> None:
    """Remove the provenance keys (``--no-provenance``)."""
    for graph in graphs:
        for node in graph:
            node.metadata_props.pop(PROVENANCE_RULE, None)
            node.metadata_props.pop(PROVENANCE_REPLACED, None)


def _create_nodes(
    match: Match,
    context: ModelContext,
    names: NameSource,
    env: dict[str, ir.Value | None],
    base: str,
) -> list[ir.Node]:
    """The replacement's nodes, reading the bound values, not yet in the graph; ``env``
    maps each replacement value to its new value."""
    created: list[ir.Node] = []
    provenance = {
        PROVENANCE_RULE: match.rule.name,
        PROVENANCE_REPLACED: json.dumps(replaced_sources(match.nodes)),
    }
    try:
        for planned in plan_match(match, context).nodes:
            pnode = planned.pattern
            inputs = [None if pv is None else env[pv.name] for pv in pnode.inputs]
            attributes = [
                _make_attribute(pnode.op_type, planned.opset, pnode.domain, attribute)
                for attribute in planned.attributes
            ]
            node = ir.Node(
                pnode.domain,
                pnode.op_type,
                inputs,
                attributes,
                num_outputs=len(pnode.outputs),
                name=names.fresh(f"{base}/{match.rule.name}"),
            )
            node.metadata_props.update(provenance)
            for pvalue, output in zip(pnode.outputs, node.outputs):
                output.name = names.fresh(f"{base}/{pvalue.name if pvalue else 'unused'}")
                if pvalue is not None:
                    env[pvalue.name] = output
            created.append(node)
    except Blocked:
        _detach(created)
        raise
    return created


def _detach(nodes: list[ir.Node]) -> None:
    """Nodes of a blocked rewrite stop using the graph's values (a node records itself
    among the uses of its inputs when it is made), so that nothing is left changed."""
    for node in nodes:
        for index in range(len(node.inputs)):
            node.replace_input_with(index, None)


def _check_types(
    match: Match, created: list[ir.Node], env: dict[str, ir.Value | None], context: ModelContext
) -> None:
    """Type the created nodes by onnx's inference, before anything is committed: a node
    onnx finds ill-typed, or a replacement output of another element type, rank or static
    dimension than the value it replaces, blocks the rewrite. The model would fail the
    checker at the end (a rule ``Mul(X, 1) -> Identity(X)`` without a rank guard, on a 1
    that broadcasts X to a higher rank). Nodes computing on constants only are folded
    after the rewrite; here they get the element type their op fixes, no shape.
    Inferred static types stay (the same once folding is done); the rest is cleared for
    ``fold_and_type``."""
    on_constants = {id(n) for n in _computes_on_constants(created, context)}
    try:
        for node in created:
            if id(node) in on_constants:
                for output, dtype in zip(node.outputs, schema_dtypes(node, context.opset(""))):
                    if dtype is not None:
                        output.type = ir.TensorType(dtype)
                continue
            error = infer_node(node, context.opset(node.domain))
            if error is not None:
                raise IllTyped(f"the {node.op_type} it creates does not type-check: {error}")
        for old, pvalue in zip(match.outputs, match.rule.replacement.outputs):
            new = env[pvalue.name]
            if pvalue.kind == "input" or new is None:
                continue  # passed through: _check_outputs compared it
            change = _value_change(old, new)
            if change is not None:
                raise IllTyped(f"changes the {change[0]} of '{old.name}' {change[1]}")
    finally:
        for node in created:
            for output in node.outputs:
                shape = output.shape
                if id(node) in on_constants or shape is None or not shape.is_static():
                    output.type = None
                    output.shape = None


def _computes_on_constants(created: list[ir.Node], context: ModelContext) -> list[ir.Node]:
    """The created ai.onnx nodes whose inputs are constants or computed from constants
    by such nodes: folding will make them initializers."""
    constant: set[int] = set()
    found = []
    for node in created:
        if node.domain != "" or not all(
            v is None or id(v) in constant or constant_tensor(v, context.ir_version) is not None
            for v in node.inputs
        ):
            continue
        constant.update(id(o) for o in node.outputs)
        found.append(node)
    return found


def fold_and_type(created: list[ir.Node], context: ModelContext, folder: Folder) -> list[ir.Node]:
    """Fold the new nodes that compute on constants only, then infer the
    types and shapes of those left: inferring a node about to fold is wasted (most
    nodes of a weight-folding rule), and the others see exact initializer shapes."""
    guessed: list[ir.Value] = []
    for node in _computes_on_constants(created, context):
        # The folder checks a result's element type against its value's: give it the
        # type the op's constraints fix.
        for output, dtype in zip(node.outputs, schema_dtypes(node, context.opset(""))):
            if output.type is None and dtype is not None:
                output.type = ir.TensorType(dtype)
                guessed.append(output)
    remaining = folder.fold_nodes(created)
    kept = {id(n) for n in remaining}
    for output in guessed:
        if id(output.producer()) in kept:
            output.type = None  # not folded after all: inferred whole below
    for node in remaining:
        declared = _clear_partial_shapes(node)
        infer_node(node, context.opset(node.domain))
        _merge_declared(declared)
    return remaining


def _clear_partial_shapes(node: ir.Node) -> list[tuple[ir.Value, ir.TypeProtocol, ir.Shape]]:
    """The outputs whose declared shape (kept from the replaced value) has dimensions
    that are not static, with their type and shape, cleared so that inference runs on
    them: a replacement can make a dimension known (a computed Reshape shape made
    constant), and the graph's declared shape would hide that."""
    declared = []
    for output in node.outputs:
        shape = output.shape
        if output.type is None or shape is None or all(isinstance(d, int) for d in shape):
            continue
        declared.append((output, output.type, shape))
        output.type = None
        output.shape = None
    return declared


def _merge_declared(declared: list[tuple[ir.Value, ir.TypeProtocol, ir.Shape]]) -> None:
    """The declared type and shape back, with each dimension inference found static where
    the declared one was not (same element type and rank; anything else: as declared)."""
    for output, type_, shape in declared:
        inferred = output.shape
        same = output.type == type_ and inferred is not None and len(inferred) == len(shape)
        output.type = type_
        if not same:
            output.shape = shape
            continue
        assert inferred is not None
        dims = [
            new if not isinstance(old, int) and isinstance(new, int) else old
            for old, new in zip(shape, inferred)
        ]
        output.shape = ir.Shape(dims)


def _remove_match(match: Match, graph: ir.Graph) -> None:
    """Remove the matched nodes; a node of a kept value stays while it is still used."""
    kept_values = {match.source.values[name] for name in match.rule.keep}
    kept = [
        node
        for pnode, node in zip(match.source.nodes, match.nodes)
        if any(o is not None and o in kept_values for o in pnode.outputs)
    ]
    removed = [n for n in match.nodes if all(n is not k for k in kept)]
    inputs = [v for n in match.nodes for v in n.inputs if v is not None]
    graph.remove(removed, safe=True)
    for node in reversed(kept):  # consumers before producers
        if not any(o.uses() or o.is_graph_output() for o in node.outputs):
            graph.remove(node, safe=True)
    _remove_dead_producers(inputs, graph)


def _remove_dead_producers(values: list[ir.Value], graph: ir.Graph) -> None:
    """Remove the nodes that computed only for the match: a producer of one of ``values``
    (and, in turn, of its inputs) none of whose outputs is used any more. A shape
    computation that sized a matched Reshape would otherwise keep the values it reads
    alive, with a use outside the next match, until dead-code removal runs. Nodes with
    subgraphs stay for dead-code removal."""
    pending = list(values)
    while pending:
        value = pending.pop()
        node = value.producer()
        if node is None or node.graph is not graph or not removable_unused(node):
            continue
        pending.extend(v for v in node.inputs if v is not None)
        graph.remove(node, safe=True)


def removable_unused(node: ir.Node) -> bool:
    """No output of ``node`` is used or a graph output, and it holds no subgraph (those
    are left to dead-code removal, which sees their outer reads)."""
    if any(o.uses() or o.is_graph_output() for o in node.outputs):
        return False
    return not any(
        a.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS)
        for a in node.attributes.values()
    )


def _check_absent_inputs(
    match: Match, env: dict[str, ir.Value | None], context: ModelContext
) -> None:
    """An absent optional variable may only feed inputs the replacement's op lets be absent."""
    for pnode in match.rule.replacement.nodes:
        for index, pvalue in enumerate(pnode.inputs):
            if pvalue is None or pvalue.kind != "input" or env.get(pvalue.name) is not None:
                continue
            opset = context.opset(pnode.domain)
            if not schemas.input_is_optional(pnode.domain, pnode.op_type, opset, index):
                raise Blocked(
                    f"'{pvalue.name}' is absent but {pnode.op_type} input {index} is required"
                )


def _check_outputs(match: Match, env: dict[str, ir.Value | None]) -> None:
    """Check that outputs can be rewired; outputs passed straight through need care."""
    seen: set[int] = set()
    for old, pvalue in zip(match.outputs, match.rule.replacement.outputs):
        existing = env.get(pvalue.name) if pvalue.kind == "input" else None
        if pvalue.kind == "input" and existing is None:
            raise Blocked(f"replacement output '{pvalue.name}' is an absent optional input")
        if existing is not None:
            if id(existing) in seen:
                raise Blocked("two outputs would become the same value")
            seen.add(id(existing))
            if old.is_graph_output() and (
                existing.is_graph_input()
                or existing.is_graph_output()
                or existing.is_initializer()
                or existing.graph is not old.graph
            ):
                raise Blocked(f"graph output '{old.name}' would be renamed onto '{existing.name}'")
            change = _value_change(old, existing)
            if change is not None:
                raise IllTyped(f"changes the {change[0]} of '{old.name}' {change[1]}")


def _value_change(old: ir.Value, new: ir.Value) -> tuple[str, str] | None:
    """What putting ``new`` in place of ``old`` would change (its element type, rank or
    a static dimension: ``("shape", "from [1, 8] to [8]")``), where both are known; None
    when nothing known differs."""
    tensors = isinstance(old.type, ir.TensorType) and isinstance(new.type, ir.TensorType)
    if tensors and old.dtype is not None and new.dtype is not None and old.dtype != new.dtype:
        was, now = element_types.from_onnx(old.dtype), element_types.from_onnx(new.dtype)
        return "type", f"from {was} to {now}"
    if old.shape is None or new.shape is None:
        return None
    before, after = list(old.shape), list(new.shape)
    differs = len(before) != len(after) or any(
        isinstance(a, int) and isinstance(b, int) and a != b for a, b in zip(before, after)
    )
    return ("shape", f"from {_dims(old.shape)} to {_dims(new.shape)}") if differs else None


def _dims(shape: ir.Shape) -> str:
    """``[1, N, ?]``: static dims, symbolic names, ``?`` for a dim with neither."""
    return "[" + ", ".join(str(d) if isinstance(d, int) or d.value else "?" for d in shape) + "]"


def _keep_type(old: ir.Value, new: ir.Value) -> None:
    """The replacement keeps the type and shape the graph already declared."""
    if old.type is not None:
        new.type = old.type
    if old.shape is not None:
        new.shape = old.shape


def _make_attribute(op_type: str, opset: int, domain: str, planned: PlannedAttribute) -> ir.Attr:
    if planned.copied is not None:
        return planned.copied
    attr_type = _attribute_type(domain, op_type, opset, planned.name, planned.written_type)
    try:
        return _convert(planned.name, planned.value, attr_type)
    except (TypeError, ValueError, OverflowError) as exc:
        raise Blocked(f"{op_type}.{planned.name} cannot hold {planned.value!r}: {exc}") from None


def _attribute_type(domain: str, op_type: str, opset: int, name: str, written: Any) -> int:
    schema = schemas.get_schema(domain, op_type, opset)
    if schema is not None and name in schema.attributes:
        return int(schema.attributes[name].type)  # type: ignore[call-overload]  # an int enum
    return written  # the attribute kind the rule wrote


def _convert(name: str, value: Any, attr_type: int) -> ir.Attr:
    kind = onnx.AttributeProto
    if attr_type == kind.FLOAT:
        return ir.AttrFloat32(name, float(value))
    if attr_type == kind.INT:
        return ir.AttrInt64(name, _int64(value))
    if attr_type == kind.STRING:
        return ir.AttrString(name, str(value))
    if attr_type == kind.FLOATS:
        return ir.AttrFloat32s(name, [float(v) for v in _as_list(value)])
    if attr_type == kind.INTS:
        return ir.AttrInt64s(name, [_int64(v) for v in _as_list(value)])
    if attr_type == kind.STRINGS:
        return ir.AttrStrings(name, [str(v) for v in _as_list(value)])
    if attr_type == kind.TENSOR or isinstance(value, np.ndarray):
        return ir.AttrTensor(name, ir.Tensor(np.asarray(value)))
    return ir.convenience.convert_attribute(name, value)


def _int64(value: Any) -> int:
    number = int(value)
    if not -(2**63) <= number < 2**63:
        raise OverflowError(f"{number} is not a 64-bit integer")
    return number


def _as_list(value: Any) -> list[Any]:
    if isinstance(value, np.ndarray):
        return value.reshape(-1).tolist()
    if isinstance(value, (list, tuple)):
        return list(value)
    return [value]
