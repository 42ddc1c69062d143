"""Loading and saving models: clear errors on bad input, atomic output.

Models are checked with onnx's full checker. onnxruntime's ai.onnx extension
ops (``extension_ops``) that the chosen target runs are checked on a view of
the model where exactly those nodes sit in a private domain; ``target=None``
(no gating) accepts every extension op onnxruntime defines.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import onnx
import onnx_ir as ir
import onnx_ir.passes.common
from google.protobuf.message import DecodeError

from onnxfuse.errors import InvariantError, ModelError
from onnxfuse.extension_ops import checker_view, holds_accepted
from onnxfuse.infer import extension_output_types
from onnxfuse.naming import subgraphs
from onnxfuse.spill import is_spilled, load_spilled

if TYPE_CHECKING:
    from onnxfuse.targets import Target

_CHECK_ERRORS = (onnx.checker.ValidationError, onnx.shape_inference.InferenceError)

# Above this many bytes of initializers a model cannot be one protobuf file.
_EXTERNAL_DATA_THRESHOLD = 1_800_000_000


def load_model(
    path: str | os.PathLike, check: bool = True, target: Target | None = None
) -> ir.Model:
    """Load a model lazily (external weights stay on disk until read).

    Raises ModelError with a one-line message for a missing, truncated or
    non-ONNX file, or a model that fails ``onnx.checker`` (extension ops the
    ``target`` runs are allowed).
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
    try:
        failure = _check_loaded(path, proto, target) if check else None
    except OSError as exc:
        raise ModelError(f"{path}: cannot check the model ({_first_line(exc)})") from None
    try:
        model = ir.from_proto(proto)
    except Exception as exc:  # onnx_ir raises many types on malformed graphs
        raise ModelError(f"{path}: cannot be read as an ONNX graph ({_first_line(exc)})") from None
    if failure is not None and not _valid_once_sorted(model, failure, target):
        raise ModelError(f"{path}: fails the ONNX checker: {failure}")
    _attach_external_data_base(model, path.parent)
    return model


def _check_loaded(path: Path, proto: onnx.ModelProto, target: Target | None) -> str | None:
    """The checker's first complaint about the model at ``path`` (loaded as ``proto``
    without its external data), or None."""
    view = _view(proto, target)
    if view is None:
        return _check_path(path)  # by path: handles models over 2 GB with external data
    if not _has_external_data(view):
        return _check_proto(view)
    # External data is found next to the model file: check the view from there.
    return _check_beside(path, view)


def _view(proto: onnx.ModelProto, target: Target | None) -> onnx.ModelProto | None:
    """The checker's view of ``proto`` (None: check ``proto`` itself), with the types
    of the extension nodes' outputs declared so that checking reaches past them."""
    view = checker_view(proto, target)
    if view is not None:
        view.graph.value_info.extend(extension_output_types(proto))
    return view


def _check_path(path: Path) -> str | None:
    try:
        onnx.checker.check_model(str(path), full_check=True)
    except _CHECK_ERRORS as exc:
        return _first_line(exc)
    return None


def _check_proto(proto: onnx.ModelProto) -> str | None:
    try:
        onnx.checker.check_model(proto, full_check=True)
    except _CHECK_ERRORS as exc:
        return _first_line(exc)
    return None


def _check_beside(path: Path, view: onnx.ModelProto) -> str | None:
    """Check ``view`` by path from a temporary file in ``path``'s directory."""
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".view.onnx", dir=path.parent)
    os.close(fd)
    try:
        onnx.save_model(view, name)
        return _check_path(Path(name))
    finally:
        Path(name).unlink(missing_ok=True)


def _check_file(path: Path, target: Target | None) -> str | None:
    """The checker's first complaint about a model file, or None."""
    proto = onnx.load_model(str(path), load_external_data=False)
    return _check_loaded(path, proto, target)


def _has_external_data(proto: onnx.ModelProto) -> bool:
    nodes = [*proto.graph.node, *(n for f in proto.functions for n in f.node)]
    tensors = list(proto.graph.initializer)
    while nodes:
        node = nodes.pop()
        for attr in node.attribute:
            tensors.extend([attr.t] if attr.HasField("t") else attr.tensors)
            for graph in [attr.g] if attr.HasField("g") else attr.graphs:
                tensors.extend(graph.initializer)
                nodes.extend(graph.node)
    return any(t.data_location == onnx.TensorProto.EXTERNAL for t in tensors)


def _valid_once_sorted(model: ir.Model, failure: str, target: Target | None) -> bool:
    """Nodes out of order are a writer's slip, not a different model: sort them
    (in place) and accept the model if that was the only problem."""
    if "topologically sorted" not in failure or _needs_external_data(model):
        return False
    ir.passes.common.TopologicalSortPass()(model)
    proto = ir.serde.serialize_model(model)
    return _check_proto(_view(proto, target) or proto) is None


def _attach_external_data_base(model: ir.Model, base_dir: Path) -> None:
    """Let lazily loaded external tensors find their files next to the model."""
    for graph in (model.graph, *subgraphs(model.graph)):
        for value in graph.initializers.values():
            tensor = value.const_value
            if isinstance(tensor, ir.ExternalTensor):
                tensor.base_dir = str(base_dir)


def check_model(model: ir.Model, target: Target | None = None) -> None:
    """The model must pass onnx's full checker (external weights: checked on disk);
    extension ops the ``target`` runs are allowed."""
    if _needs_external_data(model):
        with tempfile.TemporaryDirectory(prefix="onnxfuse-check-") as directory:
            save_model(model, Path(directory) / "model.onnx", target)
        return
    load_spilled(model)
    proto = ir.serde.serialize_model(model)
    failure = _check_proto(_view(proto, target) or proto)
    if failure is not None:
        raise InvariantError(f"optimized model fails the ONNX checker: {failure}")


def save_model(model: ir.Model, path: str | os.PathLike, target: Target | None = None) -> None:
    """Write ``model`` to ``path`` atomically: a temporary file, checked, then renamed.

    Models with external weights, or too large for one protobuf, are written
    with their weights in ``<name>.data`` beside the model. A model that fails
    onnx's full checker is not written (extension ops the ``target`` runs are
    allowed).
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
            load_spilled(model)
            ir.save(model, tmp_name)
        # By path: handles external data and models over 2 GB.
        if holds_accepted(model, target):
            failure = _check_file(Path(tmp_name), target)
        else:
            failure = _check_path(Path(tmp_name))
        if failure is not None:
            raise InvariantError(f"optimized model fails the ONNX checker: {failure}")
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise


def _needs_external_data(model: ir.Model) -> bool:
    total = 0
    for graph in (model.graph, *subgraphs(model.graph)):
        for value in graph.initializers.values():
            tensor = value.const_value
            if tensor is None:
                continue
            if isinstance(tensor, ir.ExternalTensor) and not is_spilled(tensor):
                return True
            total += tensor.nbytes
    return total > _EXTERNAL_DATA_THRESHOLD


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0][:300]
