"""Ops an onnxruntime provider runs by expanding their ONNX function body.

onnxruntime's graph partitioner offers every node to the session's providers;
a node none of them claims whose schema has a function body is replaced by
that body (``InlineNodes`` in graph_partitioner.cc), and the body's nodes are
offered again. So a provider with no HardSwish kernel still runs HardSwish-14
when it runs the body's HardSigmoid and Mul for that element type: the CPU
provider does exactly that (a session with its optimizer off saves
HardSigmoid + Mul). The partitioner does this for every provider, so every
onnxruntime target gets these entries, each checked against that target's
own listed ops: a body op the provider does not run would go to the CPU
fallback, and the op does not count as run by that provider. Only a node no
provider claims is inlined, and the CPU provider is in every session: an op
with a CPU kernel (Softplus, MeanVarianceNormalization) runs there, not as a
body on another provider, so it gets no entry anywhere.

Only ops with a *static* body are listed: a context-dependent body (CastLike,
GroupNormalization, the losses, Attention) depends on the node's attributes
and input types, which a capability entry cannot key on. Inside a static body
a context-dependent op is expanded with the node and types at hand (Swish's
CastLike), and a nested function op is checked the same way (SwiGLU's Swish).
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable
from typing import Any

import onnx
import onnx.defs
import onnx.helper
import onnx.shape_inference

from onnxfuse.ops import element_types
from onnxfuse.targets.capabilities import FUNCTION_BODY_NOTE, OpSupport, Target
from onnxfuse.targets.facts import NodeFacts, ValueFacts, dtype_name
from onnxfuse.targets.generator.sources import short_type

MAX_OPSET = onnx.defs.onnx_opset_version()
MAX_DEPTH = 4  # nested function bodies (SwiGLU -> Swish -> CastLike -> Cast)


# Whether a real session runs a one-node model of (op, opset, element types).
Confirm = Callable[[onnx.defs.OpSchema, int, dict[str, str]], bool]


def function_ops(
    target: Target, cpu_kernels: Target, confirm: Confirm | None = None
) -> list[dict[str, Any]]:
    """Target-file entries for the ai.onnx ops this target runs only by their function body.

    ``cpu_kernels`` is the CPU provider's kernel registry: the CPU provider is
    in every session, and a node it has a kernel for is assigned to it, not
    inlined, so no provider runs such an op by its body. ``confirm``, where a
    session can be made (the CPU), must also run each case: onnxruntime
    inlines the bodies of the onnx it was built with, which may differ from
    the installed onnx's (MeanVarianceNormalization's for double).
    """
    entries: list[dict[str, Any]] = []
    for schema in _static_function_schemas():
        entries.extend(_entries_for(target, cpu_kernels, schema, confirm))
    return entries


@functools.cache
def _static_function_schemas() -> tuple[onnx.defs.OpSchema, ...]:
    found = [
        s
        for s in onnx.defs.get_all_schemas_with_history()
        # onnx's stub leaves out OpSchema's function members (has_function, ...).
        if s.domain in ("", "ai.onnx") and s.has_function and not s.deprecated  # type: ignore[attr-defined]
    ]
    return tuple(sorted(found, key=lambda s: (s.name, s.since_version)))


@functools.cache
def _versions(op_type: str) -> tuple[int, ...]:
    return tuple(
        s.since_version
        for s in onnx.defs.get_all_schemas_with_history()
        if s.name == op_type and s.domain in ("", "ai.onnx")
    )


def _last_model_opset(schema: onnx.defs.OpSchema) -> int:
    newer = [v for v in _versions(schema.name) if v > schema.since_version]
    return min(newer) - 1 if newer else MAX_OPSET


def _entries_for(
    target: Target, cpu_kernels: Target, schema: onnx.defs.OpSchema, confirm: Confirm | None
) -> list[dict[str, Any]]:
    last = _last_model_opset(schema)
    variables = _input_variables(schema)
    combos = list(itertools.product(*(allowed for _, allowed in variables)))
    runs: list[tuple[int, tuple[dict[str, list[str]] | None, int]]] = []
    for opset in range(schema.since_version, last + 1):
        verdicts = {}
        for combo in combos:
            bound = dict(zip(_names(variables), combo))
            verdict = _inlined_and_run(target, cpu_kernels, schema, opset, bound)
            if verdict is not None and (confirm is None or confirm(schema, opset, bound)):
                verdicts[combo] = verdict
        ranks = set(verdicts.values())
        if len(ranks) > 1:  # a rank limit that depends on the type: list nothing
            verdicts = {}
        types = _as_types(variables, list(verdicts))
        runs.append((opset, (types, ranks.pop() if len(ranks) == 1 else NO_LIMIT)))
    entries: list[dict[str, Any]] = []
    for (types, rank), group in itertools.groupby(runs, key=lambda r: r[1]):
        opsets = [o for o, _ in group]
        if not types:
            continue
        until = None if opsets[-1] == MAX_OPSET else opsets[-1]
        entry: dict[str, Any] = {
            "domain": "",
            "op": schema.name,
            "since": opsets[0],
            "until": until,
            "types": types,
        }
        if rank != NO_LIMIT:
            entry["limits"] = {"max_rank": rank}  # every body op's
        entry["notes"] = (
            f"{FUNCTION_BODY_NOTE} ("
            + ", ".join(_body_ops(schema, opsets[0]))
            + "), which onnxruntime's partitioner inlines"
        )
        entries.append(entry)
    return entries


def _names(variables: list[tuple[str, list[str]]]) -> list[str]:
    return [name for name, _ in variables]


def _input_variables(schema: onnx.defs.OpSchema) -> list[tuple[str, list[str]]]:
    """The type variables of the inputs, each with the element types the schema allows."""
    allowed = {
        c.type_param_str: sorted(short_type(t) for t in c.allowed_type_strs)
        for c in schema.type_constraints
    }
    seen: list[tuple[str, list[str]]] = []
    for formal in schema.inputs:
        name = formal.type_str
        if name in allowed and name not in _names(seen):
            seen.append((name, allowed[name]))
    return seen


def _as_types(
    variables: list[tuple[str, list[str]]], accepted: list[tuple[str, ...]]
) -> dict[str, list[str]] | None:
    """Per-variable lists, when the accepted combinations are exactly their product."""
    if not accepted:
        return None
    per_variable = [sorted({c[i] for c in accepted}) for i in range(len(variables))]
    if len(accepted) != len(list(itertools.product(*per_variable))):
        return None  # not expressible per variable: list nothing rather than too much
    return {name: types for (name, _), types in zip(variables, per_variable)}


def _body_ops(schema: onnx.defs.OpSchema, opset: int) -> list[str]:
    body = _function(schema, opset)
    ops = [] if body is None else [n.op_type for n in body.node if n.op_type != "Constant"]
    return list(dict.fromkeys(ops))


def _function(schema: onnx.defs.OpSchema, opset: int) -> onnx.FunctionProto | None:
    try:
        # onnx's stub leaves out OpSchema's function members.
        raw = schema.get_function_with_opset_version(opset)  # type: ignore[attr-defined]
    except Exception:  # onnx has no body for this opset
        return None
    return _valid_at(onnx.FunctionProto.FromString(raw) if raw else None, opset)


def _valid_at(body: onnx.FunctionProto | None, opset: int) -> onnx.FunctionProto | None:
    """The body, if each op it calls is the same version at the model's opset.

    onnxruntime inlines a body written for opset 18 into a model of opset 18
    only when nothing it calls changed since (onnx's ValidateReferencedOps):
    HardSigmoid-6 for double runs at opset 18 as its body, at 19 (CastLike-19)
    it fails to load.
    """
    if body is None:
        return None
    written = next((o.version for o in body.opset_import if o.domain in ("", "ai.onnx")), opset)
    for node in body.node:
        if node.domain not in ("", "ai.onnx"):
            return None
        then = _since(node.op_type, written)
        if then is None or then != _since(node.op_type, opset):
            return None
    return body


@functools.cache
def _since(op_type: str, opset: int) -> int | None:
    try:
        return onnx.defs.get_schema(op_type, opset, "").since_version
    except onnx.defs.SchemaError:
        return None


# What running a body needs of the caller's tensors: None (it does not run), or the
# largest rank every body op accepts (NO_LIMIT: any). Other limits (constant
# inputs, attributes) say nothing about the caller's node: a body op with one
# is taken as not run.
NO_LIMIT = 2**31 - 1
Verdict = int | None


def _inlined_and_run(
    target: Target,
    cpu_kernels: Target,
    schema: onnx.defs.OpSchema,
    opset: int,
    bound: dict[str, str],
) -> Verdict:
    """Whether no kernel claims the op for these types and the target runs its body."""
    inputs = [bound.get(f.type_str) or _fixed(f.type_str) for f in schema.inputs]
    node = onnx.helper.make_node(
        schema.name, [f"in{i}" for i in range(len(inputs))], ["out"], name="caller"
    )
    facts = _facts(node, inputs, opset)
    if _kernel(target, facts) or _kernel(cpu_kernels, facts):
        return None  # a kernel runs it: the node is not inlined (or not ours to list)
    return _runs_all(target, cpu_kernels, _function(schema, opset), inputs, opset, MAX_DEPTH)


def _fixed(type_str: str) -> str | None:
    return short_type(type_str) if type_str.startswith("tensor(") else None


def _kernel(target: Target, facts: NodeFacts) -> OpSupport | None:
    """The target's entry that runs the node (its types; limits on known facts)."""
    if not target.supports(facts.domain, facts.op_type, facts.opset):
        return None
    bound = facts.type_bindings(target.signature(facts.domain, facts.op_type, facts.opset))
    for entry in target.ops.get((facts.domain, facts.op_type), ()):
        if (
            entry.covers(facts.opset)
            and entry.accepts(bound)
            and entry.limits.violation(facts) is None
        ):
            return entry
    return None


def _runs_all(
    target: Target,
    cpu_kernels: Target,
    body: onnx.FunctionProto | None,
    inputs: list[str | None],
    opset: int,
    depth: int,
) -> Verdict:
    if body is None:
        return None
    rank = NO_LIMIT
    for inner, types in _typed_nodes(body, inputs):
        verdict = _runs(target, cpu_kernels, inner, types, opset, depth)
        if verdict is None:
            return None
        rank = min(rank, verdict)
    return rank


def _runs(
    target: Target,
    cpu_kernels: Target,
    node: onnx.NodeProto,
    inputs: list[str | None],
    opset: int,
    depth: int,
) -> Verdict:
    """Whether the target runs this node of a body, by a kernel or by inlining it in turn.

    A node the target has no kernel for but the CPU has goes to the CPU: not run
    by the target (the CPU target is its own ``cpu_kernels``, so there it runs).
    """
    if node.op_type == "Constant":
        return NO_LIMIT  # onnxruntime makes Constant nodes initializers at load
    facts = _facts(node, inputs, opset)
    entry = _kernel(target, facts)
    if entry is not None:
        limits = entry.limits.describe()
        if set(limits) - {"max_rank"}:
            return None
        return limits.get("max_rank", NO_LIMIT)
    if _kernel(cpu_kernels, facts) or depth == 0:
        return None
    schema = onnx.defs.get_schema(node.op_type, opset, node.domain or "")
    body = _expand(schema, node, inputs, opset)
    return _runs_all(target, cpu_kernels, body, inputs, opset, depth - 1)


def _facts(node: onnx.NodeProto, inputs: list[str | None], opset: int) -> NodeFacts:
    attributes = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    return NodeFacts(
        node.domain,
        node.op_type,
        opset,
        [ValueFacts(dtype=t) if t else None for t in inputs],
        [],
        attributes,
    )


def _expand(
    schema: onnx.defs.OpSchema, node: onnx.NodeProto, inputs: list[str | None], opset: int
) -> onnx.FunctionProto | None:
    # onnx's stub leaves out OpSchema's function members (has_function, ...).
    if schema.has_function:  # type: ignore[attr-defined]
        return _function(schema, opset)
    if not schema.has_context_dependent_function or None in inputs:  # type: ignore[attr-defined]
        return None
    types = [
        onnx.helper.make_tensor_type_proto(_elem(t), None).SerializeToString()
        for t in inputs
        if t is not None  # every one: None returned above
    ]
    try:
        raw = schema.get_context_dependent_function_with_opset_version(  # type: ignore[attr-defined]
            opset, node.SerializeToString(), types
        )
    except Exception:  # no body for this node (e.g. an attribute it needs is missing)
        return None
    return _valid_at(onnx.FunctionProto.FromString(raw) if raw else None, opset)


def _elem(dtype: str) -> int:
    return element_types.to_onnx(dtype)


def _typed_nodes(
    body: onnx.FunctionProto, inputs: list[str | None]
) -> list[tuple[onnx.NodeProto, list[str | None]]]:
    """The body's nodes, each with its inputs' element types (onnx's type inference)."""
    graph_inputs = [
        onnx.helper.make_tensor_value_info(name, _elem(t), None)
        for name, t in zip(body.input, inputs)
        if t is not None
    ]
    nodes = [_with_placeholders(n) for n in body.node]
    graph = onnx.helper.make_graph(nodes, "body", graph_inputs, [])
    model = onnx.helper.make_model(graph, opset_imports=list(body.opset_import))
    inferred = onnx.shape_inference.infer_shapes(model).graph
    types = {i.name: dtype_name(i.type.tensor_type.elem_type) for i in graph_inputs}
    for info in inferred.value_info:
        types[info.name] = dtype_name(info.type.tensor_type.elem_type)
    return [(n, [types.get(i) if i else None for i in n.input]) for n in nodes]


_PLACEHOLDERS = {
    onnx.AttributeProto.FLOAT: 1.0,
    onnx.AttributeProto.INT: 1,
    onnx.AttributeProto.STRING: "",
    onnx.AttributeProto.FLOATS: [1.0],
    onnx.AttributeProto.INTS: [1],
}


def _with_placeholders(node: onnx.NodeProto) -> onnx.NodeProto:
    """The node with each reference to a caller attribute replaced by a value of its kind.

    The value never changes which op runs or the element types in a static body
    (Swish's alpha becomes a float Constant either way); an attribute of another
    kind is dropped.
    """
    copy = onnx.NodeProto()
    copy.CopyFrom(node)
    attributes = []
    for attribute in copy.attribute:
        if not attribute.ref_attr_name:
            attributes.append(attribute)
        elif attribute.type in _PLACEHOLDERS:
            value = _PLACEHOLDERS[attribute.type]
            attributes.append(onnx.helper.make_attribute(attribute.name, value))
    del copy.attribute[:]
    copy.attribute.extend(attributes)
    return copy
