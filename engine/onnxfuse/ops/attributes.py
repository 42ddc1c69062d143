"""Attribute values as Python values: numbers, strings, lists, numpy tensors."""

from __future__ import annotations

from typing import Any

import onnx
from onnx import helper, numpy_helper


def python_value(attr: onnx.AttributeProto) -> Any:
    """A Python value for an attribute; ValueError for a tensor whose values do not fill
    its shape and for subgraphs, which have no plain value."""
    value = helper.get_attribute_value(attr)
    if attr.type == onnx.AttributeProto.TENSOR:
        try:
            return numpy_helper.to_array(value)
        except ValueError as exc:
            raise ValueError(f"attribute {attr.name}: {exc}") from None
    if attr.type == onnx.AttributeProto.STRING:
        return value.decode("utf-8")
    if attr.type == onnx.AttributeProto.STRINGS:
        return [v.decode("utf-8") for v in value]
    if attr.type in (onnx.AttributeProto.INTS, onnx.AttributeProto.FLOATS):
        return list(value)
    if attr.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS):
        raise ValueError(f"attribute '{attr.name}': subgraph attributes cannot be patterns")
    return value
