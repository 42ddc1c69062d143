"""How large a model is on disk, and, where an output is larger than its input, why.

An output may grow for a reason the user should hear of: the inferred types and shapes
recorded as value_info (what viewers and the planner read), the provenance each created
node records (``--no-provenance`` leaves it out), or constants that folding made larger
than what they were computed from (a fill written out, an Expand folded).
Each such part is measured on the two protobufs (weights counted by their dims, never
read), and the report states it.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import onnx

from onnxfuse.files.input_files import InputFiles
from onnxfuse.files.model_io import read_proto
from onnxfuse.rewrite.apply import PROVENANCE_REPLACED, PROVENANCE_RULE


@dataclass(frozen=True)
class SizeChange:
    """Bytes on disk of the input (model file and the data files it reads) and of the
    output; ``reasons``: what made the output larger, when it is."""

    bytes_before: int
    bytes_after: int
    reasons: tuple[str, ...] = ()


def input_bytes(files: InputFiles) -> int:
    return sum(_size(path) for path in (files.model, *files.data))


def output_bytes(path: Path) -> int:
    """The model file and its data file (0 where there is none, or its name is too long
    to exist)."""
    return _size(path) + _size(f"{path}.data")


def size_change(before: int, source: InputFiles, output: Path) -> SizeChange:
    after = output_bytes(output)
    if after <= before:
        return SizeChange(before, after)
    reasons, explained = [], 0
    for reason, grown in _growth(Path(source.model), output):
        reasons.append(reason)
        explained += grown
    if after - before > explained:  # names, attributes, metadata: the rest of the graph
        reasons.append(f"the graph's nodes and names (+{_human(after - before - explained)})")
    return SizeChange(before, after, tuple(reasons))


def _growth(source: Path, output: Path) -> Iterator[tuple[str, int]]:
    old, new = read_proto(source), read_proto(output)
    infos_before, infos_after = _value_infos(old.graph), _value_infos(new.graph)
    grown = sum(i.ByteSize() for i in infos_after) - sum(i.ByteSize() for i in infos_before)
    if grown > 0:
        reason = (
            f"value_info records the inferred type and shape of {len(infos_after)} values "
            f"(+{_human(grown)})"
        )
        yield reason, grown
    recorded = provenance_bytes(new) - provenance_bytes(old)
    if recorded > 0:
        yield (
            (
                f"each created node records the rule and the nodes it replaced "
                f"(--no-provenance leaves it out) (+{_human(recorded)})"
            ),
            recorded,
        )
    tensors_before, tensors_after = _tensors(old.graph), _tensors(new.graph)
    weights = sum(map(_tensor_bytes, tensors_after)) - sum(map(_tensor_bytes, tensors_before))
    if weights > 0:
        known = {(t.name, tuple(t.dims)) for t in tensors_before}
        made = [t for t in tensors_after if (t.name, tuple(t.dims)) not in known]
        largest = max(made, key=_tensor_bytes, default=None)
        detail = ""
        if largest is not None:
            dims = "x".join(map(str, largest.dims)) or "scalar"
            detail = f"; the largest, {largest.name!r} [{dims}], {_human(_tensor_bytes(largest))}"
        reason = (
            f"folded constants hold more than what they were computed from "
            f"(+{_human(weights)}{detail})"
        )
        yield reason, weights


def provenance_bytes(model: onnx.ModelProto) -> int:
    """Bytes of the provenance entries in the nodes' metadata_props."""
    return sum(
        entry.ByteSize() + 2  # the entry's field tag and length
        for g in _graphs(model.graph)
        for node in g.node
        for entry in node.metadata_props
        if entry.key in (PROVENANCE_RULE, PROVENANCE_REPLACED)
    )


def _value_infos(graph: onnx.GraphProto) -> list[onnx.ValueInfoProto]:
    return [info for g in _graphs(graph) for info in g.value_info]


def _tensors(graph: onnx.GraphProto) -> list[onnx.TensorProto]:
    found: list[onnx.TensorProto] = []
    for g in _graphs(graph):
        found.extend(g.initializer)
        for node in g.node:
            found.extend(a.t for a in node.attribute if a.type == onnx.AttributeProto.TENSOR)
    return found


def _graphs(graph: onnx.GraphProto) -> Iterable[onnx.GraphProto]:
    yield graph
    for node in graph.node:
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.GRAPH:
                yield from _graphs(attribute.g)
            elif attribute.type == onnx.AttributeProto.GRAPHS:
                for sub in attribute.graphs:
                    yield from _graphs(sub)


def _tensor_bytes(tensor: onnx.TensorProto) -> int:
    """Bytes of a tensor's elements by its dims and type (external data is not read)."""
    count = 1
    for dim in tensor.dims:
        count *= dim
    if tensor.data_type == onnx.TensorProto.STRING:
        return sum(len(s) for s in tensor.string_data)
    bits = onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize * 8
    if tensor.data_type in _FOUR_BIT:
        bits = 4
    return (count * bits + 7) // 8


_FOUR_BIT = frozenset(
    getattr(onnx.TensorProto, name)
    for name in ("INT4", "UINT4", "FLOAT4E2M1")
    if hasattr(onnx.TensorProto, name)
)


def _human(count: int) -> str:
    if count < 1024:
        return f"{count} B"
    if count < 1024 * 1024:
        return f"{count / 1024:.1f} KiB"
    return f"{count / (1024 * 1024):.1f} MiB"


def _size(path: str | os.PathLike[str]) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0
