"""One model of a zoo run: optimized, checked against the original on onnxruntime, beside
its peers; and where the models of a folder or a manifest come from.

A job is a ``ZooJob`` (the model's path, how to feed it, the run's settings), picklable
and self-contained, so that any worker (a local process, a Ray node that sees the same
paths) can run it; its result is a row, a plain dict (one JSON line of ``--json``).
"""

from __future__ import annotations

import hashlib
import shlex
import tempfile
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from onnxfuse.errors import OnnxfuseError
from onnxfuse.zoo import models

# A symbolic dimension of a folder's model (batch, sequence) is given this size.
SYMBOLIC_DIM = 1
LATENCY_RUNS = 5


@dataclass(frozen=True)
class Settings:
    """What every model of a run shares."""

    target: str = "cpu"
    rules: tuple[str, ...] = ()  # extra rule files and pack folders (absolute paths)
    builtin: bool = True
    every_pack: bool = False  # every built-in pack, not only the target's
    every_fusion: bool = False  # also the fusions a target profile gates
    peers: tuple[str, ...] = ()  # tool names (PEERS' values)
    latency_runs: int = LATENCY_RUNS  # 0: no latency measured
    seed: int = 0


@dataclass(frozen=True)
class ZooJob:
    name: str
    path: str
    inputs: tuple[models.InputSpec, ...] | None  # None: drawn from the declared shapes
    settings: Settings
    feeds: str | None = None  # or stored: an .npz of one array per input
    transformer: models.Transformer | None = None  # for the ort-transformers peer


def jobs_of(
    source: Path, settings: Settings, names: Collection[str] | None = None
) -> Iterator[ZooJob]:
    """The jobs of a folder (every .onnx file under it, in path order) or a manifest
    (its models in its order, each fetched and cached here as its job is handed out);
    with ``names``, only the manifest's models of those names."""
    if source.is_dir():
        for path in sorted(source.rglob("*.onnx")):
            name = path.relative_to(source).with_suffix("").as_posix()
            yield ZooJob(name, str(path.resolve()), None, settings)
        return
    try:
        manifest = models.load_manifest(source)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise OnnxfuseError(f"{source}: not a folder of models or a zoo manifest: {exc}") from None
    for model in manifest.values():
        if names is not None and model.name not in names:
            continue
        try:
            path = models.model_path(model, manifest)
        except models.FetchError as exc:
            raise OnnxfuseError(f"{model.name}: {exc}") from None
        feeds = str(model.feeds) if model.feeds is not None else None
        yield ZooJob(model.name, str(path), model.inputs, settings, feeds, model.transformer)


def random_feeds(model: onnx.ModelProto, seed: int) -> tuple[dict[str, np.ndarray], str]:
    """Inputs drawn from the model's declared shapes and types, and a note of the
    symbolic dimensions sized SYMBOLIC_DIM."""
    rng = np.random.default_rng(seed)
    initializers = {t.name for t in model.graph.initializer}
    feeds: dict[str, np.ndarray] = {}
    symbolic: set[str] = set()
    for value in model.graph.input:
        if value.name in initializers:
            continue
        tensor = value.type.tensor_type
        if not value.type.HasField("tensor_type"):
            raise OnnxfuseError(f"input {value.name} is not a tensor: give a manifest with inputs")
        shape = []
        for dim in tensor.shape.dim:
            if dim.HasField("dim_value") and dim.dim_value > 0:
                shape.append(dim.dim_value)
            else:
                symbolic.add(dim.dim_param or "?")
                shape.append(SYMBOLIC_DIM)
        dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type)
        if dtype == np.bool_:
            feeds[value.name] = rng.integers(0, 2, size=shape).astype(np.bool_)
        elif np.issubdtype(dtype, np.integer):
            feeds[value.name] = rng.integers(0, 4, size=shape, endpoint=True).astype(dtype)
        else:
            feeds[value.name] = rng.uniform(-1.0, 1.0, size=shape).astype(dtype)
    note = "random"
    if symbolic:
        note += f" ({', '.join(sorted(symbolic))} = {SYMBOLIC_DIM})"
    return feeds, note


def _seed(settings: Settings, name: str) -> int:
    digest = hashlib.sha256(f"{settings.seed}:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little")


def repro(job: ZooJob) -> str:
    """The one command that optimizes this model as the run did."""
    command = ["onnxfuse", "optimize", job.path, "-o", "out.onnx", "--target"]
    command.append(job.settings.target)
    for path in job.settings.rules:
        command += ["--rules", path]
    if not job.settings.builtin:
        command.append("--no-builtin")
    return shlex.join(command)


def run_job(job: ZooJob) -> dict[str, Any]:
    """The row of one model (a worker's unit of work); a failure is in the row, not raised."""
    from onnxfuse.api import select_rules
    from onnxfuse.zoo import peers

    settings = job.settings
    path = Path(job.path)
    row: dict[str, Any] = {"model": job.name, "path": job.path, "repro": repro(job)}
    try:
        proto = onnx.load(path, load_external_data=False)
        row["opset"] = next(
            (o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), None
        )
        row["nodes"] = peers.count_nodes(proto.graph)
        row["size"] = path.stat().st_size
        if job.feeds is not None:
            feeds, row["inputs"] = models.stored_feeds(Path(job.feeds)), "stored"
        elif job.inputs is None:
            feeds, row["inputs"] = random_feeds(proto, _seed(settings, job.name))
        else:
            feeds, row["inputs"] = models.make_feeds_of(job.inputs, settings.seed), "manifest"
        del proto
        target = None if settings.every_pack else settings.target
        rules = select_rules(list(settings.rules), builtin=settings.builtin, target=target)
        with tempfile.TemporaryDirectory(prefix="onnxfuse-zoo-") as tmp:
            results = peers.compare(
                path,
                Path(tmp),
                job.transformer,
                feeds,
                rules,
                tools=("onnxfuse", *settings.peers),
                target=settings.target,
                gate_by_profile=not settings.every_fusion,
            )
            row["tools"] = {tool: _tool_row(result) for tool, result in results.items()}
            ours = results["onnxfuse"]
            row["fired"] = dict(sorted(ours.fired.items()))
            if ours.valid and settings.latency_runs:
                row["latency"] = _latency(path, results, feeds, settings.latency_runs)
    except Exception as exc:  # the original does not load or run: the model's own row
        row["error"] = f"{type(exc).__name__}: {peers._line(exc)}"
    row["ok"] = "error" not in row and row["tools"]["onnxfuse"]["valid"]
    return row


def _tool_row(result) -> dict[str, Any]:
    return {
        "valid": result.valid,
        "nodes": result.nodes,
        "size": result.path.stat().st_size if result.path else None,
        "max_error": result.max_error,
        "seconds": result.seconds,
        "error": result.error,
        "detail": result.detail,
        "all_ops": dict(result.all_ops),
    }


def _latency(original: Path, results: dict, feeds, runs: int) -> dict[str, float]:
    """Median milliseconds of the original and of every valid result, their runs
    alternating; ``ratio``: onnxfuse's over the original's."""
    from onnxfuse.zoo.peers import latency_ms

    paths = {"original": original}
    paths |= {tool: r.path for tool, r in results.items() if r.valid and r.path is not None}
    ms = latency_ms(paths, feeds, runs)
    return {**ms, "ratio": ms["onnxfuse"] / ms["original"] if ms["original"] else 1.0}
