"""Writing a model as one protobuf file without copying its weights three times.

``ir.save`` copies every weight into a bytes object, then into the ModelProto, then
into the serialized string, and only then writes it. Here the main graph's large
initializers are written straight from their arrays (or their loaded protos), and
only the rest of the model is serialized. The file's bytes are the ones ``ir.save``
writes: protobuf encodes a message as its set fields in field-number order, each
as tag, length and bytes, so a message is the concatenation of its parts
(``tests/files/test_writer.py`` compares the two on real models).

Loading leaves the raw data of a model's large main-graph initializers in the file
(``source_weights``): protobuf parses only the rest, and the writer copies those still
unchanged file to file.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import BinaryIO

import numpy as np
import onnx
import onnx_ir as ir
from google.protobuf.message import Message

from onnxfuse.files.source_weights import SourceTensor
from onnxfuse.files.wire import (
    GRAPH_INITIALIZER,
    LENGTH_DELIMITED,
    MODEL_GRAPH,
    PLAIN_DTYPES,
    TENSOR_RAW_DATA,
    FileRange,
    varint,
)
from onnxfuse.fold.spill import FillTensor
from onnxfuse.support.ir_types import tensor_shape

# In-memory initializers of this many bytes or more are written from their own buffers.
DIRECT_MIN_BYTES = 64 * 1024
# Where large initializers point in a serialized model until their bytes are written.
PLACEHOLDER = "onnxfuse-check-placeholder"
# Output files of this many bytes or more have their blocks allocated before writing.
RESERVE_MIN_BYTES = 16 << 20

Buffer = bytes | memoryview
Part = Buffer | FileRange

# Where a loaded model's initializers lie in its file (``remember_source``), in its meta.
SOURCE_META = "onnxfuse.source_tensors"


@dataclass
class SourceTensors:
    """The file a model was loaded from, as it was then, and for each main-graph
    initializer's TensorProto (by identity) its byte range there and its raw_data's."""

    path: str
    stat: tuple[int, int, int]  # size, mtime_ns, inode
    ranges: dict[int, tuple[onnx.TensorProto, int, int, int, int]]


def serialize_stripped(model: ir.Model) -> tuple[onnx.ModelProto, list[ir.TensorProtocol | None]]:
    """``model`` serialized with its large in-memory main-graph initializers (not strings)
    as external references to ``PLACEHOLDER``, and for each initializer proto the tensor
    it stands for (None: the proto holds it). The checker can check this proto from a
    directory holding an empty ``PLACEHOLDER`` file; ``write_model`` writes it."""
    values = list(model.graph.initializers.values())
    large = [
        value
        for value in values
        if value.const_value is not None
        and not isinstance(value.const_value, ir.ExternalTensor)
        and value.const_value.dtype != ir.DataType.STRING
        and value.const_value.nbytes >= DIRECT_MIN_BYTES
    ]
    originals = {id(value): value.const_value for value in large}
    try:
        for value in large:
            tensor = value.const_value
            assert tensor is not None
            assert value.name is not None  # an initializer is registered by its name
            tensor.name = value.name  # as ir's serializer does
            value.const_value = ir.ExternalTensor(
                PLACEHOLDER, None, None, tensor.dtype, shape=tensor_shape(tensor), name=value.name
            )
        proto = ir.serde.serialize_model(model)
    finally:
        for value in large:
            value.const_value = originals[id(value)]
    tensors = [originals.get(id(value)) for value in values if value.const_value is not None]
    if len(tensors) != len(proto.graph.initializer):
        raise AssertionError("initializers and their protos do not line up")
    return proto, tensors


def write_model(
    model: ir.Model,
    out: BinaryIO,
    serialized: tuple[onnx.ModelProto, list[ir.TensorProtocol | None]] | None = None,
) -> None:
    """Write ``model`` into ``out``, a new empty file open for binary writing, as one
    protobuf: the bytes ``ir.save(model, path)`` writes. Initializers must be in memory
    (no external data). ``serialized``: what ``serialize_stripped(model)`` returned, if
    the caller has it (the model unchanged)."""
    proto, tensors = serialized or serialize_stripped(model)
    graph = proto.graph
    with _open_source(model) as (source_fd, source):
        entries: list[list[Part]] = []
        for tensor, tensor_proto in zip(tensors, graph.initializer):
            if tensor is None:
                entries.append([tensor_proto.SerializeToString()])
                continue
            if isinstance(tensor, SourceTensor):
                found = tensor.file_range()
            else:
                found = _source_range(tensor, source, source_fd)
            entries.append([found] if found is not None else _tensor(tensor))
        graph_parts: list[Part] = [_part(graph, 0, GRAPH_INITIALIZER)]
        for entry in entries:
            graph_parts.extend(_field(GRAPH_INITIALIZER, entry))
        graph_parts.append(_part(graph, GRAPH_INITIALIZER + 1))
        parts: list[Part] = [_part(proto, 0, MODEL_GRAPH)]
        parts.extend(_field(MODEL_GRAPH, graph_parts))
        parts.append(_part(proto, MODEL_GRAPH + 1))
        total = _size(parts)
        _reserve(out.fileno(), total)
        for part in parts:
            if isinstance(part, FileRange):
                from_fd = source_fd if part.fd is None else part.fd
                assert from_fd is not None
                out.flush()
                _copy_range(from_fd, out.fileno(), part)
            else:
                out.write(part)
        out.flush()
        if os.fstat(out.fileno()).st_size != total:
            raise AssertionError("the model written is not the size its parts add up to")


def _reserve(fd: int, size: int) -> None:
    """Allocate a large file's blocks in one call rather than as each write lands
    (244 MB: 0.095 -> 0.075 s on ext4). Where the file system cannot, writes allocate."""
    if size < RESERVE_MIN_BYTES:
        return
    with suppress(OSError):
        os.posix_fallocate(fd, 0, size)


@contextmanager
def _open_source(model: ir.Model) -> Iterator[tuple[int | None, SourceTensors | None]]:
    """The source file of ``model``, opened, if it is still the file it was loaded from."""
    source = model.meta.get(SOURCE_META)
    if not isinstance(source, SourceTensors):
        yield None, None
        return
    try:
        fd = os.open(source.path, os.O_RDONLY)
    except OSError:
        yield None, None
        return
    try:
        found = os.fstat(fd)
        if (found.st_size, found.st_mtime_ns, found.st_ino) != source.stat:
            yield None, None
        else:
            yield fd, source
    finally:
        os.close(fd)


def _source_range(
    tensor: ir.TensorProtocol, source: SourceTensors | None, fd: int | None
) -> FileRange | None:
    """The range of the source file that holds exactly what ``_tensor`` would make for
    a tensor loaded from it: its TensorProto, unchanged (size, every byte outside
    raw_data compared; raw_data is the one the proto was parsed from)."""
    if source is None or fd is None or not isinstance(tensor, ir.serde.TensorProtoTensor):
        return None
    if tensor.metadata_props or tensor.dtype not in PLAIN_DTYPES:
        return None
    entry = source.ranges.get(id(tensor.raw))
    if entry is None or entry[0] is not tensor.raw:
        return None
    message, start, length, raw_start, raw_length = entry
    if message.ByteSize() != length:
        return None
    head = _part(message, 0, TENSOR_RAW_DATA)
    head += varint(TENSOR_RAW_DATA << 3 | LENGTH_DELIMITED) + varint(raw_length)
    tail = _part(message, TENSOR_RAW_DATA + 1)
    raw_end = raw_start + raw_length
    if (
        len(head) != raw_start - start
        or len(tail) != start + length - raw_end
        or os.pread(fd, len(head), start) != head
        or os.pread(fd, len(tail), raw_end) != tail
    ):
        return None
    return FileRange(start, length)


def _copy_range(source_fd: int, out_fd: int, part: FileRange) -> None:
    """Append ``part`` of the source file to ``out_fd``: in the kernel where it can,
    else through a small buffer."""
    offset, left = part.offset, part.nbytes
    try:
        while left:
            sent = os.sendfile(out_fd, source_fd, offset, left)
            if sent == 0:
                raise OSError("source file ended early")
            offset, left = offset + sent, left - sent
    except OSError:
        while left:
            chunk = os.pread(source_fd, min(left, 1 << 20), offset)
            if not chunk:
                raise
            view = memoryview(chunk)
            while view:
                view = view[os.write(out_fd, view) :]
            offset, left = offset + len(chunk), left - len(chunk)


def _tensor(tensor: ir.TensorProtocol) -> list[Part]:
    """The serialized TensorProto of an initializer, as ``serialize_tensor_into`` makes it."""
    if isinstance(tensor, ir.serde.TensorProtoTensor):
        if tensor.metadata_props or tensor.dtype not in PLAIN_DTYPES:
            return [ir.serde.serialize_tensor(tensor).SerializeToString()]
        return [tensor.raw.SerializeToString()]  # what CopyFrom(raw) serializes to
    if (
        type(tensor) not in (ir.Tensor, FillTensor, SourceTensor)
        or tensor.dtype not in PLAIN_DTYPES
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
        return [head.SerializeToString(), *_field(TENSOR_RAW_DATA, tensor.chunks())]
    array = tensor.numpy()
    if array.flags.c_contiguous:
        # numpy's stubs give ndarray the buffer protocol's __buffer__ only from Python 3.12.
        data: Buffer = memoryview(array.reshape(-1).view(np.uint8))  # type: ignore[arg-type]
    else:
        data = array.tobytes()
    return [head.SerializeToString(), *_field(TENSOR_RAW_DATA, [data])]


def _field(number: int, parts: Sequence[Part]) -> list[Part]:
    """A length-delimited field holding ``parts``: tag, length, then the parts."""
    return [varint(number << 3 | LENGTH_DELIMITED) + varint(_size(parts)), *parts]


def _size(parts: Sequence[Part]) -> int:
    return sum(len(p) if isinstance(p, bytes) else p.nbytes for p in parts)


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


def remember_source(
    model: ir.Model, path: str | os.PathLike, stat: os.stat_result, ranges: dict
) -> None:
    """Record, in ``model.meta``, where its main-graph initializers (just loaded from
    ``path``, unchanged) lie in the file: the writer copies those still unchanged file to
    file instead of serializing them (a copy of every weight)."""
    found = {}
    for value in model.graph.initializers.values():
        tensor = value.const_value
        if isinstance(tensor, ir.serde.TensorProtoTensor) and tensor.raw.name in ranges:
            found[id(tensor.raw)] = (tensor.raw, *ranges[tensor.raw.name])
    if found:
        key = (stat.st_size, stat.st_mtime_ns, stat.st_ino)
        model.meta[SOURCE_META] = SourceTensors(os.fspath(path), key, found)
