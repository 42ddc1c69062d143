"""What is known, when a rule fires, about each node its target pattern creates.

For gating (engine/targets.py) every created node is described by its op, the
opset it will run at, and for each input and output: element type, rank and
whether it is a constant. Inputs bound by the match carry the graph's facts;
values the rewrite replaces keep the type and shape of the value they
replace; other values the target creates get their element type from the op
schemas (type variables bound by the inputs, fixed types, Cast's ``to``,
Constant's attribute kind) and no rank. Anything not known stays None and is
never held against a rule.
"""

from __future__ import annotations

import functools
import numbers
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
import onnx.defs
import onnx_ir as ir

from onnxfuse.language.guards import constant_tensor
from onnxfuse.language.pattern import AttrLiteral, PatternNode
from onnxfuse.language.rule import Rule
from onnxfuse.ops import element_types, schemas

Signature = tuple[tuple[str, ...], tuple[str, ...]]

# Constant attributes and the element type of the value they make.
_CONSTANT_KINDS = {
    "value_float": "float",
    "value_floats": "float",
    "value_int": "int64",
    "value_ints": "int64",
    "value_string": "string",
    "value_strings": "string",
}


def dtype_name(data_type: int | ir.DataType | None) -> str | None:
    """The ONNX spelling of an element type ('float', 'float16', 'int64', ...)."""
    return element_types.from_onnx(data_type)


def _numpy_dtype_name(array: np.ndarray) -> str | None:
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
        if schemas.get_schema(self.domain, self.op_type, self.opset) is None:
            return False, None  # no schema here: the default is not known
        default = schemas.attribute_default(self.domain, self.op_type, self.opset, name)
        return True, _plain(default) if schemas.has_default(default) else None

    def type_bindings(self, signature: Signature | None) -> dict[str, str]:
        """Type variable -> element type, from the inputs and outputs whose type is known."""
        if signature is None:
            return {}
        bound: dict[str, str] = {}
        for formals, values in zip(signature, (self.inputs, self.outputs)):
            for index, value in enumerate(values):
                variable = _formal(formals, index)
                if variable is None or value is None or value.dtype is None:
                    continue
                if _is_variable(variable):
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


def _formal(formals: tuple[str, ...], index: int) -> str | None:
    if index < len(formals):
        return formals[index].removesuffix("...")
    if formals and formals[-1].endswith("..."):
        return formals[-1].removesuffix("...")
    return None


def _is_variable(type_str: str) -> bool:
    return "(" not in type_str


def _fixed_type(type_str: str) -> str | None:
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


def created_nodes(
    rule: Rule,
    constants: set[str],
    opsets: dict[str, int],
    values: dict[str, ir.Value | None] | None = None,
    outputs: list[ir.Value] | None = None,
    attrs: dict[str, Any] | None = None,
    copied: dict[str, dict[str, Any]] | None = None,
    ir_version: int = 10,
) -> Iterator[NodeFacts]:
    """Facts of each target node that will need a kernel (constant-only nodes fold away)."""
    env: dict[str, ValueFacts | None] = {}
    for name in rule.target.input_names():
        if values is not None and name in values:
            env[name] = value_facts(values[name], ir_version)
        else:
            env[name] = ValueFacts(constant=name in constants)
    replaced = {
        pvalue.name: value_facts(old, ir_version)
        for pvalue, old in zip(rule.target.outputs, outputs or [])
    }
    for pnode in rule.target.nodes:
        inputs = [None if pv is None else env.get(pv.name) for pv in pnode.inputs]
        value_inputs = inputs[:1] if pnode.op_type == "CastLike" else inputs
        folded = pnode.domain == "" and all(v is None or v.constant for v in value_inputs)
        opset = opsets.get(pnode.domain, rule.imports.get(pnode.domain, 1))
        attributes = _attributes(pnode, attrs or {}, copied or {})
        schema = standard_schema(pnode.domain, pnode.op_type, opset)
        facts = NodeFacts(pnode.domain, pnode.op_type, opset, inputs, [], attributes)
        dtypes = _output_dtypes(pnode, facts, schema)
        for pvalue, dtype in zip(pnode.outputs, dtypes):
            if pvalue is None:
                facts.outputs.append(None)
                continue
            known = replaced.get(pvalue.name)
            output = ValueFacts(
                dtype=(known.dtype if known is not None else None) or dtype,
                rank=known.rank if known is not None else None,
                constant=folded,
            )
            env[pvalue.name] = output
            facts.outputs.append(output)
        if not folded:
            yield facts


def _attributes(
    pnode: PatternNode, attrs: dict[str, Any], copied: dict[str, dict[str, Any]]
) -> dict[str, Any]:
    """The attributes the created node will carry (absent ones left out)."""
    found: dict[str, Any] = {}
    for pvalue in pnode.outputs:
        if pvalue is not None and pvalue.name in copied:
            for name, attr in copied[pvalue.name].items():
                found[name] = attr.value if isinstance(attr, ir.Attr) else attr
    for name, spec in pnode.attributes.items():
        value = spec.value if isinstance(spec, AttrLiteral) else attrs.get(spec.var)
        if value is None:
            found.pop(name, None)
        else:
            found[name] = value
    return found


def _output_dtypes(
    pnode: PatternNode, node: NodeFacts, schema: onnx.defs.OpSchema | None
) -> list[str | None]:
    count = len(pnode.outputs)
    if pnode.domain == "" and pnode.op_type == "Constant":
        return [_constant_dtype(node.attributes)] * count
    to = node.attributes.get("to")
    if pnode.domain == "" and pnode.op_type == "Cast" and isinstance(to, numbers.Integral):
        return [dtype_name(int(to))] * count
    if schema is None:
        return [None] * count
    formals = tuple(f.type_str for f in schema.inputs), tuple(f.type_str for f in schema.outputs)
    bound = node.type_bindings(formals)
    single = {
        c.type_param_str: _fixed_type(c.allowed_type_strs[0])
        for c in schema.type_constraints
        if len(c.allowed_type_strs) == 1
    }
    dtypes: list[str | None] = []
    for index in range(count):
        type_str = _formal(formals[1], index)
        if type_str is None:
            dtypes.append(None)
        elif _is_variable(type_str):
            dtypes.append(bound.get(type_str) or single.get(type_str))
        else:
            dtypes.append(_fixed_type(type_str))
    return dtypes


def _constant_dtype(attributes: dict[str, Any]) -> str | None:
    for name, value in attributes.items():
        if name in _CONSTANT_KINDS:
            return _CONSTANT_KINDS[name]
        if name == "value":
            if isinstance(value, np.ndarray):
                return _numpy_dtype_name(value)
            if isinstance(value, ir.TensorProtocol):
                return dtype_name(value.dtype)
    return None
