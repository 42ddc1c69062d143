"""Type and shape inference: per node for nodes a rewrite creates, per model in normalize.

onnx infers nothing for onnxruntime's ai.onnx extension ops (no standard
schema): their outputs are typed here by a standard op with the same
inference function (``extension_ops.stand_in``), and inference runs again so
that the values downstream of them get types and shapes too.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager

import onnx
import onnx.shape_inference
import onnx_ir as ir

from onnxfuse.graph.traversal import owned_graphs, subgraphs
from onnxfuse.ops import extension as extension_ops
from onnxfuse.ops import schemas
from onnxfuse.support.ir_types import tensor_shape

# Initializers above this many elements reach onnx's inference as external references
# (type and shape, no data). No operator's inference reads such a tensor's data
# (shape-like inputs hold one element per dimension), and a serialized copy would hold
# the model's weights several times over (proto, bytes, onnx's parsed copy, its result).
_INFERENCE_DATA_LIMIT = 1024
_PLACEHOLDER = "onnxfuse-inference-placeholder"
_VARIADIC = onnx.defs.OpSchema.FormalParameterOption.Variadic


def infer_node(node: ir.Node, opset: int) -> str | None:
    """Fill in the type and shape of ``node``'s outputs where onnx can infer them.

    Only outputs with no type yet are touched; failures leave them unknown
    (a later full shape inference may still fill them). Returns onnx's message where
    it finds the node ill-typed (inputs of types or shapes the op cannot take), which
    the checker would reject too; None otherwise, also where it lacks an input's type.
    """
    schema = schemas.get_schema(node.domain, node.op_type, opset)
    stand_in = False
    if schema is None and extension_ops.is_extension(node.domain, node.op_type, opset):
        found = extension_ops.stand_in(node.op_type)
        if found is not None:
            schema, opset = found
            stand_in = True
    if schema is None or all(o.type is not None for o in node.outputs):
        return None
    input_types: dict[str, onnx.TypeProto] = {}
    for value in node.inputs:
        if value is None or value.type is None or not value.name:
            continue
        type_proto = onnx.TypeProto()
        ir.serde.serialize_type_into(type_proto, value.type)
        if value.shape is not None and type_proto.HasField("tensor_type"):
            ir.serde.serialize_shape_into(type_proto, value.shape)
        input_types[value.name] = type_proto
    input_data: dict[str, onnx.TensorProto] = {}
    for value in node.inputs:
        const = value.const_value if value is not None else None
        if value is not None and value.name and const is not None and const.size <= 64:
            input_data[value.name] = ir.serde.serialize_tensor(const)
    try:
        proto = ir.serde.serialize_node(node)
        inferred = onnx.shape_inference.infer_node_outputs(
            schema,
            proto,
            input_types,
            input_data,
            opset_imports=[onnx.helper.make_opsetid(node.domain, opset)],
            ir_version=10,
        )
    except (onnx.shape_inference.InferenceError, onnx.checker.ValidationError) as exc:
        # Only a verdict on the node itself: its own schema, every input typed.
        typed = all(v is None or v.name in input_types for v in node.inputs)
        return str(exc).strip() if typed and not stand_in else None
    except Exception:  # onnx raises several types for nodes it cannot infer (KeyError: an
        return None  # untyped input)
    for output in node.outputs:
        inferred_type = inferred.get(output.name or "")
        if inferred_type is None or output.type is not None:
            continue
        try:
            output.type = ir.serde.deserialize_type_proto_for_type(inferred_type)
            output.shape = ir.serde.deserialize_type_proto_for_shape(inferred_type)
        except Exception:  # an inferred type the IR cannot hold: leave it unknown
            continue
    return None


def schema_dtypes(node: ir.Node, opset: int) -> list[ir.DataType | None]:
    """Each output's element type as the op's type constraints fix it from its inputs'
    types (None where they do not): inference's answer for the types alone, without
    onnx's per-node cost."""
    if node.domain == "" and node.op_type == "Cast":
        to = node.attributes.get("to")
        return [ir.DataType(to.as_int()) if to is not None else None] * len(node.outputs)
    schema = schemas.get_schema(node.domain, node.op_type, opset)
    if schema is None:
        return [None] * len(node.outputs)
    bound: dict[str, ir.DataType] = {}
    formals = schema.inputs
    for index, value in enumerate(node.inputs):
        if not formals or value is None or value.dtype is None:
            continue
        formal = formals[min(index, len(formals) - 1)]
        if (
            index >= len(formals)
            and formal.option != onnx.defs.OpSchema.FormalParameterOption.Variadic
        ):
            continue
        bound.setdefault(formal.type_str, value.dtype)
    single = {
        c.type_param_str: c.allowed_type_strs[0]
        for c in schema.type_constraints
        if len(c.allowed_type_strs) == 1
    }
    found: list[ir.DataType | None] = []
    for index in range(len(node.outputs)):
        if index >= len(schema.outputs):
            found.append(None)
            continue
        type_str = schema.outputs[index].type_str
        fixed = bound.get(type_str) or _tensor_type(single.get(type_str, type_str))
        found.append(fixed)
    return found


def _tensor_type(type_str: str) -> ir.DataType | None:
    """``tensor(float)`` -> FLOAT; None for anything else (a type variable, a sequence)."""
    if not type_str.startswith("tensor(") or not type_str.endswith(")"):
        return None
    return ir.DataType.__members__.get(type_str[7:-1].upper())


# onnx's inferred types of a model's values, by name (``inferred_types``).
InferredTypes = dict[str, onnx.TypeProto]


def infer_shapes(
    model: ir.Model, inferred: InferredTypes | None = None, outputs: bool = True
) -> bool:
    """onnx's shape inference over the whole model, through extension ops.

    onnx leaves the outputs of extension ops, and everything computed from them,
    untyped. Where the model holds any, one walk in graph order types them by
    their stand-ins and the nodes after them by their own schemas (node by node),
    then onnx's inference runs again to refine what the walk could not see
    (shapes computed at run time). A help, not a requirement: where inference
    fails, values stay as they were. ``inferred``: onnx's first inference, already
    made on a protobuf of the model (as loaded, or as it is about to be saved).
    ``outputs``: False leaves the graph outputs' declared types alone. Whether any
    value's type or shape changed.
    """
    if inferred is None:
        changed = _infer_once(model, outputs)
    else:
        changed = _apply_types(model, inferred, outputs)
    if _type_through_extension_ops(model):
        _infer_once(model, outputs)
        changed = True
    return changed


def _type_through_extension_ops(model: ir.Model) -> bool:
    """Type the untyped outputs of extension nodes and of the nodes after them, in
    graph order; whether any extension node was met."""
    found = False
    for graph, opsets, _ in owned_graphs(model):
        opset = opsets.get("", opsets.get("ai.onnx"))
        if opset is None:
            continue
        reached = False  # only values after an extension node are left untyped by onnx
        for node in graph:
            if extension_ops.is_extension(node.domain, node.op_type, opset):
                found = reached = True
            if reached and any(o.type is None for o in node.outputs):
                version = opset if node.domain in ("", "ai.onnx") else opsets.get(node.domain, 1)
                infer_node(node, version)
    return found


def extension_output_types(proto: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    """Inferred types of the main graph's extension-node outputs that ``proto`` leaves
    undeclared: declared in a checker view, they let the checker's own inference
    see through those nodes."""
    declared = {v.name for v in (*proto.graph.value_info, *proto.graph.output)}
    try:
        model = ir.from_proto(proto)
    except Exception:  # a graph onnx_ir cannot read: the checker will say why
        return []
    infer_shapes(model)
    opset = model.opset_imports.get("", model.opset_imports.get("ai.onnx"))
    found = []
    for node in model.graph:
        if opset is None or not extension_ops.is_extension(node.domain, node.op_type, opset):
            continue
        for output in node.outputs:
            if output.name and output.type is not None and output.name not in declared:
                found.append(ir.serde.serialize_value(output))
    return found


def _infer_once(model: ir.Model, outputs: bool = True) -> bool:
    """Types and shapes for every value of the model's graphs that onnx can infer.

    onnx's own inference on a serialized copy, merged back by value name. Lighter
    than onnx_ir's ShapeInferencePass, which deserializes the whole inferred
    model to merge it, and not strict: a node onnx cannot infer leaves only the
    values that depend on it unknown. Shape inference is a help: failures are
    ignored.
    """
    try:
        with _weights_as_placeholders(model):
            proto = ir.serde.serialize_model(model)
    except Exception:  # too large to serialize: keep what we have
        return False
    _forget_invented_dims(proto.graph)
    found = inferred_types(proto)
    return found is not None and _apply_types(model, found, outputs)


# onnx names a dimension it cannot infer ``unk__N``: a placeholder, not a dimension the
# model declares.
_INVENTED_DIM = re.compile(r"unk__\d+")


def _forget_invented_dims(graph: onnx.GraphProto) -> None:
    """Clear the ``unk__N`` names of intermediate values (and of subgraphs' values).

    onnx's inference keeps a dimension's existing name over the one it infers, so a name
    invented before folding made a shape computable (a Slice whose ends came from Shape,
    [unk__1, unk__2, 512] where [batch, seq, 512] is now inferable) would stay; the
    graph's inputs and outputs keep what they declare."""
    for info in graph.value_info:
        for dim in info.type.tensor_type.shape.dim:
            if dim.HasField("dim_param") and _INVENTED_DIM.fullmatch(dim.dim_param):
                dim.ClearField("dim_param")
    for node in graph.node:
        for attr in node.attribute:
            for sub in (attr.g,) if attr.HasField("g") else attr.graphs:
                _forget_invented_dims(sub)


def inferred_types(proto: onnx.ModelProto) -> InferredTypes | None:
    """onnx's inference over ``proto``, not strict, with data propagation; None where
    onnx gave up."""
    try:
        inferred = onnx.shape_inference.infer_shapes(proto, strict_mode=False, data_prop=True)
    except Exception:  # onnx gave up: keep what we have
        return None
    found: InferredTypes = {}
    _collect_types(inferred.graph, found)
    return found


def _apply_types(model: ir.Model, found: InferredTypes, outputs: bool = True) -> bool:
    changed = False
    kept = set() if outputs else {id(v) for v in model.graph.outputs}
    for graph in (model.graph, *subgraphs(model.graph)):
        for value in _graph_values(graph):
            if id(value) in kept:
                continue
            type_proto = found.get(value.name or "")
            if type_proto is None or not type_proto.HasField("tensor_type"):
                continue
            try:
                dtype = ir.serde.deserialize_type_proto_for_type(type_proto)
                shape = ir.serde.deserialize_type_proto_for_shape(type_proto)
            except Exception:  # a type the IR cannot hold: leave the value as it is
                continue
            if value.type is None and dtype is not None:
                value.type = dtype
                changed = True
            if shape is not None and value.shape != shape:
                value.shape = shape
                changed = True
    return changed


def _weights_as_placeholders(model: ir.Model) -> AbstractContextManager[None]:
    return weights_as_placeholders(
        model, _PLACEHOLDER, lambda tensor: tensor.size > _INFERENCE_DATA_LIMIT
    )


@contextmanager
def weights_as_placeholders(
    model: ir.Model, location: str, large: Callable[[ir.TensorProtocol], bool]
) -> Iterator[None]:
    """In-memory initializers for which ``large`` holds stand in as external tensors
    (at ``location``) of the same type and shape while the model is serialized; the
    originals are back afterwards."""
    saved: list[tuple[ir.Value, ir.TensorProtocol]] = []
    try:
        for graph in (model.graph, *subgraphs(model.graph)):
            for value in graph.initializers.values():
                tensor = value.const_value
                if tensor is None or isinstance(tensor, ir.ExternalTensor) or not large(tensor):
                    continue
                assert value.name is not None  # an initializer is registered by its name
                saved.append((value, tensor))
                value.const_value = ir.ExternalTensor(
                    location, None, None, tensor.dtype, shape=tensor_shape(tensor), name=value.name
                )
        yield
    finally:
        for value, tensor in saved:
            value.const_value = tensor


def _collect_types(graph: onnx.GraphProto, found: dict[str, onnx.TypeProto]) -> None:
    for info in (*graph.input, *graph.value_info, *graph.output):
        found.setdefault(info.name, info.type)
    for node in graph.node:
        for attr in node.attribute:
            for sub in (attr.g,) if attr.HasField("g") else attr.graphs:
                _collect_types(sub, found)


def _graph_values(graph: ir.Graph):
    yield from graph.inputs
    for node in graph:
        yield from node.outputs
