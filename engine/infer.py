"""Per-node type and shape inference for nodes a rewrite creates."""

from __future__ import annotations

import onnx
import onnx.shape_inference
import onnx_ir as ir

from onnxfuse.language import schemas


def infer_node(node: ir.Node, opset: int) -> None:
    """Fill in the type and shape of ``node``'s outputs where onnx can infer them.

    Only outputs with no type yet are touched; failures leave them unknown
    (a later full shape inference may still fill them).
    """
    schema = schemas.get_schema(node.domain, node.op_type, opset)
    if schema is None or all(o.type is not None for o in node.outputs):
        return
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
    except Exception:  # onnx raises several types for nodes it cannot infer
        return
    for output in node.outputs:
        type_proto = inferred.get(output.name or "")
        if type_proto is None or output.type is not None:
            continue
        try:
            output.type = ir.serde.deserialize_type_proto_for_type(type_proto)
            output.shape = ir.serde.deserialize_type_proto_for_shape(type_proto)
        except Exception:  # an inferred type the IR cannot hold: leave it unknown
            continue
