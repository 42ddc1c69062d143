"""The pattern IR: what an ONNX function means as a source or target pattern.

Function inputs are pattern variables, function attributes are attribute
variables, and (in a source) a ``Constant`` node stands for "a constant of this
value". Both rule syntaxes (ONNX text in YAML, onnxscript functions in Python)
produce a ``FunctionProto``; ``compile_function`` is the single compiler.
"""

from __future__ import annotations

import hashlib
import itertools
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np
import onnx

from onnxfuse.errors import RuleError
from onnxfuse.ops.attributes import python_value

# Ops whose inputs may be matched in any order, without copying the rule.
COMMUTATIVE_OPS = frozenset(
    {("", op) for op in ("Add", "Mul", "Max", "Min", "Sum", "And", "Or", "Xor", "Equal")}
)

# A commutative node's inputs are tried in every order up to this many inputs.
_MAX_PERMUTED_INPUTS = 5

# Pattern-node structures are numbered by a digest of what they require: equal
# structures of any rules get one number, so a check of one at a graph node serves them
# all; and the number is the same in every process, so rules read back from the load
# cache carry theirs (a 64-bit digest: distinct structures meet with odds of 2^-64).
_STRUCTURE_DIGEST_BYTES = 8

# Per input order, the non-variable inputs: (position, producer pattern node or None
# for a constant, output index).
Requirements = list[list[tuple[int, "PatternNode | None", int]]]

# A Constant-node attribute that holds a single value, as opposed to a tensor.
_SCALAR_CONSTANT_ATTRS = ("value_float", "value_int", "value_string")
_CONSTANT_ATTRS = (*_SCALAR_CONSTANT_ATTRS, "value", "value_floats", "value_ints", "value_strings")


@dataclass(frozen=True)
class AttrLiteral:
    """The attribute must equal this value (or be absent and default to it)."""

    value: Any
    attr_type: int = 0  # onnx.AttributeProto.AttributeType as written in the pattern


@dataclass(frozen=True)
class AttrRef:
    """The attribute's value is bound to (source) or taken from (target) a variable."""

    var: str
    attr_type: int = 0


@dataclass(eq=False)
class PatternValue:
    name: str
    kind: str  # "input", "constant" or "node"
    producer: PatternNode | None = field(default=None, repr=False)
    output_index: int = 0
    constant: np.ndarray | None = None
    scalar: bool = False  # from value_float/value_int: any size-1 tensor of that value


@dataclass(eq=False)
class PatternNode:
    index: int
    domain: str
    op_type: str
    inputs: list[PatternValue | None] = field(repr=False)
    outputs: list[PatternValue | None] = field(repr=False)
    attributes: dict[str, AttrLiteral | AttrRef]
    commutative: bool = False

    @property
    def key(self) -> tuple[str, str]:
        return (self.domain, self.op_type)

    @cached_property
    def input_orders(self) -> list[list[PatternValue | None]]:
        """The input orders the matcher tries: each distinct permutation of a
        commutative node's inputs (up to five inputs), else the written order."""
        if not self.commutative or not 1 < len(self.inputs) <= _MAX_PERMUTED_INPUTS:
            return [self.inputs]
        orders: list[list[PatternValue | None]] = []
        for order in itertools.permutations(self.inputs):
            candidate = list(order)
            if not any(all(a is b for a, b in zip(candidate, seen)) for seen in orders):
                orders.append(candidate)
        return orders

    @cached_property
    def structure(self) -> tuple[int, Requirements]:
        """What must be below this node, whatever the variables bind to: the op types,
        constants and output positions of its inputs' producers, per input order; with
        a number naming that structure (equal structures, equal numbers)."""
        requirements: Requirements = []
        signature: list[Any] = [self.domain, self.op_type]
        for order in self.input_orders:
            needs = []
            for position, pvalue in enumerate(order):
                if pvalue is None or pvalue.kind == "input":
                    continue
                producer = pvalue.producer
                below = None if producer is None else producer.structure[0]
                needs.append((position, producer, pvalue.output_index))
                signature.append((position, below, pvalue.output_index))
            requirements.append(needs)
            signature.append(None)  # ends an order
        digest = hashlib.blake2b(repr(signature).encode(), digest_size=_STRUCTURE_DIGEST_BYTES)
        return int.from_bytes(digest.digest(), "little"), requirements

    def describe(self) -> str:
        op = f"{self.domain}::{self.op_type}" if self.domain else self.op_type
        names = [o.name for o in self.outputs if o is not None]
        return f"{op} -> {', '.join(names)}" if names else op


@dataclass(eq=False)
class Pattern:
    name: str
    inputs: list[PatternValue]
    outputs: list[PatternValue]
    nodes: list[PatternNode]
    attribute_vars: list[str]
    values: dict[str, PatternValue] = field(default_factory=dict, repr=False)

    @property
    def anchor(self) -> PatternNode:
        """The node the matcher starts from: the producer of the first output."""
        producer = self.outputs[0].producer
        assert producer is not None
        return producer

    def input_names(self) -> list[str]:
        return [v.name for v in self.inputs]


def normalize_domain(domain: str) -> str:
    return "" if domain in ("", "ai.onnx") else domain


def attribute_value(attr: onnx.AttributeProto) -> Any:
    """A Python value for an attribute written in a pattern."""
    try:
        return python_value(attr)
    except ValueError as exc:
        raise RuleError(str(exc)) from None


def _constant_value(node: onnx.NodeProto) -> tuple[np.ndarray, bool]:
    if len(node.attribute) != 1 or node.attribute[0].name not in _CONSTANT_ATTRS:
        raise RuleError(
            "a Constant in a pattern needs exactly one of "
            + ", ".join(_CONSTANT_ATTRS)
            + " with a literal value"
        )
    attr = node.attribute[0]
    if attr.ref_attr_name:
        raise RuleError(
            "a Constant in a source pattern must hold a literal value, not an attribute reference"
        )
    scalar = attr.name in _SCALAR_CONSTANT_ATTRS
    try:
        value = attribute_value(attr)
        if attr.name == "value_float" or attr.name == "value_floats":
            return np.asarray(value, dtype=np.float32), scalar
        if attr.name in ("value_int", "value_ints"):
            return np.asarray(value, dtype=np.int64), scalar
        return np.asarray(value), scalar
    except (TypeError, ValueError, OverflowError) as exc:
        raise RuleError(f"Constant {attr.name}: not a literal value ({exc})") from None


def compile_function(
    function: onnx.FunctionProto,
    *,
    role: str,
    commutative: frozenset[tuple[str, str]] = COMMUTATIVE_OPS,
    node_lines: list[int] | None = None,
) -> Pattern:
    """Compile a FunctionProto into a Pattern.

    ``role`` is "source" or "replacement": in a source, Constant nodes become value
    constraints; in a target they stay nodes that create constants.
    ``node_lines`` gives each node's line in the pattern text, for errors.
    """
    values: dict[str, PatternValue] = {}
    inputs: list[PatternValue] = []
    for name in function.input:
        if name in values:
            raise RuleError(f"pattern input '{name}' is listed twice")
        values[name] = PatternValue(name=name, kind="input")
        inputs.append(values[name])

    nodes: list[PatternNode] = []
    for position, proto in enumerate(function.node):
        line = node_lines[position] if node_lines and position < len(node_lines) else None
        try:
            node = _compile_node(proto, values, role, commutative, len(nodes))
        except RuleError as exc:
            raise exc.located(line=line) from None
        if node is not None:
            nodes.append(node)

    outputs: list[PatternValue] = []
    for name in function.output:
        if name not in values:
            raise RuleError(f"pattern output '{name}' is never computed")
        value = values[name]
        if role == "source" and value.kind != "node":
            raise RuleError(f"source output '{name}' must be produced by a node of the pattern")
        outputs.append(value)
    if not outputs:
        raise RuleError("a pattern needs at least one output")
    if role == "source":
        _check_connected(nodes, outputs)
    return Pattern(
        name=function.name,
        inputs=inputs,
        outputs=outputs,
        nodes=nodes,
        attribute_vars=list(function.attribute),
        values=values,
    )


def _compile_node(
    proto: onnx.NodeProto,
    values: dict[str, PatternValue],
    role: str,
    commutative: frozenset[tuple[str, str]],
    index: int,
) -> PatternNode | None:
    domain = normalize_domain(proto.domain)
    if role == "source" and domain == "" and proto.op_type == "Constant":
        if len(proto.output) != 1 or proto.output[0] in values:
            raise RuleError("a Constant must define one new value")
        constant, scalar = _constant_value(proto)
        name = proto.output[0]
        values[name] = PatternValue(name=name, kind="constant", constant=constant, scalar=scalar)
        return None

    node_inputs: list[PatternValue | None] = []
    for name in proto.input:
        if name == "":
            node_inputs.append(None)
            continue
        if name not in values:
            raise RuleError(f"{proto.op_type}: input '{name}' is used before it is defined")
        node_inputs.append(values[name])

    attributes: dict[str, AttrLiteral | AttrRef] = {}
    for attr in proto.attribute:
        if attr.ref_attr_name:
            attributes[attr.name] = AttrRef(attr.ref_attr_name, attr.type)
        else:
            attributes[attr.name] = AttrLiteral(attribute_value(attr), attr.type)

    node = PatternNode(
        index=index,
        domain=domain,
        op_type=proto.op_type,
        inputs=node_inputs,
        outputs=[],
        attributes=attributes,
        commutative=(domain, proto.op_type) in commutative,
    )
    for position, name in enumerate(proto.output):
        if name == "":
            node.outputs.append(None)
            continue
        if name in values:
            raise RuleError(f"{proto.op_type}: value '{name}' is defined twice")
        value = PatternValue(name=name, kind="node", producer=node, output_index=position)
        values[name] = value
        node.outputs.append(value)
    return node


def _check_connected(nodes: list[PatternNode], outputs: list[PatternValue]) -> None:
    """Every source node must contribute to an output, or the match is ambiguous."""
    reached: set[int] = set()
    stack = [o.producer for o in outputs if o.producer is not None]
    while stack:
        node = stack.pop()
        if node.index in reached:
            continue
        reached.add(node.index)
        stack.extend(v.producer for v in node.inputs if v is not None and v.producer is not None)
    for node in nodes:
        if node.index not in reached:
            raise RuleError(f"{node.describe()}: node does not lead to any pattern output")
