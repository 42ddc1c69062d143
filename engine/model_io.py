"""Loading and saving models: clear errors on bad input, atomic output."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import onnx
import onnx_ir as ir
import onnx_ir.passes.common
from google.protobuf.message import DecodeError

from onnxfuse.errors import InvariantError, ModelError

# Above this many bytes of initializers a model cannot be one protobuf file.
_EXTERNAL_DATA_THRESHOLD = 1_800_000_000


def load_model(path: str | os.PathLike, check: bool = True) -> ir.Model:
    """Load a model lazily (external weights stay on disk until read).

    Raises ModelError with a one-line message for a missing, truncated or
    non-ONNX file, or a model that fails ``onnx.checker``.
    """
    path = Path(path)
    if not path.exists():
        raise ModelError(f"{path}: no such file")
    if not path.is_file():
        raise ModelError(f"{path}: not a file")
    if path.stat().st_size == 0:
        raise ModelError(f"{path}: empty file, not an ONNX model")
    try:
        proto = onnx.load_model(str(path), load_external_data=False)
    except (DecodeError, RuntimeError, ValueError, OSError) as exc:
        raise ModelError(f"{path}: not a readable ONNX model ({_first_line(exc)})") from None
    if not proto.graph.node and not proto.graph.output:
        raise ModelError(f"{path}: not an ONNX model (no graph)")
    failure = _check_path(path) if check else None
    try:
        model = ir.from_proto(proto)
    except Exception as exc:  # onnx_ir raises many types on malformed graphs
        raise ModelError(f"{path}: cannot be read as an ONNX graph ({_first_line(exc)})") from None
    if failure is not None and not _valid_once_sorted(model, failure):
        raise ModelError(f"{path}: fails the ONNX checker: {failure}")
    _attach_external_data_base(model, path.parent)
    return model


def _check_path(path: Path) -> str | None:
    try:
        # Checking by path handles models over 2 GB with external data.
        onnx.checker.check_model(str(path), full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as exc:
        return _first_line(exc)
    return None


def _valid_once_sorted(model: ir.Model, failure: str) -> bool:
    """Nodes out of order are a writer's slip, not a different model: sort them
    (in place) and accept the model if that was the only problem."""
    if "topologically sorted" not in failure or _needs_external_data(model):
        return False
    ir.passes.common.TopologicalSortPass()(model)
    try:
        onnx.checker.check_model(ir.serde.serialize_model(model), full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError):
        return False
    return True


def _attach_external_data_base(model: ir.Model, base_dir: Path) -> None:
    """Let lazily loaded external tensors find their files next to the model."""
    for graph in (model.graph, *model.graph.subgraphs()):
        for value in graph.initializers.values():
            tensor = value.const_value
            if isinstance(tensor, ir.ExternalTensor):
                tensor.base_dir = str(base_dir)


def check_model(model: ir.Model) -> None:
    """The model must pass onnx's full checker (external weights: checked on disk)."""
    if _needs_external_data(model):
        with tempfile.TemporaryDirectory(prefix="onnxfuse-check-") as directory:
            save_model(model, Path(directory) / "model.onnx")
        return
    try:
        onnx.checker.check_model(ir.serde.serialize_model(model), full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as exc:
        message = f"optimized model fails the ONNX checker: {_first_line(exc)}"
        raise InvariantError(message) from None


def save_model(model: ir.Model, path: str | os.PathLike) -> None:
    """Write ``model`` to ``path`` atomically: a temporary file, checked, then renamed.

    Models with external weights, or too large for one protobuf, are written
    with their weights in ``<name>.data`` beside the model. A model that fails
    onnx's full checker is not written.
    """
    path = Path(path)
    if path.exists() and path.is_dir():
        raise ModelError(f"{path}: is a directory")
    if not path.parent.exists():
        raise ModelError(f"{path.parent}: output directory does not exist")
    external = _needs_external_data(model)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        if external:
            ir.save(model, tmp_name, external_data=f"{path.name}.data")
        else:
            ir.save(model, tmp_name)
        try:
            # By path: handles external data and models over 2 GB.
            onnx.checker.check_model(tmp_name, full_check=True)
        except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as exc:
            raise InvariantError(
                f"optimized model fails the ONNX checker: {_first_line(exc)}"
            ) from None
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise


def _needs_external_data(model: ir.Model) -> bool:
    total = 0
    for graph in (model.graph, *model.graph.subgraphs()):
        for value in graph.initializers.values():
            tensor = value.const_value
            if tensor is None:
                continue
            if isinstance(tensor, ir.ExternalTensor):
                return True
            total += tensor.nbytes
    return total > _EXTERNAL_DATA_THRESHOLD


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0][:300]
