"""Large folded values live on disk until the save, not in memory.

Folding a model whose weights stay on disk (e.g. packing Q, K and V weights into
one initializer) would otherwise hold every new array in memory until the save,
and keep the weights it read mapped. While a ``spilling`` context is active,
folded arrays of ``SPILL_MIN_BYTES`` or more (``LARGE_RESULT_BYTES`` in a model
without external weights) are written to files in a private temporary directory
and stand in the graph as ``ir.ExternalTensor`` (mapped only when read;
``ir.save`` copies them file to file). The directory is removed when the context
ends, whatever happens; the tensors are invalidated then, so a model must be
saved inside the context. A folded value that is one repeated value (a
``ConstantOfShape`` fill, the weights of onnx's IR-3 test models) is a ``FillTensor``
instead: no memory and no file, its bytes made only when read or written.
"""

from __future__ import annotations

import contextlib
import functools
import shutil
import tempfile
from collections.abc import Iterator
from contextvars import ContextVar
from pathlib import Path

import numpy as np
import onnx_ir as ir

from onnxfuse.graph.traversal import subgraphs

# Smaller arrays stay in memory: a file per tensor would cost more than it saves.
SPILL_MIN_BYTES = 1 << 20
# A model without external weights is in memory, and saved as one protobuf unless it
# grows too large: only very large folded values are worth a trip to disk there.
LARGE_RESULT_BYTES = 64 << 20

# Fills this large become FillTensors (smaller ones stay plain arrays: no gain).
FILL_MIN_BYTES = 64 * 1024
# The writer writes a fill as repeats of one buffer of at most this many bytes.
FILL_CHUNK_BYTES = 1 << 20

_ACTIVE: ContextVar[SpillArea | None] = ContextVar("onnxfuse_spill_area", default=None)


class SpillArea:
    """A temporary directory (created on first use) of one file per spilled tensor."""

    def __init__(self, min_bytes: int = SPILL_MIN_BYTES) -> None:
        self.min_bytes = min_bytes
        self._directory: Path | None = None
        self._tensors: list[ir.ExternalTensor] = []
        self._ids: set[int] = set()

    @property
    def directory(self) -> Path | None:
        return self._directory

    def spill(self, tensor: ir.TensorProtocol) -> ir.ExternalTensor | None:
        """``tensor`` written to its own file, as an external tensor; None when it
        is too small or cannot be stored as raw bytes (strings)."""
        if (
            tensor.dtype == ir.DataType.STRING  # first: a string tensor has no nbytes
            or tensor.nbytes < self.min_bytes
            or isinstance(tensor, FillTensor)  # it holds no memory
        ):
            return None
        # The folder's results (folder._tensor): with strings and fills gone, in-memory tensors.
        assert isinstance(tensor, ir.Tensor)
        if self._directory is None:
            self._directory = Path(tempfile.mkdtemp(prefix="onnxfuse-spill-"))
        location = f"{len(self._tensors)}.bin"
        # tofile is what ir.save writes for an in-memory tensor: the bytes stay identical.
        with open(self._directory / location, "wb") as file:
            tensor.tofile(file)
        spilled = ir.ExternalTensor(
            location,
            0,
            tensor.nbytes,
            tensor.dtype,
            shape=tensor.shape,
            name=tensor.name or "",
            base_dir=self._directory,
        )
        self._tensors.append(spilled)
        self._ids.add(id(spilled))
        return spilled

    def holds(self, tensor: ir.TensorProtocol | None) -> bool:
        return id(tensor) in self._ids

    def close(self) -> None:
        """Unmap and invalidate the spilled tensors, then remove the directory."""
        for tensor in self._tensors:
            release(tensor)
            tensor.invalidate()
        self._tensors.clear()
        self._ids.clear()
        if self._directory is not None:
            shutil.rmtree(self._directory, ignore_errors=True)
            self._directory = None


def active() -> SpillArea | None:
    """The spill area of the current ``spilling`` context, if any."""
    return _ACTIVE.get()


@contextlib.contextmanager
def spilling(model: ir.Model) -> Iterator[SpillArea]:
    """Spill large folded values while optimizing and saving ``model``."""
    external = holds_external_data(model)
    area = SpillArea(SPILL_MIN_BYTES if external else LARGE_RESULT_BYTES)
    token = _ACTIVE.set(area)
    try:
        yield area
    finally:
        _ACTIVE.reset(token)
        area.close()


def is_spilled(tensor: ir.TensorProtocol | None) -> bool:
    area = _ACTIVE.get()
    return area is not None and area.holds(tensor)


def load_spilled(model: ir.Model) -> None:
    """Spilled values back in memory, for a model saved as one protobuf (no external
    weights, or all folded away): the file must not refer to the spill area."""
    for graph in (model.graph, *subgraphs(model.graph)):
        for value in graph.initializers.values():
            tensor = value.const_value
            if isinstance(tensor, ir.ExternalTensor) and is_spilled(tensor):
                # A view of the file's mapping, not a copy: the save reads it once. The
                # mapping outlives the file's removal at the end of the context.
                array = tensor.numpy()
                value.const_value = ir.Tensor(array, dtype=tensor.dtype, name=tensor.name)


def holds_external_data(model: ir.Model) -> bool:
    return any(
        isinstance(value.const_value, ir.ExternalTensor)
        for graph in (model.graph, *subgraphs(model.graph))
        for value in graph.initializers.values()
    )


def release(tensor: ir.TensorProtocol | None) -> None:
    """Unmap an external tensor's file (it maps again if read later). Mapped pages
    count in the process's memory. A mapping that arrays still view stays open."""
    if not isinstance(tensor, ir.ExternalTensor):
        return
    with contextlib.suppress(BufferError):  # numpy views of the mapping are alive elsewhere
        tensor.release()


class FillTensor(ir.LazyTensor):
    """A tensor whose elements all equal one value. Every read (``numpy``, ``tobytes``)
    makes a fresh array, as ``np.full`` does; nothing is held between reads. onnx's
    IR-3 models build each weight with a ConstantOfShape fill: folded as plain arrays,
    alexnet's 244 MB were filled, spilled to disk, read back and written."""

    def __init__(self, value: np.ndarray, dims: tuple[int, ...], name: str | None = None):
        super().__init__(
            self._full,
            ir.DataType.from_numpy(value.dtype),
            ir.Shape(dims, frozen=True),
            name=name,
        )
        self.value = value.reshape(-1)[:1].copy()  # one element, its own copy
        self.dims = tuple(dims)

    def __repr__(self) -> str:  # LazyTensor's names its function, a method of self
        return f"{self._repr_base()}(value={self.value[0]!r}, name={self.name!r})"

    def _full(self) -> ir.Tensor:
        return ir.Tensor(np.full(self.dims, self.value[0], dtype=self.value.dtype))

    def chunks(self) -> list[bytes | memoryview]:
        """The tensor's little-endian bytes as repeats of one buffer (``tobytes`` without
        the copy; the buffer is shared by the large fills of one value)."""
        itemsize = self.value.dtype.itemsize
        total = int(np.prod(self.dims, dtype=np.int64))
        # No larger than the tensor: each fill of a model may have its own value.
        per_chunk = max(1, min(total, FILL_CHUNK_BYTES // itemsize))
        chunk = _fill_chunk(self.value.dtype.str, self.value.tobytes(), per_chunk)
        whole, rest = divmod(total, per_chunk)
        parts: list[bytes | memoryview] = [chunk] * whole
        if rest:
            parts.append(chunk[: rest * itemsize])
        return parts


@functools.lru_cache(maxsize=8)
def _fill_chunk(dtype: str, value: bytes, count: int) -> memoryview:
    """``count`` elements of one value (native order: the writer runs on little-endian
    machines only)."""
    one = np.frombuffer(value, dtype=np.dtype(dtype))
    full = np.full(count, one[0], dtype=one.dtype)
    full.flags.writeable = False
    # numpy's stubs give ndarray the buffer protocol's __buffer__ only from Python 3.12.
    return memoryview(full.view(np.uint8))  # type: ignore[arg-type]


def fill_tensor(array: np.ndarray, name: str | None) -> FillTensor | None:
    """``array`` as a FillTensor when it is a large view of one value (``np.broadcast_to``
    of a scalar: every stride zero) of a plain numeric type; else None."""
    if (
        array.nbytes < FILL_MIN_BYTES
        or array.dtype.kind not in "biufc"
        or not array.dtype.isnative
        or any(array.strides)
    ):
        return None
    try:
        ir.DataType.from_numpy(array.dtype)
    except (TypeError, ValueError):
        return None
    return FillTensor(array, array.shape, name=name)
