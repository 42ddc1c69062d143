"""Operator schemas: which ops exist, their attributes and attribute defaults."""

from __future__ import annotations

import functools
from typing import Any

import onnx
import onnx.defs

from onnxfuse.ops import extension as extension_ops
from onnxfuse.ops.attributes import python_value

# Domains whose operator set onnx itself defines.
ONNX_DOMAINS = frozenset({"", "ai.onnx.ml", "ai.onnx.preview.training"})

_NO_DEFAULT = object()


@functools.cache
def onnxruntime_contrib_ops() -> frozenset[tuple[str, str]]:
    """(domain, op_type) of every kernel the installed onnxruntime registers."""
    from onnxruntime.capi import onnxruntime_pybind11_state as state

    return frozenset(
        ("" if d.domain == "ai.onnx" else d.domain, d.op_name) for d in state.get_all_opkernel_def()
    )


def known_op(domain: str, op_type: str) -> bool | None:
    """True/False where the domain's op set is known here; None for other domains.

    The ai.onnx domain also holds onnxruntime's extension ops (``extension_ops``).
    """
    if domain in ONNX_DOMAINS:
        if domain == "" and extension_ops.extension_versions(op_type):
            return True
        return onnx.defs.has(op_type, domain)
    if domain == "com.microsoft" or domain.startswith("com.microsoft."):
        # A kernel on this machine's (CPU) build, or a schema for another provider's
        # kernel (com.microsoft.NhwcConv runs on CUDA and DirectML only).
        key = (domain, op_type)
        return key in onnxruntime_contrib_ops() or key in _contrib_raw()
    return None


@functools.cache
def get_schema(domain: str, op_type: str, opset: int) -> onnx.defs.OpSchema | None:
    if domain not in ONNX_DOMAINS:
        return None
    try:
        return onnx.defs.get_schema(op_type, opset, domain)
    except onnx.defs.SchemaError:
        return None


def op_schema(domain: str, op_type: str, opset: int) -> onnx.defs.OpSchema | None:
    """The standard's schema, else onnxruntime's for an ai.onnx extension op.

    ``get_schema`` stays the standard's alone: gating asks it whether an op is
    standard.
    """
    found = get_schema(domain, op_type, opset)
    if found is None and domain == "":
        found = extension_ops.extension_schema(op_type, opset)
    if found is None and domain not in ONNX_DOMAINS:
        found = _contrib_schema(domain, op_type, opset)
    return found


def _contrib_schema(domain: str, op_type: str, opset: int) -> onnx.defs.OpSchema | None:
    """onnxruntime's schema of an op in one of its own domains (com.microsoft, ...)."""
    chosen = None
    for schema in _contrib_versions(domain, op_type):
        if schema.since_version <= opset:
            chosen = schema
    return chosen


@functools.cache
def _contrib_raw() -> dict[tuple[str, str], tuple[Any, ...]]:
    """onnxruntime's schemas of its own domains by op, oldest first, as its own objects:
    converting all of them cost 0.03 s at every start, for the few ops rules use."""
    found: dict[tuple[str, str], list[Any]] = {}
    for schema in extension_ops.onnxruntime_schemas():
        if schema.domain in ONNX_DOMAINS or schema.domain == "ai.onnx" or schema.deprecated:
            continue
        found.setdefault((schema.domain, schema.name), []).append(schema)
    return {key: tuple(sorted(v, key=lambda s: s.since_version)) for key, v in found.items()}


@functools.cache
def _contrib_versions(domain: str, op_type: str) -> tuple[onnx.defs.OpSchema, ...]:
    return tuple(
        extension_ops._as_onnx_schema(schema, schema.domain)
        for schema in _contrib_raw().get((domain, op_type), ())
    )


@functools.cache
def attribute_default(domain: str, op_type: str, opset: int, name: str) -> Any:
    """The schema default of an attribute, or NO_DEFAULT."""
    schema = op_schema(domain, op_type, opset)
    if schema is None or name not in schema.attributes:
        return _NO_DEFAULT
    default = schema.attributes[name].default_value
    if default is None or default.type == onnx.AttributeProto.UNDEFINED:
        return _NO_DEFAULT
    return python_value(default)


def has_default(value: Any) -> bool:
    return value is not _NO_DEFAULT


@functools.cache
def _history() -> dict[tuple[str, str], list[onnx.defs.OpSchema]]:
    versions: dict[tuple[str, str], list[onnx.defs.OpSchema]] = {}
    for schema in onnx.defs.get_all_schemas_with_history():
        versions.setdefault((schema.domain, schema.name), []).append(schema)
    for (domain, op_type), schemas in versions.items():
        if domain == "":
            schemas.extend(extension_ops.extension_versions(op_type))
        schemas.sort(key=lambda s: s.since_version)
    return versions


def schemas_in_range(
    domain: str, op_type: str, low: int | None, high: int | None
) -> list[onnx.defs.OpSchema]:
    """Every version of an op's schema in force somewhere in opsets [low, high]."""
    return list(_schemas_in_range(domain, op_type, low, high))


@functools.cache
def _schemas_in_range(
    domain: str, op_type: str, low: int | None, high: int | None
) -> tuple[onnx.defs.OpSchema, ...]:
    # Cached: every rule's every node asks (2.5k times for the built-in packs).
    versions = _history().get((domain, op_type))
    if versions is None:  # an op only onnxruntime defines, or none at all
        versions = list(extension_ops.extension_versions(op_type)) if domain == "" else []
    chosen = []
    for index, schema in enumerate(versions):
        ends = versions[index + 1].since_version - 1 if index + 1 < len(versions) else None
        if high is not None and schema.since_version > high:
            continue
        if low is not None and ends is not None and ends < low:
            continue
        chosen.append(schema)
    return tuple(chosen)


def input_is_optional(domain: str, op_type: str, opset: int, index: int) -> bool:
    """Whether input ``index`` may be left absent (unknown ops: assumed optional)."""
    schema = op_schema(domain, op_type, opset)
    if schema is None or not schema.inputs:
        return True
    formal = schema.inputs[min(index, len(schema.inputs) - 1)]
    if index >= len(schema.inputs) and formal.option != formal.option.Variadic:
        return True
    return formal.option == formal.option.Optional
