"""What onnx_ir's types leave open and its objects always hold: narrowed once, checked."""

from __future__ import annotations

import onnx_ir as ir


def tensor_shape(tensor: ir.TensorProtocol) -> ir.Shape:
    """``tensor.shape``, which ``ir.TensorProtocol`` types as a ``ShapeProtocol``.

    Every tensor class of onnx_ir holds an ``ir.Shape``, and what the shape is handed on
    to needs one: ``ir.Value.shape`` rejects anything else, ``ir.ExternalTensor`` freezes it.
    """
    shape = tensor.shape
    assert isinstance(shape, ir.Shape)
    return shape


def value_name(value: ir.Value) -> str:
    """The name of a value of a graph: onnx_ir names the values a graph is built with and
    the outputs of the nodes added to it, and an initializer cannot lose its name."""
    assert value.name is not None, "a graph's value has no name"
    return value.name
