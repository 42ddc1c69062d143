"""Large weights left in the model file at load, read when a rule needs them.

``split_weights`` makes the bytes protobuf parses: the model without the raw data of
its large main-graph initializers (BERT-base: 1.4 MB instead of 230). Each becomes a
``SourceTensor`` that maps its bytes from the file on every read, and that the writer
copies file to file while it is unchanged.
"""

from __future__ import annotations

import math
import mmap
import os
import sys
import weakref
from collections import Counter
from dataclasses import dataclass

import numpy as np
import onnx
import onnx_ir as ir
from google.protobuf.message import DecodeError

from onnxfuse.files.wire import (
    GRAPH_INITIALIZER,
    ITEMSIZE,
    LENGTH_DELIMITED,
    MODEL_GRAPH,
    PROTOBUF_LIMIT,
    TENSOR_DATA_TYPE,
    TENSOR_DIMS,
    TENSOR_DOC_STRING,
    TENSOR_NAME,
    TENSOR_RAW_DATA,
    FileRange,
    GraphScan,
    scan_graph,
    varint,
    wire_fields_at,
)

# The fields a TensorProto left in the file may have besides raw_data: the ones onnx_ir
# writes for an in-memory tensor without metadata.
_STUB_FIELDS = frozenset({TENSOR_DIMS, TENSOR_DATA_TYPE, TENSOR_NAME, TENSOR_DOC_STRING})
# Initializers whose raw data is this large are left in the file (``split_weights``).
LAZY_MIN_BYTES = 64 * 1024


@dataclass(frozen=True)
class LazyEntry:
    """A main-graph initializer whose raw data ``split_weights`` left out: its TensorProto's
    fields but raw_data, and where it and its raw data lie in the file."""

    name: str
    data_type: int
    dims: tuple[int, ...]
    doc_string: str
    start: int  # the TensorProto's bytes (the initializer field's value)
    length: int
    raw_start: int  # the raw data's bytes
    raw_length: int


def split_weights(
    data: memoryview, min_bytes: int = LAZY_MIN_BYTES, scan: GraphScan | None = None
) -> tuple[bytearray, dict[str, LazyEntry]] | None:
    """The serialized ModelProto ``data`` without the raw data of its main-graph
    initializers of ``min_bytes`` or more, and those initializers by name; None when
    there is none (or anything unexpected: parse ``data`` itself, and get protobuf's
    verdict on it). Only tensors whose bytes are exactly what onnx_ir writes for them
    are left out: a plain element type, raw data of exactly the size the shape needs,
    and besides it only a name, dims, data type and doc string, in protobuf's order.
    Whatever else stays in the copy, as protobuf would parse it. ``scan``:
    ``scan_graph(data)``, if the caller has it."""
    if sys.byteorder != "little" or len(data) > PROTOBUF_LIMIT:
        return None
    scan = scan or scan_graph(data)
    if scan is None:
        return None
    found: dict[str, tuple[int, LazyEntry, bytes]] = {}
    names: list[str] = []
    try:
        for field_start, start, end in scan.initializers:
            made = _lazy_entry(data, start, end, min_bytes, names)
            if made is not None:
                found[made[0].name] = (field_start, *made)
    except (ValueError, IndexError, UnicodeDecodeError):
        return None
    for name in {n for n, seen in Counter(names).items() if seen > 1} & found.keys():
        del found[name]  # names seen twice: left to protobuf and onnx_ir
    if not found:
        return None
    body = bytearray()
    position = scan.start
    for field_start, entry, stub in sorted(found.values(), key=lambda item: item[0]):
        body += data[position:field_start]
        body += varint(GRAPH_INITIALIZER << 3 | LENGTH_DELIMITED) + varint(len(stub))
        body += stub
        position = entry.start + entry.length
    body += data[position : scan.end]
    model = bytearray(data[: scan.field_start])
    model += varint(MODEL_GRAPH << 3 | LENGTH_DELIMITED) + varint(len(body))
    model += body
    model += data[scan.end :]
    return model, {entry.name: entry for _, entry, _ in found.values()}


def _lazy_entry(
    data: memoryview, start: int, end: int, min_bytes: int, names: list[str]
) -> tuple[LazyEntry, bytes] | None:
    """The initializer TensorProto in ``data[start:end]`` as a LazyEntry and its bytes but
    the raw data field, if it can be left in the file (see ``split_weights``). Appends its
    name, if it has one, to ``names``."""
    fields = list(wire_fields_at(data, start, end))
    named = [f for f in fields if f[0] == TENSOR_NAME]
    if len(named) == 1:
        names.append(bytes(data[named[0][3] : named[0][4]]).decode())
    raws = [f for f in fields if f[0] == TENSOR_RAW_DATA]
    if (
        len(named) != 1
        or len(raws) != 1
        or raws[0][1] != LENGTH_DELIMITED
        or raws[0][4] - raws[0][3] < min_bytes
        or any(f[0] not in _STUB_FIELDS and f[0] != TENSOR_RAW_DATA for f in fields)
    ):
        return None
    _, _, raw_field, raw_start, raw_end = raws[0]
    raw_length = raw_end - raw_start
    head, tail = bytes(data[start:raw_field]), bytes(data[raw_end:end])
    stub = onnx.TensorProto()
    try:
        stub.ParseFromString(head + tail)
    except DecodeError:  # the whole model's parse gives protobuf's verdict
        return None
    itemsize = ITEMSIZE.get(stub.data_type)
    if itemsize is None or any(d < 0 for d in stub.dims):
        return None
    if itemsize * math.prod(stub.dims) != raw_length:
        return None  # the checker's size complaint is due: the proto keeps its data
    # What onnx_ir serializes for such a tensor (``serialize_tensor_into``): these exact
    # bytes around the raw data, or the writer could not copy them from the file. Its
    # fields below raw_data's number: dims, data_type, name; above: doc_string.
    low = onnx.TensorProto(name=stub.name, data_type=stub.data_type, dims=stub.dims)
    high = onnx.TensorProto(doc_string=stub.doc_string) if stub.doc_string else None
    raw_key = varint(TENSOR_RAW_DATA << 3 | LENGTH_DELIMITED) + varint(raw_length)
    if (
        not stub.name
        or head != low.SerializeToString()
        or bytes(data[raw_field:raw_start]) != raw_key
        or tail != (high.SerializeToString() if high is not None else b"")
    ):
        return None
    entry = LazyEntry(
        stub.name,
        stub.data_type,
        tuple(stub.dims),
        stub.doc_string,
        start,
        end - start,
        raw_start,
        raw_length,
    )
    return entry, head + tail


class SourceFile:
    """The model file lazily read weights come from, held open: a file put in its place
    later (an output renamed over it) does not change them. Closed with the last tensor."""

    def __init__(self, path: str | os.PathLike, fd: int, stat: os.stat_result) -> None:
        self.path = os.fspath(path)
        self.fd = fd
        self.stat = (stat.st_size, stat.st_mtime_ns, stat.st_ino)
        weakref.finalize(self, os.close, fd)

    def __copy__(self) -> SourceFile:
        return self  # one open file, closed once: copies of a model share it

    def __deepcopy__(self, memo: dict) -> SourceFile:
        return self

    def check(self) -> None:
        """Raise OSError if the file was written to since it was loaded."""
        found = os.fstat(self.fd)
        if (found.st_size, found.st_mtime_ns, found.st_ino) != self.stat:
            raise OSError(f"{self.path}: the model file changed after it was loaded")


class SourceTensor(ir.LazyTensor):
    """A main-graph initializer whose raw data was left in the model file at load
    (``split_weights``). Each read maps its bytes anew, and the mapping goes with the
    last array viewing it: nothing stays mapped (or counts in memory) between reads.
    The writer copies its TensorProto file to file while it is as it was loaded."""

    def __init__(self, source: SourceFile, entry: LazyEntry) -> None:
        super().__init__(
            self._read,
            ir.DataType(entry.data_type),
            ir.Shape(entry.dims, frozen=True),
            name=entry.name,
            doc_string=entry.doc_string or None,
        )
        self.source = source
        self.entry = entry

    def __repr__(self) -> str:  # LazyTensor's names its function, a method of self
        return f"{self._repr_base()}(source={self.source.path!r}, name={self.name!r})"

    def _read(self) -> ir.Tensor:
        return ir.Tensor(self.numpy(), dtype=self.dtype)

    def numpy(self) -> np.ndarray:
        """The array over a fresh read-only mapping of the file (as ``TensorProtoTensor``
        reads raw data: little-endian, the tensor's shape)."""
        self.source.check()
        entry = self.entry
        aligned = entry.raw_start - entry.raw_start % mmap.ALLOCATIONGRANULARITY
        mapping = mmap.mmap(
            self.source.fd,
            entry.raw_start + entry.raw_length - aligned,
            access=mmap.ACCESS_READ,
            offset=aligned,
        )
        dtype = self.dtype.numpy().newbyteorder("<")
        count = entry.raw_length // dtype.itemsize
        array = np.frombuffer(mapping, dtype, count, entry.raw_start - aligned)
        return array.reshape(entry.dims)

    def file_range(self) -> FileRange | None:
        """The bytes of the model file that are this tensor's TensorProto as onnx_ir would
        serialize it now: None once its name, doc string or metadata changed."""
        entry = self.entry
        if (
            self.name != entry.name
            or (self.doc_string or "") != entry.doc_string
            or self.metadata_props
        ):
            return None
        self.source.check()
        return FileRange(entry.start, entry.length, self.source.fd)
