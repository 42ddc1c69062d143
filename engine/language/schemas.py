"""Operator schemas: which ops exist, their attributes and attribute defaults."""

from __future__ import annotations

import functools
from typing import Any

import onnx
import onnx.defs

from onnxfuse.language.pattern import attribute_value

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
    """True/False where the domain's op set is known here; None for other domains."""
    if domain in ONNX_DOMAINS:
        return onnx.defs.has(op_type, domain)
    if domain == "com.microsoft" or domain.startswith("com.microsoft."):
        return (domain, op_type) in onnxruntime_contrib_ops()
    return None


@functools.cache
def get_schema(domain: str, op_type: str, opset: int) -> onnx.defs.OpSchema | None:
    if domain not in ONNX_DOMAINS:
        return None
    try:
        return onnx.defs.get_schema(op_type, opset, domain)
    except onnx.defs.SchemaError:
        return None


@functools.cache
def attribute_default(domain: str, op_type: str, opset: int, name: str) -> Any:
    """The schema default of an attribute, or NO_DEFAULT."""
    schema = get_schema(domain, op_type, opset)
    if schema is None or name not in schema.attributes:
        return _NO_DEFAULT
    default = schema.attributes[name].default_value
    if default is None or default.type == onnx.AttributeProto.UNDEFINED:
        return _NO_DEFAULT
    return attribute_value(default)


def has_default(value: Any) -> bool:
    return value is not _NO_DEFAULT


@functools.cache
def latest_schema(domain: str, op_type: str) -> onnx.defs.OpSchema | None:
    if domain not in ONNX_DOMAINS:
        return None
    try:
        return onnx.defs.get_schema(op_type, domain)
    except onnx.defs.SchemaError:
        return None
