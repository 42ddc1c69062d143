"""Store a plan inside the model (metadata_props) so a runtime can read it with the model."""

from __future__ import annotations

import json
from dataclasses import replace

import onnx_ir as ir

from onnxfuse.errors import OnnxfuseError
from onnxfuse.planner.plan import Plan, Step

METADATA_KEY = "onnxfuse.memory_plan"


def embed_plan(model: ir.Model, plan: Plan) -> tuple[ir.Model, Plan]:
    """A copy of ``model`` carrying ``plan``; ``model`` itself is not modified.

    The copy's nodes are reordered to the folded constants first (graph order),
    then the steps in plan order, so that the graph's own order is the execution
    order and step ``k`` is node ``len(constants) + k``. Returns the copy and the
    plan as stored (its steps renumbered to the copy's nodes).
    """
    clone = model.clone()
    nodes = list(clone.graph)
    stepped = [s.node for s in plan.steps]
    taken = set(stepped)
    order = [i for i in range(len(nodes)) if i not in taken] + stepped
    clone.graph.remove(nodes)
    clone.graph.extend(nodes[i] for i in order)
    start = len(order) - len(stepped)
    stored = replace(plan, steps=[Step(start + k, s.name, s.op) for k, s in enumerate(plan.steps)])
    clone.metadata_props[METADATA_KEY] = json.dumps(stored.to_dict(), separators=(",", ":"))
    return clone, stored


def read_embedded_plan(model: ir.Model) -> Plan:
    text = model.metadata_props.get(METADATA_KEY)
    if text is None:
        raise OnnxfuseError(f"the model has no {METADATA_KEY!r} metadata")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise OnnxfuseError(f"{METADATA_KEY!r} metadata is not JSON: {exc}") from None
    return Plan.from_dict(data)
