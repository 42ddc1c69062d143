"""Concrete dtype and shape of every main-graph value, from shape inference with bound dims."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import onnx
import onnx_ir as ir

from onnxfuse.errors import ModelError
from onnxfuse.support.ir_types import tensor_shape, value_name

# Initializers larger than this are passed to shape inference as typed inputs without
# their data: shape inference only needs the small ones (shapes, axes) as values.
_SMALL_INITIALIZER_BYTES = 1024


@dataclass(frozen=True)
class TensorInfo:
    """A tensor's element type and concrete shape."""

    dtype: ir.DataType
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        # Sub-byte types (int4, float4) pack two elements a byte: round up.
        return math.ceil(self.dtype.itemsize * math.prod(self.shape))


def symbolic_dims(model: ir.Model) -> set[str]:
    """Names of the symbolic dims on the main graph's values."""
    names: set[str] = set()
    for value in _main_values(model.graph):
        if value.shape is not None:
            names.update(d.value for d in value.shape if isinstance(d, ir.SymbolicDim) and d.value)
    return names


def infer_tensor_infos(model: ir.Model, dims: Mapping[str, int]) -> dict[str, TensorInfo | str]:
    """Run onnx shape inference on a copy of ``model`` with ``dims`` bound.

    Returns, for every main-graph value, its TensorInfo or, when not fully known,
    a one-line reason (used to name the tensor in the error only if it matters).
    The caller's model is not modified.
    """
    unknown = sorted(set(dims) - symbolic_dims(model))
    if unknown:
        known = ", ".join(sorted(symbolic_dims(model))) or "none"
        raise ModelError(f"unknown dim {unknown[0]!r} (the model's symbolic dims: {known})")
    clone = model.clone()
    for graph in clone.graphs():
        for value in _main_values(graph):
            if value.shape is not None:
                value.shape = ir.Shape([_bind(d, dims) for d in value.shape])
    proto = _proto_without_big_weights(clone)
    try:
        inferred = onnx.shape_inference.infer_shapes(proto, strict_mode=True, data_prop=True)
    except (onnx.shape_inference.InferenceError, onnx.checker.ValidationError) as exc:
        first = str(exc).strip().splitlines()[0][:300]
        raise ModelError(f"shape inference failed: {first}") from None
    infos: dict[str, TensorInfo | str] = {}
    graph_proto = inferred.graph
    for vi in (*graph_proto.input, *graph_proto.value_info, *graph_proto.output):
        infos[vi.name] = _info_from_type(vi.type)
    for init in graph_proto.initializer:
        if init.data_type == onnx.TensorProto.STRING:
            infos[init.name] = "is a string tensor: its size is not known before it is computed"
        else:
            infos[init.name] = TensorInfo(ir.DataType(init.data_type), tuple(init.dims))
    _add_loop_carried(clone.graph, infos)
    return infos


def _add_loop_carried(graph: ir.Graph, infos: dict[str, TensorInfo | str]) -> None:
    """onnx shape inference drops the shapes of a Loop's carried values (they may change
    from one iteration to the next); when the body declares a fixed shape, use it."""
    for node in graph:
        if node.op_type != "Loop" or node.domain not in ("", "ai.onnx"):
            continue
        body_outputs = node.attributes["body"].as_graph().outputs
        n_carried = len(node.inputs) - 2
        for out, declared in zip(node.outputs[:n_carried], body_outputs[1:], strict=False):
            shape = declared.shape
            name = value_name(out)
            if isinstance(infos.get(name), TensorInfo) or declared.dtype is None:
                continue
            if shape is not None and all(isinstance(d, int) for d in shape):
                infos[name] = TensorInfo(declared.dtype, shape.numpy())


def _bind(dim: int | ir.SymbolicDim, dims: Mapping[str, int]) -> int | ir.SymbolicDim:
    if isinstance(dim, ir.SymbolicDim) and dim.value is not None and dim.value in dims:
        return dims[dim.value]
    return dim


def _main_values(graph: ir.Graph) -> list[ir.Value]:
    values = [*graph.inputs, *graph.initializers.values()]
    values += [out for node in graph for out in node.outputs]
    return values


def _proto_without_big_weights(model: ir.Model) -> onnx.ModelProto:
    """Serialize ``model`` (a private copy) with big initializers turned into typed inputs."""
    graph = model.graph
    for name, value in list(graph.initializers.items()):
        tensor = value.const_value
        if tensor is None or isinstance(tensor, ir.ExternalTensor):
            big = True
        else:
            big = tensor.nbytes > _SMALL_INITIALIZER_BYTES
        if big:
            if tensor is not None:
                value.dtype, value.shape = tensor.dtype, tensor_shape(tensor)
            if value not in graph.inputs:
                graph.inputs.append(value)
            graph.initializers.pop(name)
    return ir.serde.serialize_model(model)


def _info_from_type(type_proto: onnx.TypeProto) -> TensorInfo | str:
    if not type_proto.HasField("tensor_type"):
        return f"is a {type_proto.WhichOneof('value') or 'value of unknown type'}, not a tensor"
    tensor_type = type_proto.tensor_type
    if not tensor_type.elem_type:
        return "has an unknown element type"
    if tensor_type.elem_type == onnx.TensorProto.STRING:
        return "is a string tensor: its size is not known before it is computed"
    if not tensor_type.HasField("shape"):
        return "has an unknown rank"
    shape = []
    for d in tensor_type.shape.dim:
        if not d.HasField("dim_value"):
            if d.dim_param:
                return f"has unknown dim {d.dim_param!r}: bind it with --dim {d.dim_param}=VALUE"
            return "has a dim that shape inference could not determine"
        shape.append(d.dim_value)
    return TensorInfo(ir.DataType(tensor_type.elem_type), tuple(shape))
