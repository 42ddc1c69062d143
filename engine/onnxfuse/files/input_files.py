"""The files an input model is read from, and whether its data files hold what its
shapes say.

A model with external data is more than its ``.onnx`` file: its initializers name data
files beside it (``location``), read lazily while the model is optimized. An output
written over one of them (``-o b.onnx`` when the input names ``b.onnx.data``, or
``plan a.onnx --embed a.onnx``) would change the input model: ``output_paths`` refuses it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import onnx_ir as ir

from onnxfuse.graph.traversal import subgraphs

# Where a loaded model's InputFiles are kept, in its meta.
INPUT_FILES_META = "onnxfuse.files.input_files"


@dataclass(frozen=True)
class InputFiles:
    """Real paths (symlinks resolved) of a model file and of the data files it names."""

    model: str
    data: frozenset[str]


def external_tensors(model: ir.Model) -> list[ir.ExternalTensor]:
    """The initializers of ``model`` (main graph and its subgraphs) held in data files."""
    return [
        value.const_value
        for graph in (model.graph, *subgraphs(model.graph))
        for value in graph.initializers.values()
        if isinstance(value.const_value, ir.ExternalTensor)
    ]


def input_files(path: Path, external: list[ir.ExternalTensor]) -> InputFiles:
    """The files a model loaded from ``path`` reads: its own and those its ``external``
    tensors name (relative to the model's directory, as loaders resolve them)."""
    data = {os.path.realpath(path.parent / tensor.location) for tensor in external}
    return InputFiles(os.path.realpath(path), frozenset(data))


def external_data_problem(path: Path, external: list[ir.ExternalTensor]) -> str | None:
    """What keeps one of the ``external`` tensors of a model loaded from ``path`` from
    being read as its shape and type say: a ``length`` other than the bytes they need,
    or data past the end of its file (a truncated copy). onnxruntime refuses both;
    onnx's checker looks at neither."""
    sizes: dict[str, int] = {}
    for tensor in external:
        if tensor.dtype == ir.DataType.STRING:
            continue  # never external: the checker refuses it
        need = tensor.nbytes
        if tensor.length is not None and tensor.length != need:
            return (
                f"external data of tensor '{tensor.name}' is {tensor.length} bytes, "
                f"but its shape and type need {need}"
            )
        file = os.path.realpath(path.parent / tensor.location)
        if file not in sizes:
            try:
                sizes[file] = os.stat(file).st_size
            except OSError as exc:
                return f"cannot read external data file {tensor.location} ({exc.strerror})"
        end = (tensor.offset or 0) + need
        if end > sizes[file]:
            return (
                f"external data of tensor '{tensor.name}' ends at byte {end}, past the end "
                f"of {tensor.location} ({sizes[file]} bytes)"
            )
    return None
