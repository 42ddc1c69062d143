"""QDQ node units: a float op between DequantizeLinear and QuantizeLinear nodes.

A quantized model written in QDQ form runs each float op on dequantized inputs and
quantizes its output again. onnxruntime's CPU provider fuses such a unit into one
integer kernel (the `qdq` pack does the same); QNN, NNAPI, CoreML and others read the
units themselves and run them on integer hardware. Two things follow, and the
conditions of a rewrite check both (``unit_breaks``):

- a rule that knows nothing of quantization (its source has no Q or DQ) must not
  rewrite the float op of a unit: it would take the unit apart (a FusedConv from a
  unit's Conv and Relu leaves its DQs and Q around a float kernel);
- for a target whose capability file says ``quantization: qdq_units`` no rewrite may
  touch a unit at all, its DQs and Qs included, nor any other Q or DQ (a weight's DQ
  before a float MatMul is a unit of its own for those providers). The one exemption
  is a rule that declares ``keeps_units: true``: onnxruntime's level-1 cleanups, which
  it runs for every provider before partitioning (a DQ -> Q pair of equal parameters
  removed, Q/DQ propagated through data-movement ops). Such a rule may change the Qs
  and DQs that belong to no unit; a match touching a unit's node is still refused.

The unit is onnxruntime's (``NodeUnit``, ``GetQDQSelection``): the op has an input
computed by a DequantizeLinear, and every use of its outputs is a QuantizeLinear,
possibly through one Relu or Clip (which the Q makes redundant).
"""

from __future__ import annotations

from collections.abc import Iterable

import onnx_ir as ir

DQ, Q = "DequantizeLinear", "QuantizeLinear"
QDQ_OPS = frozenset({DQ, Q})
# Between a unit's op and its Q: onnxruntime's "redundant clip node".
_BETWEEN = frozenset({"Relu", "Clip"})


def _is(node: ir.Node | None, op_types: Iterable[str]) -> bool:
    return node is not None and node.domain in ("", "ai.onnx") and node.op_type in op_types


def _only_quantized(value: ir.Value, through: bool = True) -> bool:
    """Every use of ``value`` is a Q (or a Relu/Clip whose every use is one)."""
    if value.is_graph_output():
        return False
    uses = [consumer for consumer, _ in value.uses()]
    if not uses:
        return False
    for consumer in uses:
        if _is(consumer, (Q,)):
            continue
        if not (through and _is(consumer, _BETWEEN)):
            return False
        if not all(_only_quantized(out, through=False) for out in consumer.outputs):
            return False
    return True


def is_unit_op(node: ir.Node) -> bool:
    """``node`` is the float op of a QDQ node unit."""
    if _is(node, QDQ_OPS):
        return False
    if not any(v is not None and _is(v.producer(), (DQ,)) for v in node.inputs):
        return False
    used = [out for out in node.outputs if out.uses() or out.is_graph_output()]
    return bool(used) and all(_only_quantized(out) for out in used)


def _between_of_unit(node: ir.Node) -> bool:
    """``node`` is a Relu/Clip between a unit's op and its Q."""
    if not _is(node, _BETWEEN) or not node.inputs or node.inputs[0] is None:
        return False
    producer = node.inputs[0].producer()
    return producer is not None and is_unit_op(producer)


def in_unit(node: ir.Node) -> bool:
    """``node`` belongs to a QDQ node unit: its op, a Relu/Clip before its Q, one of its
    input DQs or one of its output Qs."""
    if is_unit_op(node) or _between_of_unit(node):
        return True
    if _is(node, (DQ,)):
        return any(is_unit_op(consumer) for out in node.outputs for consumer, _ in out.uses())
    if _is(node, (Q,)) and node.inputs and node.inputs[0] is not None:
        producer = node.inputs[0].producer()
        return producer is not None and (is_unit_op(producer) or _between_of_unit(producer))
    return False


def unit_breaks(
    nodes: Iterable[ir.Node], knows_qdq: bool, keep_units: bool, keeps_units: bool
) -> ir.Node | None:
    """The first matched node whose rewrite would break a QDQ node unit, or None.
    ``knows_qdq``: the rule's source has Q or DQ nodes (it rewrites units as units);
    ``keep_units``: the target consumes units itself, so none may change;
    ``keeps_units``: the rule declares that it leaves units whole (a level-1 cleanup),
    so for such a target only the nodes of units are out of its reach."""
    for node in nodes:
        if keep_units:
            if in_unit(node) or (_is(node, QDQ_OPS) and not keeps_units):
                return node
        elif not knows_qdq and (is_unit_op(node) or _between_of_unit(node)):
            return node
    return None
