"""Shared weights stay shared: equal large initializers are stored once.

A fold or rewrite that rebuilds a weight per reader (packed QKV of layers that share
their weights, one folded Transpose per If branch) leaves copies of equal content;
each group of copies becomes one initializer that all readers read. onnx_ir's
DeduplicateInitializersPass (used for small tensors) and DeduplicateHashedInitializersPass
read every weight whole to key it; here only weights of one dtype and shape are
compared, first on a probe of a few elements, so distinct weights of a lazily loaded
model stay mostly unread, and fills are compared by their one value.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from onnxfuse.fold import spill
from onnxfuse.graph.traversal import all_graphs
from onnxfuse.support.ir_types import tensor_shape

# Above onnx_ir's DeduplicateInitializersPass's default size limit (elements).
SMALL_ELEMENTS = 1024
# Elements read from each candidate before two weights are compared whole.
_PROBE_ELEMENTS = 256


def deduplicate_large_initializers(model: ir.Model) -> None:
    """Merge initializers of equal dtype, shape and bytes within each graph. An
    initializer that is a graph input (a default the caller may override) or a graph
    output (its name is the interface) is left alone."""
    for graph in all_graphs(model):
        groups: dict[tuple[ir.DataType, tuple[int | ir.SymbolicDim, ...]], list[ir.Value]] = {}
        for value in graph.initializers.values():
            tensor = value.const_value
            if tensor is None or tensor.size <= SMALL_ELEMENTS:
                continue
            if value.is_graph_input() or value.is_graph_output():
                continue
            groups.setdefault((tensor.dtype, tensor_shape(tensor).dims), []).append(value)
        for members in groups.values():
            if len(members) > 1:
                _merge_equal(graph, members)


def _merge_equal(graph: ir.Graph, members: list[ir.Value]) -> None:
    kept: dict[bytes, list[ir.Value]] = {}
    for value in members:
        probe = _probe(value)
        if probe is None:
            continue
        candidates = kept.setdefault(probe, [])
        same = next((k for k in candidates if _same_content(k, value)), None)
        if same is None:
            candidates.append(value)
            continue
        value.replace_all_uses_with(same)
        assert value.name is not None
        graph.initializers.pop(value.name)


def _probe(value: ir.Value) -> bytes | None:
    """A few evenly spaced elements' bytes (a fill: its one value); None where the
    tensor cannot be read here (it then stays as it is)."""
    tensor = value.const_value
    if isinstance(tensor, spill.FillTensor):
        return b"fill" + tensor.value.tobytes()
    try:
        flat = _flat(tensor)
    except Exception:
        return None
    step = max(1, flat.size // _PROBE_ELEMENTS)
    probe = np.ascontiguousarray(flat[::step][:_PROBE_ELEMENTS]).tobytes()
    del flat
    spill.release(tensor)
    return probe


def _same_content(a: ir.Value, b: ir.Value) -> bool:
    """Bitwise equality: NaN payloads and -0.0 count, as they do in a weight's bytes."""
    first, second = a.const_value, b.const_value
    if isinstance(first, spill.FillTensor) and isinstance(second, spill.FillTensor):
        return first.value.tobytes() == second.value.tobytes()
    try:
        left, right = _flat(first), _flat(second)
        same = left.dtype == right.dtype and np.array_equal(
            left.view(np.uint8), right.view(np.uint8)
        )
    except Exception:
        return False
    del left, right
    spill.release(first)
    spill.release(second)
    return bool(same)


def _flat(tensor: ir.TensorProtocol | None) -> np.ndarray:
    assert tensor is not None
    return np.ascontiguousarray(tensor.numpy()).reshape(-1)
