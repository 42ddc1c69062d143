"""Loading and saving models: clear errors on bad input, atomic output.

Models are checked with onnx's full checker. onnxruntime's ai.onnx extension
ops (``extension_ops``) that the chosen target runs are checked on a view of
the model where exactly those nodes sit in a private domain; ``target=None``
(no gating) accepts every extension op onnxruntime defines.
"""

from __future__ import annotations

import math
import mmap
import os
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import onnx
import onnx.parser
import onnx_ir as ir
import onnx_ir.passes.common
from google.protobuf import json_format, text_format
from google.protobuf.message import DecodeError, Message

from onnxfuse.errors import InvariantError, ModelError, creating
from onnxfuse.files.check_directory import check_by_path
from onnxfuse.files.input_files import (
    INPUT_FILES_META,
    InputFiles,
    external_data_problem,
    external_tensors,
    input_files,
)
from onnxfuse.files.output_paths import check_output, refuse_overwriting, temporary_prefix
from onnxfuse.files.repair import (
    record,
    repair_attributes,
    repair_declarations,
    repair_structure,
)
from onnxfuse.files.source_weights import LazyEntry, SourceFile, SourceTensor, split_weights
from onnxfuse.files.wire import ITEMSIZE, GraphScan, initializer_ranges, scan_graph
from onnxfuse.files.writer import (
    PLACEHOLDER,
    remember_source,
    serialize_stripped,
    write_model,
)
from onnxfuse.fold.spill import is_spilled, load_spilled
from onnxfuse.graph.traversal import subgraphs
from onnxfuse.ops.extension import checker_view, holds_accepted
from onnxfuse.ops.inference import (
    InferredTypes,
    extension_output_types,
    infer_shapes,
    inferred_types,
    weights_as_placeholders,
)

if TYPE_CHECKING:
    from onnxfuse.targets.capabilities import Target

_CHECK_ERRORS = (onnx.checker.ValidationError, onnx.shape_inference.InferenceError)
# What reading a model file raises: binary protobuf, then onnx's text formats.
_READ_ERRORS = (
    DecodeError,
    RuntimeError,
    ValueError,
    OSError,
    json_format.ParseError,
    text_format.ParseError,
    onnx.parser.ParseError,
)

# Above this many bytes of initializers a model cannot be one protobuf file.
_EXTERNAL_DATA_THRESHOLD = 1_800_000_000

# Initializers of this many bytes or more reach the checker as references to an empty
# placeholder file: the checker would only parse and size-check their bytes (a copy of
# the model's weights per check). No operator's inference reads tensors this large
# (shape-like inputs hold one element per dimension).
_STRIP_MIN_BYTES = 64 * 1024
# Weight data in memory up to which onnx's inference runs on the protobuf as parsed.
_INFER_AS_PARSED_MAX_BYTES = 16 << 20
CHECK_PLACEHOLDER = PLACEHOLDER


def load_model(
    path: str | os.PathLike, check: bool = True, target: Target | None = None
) -> ir.Model:
    """Load a model lazily (external weights stay on disk until read).

    Raises ModelError with a one-line message for a missing, truncated or
    non-ONNX file, or a model that fails ``onnx.checker`` (extension ops the
    ``target`` runs are allowed).
    """
    return _load(_existing(path), check, target, split=True, types=False)[0]


def load_model_and_types(
    path: str | os.PathLike, target: Target | None = None
) -> tuple[ir.Model, InferredTypes | None]:
    """``load_model``, checked, with onnx's inference of its types made on the protobuf
    as parsed: ``optimize`` takes them for its first inference instead of serializing
    the model again (5 ms on a small CNN, 50 ms on BERT-base). An IR-3 model comes back
    as ``optimize`` makes it first: IR 4, its initializers no longer inputs. Types are
    None where that protobuf is not the model ``optimize`` would infer: nodes out of
    order, subgraphs or functions, or much weight data in memory."""
    return _load(_existing(path), True, target, split=True, types=True)


def _existing(path: str | os.PathLike) -> Path:
    path = Path(path)
    try:
        os.fsencode(path).decode("utf-8")
    except UnicodeDecodeError:  # onnx's checker takes only UTF-8 paths
        raise ModelError(f"{path}: onnx reads only file names in UTF-8") from None
    if not path.exists():
        raise ModelError(f"{path}: no such file")
    if not path.is_file():
        raise ModelError(f"{path}: not a file")
    if path.stat().st_size == 0:
        raise ModelError(f"{path}: empty file, not an ONNX model")
    return path


def _load(
    path: Path, check: bool, target: Target | None, split: bool, types: bool
) -> tuple[ir.Model, InferredTypes | None]:
    try:
        proto, ranges, stat, lazy = _read_proto(path, split)
    except _READ_ERRORS as exc:
        raise ModelError(f"{path}: not a readable ONNX model ({_first_line(exc)})") from None
    if not proto.graph.node and not proto.graph.output:
        raise ModelError(f"{path}: not an ONNX model (no graph)")
    for opset in (*proto.opset_import, *(i for f in proto.functions for i in f.opset_import)):
        if not 0 < opset.version < 2**31:  # onnx's schemas are looked up by a C int
            raise ModelError(
                f"{path}: opset version {opset.version} of '{opset.domain}' is out of range"
            )
    wrong_size = _raw_size_problem(proto, ranges, lazy)
    if wrong_size is not None:
        raise ModelError(f"{path}: {wrong_size}")
    try:
        # Names and opset imports are nothing the checker reads: the file's verdict stands,
        # unless attributes it reads were mended.
        repairs = repair_structure(proto)
        mended = repair_attributes(proto)
        repairs += mended
        as_read = not mended
        failure = _check_loaded(path, proto, target, ranges, lazy, as_read) if check else None
        if failure is not None:
            found = repair_declarations(proto)
            if found:  # the file is no longer the model: the protobuf is checked
                repairs += found
                failure = _check_loaded(path, proto, target, ranges, lazy, as_read=False)
    except ModelError as exc:
        raise ModelError(f"{path}: {exc}") from None
    except OSError as exc:
        raise ModelError(f"{path}: cannot check the model ({_first_line(exc)})") from None
    inferred = None
    if types and check and failure is None:
        _proto_as_ir4(proto)
        if _inferable_as_parsed(proto, ranges, lazy, path):
            inferred = inferred_types(proto)
    try:
        model = ir.from_proto(proto)
    except Exception as exc:  # onnx_ir raises many types on malformed graphs
        raise ModelError(f"{path}: cannot be read as an ONNX graph ({_first_line(exc)})") from None
    if lazy and not _attach_source_tensors(model, path, stat, lazy):
        # the graph did not take them all
        return _load(path, check, target, split=False, types=types)
    if failure is not None:
        failure = _failure_once_sorted(model, failure, target)
    if failure is not None:
        raise ModelError(f"{path}: fails the ONNX checker: {failure}")
    record(model, repairs)
    external = external_tensors(model)
    problem = external_data_problem(path, external)
    if problem is not None:
        raise ModelError(f"{path}: {problem}")
    for tensor in external:  # read lazily: from files beside the model
        tensor.base_dir = str(path.parent)
    model.meta[INPUT_FILES_META] = input_files(path, external)
    if stat is not None:
        remember_source(model, path, stat, ranges)
    return model, inferred


def _proto_as_ir4(proto: onnx.ModelProto) -> None:
    """What ``optimize`` first does to an IR-3 model, done on the checked protobuf so that
    its inference is the one ``optimize`` would make: initializers are no longer graph
    inputs (IR 3 lists them there by convention), and the model is IR 4."""
    if proto.ir_version >= 4:
        return
    initializers = {tensor.name for tensor in proto.graph.initializer}
    inputs = [value for value in proto.graph.input if value.name not in initializers]
    del proto.graph.input[:]
    proto.graph.input.extend(inputs)
    proto.ir_version = 4


def _inferable_as_parsed(
    proto: onnx.ModelProto,
    ranges: dict[str, tuple[int, int, int, int]],
    lazy: dict[str, LazyEntry],
    path: Path,
) -> bool:
    """Whether onnx's inference over ``proto`` as parsed types the model ``normalize``
    infers (checked nodes in order; one graph),
    without copying much weight data (inference serializes its input)."""
    if proto.functions:
        return False
    for node in proto.graph.node:
        if any(a.HasField("g") or a.graphs for a in node.attribute):
            return False
    in_memory = 0
    for tensor in proto.graph.initializer:
        if tensor.name in lazy:
            continue
        found = ranges.get(tensor.name)
        if found is None:
            return path.stat().st_size <= _INFER_AS_PARSED_MAX_BYTES
        in_memory += found[3]
    return in_memory <= _INFER_AS_PARSED_MAX_BYTES


def _read_proto(
    path: Path, split: bool = True
) -> tuple[
    onnx.ModelProto,
    dict[str, tuple[int, int, int, int]],
    os.stat_result | None,
    dict[str, LazyEntry],
]:
    """``onnx.load_model(path, load_external_data=False)``, parsed from a mapping of the
    file rather than from a copy of it read into memory; with where its initializers lie
    in the file (``protobuf_wire.initializer_ranges``) and the file's stat then. The raw
    data of large main-graph initializers is left in the file (``split_weights``): their
    TensorProtos hold no data, and the entries returned say where it is (BERT-base:
    protobuf parses 1 MB instead of 440). Text formats, named by their extensions, go
    through onnx. ``split``: False parses the whole file."""
    if _format(path) != "protobuf":
        return read_proto(path), {}, None, {}
    with open(path, "rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
        stat = os.fstat(file.fileno())
        view = memoryview(data)
        try:
            scan = scan_graph(view)
            proto, lazy = _parse_split(view, scan) if split else (None, {})
            if proto is None:
                proto = onnx.ModelProto()
                _parse(proto, view)
            ranges = initializer_ranges(view, scan)
        finally:
            view.release()  # the mapping closes only once no view of it is left
    return proto, ranges, stat, lazy


def _parse(proto: onnx.ModelProto, data: memoryview | bytearray) -> None:
    # protobuf parses any buffer; types-protobuf's stub asks for bytes.
    decoded = proto.ParseFromString(data)  # type: ignore[arg-type]
    if decoded is not None and decoded != len(data):
        raise DecodeError(f"protobuf has {decoded} bytes but the file has {len(data)}")


def _parse_split(
    view: memoryview, scan: GraphScan | None
) -> tuple[onnx.ModelProto | None, dict[str, LazyEntry]]:
    """The model in ``view`` parsed without its large weights' raw data, and where
    those are; (None, {}) when nothing is left out. Any doubt (a parse error, external
    data the checker must see in full) gives (None, {}): the whole file is parsed then,
    and protobuf's verdict is the one it always gave."""
    split = split_weights(view, scan=scan)
    if split is None:
        return None, {}
    stub, lazy = split
    proto = onnx.ModelProto()
    try:
        _parse(proto, stub)
    except (DecodeError, RuntimeError, ValueError):
        return None, {}
    if _has_external_data(proto):
        return None, {}  # the checker reads this model from its directory, whole
    return proto, lazy


def _attach_source_tensors(
    model: ir.Model, path: Path, stat: os.stat_result | None, lazy: dict[str, LazyEntry]
) -> bool:
    """The main-graph initializers whose raw data was left in the file read it from there.
    False if some of them are not the model's initializers (nothing read would be
    right: the caller loads the file whole)."""
    assert stat is not None
    fd = os.open(path, os.O_RDONLY)
    try:
        found = os.fstat(fd)
        if (found.st_size, found.st_mtime_ns, found.st_ino) != (
            stat.st_size,
            stat.st_mtime_ns,
            stat.st_ino,
        ):
            raise ModelError(f"{path}: the model file changed while it was loaded")
        source = SourceFile(path, fd, stat)
    except BaseException:
        os.close(fd)
        raise
    attached = 0
    for value in model.graph.initializers.values():
        tensor = value.const_value
        entry = lazy.get(value.name or "")
        if (
            entry is not None
            and isinstance(tensor, ir.serde.TensorProtoTensor)
            and not tensor.raw.HasField("raw_data")
        ):
            value.const_value = SourceTensor(source, entry)
            attached += 1
    return attached == len(lazy)


def _check_loaded(
    path: Path,
    proto: onnx.ModelProto,
    target: Target | None,
    ranges: dict[str, tuple[int, int, int, int]] | None = None,
    lazy: dict[str, LazyEntry] | None = None,
    as_read: bool = True,
) -> str | None:
    """The checker's first complaint about the model at ``path`` (loaded as ``proto``
    without its external data), or None. ``ranges``: where ``proto``'s initializers lie
    in the file it was just parsed from (``protobuf_wire.initializer_ranges``); ``lazy``:
    its initializers whose raw data was left in the file (``split_weights``). ``as_read``:
    False when ``proto`` was changed since (repaired): the file is then not checked."""
    # A split parse (``lazy``) is only kept for a model without external data: no walk.
    if lazy or not _has_external_data(proto):
        stripped = _stripped(proto, ranges or {}, lazy or {})
        if stripped is not None:
            checked = _view(stripped, target) or stripped
            if lazy and not as_read:
                # The data left in the file is not in ``proto``, and the file is not the
                # model: the verdict on the placeholders is the one there is.
                return check_by_path(checked, CHECK_PLACEHOLDER, _check_path)
            return _check_stripped(checked, lambda: _check_as_read(path, proto, as_read))
    view = _view(proto, target)
    if view is None:
        return _check_as_read(path, proto, as_read)
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


def _check_as_read(path: Path, proto: onnx.ModelProto, as_read: bool = True) -> str | None:
    """Check the model read from ``path`` as ``proto``: by path (handles models over
    2 GB with external data), but from memory for a text format, which the checker
    would read as binary protobuf, or for a ``proto`` changed since (not ``as_read``)."""
    if as_read and _format(path) == "protobuf":
        return _check_path(path)
    return _check_beside(path, proto) if _has_external_data(proto) else _check_proto(proto)


def _format(path: Path) -> str:
    """The serialization ``path``'s extension names (onnx's registry); protobuf else."""
    return onnx.serialization.registry.get_format_from_file_extension(path.suffix) or "protobuf"


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
    fd, name = tempfile.mkstemp(prefix=temporary_prefix(path), suffix=".view.onnx", dir=path.parent)
    os.close(fd)
    try:
        onnx.save_model(view, name)
        return _check_path(Path(name))
    finally:
        Path(name).unlink(missing_ok=True)


def _check_stripped(stripped: onnx.ModelProto, full_check: Callable[[], str | None]) -> str | None:
    """Check a model whose large weights are placeholders (``_stripped``) from the
    private directory holding the placeholder file. The checker only sees that an external
    file exists; it reads no external data. Should the stripped model fail, the
    verdict is the full model's (``full_check``): stripping never rejects a model."""
    failure = check_by_path(stripped, CHECK_PLACEHOLDER, _check_path)
    return None if failure is None else full_check()


def _strip_in_check(tensor: ir.TensorProtocol) -> bool:
    return tensor.dtype != ir.DataType.STRING and tensor.nbytes >= _STRIP_MIN_BYTES


def _stripped(
    proto: onnx.ModelProto,
    ranges: dict[str, tuple[int, int, int, int]],
    lazy: dict[str, LazyEntry] | None = None,
) -> onnx.ModelProto | None:
    """A copy of ``proto`` whose large main-graph initializers are external references
    to ``CHECK_PLACEHOLDER`` (None: nothing to strip). Only tensors whose sole value is
    raw data of at least the size their shape and type need are stripped: what the
    checker would verify of them is verified here. Those of ``lazy`` hold no data in
    ``proto``: ``split_weights`` left out only raw data of exactly that size."""
    graph = proto.graph
    lazy = lazy or {}
    strip = [
        _placeholder(t) if t.name in lazy else _stripped_tensor(t, ranges.get(t.name))
        for t in graph.initializer
    ]
    if not any(s is not None for s in strip):
        return None
    view = onnx.ModelProto()
    _copy_fields(proto, view, skip="graph")
    _copy_fields(graph, view.graph, skip="initializer")
    for tensor, stripped in zip(graph.initializer, strip):
        view.graph.initializer.add().CopyFrom(tensor if stripped is None else stripped)
    return view


def _stripped_tensor(
    tensor: onnx.TensorProto, found: tuple[int, int, int, int] | None
) -> onnx.TensorProto | None:
    itemsize = ITEMSIZE.get(tensor.data_type)
    if (
        itemsize is None
        or not tensor.HasField("raw_data")
        or tensor.HasField("segment")
        or tensor.data_location == onnx.TensorProto.EXTERNAL
        or any(len(getattr(tensor, f)) for f in _TYPED_FIELDS)
    ):
        return None
    stripped = onnx.TensorProto()
    _copy_fields(tensor, stripped, skip="raw_data")  # reading raw_data would copy it
    # The one raw_data field of the file it was parsed from, if known: protobuf's ByteSize
    # serializes the whole tensor, weights and all, to measure it.
    size = found[3] if found is not None else _raw_size(tensor.ByteSize() - stripped.ByteSize())
    needed = itemsize * math.prod(tensor.dims)
    if needed < _STRIP_MIN_BYTES or size < needed:
        return None  # small, or the checker's size complaint is due
    return _as_placeholder(stripped)


def _placeholder(tensor: onnx.TensorProto) -> onnx.TensorProto:
    """A copy of ``tensor`` (no data) referring to ``CHECK_PLACEHOLDER``."""
    stripped = onnx.TensorProto()
    stripped.CopyFrom(tensor)
    return _as_placeholder(stripped)


def _as_placeholder(stripped: onnx.TensorProto) -> onnx.TensorProto:
    entry = stripped.external_data.add()
    entry.key, entry.value = "location", CHECK_PLACEHOLDER
    stripped.data_location = onnx.TensorProto.EXTERNAL
    return stripped


def _raw_size_problem(
    proto: onnx.ModelProto,
    ranges: dict[str, tuple[int, int, int, int]],
    lazy: dict[str, LazyEntry],
) -> str | None:
    """A main-graph initializer whose raw data is longer than its type and shape need
    (onnx's checker lets that pass; any read of it would fail), or None. Shorter raw
    data is the checker's to report."""
    for tensor in proto.graph.initializer:
        itemsize = ITEMSIZE.get(tensor.data_type)
        if itemsize is None or tensor.name in lazy or not tensor.HasField("raw_data"):
            continue
        found = ranges.get(tensor.name)
        size = found[3] if found is not None else len(tensor.raw_data)
        needed = itemsize * math.prod(tensor.dims)
        if size > needed:
            return (
                f"initializer '{tensor.name}' holds {size} bytes of raw data; "
                f"its type and shape need {needed}"
            )
    return None


def _raw_size(field_bytes: int) -> int:
    """The length of a raw_data field from its serialized size: tag (1 byte), length
    varint, data."""
    for width in range(1, 11):
        size = field_bytes - 1 - width
        if size >= 0 and _varint_width(size) == width:
            return size
    return -1


def _varint_width(value: int) -> int:
    return max(1, (value.bit_length() + 6) // 7)


def _copy_fields(source: Message, destination: Message, skip: str) -> None:
    """Every set field of ``source`` but ``skip`` into ``destination`` (same type)."""
    for field in source.DESCRIPTOR.fields:
        if field.name == skip:
            continue
        if field.is_repeated:
            values = getattr(source, field.name)
            if values:
                getattr(destination, field.name).extend(values)
        elif source.HasField(field.name):
            if field.message_type is not None:
                getattr(destination, field.name).CopyFrom(getattr(source, field.name))
            else:
                setattr(destination, field.name, getattr(source, field.name))


_TYPED_FIELDS = (
    "float_data",
    "int32_data",
    "string_data",
    "int64_data",
    "double_data",
    "uint64_data",
)


def read_proto(path: Path) -> onnx.ModelProto:
    """The model file as onnx reads it, in any format its extension names, without its
    external data: a text format without onnx's warning that it is experimental."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return onnx.load_model(str(path), load_external_data=False)


def _check_file(path: Path, target: Target | None) -> str | None:
    """The checker's first complaint about a model file, or None."""
    proto = read_proto(path)
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


def _failure_once_sorted(model: ir.Model, failure: str, target: Target | None) -> str | None:
    """The checker's ``failure`` once the nodes are sorted (in place), None if sorting
    fixed it: nodes out of order are a writer's slip, not a different model."""
    if "topologically sorted" not in failure or _needs_external_data(model):
        return failure
    try:
        ir.passes.common.TopologicalSortPass()(model)
    except ValueError:
        return "its nodes form a cycle"
    proto = ir.serde.serialize_model(model)
    return None if _check_proto(_view(proto, target) or proto) is None else failure


def check_model(model: ir.Model, target: Target | None = None) -> None:
    """The model must pass onnx's full checker (external weights: checked on disk);
    extension ops the ``target`` runs are allowed."""
    if _needs_external_data(model):
        with tempfile.TemporaryDirectory(prefix="onnxfuse-check-") as directory:
            save_model(model, Path(directory) / "model.onnx", target)
        return
    load_spilled(model)
    _check_in_memory(model, target)


def _check_in_memory(model: ir.Model, target: Target | None) -> None:
    """The full checker on ``model`` (held in memory) with its large weights as
    placeholders: their bytes come from arrays of their own shape and type, or from
    loaded tensors whose size was checked on load, and no check reads them."""

    def full_check() -> str | None:
        proto = ir.serde.serialize_model(model)
        return _check_proto(_view(proto, target) or proto)

    with weights_as_placeholders(model, CHECK_PLACEHOLDER, _strip_in_check):
        stripped = ir.serde.serialize_model(model)
    failure = _check_stripped(_view(stripped, target) or stripped, full_check)
    if failure is not None:
        raise InvariantError(f"optimized model fails the ONNX checker: {failure}")


def _check_serialized(model: ir.Model, stripped: onnx.ModelProto, target: Target | None) -> None:
    """``_check_in_memory`` on the writer's serialization (``serialize_stripped``): its
    large main-graph weights are placeholders too, from arrays of their own shape and
    type or loaded tensors whose size was checked on load."""

    def full_check() -> str | None:
        proto = ir.serde.serialize_model(model)
        return _check_proto(_view(proto, target) or proto)

    failure = _check_stripped(_view(stripped, target) or stripped, full_check)
    if failure is not None:
        raise InvariantError(f"optimized model fails the ONNX checker: {failure}")


def save_model(
    model: ir.Model,
    path: str | os.PathLike,
    target: Target | None = None,
    infer: bool = False,
    inputs: InputFiles | None = None,
) -> None:
    """Write ``model`` to ``path`` atomically: a temporary file, checked, then renamed.

    Models with external weights, or too large for one protobuf, are written
    with their weights in ``<name>.data`` beside the model. A model that fails
    onnx's full checker is not written (extension ops the ``target`` runs are
    allowed). ``infer``: first type the model's values by onnx's shape inference
    (graph outputs keep their declared types), made on the protobuf the save
    serializes anyway; it is serialized again only if inference changed something.
    Neither file may be one the input model reads (``inputs``; by default those of
    the file ``model`` was loaded from).
    """
    path = Path(path)
    external = _needs_external_data(model)
    data = path.with_name(f"{path.name}.data")
    outputs = [path, data] if external else [path]
    for output in outputs:
        check_output(output)
    refuse_overwriting(outputs, model.meta.get(INPUT_FILES_META) if inputs is None else inputs)
    if external:
        if infer:
            infer_shapes(model, outputs=False)
        _save_with_external_data(model, path, data, target)
        return
    load_spilled(model)
    # One serialization, large weights as placeholders: inferred, checked, written.
    serialized = serialize_stripped(model)
    if infer:
        found = inferred_types(serialized[0]) or {}  # {}: onnx gave up, nothing to apply
        if infer_shapes(model, found, outputs=False):
            serialized = serialize_stripped(model)
    _check_serialized(model, serialized[0], target)
    with creating(path):
        fd, tmp_name = tempfile.mkstemp(
            prefix=temporary_prefix(path), suffix=".tmp", dir=path.parent
        )
    # Written through the descriptor made with the file, not reopened: ext4 flushes a file
    # truncated by a reopen when it is closed (auto_da_alloc; 244 MB: about 0.1 s).
    out = os.fdopen(fd, "wb")
    try:
        with out:
            write_model(model, out, serialized)  # ir.save's bytes, weights in place
        # mkstemp creates the file private (0600): give it the mode a plain open() would.
        os.chmod(tmp_name, _new_file_mode())
        os.replace(tmp_name, path)
    except BaseException:
        out.close()
        Path(tmp_name).unlink(missing_ok=True)
        raise


def _save_with_external_data(
    model: ir.Model, path: Path, data: Path, target: Target | None
) -> None:
    """The model and its ``data`` file beside it, written and checked in a directory of
    their own, then renamed into place: the data first, the model last. A failed
    check, or an interruption before the renames, leaves an earlier output whole, and
    no model file there ever names data still being written."""
    data_name = data.name
    with creating(path):
        staging_directory = tempfile.TemporaryDirectory(
            prefix=temporary_prefix(path), dir=path.parent
        )
    with staging_directory as staging:
        staged = Path(staging) / path.name
        ir.save(model, staged, external_data=data_name)
        # By path: handles external data and models over 2 GB.
        if holds_accepted(model, target):
            failure = _check_file(staged, target)
        else:
            failure = _check_path(staged)
        if failure is not None:
            raise InvariantError(f"optimized model fails the ONNX checker: {failure}")
        staged_data = staged.with_name(data_name)
        if staged_data.exists():  # none when every weight is small
            os.chmod(staged_data, _new_file_mode())
            if data.is_file() or data.is_symlink():
                # Moved aside, not renamed over: ext4 writes a file out before renaming it
                # over another (auto_da_alloc; 600 MB: 0.3 s). Removed with the staging.
                os.replace(data, Path(staging) / f"earlier-{data_name}")
            os.replace(staged_data, data)
        os.chmod(staged, _new_file_mode())
        os.replace(staged, path)


def _new_file_mode() -> int:
    """0o666 less the process's umask, as open() would create a file."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


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
    message = exc.args[0] if len(exc.args) == 1 else None
    text = message.decode(errors="replace") if isinstance(message, bytes) else str(exc)
    text = text.strip() or type(exc).__name__
    return text.splitlines()[0][:300]
