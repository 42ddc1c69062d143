"""Facts about a node a rewrite will create, as gating reads them.

A node is described by its op, the opset it will run at, its attributes, and for
each input and output: element type, rank and whether it is a constant. Anything
not known stays None and is never held against a rule. The rewrite layer's
replacement plan (``onnxfuse.rewrite.plan``) fills them in; capability files
(``capabilities.py``) check them.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
import onnx.defs
import onnx_ir as ir

from onnxfuse.language.guards import constant_tensor
from onnxfuse.ops import element_types, schemas

Signature = tuple[tuple[str, ...], tuple[str, ...]]


def dtype_name(data_type: int | ir.DataType | None) -> str | None:
    """The ONNX spelling of an element type ('float', 'float16', 'int64', ...)."""
    return element_types.from_onnx(data_type)


def numpy_dtype_name(array: np.ndarray) -> str | None:
    return element_types.from_numpy(array.dtype)


@dataclass(frozen=True)
class ValueFacts:
    dtype: str | None = None
    rank: int | None = None
    constant: bool = False


@dataclass
class NodeFacts:
    domain: str
    op_type: str
    opset: int
    inputs: list[ValueFacts | None]
    outputs: list[ValueFacts | None]
    attributes: dict[str, Any] = field(default_factory=dict)

    def label(self) -> str:
        return f"{self.domain}::{self.op_type}" if self.domain else self.op_type

    def input_rank(self, index: int) -> int | None:
        value = self.inputs[index] if index < len(self.inputs) else None
        return None if value is None else value.rank

    def input_count(self) -> int:
        return _trimmed(self.inputs)

    def output_count(self) -> int:
        return _trimmed(self.outputs)

    def attribute(self, name: str) -> tuple[bool, Any]:
        """(known, value): set on the node, else the schema default (None: no default)."""
        if name in self.attributes:
            return True, _plain(self.attributes[name])
        schema = schemas.get_schema(self.domain, self.op_type, self.opset)
        if schema is None:
            return False, None  # no schema here: the default is not known
        if name not in schema.attributes:
            # Not an attribute at this opset (BatchNormalization's spatial, gone from
            # opset 9): a limit on it is about older versions of the op.
            return False, None
        default = schemas.attribute_default(self.domain, self.op_type, self.opset, name)
        return True, _plain(default) if schemas.has_default(default) else None

    def type_bindings(self, signature: Signature | None) -> dict[str, str]:
        """Type variable -> element type, from the inputs and outputs whose type is known."""
        if signature is None:
            return {}
        bound: dict[str, str] = {}
        for formals, values in zip(signature, (self.inputs, self.outputs)):
            for index, value in enumerate(values):
                variable = formal_type(formals, index)
                if variable is None or value is None or value.dtype is None:
                    continue
                if is_type_variable(variable):
                    bound.setdefault(variable, value.dtype)
        return bound


def _trimmed(values: list[ValueFacts | None]) -> int:
    count = len(values)
    while count and values[count - 1] is None:
        count -= 1
    return count


def _plain(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, tuple):
        return list(value)
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value


def formal_type(formals: tuple[str, ...], index: int) -> str | None:
    if index < len(formals):
        return formals[index].removesuffix("...")
    if formals and formals[-1].endswith("..."):
        return formals[-1].removesuffix("...")
    return None


def is_type_variable(type_str: str) -> bool:
    return "(" not in type_str


def fixed_type(type_str: str) -> str | None:
    if type_str.startswith("tensor(") and type_str.endswith(")"):
        return type_str[len("tensor(") : -1]
    return None


@functools.cache
def standard_schema(domain: str, op_type: str, opset: int) -> onnx.defs.OpSchema | None:
    """onnx's schema of a standard op at an opset (None: not a standard op there)."""
    if domain not in schemas.ONNX_DOMAINS:
        return None
    schema = schemas.get_schema(domain, op_type, opset)
    if schema is None or schema.deprecated:
        return None
    return schema


def value_facts(value: ir.Value | None, ir_version: int = 10) -> ValueFacts | None:
    if value is None:
        return None
    dtype = dtype_name(value.dtype) if isinstance(value.type, ir.TensorType) else None
    rank = len(value.shape) if value.shape is not None else None
    return ValueFacts(dtype, rank, constant_tensor(value, ir_version) is not None)
