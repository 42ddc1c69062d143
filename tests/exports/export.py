"""Export a model spec with the legacy or the dynamo exporter, cached on disk.

The cache key is the spec's config, the exporter and opset, the torch and transformers
versions and `EXPORT_VERSION` (bump it when a builder changes what it builds), so a
repeated run reuses the files. The cache lives in `$ONNXFUSE_EXPORT_CACHE`, else
`~/.cache/onnxfuse-exports`. Next to each model, `<name>.npz` holds the example inputs
and the outputs torch computed for them.
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import io
import json
import logging
import os
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .models import MODELS, ModelSpec, build

EXPORT_VERSION = 1
# (exporter, opset): the legacy TorchScript exporter at 14 and 17, dynamo at 18 and 20.
EXPORTERS: tuple[tuple[str, int], ...] = (
    ("legacy", 14),
    ("legacy", 17),
    ("dynamo", 18),
    ("dynamo", 20),
)


@dataclass(frozen=True)
class Export:
    """One exported model on disk."""

    name: str  # e.g. bert-mask-legacy14
    spec: ModelSpec
    exporter: str
    opset: int
    path: Path
    feeds: dict[str, np.ndarray]
    expected: list[np.ndarray]  # torch's outputs for `feeds`


def export_name(spec: ModelSpec, exporter: str, opset: int) -> str:
    return f"{spec.name}-{exporter}{opset}"


# Every export of the test set, by name: (spec, exporter, opset).
ALL_EXPORTS: dict[str, tuple[ModelSpec, str, int]] = {
    export_name(spec, exporter, opset): (spec, exporter, opset)
    for spec in MODELS
    for exporter, opset in EXPORTERS
    if spec.exporters is None or exporter in spec.exporters
}


def export_by_name(name: str) -> Export:
    """The test set's export ``name`` (bert-mask-legacy14...), made now if not cached."""
    return get_export(*ALL_EXPORTS[name])


def cache_dir() -> Path:
    root = os.environ.get("ONNXFUSE_EXPORT_CACHE")
    path = Path(root) if root else Path.home() / ".cache" / "onnxfuse-exports"
    path.mkdir(parents=True, exist_ok=True)
    return path


def cache_key(spec: ModelSpec, exporter: str, opset: int) -> str:
    import torch
    import transformers

    blob = json.dumps(
        {
            "config": spec.config,
            "family": spec.family,
            "dynamic": {k: {str(a): d for a, d in v.items()} for k, v in spec.dynamic.items()},
            "exporter": exporter,
            "opset": opset,
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "version": EXPORT_VERSION,
        },
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def get_export(spec: ModelSpec, exporter: str, opset: int) -> Export:
    """The cached export, made now if missing."""
    name = export_name(spec, exporter, opset)
    stem = cache_dir() / f"{name}-{cache_key(spec, exporter, opset)}"
    model_path, data_path = stem.with_suffix(".onnx"), stem.with_suffix(".npz")
    if not (model_path.exists() and data_path.exists()):
        _export(spec, exporter, opset, model_path, data_path)
    data = np.load(data_path)
    feeds = {k[len("in:") :]: data[k] for k in data.files if k.startswith("in:")}
    outputs = sorted((k for k in data.files if k.startswith("out:")), key=lambda k: int(k[4:]))
    return Export(name, spec, exporter, opset, model_path, feeds, [data[k] for k in outputs])


def _export(spec: ModelSpec, exporter: str, opset: int, model_path: Path, data_path: Path):
    import torch

    built = build(spec)
    args = tuple(built.inputs.values())
    names = list(built.inputs)
    with torch.no_grad():
        expected = built.module(*args)
    expected = expected if isinstance(expected, tuple) else (expected,)
    with tempfile.TemporaryDirectory(dir=model_path.parent) as tmp:
        tmp_model = Path(tmp) / "model.onnx"
        with _quiet():
            if exporter == "legacy":
                torch.onnx.export(
                    built.module,
                    args,
                    str(tmp_model),
                    dynamo=False,
                    opset_version=opset,
                    input_names=names,
                    output_names=built.outputs,
                    dynamic_axes={k: v for k, v in spec.dynamic.items() if k in names},
                )
            else:
                dims: dict[str, torch.export.Dim] = {}
                shapes = []
                for input_name in names:
                    axes = spec.dynamic.get(input_name, {})
                    shapes.append(
                        {a: dims.setdefault(d, torch.export.Dim(d)) for a, d in axes.items()}
                        or None
                    )
                program = torch.onnx.export(
                    built.module,
                    args,
                    dynamo=True,
                    opset_version=opset,
                    input_names=names,
                    output_names=built.outputs,
                    dynamic_shapes=_by_signature(built.module, shapes),
                    verbose=False,
                )
                program.save(str(tmp_model))
        arrays = {f"in:{k}": v.numpy() for k, v in built.inputs.items()}
        arrays |= {f"out:{i}": t.numpy() for i, t in enumerate(expected)}
        tmp_data = Path(tmp) / "data.npz"
        np.savez(tmp_data, **arrays)
        # Model first, data last: the data file's presence says the pair is complete.
        os.replace(tmp_model, model_path)
        os.replace(tmp_data, data_path)


def _by_signature(module, shapes: list) -> tuple:
    """torch.export wants dynamic shapes nested like forward()'s parameters (*args: a tuple)."""
    structure: list = []
    rest = list(shapes)
    for parameter in inspect.signature(module.forward).parameters.values():
        if parameter.kind is inspect.Parameter.VAR_POSITIONAL:
            if rest:  # torch.export leaves an empty *args out of the inputs' structure
                structure.append(tuple(rest))
            rest = []
        elif rest:
            structure.append(rest.pop(0))
    return tuple(structure)


@contextlib.contextmanager
def _quiet():
    """The exporters print progress and warnings for every export; keep test output readable."""
    loggers = [logging.getLogger(n) for n in ("torch.onnx", "torch.export", "torch._dynamo")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        with (
            warnings.catch_warnings(),
            contextlib.redirect_stdout(io.StringIO()),
        ):
            warnings.simplefilter("ignore")
            yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)
