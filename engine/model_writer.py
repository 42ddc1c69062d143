"""Writing a model as one protobuf file without copying its weights three times.

``ir.save`` copies every weight into a bytes object, then into the ModelProto, then
into the serialized string, and only then writes it. Here the main graph's large
initializers are written straight from their arrays (or their loaded protos), and
only the rest of the model is serialized. The file's bytes are the ones ``ir.save``
writes: protobuf encodes a message as its set fields in field-number order, each
as tag, length and bytes, so a message is the concatenation of its parts
(``tests/test_model_writer.py`` compares the two on real models).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable

import numpy as np
import onnx
import onnx_ir as ir
from google.protobuf.message import Message

from onnxfuse.spill import FillTensor

# In-memory initializers of this many bytes or more are written from their own buffers.
DIRECT_MIN_BYTES = 64 * 1024
_PLACEHOLDER = "onnxfuse-writer-placeholder"

# Field numbers (onnx.proto): ModelProto.graph, GraphProto.initializer, TensorProto.raw_data.
_MODEL_GRAPH = 7
_GRAPH_INITIALIZER = 5
_TENSOR_RAW_DATA = 9
_LENGTH_DELIMITED = 2

# Dtypes whose bytes are the array's own (no 2-, 4- or 6-bit packing; strings apart).
_PLAIN = frozenset(
    {
        ir.DataType.FLOAT,
        ir.DataType.UINT8,
        ir.DataType.INT8,
        ir.DataType.UINT16,
        ir.DataType.INT16,
        ir.DataType.INT32,
        ir.DataType.INT64,
        ir.DataType.BOOL,
        ir.DataType.FLOAT16,
        ir.DataType.DOUBLE,
        ir.DataType.UINT32,
        ir.DataType.UINT64,
        ir.DataType.COMPLEX64,
        ir.DataType.COMPLEX128,
        ir.DataType.BFLOAT16,
    }
)

Buffer = bytes | memoryview


def write_model(model: ir.Model, path: str | os.PathLike) -> None:
    """Write ``model`` to ``path`` as one protobuf: the bytes ``ir.save(model, path)``
    writes. Initializers must be in memory (no external data)."""
    values = list(model.graph.initializers.values())
    large = [
        value
        for value in values
        if value.const_value is not None
        and not isinstance(value.const_value, ir.ExternalTensor)
        and value.const_value.nbytes >= DIRECT_MIN_BYTES
    ]
    originals = {id(value): value.const_value for value in large}
    try:
        for value in large:
            tensor = value.const_value
            assert tensor is not None
            tensor.name = value.name  # as ir's serializer does
            value.const_value = ir.ExternalTensor(
                _PLACEHOLDER, None, None, tensor.dtype, shape=tensor.shape, name=value.name
            )
        proto = ir.serde.serialize_model(model)
    finally:
        for value in large:
            value.const_value = originals[id(value)]
    tensors = [originals.get(id(value)) for value in values if value.const_value is not None]
    graph = proto.graph
    if len(tensors) != len(graph.initializer):
        raise AssertionError("initializers and their protos do not line up")
    entries: list[list[Buffer]] = []
    for tensor, serialized in zip(tensors, graph.initializer):
        entries.append([serialized.SerializeToString()] if tensor is None else _tensor(tensor))
    graph_parts = [_part(graph, 0, _GRAPH_INITIALIZER)]
    for entry in entries:
        graph_parts.extend(_field(_GRAPH_INITIALIZER, entry))
    graph_parts.append(_part(graph, _GRAPH_INITIALIZER + 1))
    parts = [_part(proto, 0, _MODEL_GRAPH)]
    parts.extend(_field(_MODEL_GRAPH, graph_parts))
    parts.append(_part(proto, _MODEL_GRAPH + 1))
    with open(path, "wb") as file:
        for part in parts:
            file.write(part)


def _tensor(tensor: ir.TensorProtocol) -> list[Buffer]:
    """The serialized TensorProto of an initializer, as ``serialize_tensor_into`` makes it."""
    if isinstance(tensor, ir.serde.TensorProtoTensor):
        if tensor.metadata_props or tensor.dtype not in _PLAIN:
            return [ir.serde.serialize_tensor(tensor).SerializeToString()]
        return [tensor.raw.SerializeToString()]  # what CopyFrom(raw) serializes to
    if (
        type(tensor) not in (ir.Tensor, FillTensor)
        or tensor.dtype not in _PLAIN
        or tensor.doc_string
        or tensor.metadata_props
        or sys.byteorder != "little"
    ):
        return [ir.serde.serialize_tensor(tensor).SerializeToString()]
    head = onnx.TensorProto()
    if tensor.name:
        head.name = tensor.name
    head.data_type = tensor.dtype.value
    head.dims.extend(tensor.shape.numpy())
    if isinstance(tensor, FillTensor):
        return [head.SerializeToString(), *_field(_TENSOR_RAW_DATA, tensor.chunks())]
    array = tensor.numpy()
    if array.flags.c_contiguous:
        data: Buffer = memoryview(array.reshape(-1).view(np.uint8))
    else:
        data = array.tobytes()
    return [head.SerializeToString(), *_field(_TENSOR_RAW_DATA, [data])]


def _field(number: int, parts: list[Buffer]) -> list[Buffer]:
    """A length-delimited field holding ``parts``: tag, length, then the parts."""
    size = sum(len(p) if isinstance(p, bytes) else p.nbytes for p in parts)
    return [_varint(number << 3 | _LENGTH_DELIMITED) + _varint(size), *parts]


def _part(message: Message, low: int, high: int | None = None) -> bytes:
    """``message``'s fields numbered from ``low`` up to (not including) ``high``, serialized."""
    part = type(message)()
    for field in _set_fields(message, low, high):
        value = getattr(message, field.name)
        if field.is_repeated:
            getattr(part, field.name).extend(value)
        elif field.message_type is not None:
            getattr(part, field.name).CopyFrom(value)
        else:
            setattr(part, field.name, value)
    return part.SerializeToString()


def _set_fields(message: Message, low: int, high: int | None) -> Iterable:
    for field in message.DESCRIPTOR.fields:
        if field.number < low or (high is not None and field.number >= high):
            continue
        if field.is_repeated:
            if len(getattr(message, field.name)):
                yield field
        elif message.HasField(field.name):
            yield field


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)
