"""The replacement plan: what a firing will create, computed once, as data.

Gating reads the plan (each node that will need a kernel, with the facts of its
values) and ``apply.apply_match`` carries it out (the same nodes, attributes and
names), so what is checked is what is built. Inputs bound by the match carry the
graph's facts; values the rewrite replaces keep the type and shape of the value
they replace; other created values get their element type from the op schemas
(type variables bound by the inputs, fixed types, Cast's ``to``, Constant's
attribute kind) and no rank.
"""

from __future__ import annotations

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
from onnxfuse.rewrite.matcher import ABSENT, Match, ModelContext
from onnxfuse.targets.facts import (
    NodeFacts,
    ValueFacts,
    dtype_name,
    fixed_type,
    formal_type,
    is_type_variable,
    numpy_dtype_name,
    standard_schema,
    value_facts,
)

# Constant attributes and the element type of the value they make.
_CONSTANT_KINDS = {
    "value_float": "float",
    "value_floats": "float",
    "value_int": "int64",
    "value_ints": "int64",
    "value_string": "string",
    "value_strings": "string",
}


@dataclass(frozen=True)
class PlannedAttribute:
    """An attribute a created node will carry: the value, and the kind the rule wrote it
    as (None for one copied whole from a matched node, ``copied``)."""

    name: str
    value: Any
    written_type: int | None = None
    copied: ir.Attr | None = None


@dataclass
class PlannedNode:
    pattern: PatternNode
    opset: int  # the opset it will run at: the model's, or the rule's import of a new domain
    attributes: list[PlannedAttribute]


@dataclass
class ReplacementPlan:
    """The nodes a firing creates; the facts of their values are worked out when gating
    first asks for them (``kernels``), since applying a match needs only the nodes."""

    rule: Rule
    nodes: list[PlannedNode]
    values: dict[str, ir.Value | None] | None = None
    outputs: list[ir.Value] = field(default_factory=list)
    constants: set[str] | None = None  # None: the constants among ``values``
    ir_version: int = 10
    _facts: list[tuple[NodeFacts, bool]] | None = field(default=None, repr=False)

    def kernels(self) -> Iterator[NodeFacts]:
        """The facts of each created node that will need a kernel (a node computing on
        constants only folds away)."""
        if self._facts is None:
            self._facts = self._work_out_facts()
        return (facts for facts, folds in self._facts if not folds)

    def _work_out_facts(self) -> list[tuple[NodeFacts, bool]]:
        values, version = self.values, self.ir_version
        constants = self.constants
        if constants is None:
            constants = {
                name
                for name, value in (values or {}).items()
                if constant_tensor(value, version) is not None
            }
        replacement = self.rule.replacement
        env: dict[str, ValueFacts | None] = {}
        for name in replacement.input_names():
            if values is not None and name in values:
                env[name] = value_facts(values[name], version)
            else:
                env[name] = ValueFacts(constant=name in constants)
        replaced = {
            pvalue.name: value_facts(old, version)
            for pvalue, old in zip(replacement.outputs, self.outputs)
        }
        found: list[tuple[NodeFacts, bool]] = []
        for planned in self.nodes:
            pnode = planned.pattern
            inputs = [None if pv is None else env.get(pv.name) for pv in pnode.inputs]
            value_inputs = inputs[:1] if pnode.op_type == "CastLike" else inputs
            folds = pnode.domain == "" and all(v is None or v.constant for v in value_inputs)
            plain = {
                a.name: a.copied.value if a.copied is not None else a.value
                for a in planned.attributes
            }
            schema = standard_schema(pnode.domain, pnode.op_type, planned.opset)
            facts = NodeFacts(pnode.domain, pnode.op_type, planned.opset, inputs, [], plain)
            for pvalue, dtype in zip(pnode.outputs, _output_dtypes(pnode, facts, schema)):
                if pvalue is None:
                    facts.outputs.append(None)
                    continue
                known = replaced.get(pvalue.name)
                output = ValueFacts(
                    dtype=(known.dtype if known is not None else None) or dtype,
                    rank=known.rank if known is not None else None,
                    constant=folds,
                )
                env[pvalue.name] = output
                facts.outputs.append(output)
            found.append((facts, folds))
        return found


def plan_replacement(
    rule: Rule,
    constants: set[str] | None,
    opsets: dict[str, int],
    values: dict[str, ir.Value | None] | None = None,
    outputs: list[ir.Value] | None = None,
    attrs: dict[str, Any] | None = None,
    copied: dict[str, dict[str, Any]] | None = None,
    ir_version: int = 10,
) -> ReplacementPlan:
    """The plan of a firing of ``rule``. Without the match's ``values`` (and its
    ``outputs``, ``attrs`` and ``copied`` attributes) only ops and opsets are known;
    ``constants`` (None: those among ``values``) names the bound constants."""
    nodes = [
        PlannedNode(
            pnode,
            opsets.get(pnode.domain, rule.imports.get(pnode.domain, 1)),
            _attributes(pnode, attrs or {}, copied or {}),
        )
        for pnode in rule.replacement.nodes
    ]
    return ReplacementPlan(rule, nodes, values, list(outputs or []), constants, ir_version)


def plan_match(match: Match, context: ModelContext) -> ReplacementPlan:
    """The replacement plan of a match whose lets are bound."""
    return plan_replacement(
        match.rule,
        None,
        context.opsets,
        values=match.values,
        outputs=match.outputs,
        attrs=match.attrs,
        copied=match.copied,
        ir_version=context.ir_version,
    )


def _attributes(
    pnode: PatternNode, attrs: dict[str, Any], copied: dict[str, dict[str, Any]]
) -> list[PlannedAttribute]:
    """The pattern's attributes in its order (an unset or absent one stays unset, as in
    ONNX functions), then those copied from a matched node that the pattern did not set."""
    found: list[PlannedAttribute] = []
    for name, spec in pnode.attributes.items():
        value = spec.value if isinstance(spec, AttrLiteral) else attrs.get(spec.var, ABSENT)
        if value is not ABSENT and value is not None:
            found.append(PlannedAttribute(name, value, spec.attr_type))
    for pvalue in pnode.outputs:
        if pvalue is not None and pvalue.name in copied:
            named = {a.name for a in found}
            for name, attr in copied[pvalue.name].items():
                if name not in named:
                    found.append(PlannedAttribute(name, None, None, attr))
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
        c.type_param_str: fixed_type(c.allowed_type_strs[0])
        for c in schema.type_constraints
        if len(c.allowed_type_strs) == 1
    }
    dtypes: list[str | None] = []
    for index in range(count):
        type_str = formal_type(formals[1], index)
        if type_str is None:
            dtypes.append(None)
        elif is_type_variable(type_str):
            dtypes.append(bound.get(type_str) or single.get(type_str))
        else:
            dtypes.append(fixed_type(type_str))
    return dtypes


def _constant_dtype(attributes: dict[str, Any]) -> str | None:
    for name, value in attributes.items():
        if name in _CONSTANT_KINDS:
            return _CONSTANT_KINDS[name]
        if name == "value":
            if isinstance(value, np.ndarray):
                return numpy_dtype_name(value)
            if isinstance(value, ir.TensorProtocol):
                return dtype_name(value.dtype)
    return None
