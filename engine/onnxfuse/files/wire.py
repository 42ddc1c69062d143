"""The protobuf wire format of a serialized ModelProto, read in place.

Where a model's main graph and its initializers lie in its file, found without
parsing it (``scan_graph``, ``initializer_ranges``): the loader leaves large weights
in the file, and the writer copies unchanged ones file to file.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import onnx_ir as ir

# Field numbers (onnx.proto): ModelProto.graph, GraphProto.initializer, TensorProto.raw_data.
MODEL_GRAPH = 7
GRAPH_INITIALIZER = 5
TENSOR_RAW_DATA = 9
TENSOR_NAME = 8
TENSOR_DIMS = 1
TENSOR_DATA_TYPE = 2
TENSOR_DOC_STRING = 12
LENGTH_DELIMITED = 2
# protobuf refuses messages this large; such files are left to it (and its error).
PROTOBUF_LIMIT = (1 << 31) - 1

# Dtypes whose bytes are the array's own (no 2-, 4- or 6-bit packing; strings apart).
PLAIN_DTYPES = frozenset(
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


# Whole-byte element types: the bytes a raw_data field needs follow from the shape.
ITEMSIZE = {dtype.value: int(dtype.itemsize) for dtype in PLAIN_DTYPES}


@dataclass(frozen=True)
class FileRange:
    """Bytes of the source model file, copied file to file (``os.sendfile``)."""

    offset: int
    nbytes: int
    fd: int | None = None  # a SourceTensor's own file; None: the model's source file


def varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


# -- where a loaded model's initializers are in its file ----------------------------------


@dataclass(frozen=True)
class GraphScan:
    """Where a serialized ModelProto's one main graph and its initializers lie: the graph
    field (its tag) and value, and each initializer's (field start, value start, end)."""

    field_start: int
    start: int
    end: int
    initializers: list[tuple[int, int, int]]


def scan_graph(data: memoryview) -> GraphScan | None:
    """The main graph of the serialized ModelProto ``data`` and its initializers; None
    for anything unexpected (no graph or two, a malformed message)."""
    try:
        graphs = [f for f in wire_fields_at(data, 0, len(data)) if f[0] == MODEL_GRAPH]
        if len(graphs) != 1 or graphs[0][1] != LENGTH_DELIMITED:
            return None
        _, _, field_start, start, end = graphs[0]
        initializers = [
            (at, a, b)
            for number, wire, at, a, b in wire_fields_at(data, start, end)
            if number == GRAPH_INITIALIZER and wire == LENGTH_DELIMITED
        ]
    except (ValueError, IndexError):
        return None
    return GraphScan(field_start, start, end, initializers)


def initializer_ranges(
    data: memoryview, scan: GraphScan | None = None
) -> dict[str, tuple[int, int, int, int]]:
    """For each main-graph initializer of the serialized ModelProto ``data`` whose
    TensorProto holds one raw_data field: its name -> (start, length, raw_data start,
    raw_data length). Names seen twice are left out; anything unexpected gives {}.
    ``scan``: ``scan_graph(data)``, if the caller has it."""
    scan = scan or scan_graph(data)
    if scan is None:
        return {}
    found: dict[str, tuple[int, int, int, int]] = {}
    twice: set[str] = set()
    try:
        for _, start, end in scan.initializers:
            names, raws = [], []
            for field, _, a, b in wire_fields(data, start, end):
                if field == TENSOR_NAME:
                    names.append(bytes(data[a:b]).decode())
                elif field == TENSOR_RAW_DATA:
                    raws.append((a, b - a))
            if len(names) != 1 or len(raws) != 1:
                continue
            if names[0] in found:
                twice.add(names[0])
            found[names[0]] = (start, end - start, *raws[0])
    except (ValueError, IndexError, UnicodeDecodeError):
        return {}
    for name in twice:
        del found[name]
    return found


def wire_fields(data: memoryview, start: int, end: int) -> Iterator[tuple[int, int, int, int]]:
    """The fields of the protobuf message in ``data[start:end]``: (number, wire type,
    value start, value end); the value of a non-length-delimited field is (-1, -1)."""
    for number, wire, _, value_start, value_end in wire_fields_at(data, start, end):
        yield number, wire, value_start, value_end


def wire_fields_at(
    data: memoryview, start: int, end: int
) -> Iterator[tuple[int, int, int, int, int]]:
    """``wire_fields`` with where each field (its tag) starts: (number, wire type,
    field start, value start, value end)."""
    position = start
    while position < end:
        field_start = position
        key = data[position]  # one-byte keys and lengths inline: the walk is per field
        if key < 0x80:
            position += 1
        else:
            key, position = read_varint(data, position)
        number, wire = key >> 3, key & 7
        if wire == 0:
            _, position = read_varint(data, position)
            yield number, wire, field_start, -1, -1
        elif wire == 1 or wire == 5:
            position += 8 if wire == 1 else 4
            yield number, wire, field_start, -1, -1
        elif wire == LENGTH_DELIMITED:
            length = data[position]
            if length < 0x80:
                position += 1
            else:
                length, position = read_varint(data, position)
            if position + length > end:
                raise ValueError("field overruns its message")
            yield number, wire, field_start, position, position + length
            position += length
        else:
            raise ValueError(f"wire type {wire}")
    if position != end:
        raise ValueError("message overruns its field")


def read_varint(data: memoryview, position: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[position]
        position += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, position
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")
