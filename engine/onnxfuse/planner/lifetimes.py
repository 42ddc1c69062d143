"""Execution steps and the lifetime (first and last step) of every intermediate tensor."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import onnx
import onnx_ir as ir

from onnxfuse.errors import ModelError
from onnxfuse.planner.tensor_info import TensorInfo
from onnxfuse.support.ir_types import value_name

# Ops whose output differs between runs: never evaluated ahead of time.
NONDETERMINISTIC = frozenset(
    {
        "Bernoulli",
        "Multinomial",
        "RandomNormal",
        "RandomNormalLike",
        "RandomUniform",
        "RandomUniformLike",
    }
)


@dataclass(frozen=True)
class Listed:
    """A tensor kept outside the arena (input, output, initializer or folded constant)."""

    name: str
    info: TensorInfo


@dataclass
class Lifetime:
    """An intermediate tensor: produced at step ``first``, last used at step ``last``."""

    name: str
    info: TensorInfo
    first: int
    last: int


@dataclass
class Lifetimes:
    """What the planner places, for one execution order."""

    steps: list[ir.Node]
    step_nodes: list[int]  # index of each step's node in the graph's node list
    tensors: list[Lifetime]
    inputs: list[Listed]
    outputs: list[Listed]
    initializers: list[Listed]
    constants: list[Listed]  # outputs of folded nodes
    constant_nodes: list[ir.Node]  # folded nodes, in graph order
    # Optional outputs nobody reads: the node runs without producing them.
    omitted: list[str]


def peak(intervals: Sequence[tuple[int, int, int]], n_steps: int) -> int:
    """Max over steps of the summed sizes of the (first, last, size) intervals alive there."""
    delta = [0] * (n_steps + 1)
    for first, last, size in intervals:
        delta[first] += size
        delta[last + 1] -= size
    best = live = 0
    for d in delta:
        live += d
        best = max(best, live)
    return best


def subgraphs(node: ir.Node) -> Iterator[ir.Graph]:
    for attr in node.attributes.values():
        if attr.type == ir.AttributeType.GRAPH:
            yield attr.as_graph()
        elif attr.type == ir.AttributeType.GRAPHS:
            yield from attr.as_graphs()


def used_values(node: ir.Node) -> list[ir.Value]:
    """Values of the node's graph that it reads: inputs, and outer-scope values its bodies read.

    A value read inside an If/Loop/Scan body lives across the whole node.
    """
    used = [v for v in node.inputs if v is not None]
    for body in subgraphs(node):
        for inner in ir.traversal.RecursiveGraphIterator(body):
            used += [v for v in inner.inputs if v is not None and v.graph is node.graph]
    return used


def constant_values(model: ir.Model) -> set[ir.Value]:
    """Initializers that cannot be overridden by a feed.

    Before IR 4 every initializer is listed as a graph input too and is still a
    constant; from IR 4 on, an initializer that is also an input is only a default.
    """
    graph = model.graph
    old_ir = model.ir_version < 4
    return {v for v in graph.initializers.values() if old_ir or not v.is_graph_input()}


def foldable_nodes(model: ir.Model) -> list[ir.Node]:
    """Nodes computed from constants only (e.g. ConstantOfShape weights), in graph order."""
    known = constant_values(model)
    folded = []
    for node in model.graph:
        if node.op_type in NONDETERMINISTIC and node.domain in ("", "ai.onnx"):
            continue
        if all(v in known for v in used_values(node)):
            folded.append(node)
            known.update(node.outputs)
    return folded


def compute_lifetimes(
    model: ir.Model,
    infos: Mapping[str, TensorInfo | str],
    order: Sequence[int] | None = None,
    fold_constants: bool = True,
) -> Lifetimes:
    """Lifetimes for executing the non-folded nodes in ``order`` (graph node indices).

    ``order`` defaults to the graph's own (topological) order; a given order must
    be a topological order of the same nodes.
    """
    graph = model.graph
    nodes = list(graph)
    folded = foldable_nodes(model) if fold_constants else []
    folded_set = set(folded)
    if order is None:
        order = [i for i, n in enumerate(nodes) if n not in folded_set]
    steps = [nodes[i] for i in order]
    _check_order(steps, nodes, folded_set)

    def info(value: ir.Value, role: str) -> TensorInfo:
        found = infos.get(value.name or "")
        if isinstance(found, TensorInfo):
            return found
        reason = found or "has no type or shape after shape inference"
        raise ModelError(f"{role} {value.name!r} {reason}")

    def listed(value: ir.Value, role: str) -> Listed:
        found = info(value, role)
        return Listed(value_name(value), found)

    # In execution order, so that an error names the first tensor that cannot be sized.
    consts = constant_values(model)
    inputs = [listed(v, "input") for v in graph.inputs if v not in consts]
    initializers = [listed(v, "initializer") for v in graph.initializers.values()]
    constants = [Listed(v.name, info(v, "constant")) for n in folded for v in n.outputs if v.name]
    graph_outputs = set(graph.outputs)
    read = {v for node in steps for v in used_values(node)}
    tensors: dict[ir.Value, Lifetime] = {}
    omitted: list[str] = []
    for step, node in enumerate(steps):
        for value in used_values(node):
            if value in tensors:
                tensors[value].last = step
        for value in node.outputs:
            # An omitted optional output has no name and needs no memory.
            if not value.name:
                continue
            if value in graph_outputs:
                info(value, "output")
                continue
            if value not in read and _is_optional_output(model, node, value.index() or 0):
                omitted.append(value.name)
            else:
                tensors[value] = Lifetime(value.name, info(value, "tensor"), step, step)
    outputs = [listed(v, "output") for v in graph.outputs]
    return Lifetimes(
        steps=steps,
        step_nodes=list(order),
        tensors=list(tensors.values()),
        inputs=inputs,
        outputs=outputs,
        initializers=initializers,
        constants=constants,
        constant_nodes=folded,
        omitted=omitted,
    )


def _is_optional_output(model: ir.Model, node: ir.Node, index: int) -> bool:
    opset = model.opset_imports.get(node.domain or "", 1)
    try:
        schema = onnx.defs.get_schema(node.op_type, opset, node.domain)
    except onnx.defs.SchemaError:
        return False
    formal = schema.outputs[min(index, len(schema.outputs) - 1)]
    return formal.option == onnx.defs.OpSchema.FormalParameterOption.Optional


def _check_order(steps: list[ir.Node], nodes: list[ir.Node], folded: set[ir.Node]) -> None:
    expected = len(nodes) - len(folded)
    if len(steps) != expected or len(set(steps)) != expected or set(steps) & folded:
        raise ModelError("execution order does not list each non-constant node exactly once")
    done: set[ir.Node] = set(folded)
    for node in steps:
        for value in used_values(node):
            producer = value.producer()
            if producer is not None and producer.graph is node.graph and producer not in done:
                raise ModelError(
                    f"execution order runs node {node.name!r} before the producer of {value.name!r}"
                )
        done.add(node)
