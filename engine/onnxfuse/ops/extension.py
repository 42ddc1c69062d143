"""onnxruntime's extension ops: ai.onnx-domain ops the ONNX standard does not define.

onnxruntime registers some ops in the ai.onnx domain at opsets where the
standard has no such op: ``SimplifiedLayerNormalization`` (every opset) and
``LayerNormalization`` before opset 17 (its own contrib schema, version 1).
Its optimizer writes them and older exporters emit them; ``onnx.checker``
rejects them ("No Op registered"). A model may hold them when the chosen
target runs them: the checker then sees a *view* of the model where exactly
those nodes are moved to a private domain, so everything else is still fully
checked. Their schemas (attributes, defaults, optional inputs) come from
onnxruntime's registry; their types and shapes from a standard op with the
same inference function (a *stand-in*).
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Protocol

import onnx
import onnx.defs
import onnx_ir as ir


# Where the checker view puts the extension nodes: a domain no real model uses.
# onnxruntime's schemas are registered there with onnx, so the checker verifies the
# nodes' inputs and attributes and keeps reporting errors after them (onnx stops
# reporting inference errors once it meets an op it has no schema for).
class Target(Protocol):
    """What this module asks of a target: whether it runs an op (targets/ implements it)."""

    def supports(self, domain: str, op_type: str, opset: int) -> bool: ...


PRIVATE_DOMAIN = "onnxfuse.extension"

_AI_ONNX = ("", "ai.onnx")

# Standard ops whose type and shape inference is the extension op's own
# (onnxruntime infers both with LayerNormalization's function: Y like X, the
# statistics of the stash type with the normalized axes kept as 1).
_STAND_INS: dict[str, tuple[str, int]] = {
    "LayerNormalization": ("LayerNormalization", 17),
    "SimplifiedLayerNormalization": ("LayerNormalization", 17),
}


def standard_schema(op_type: str, opset: int) -> onnx.defs.OpSchema | None:
    """The ONNX standard's schema of an ai.onnx op at ``opset``, if it has one."""
    try:
        return onnx.defs.get_schema(op_type, opset, "")
    except onnx.defs.SchemaError:
        return None


@functools.cache
def _extension_versions() -> dict[str, tuple[onnx.defs.OpSchema, ...]]:
    """onnxruntime's ai.onnx schemas at versions the standard does not define, by op."""
    found: dict[str, list[onnx.defs.OpSchema]] = {}
    for schema in _onnxruntime_extension_schemas():
        found.setdefault(schema.name, []).append(_as_onnx_schema(schema))
    return {op: tuple(sorted(v, key=lambda s: s.since_version)) for op, v in found.items()}


@functools.cache
def onnxruntime_schemas() -> tuple[Any, ...]:
    """Every operator schema the installed onnxruntime registers, read once."""
    from onnxruntime.capi import onnxruntime_pybind11_state as state

    return tuple(state.get_all_operator_schema())


@functools.cache
def _onnxruntime_extension_schemas() -> tuple[Any, ...]:
    """onnxruntime's ai.onnx schemas at versions where no standard schema is in force."""
    found = []
    for schema in onnxruntime_schemas():
        if schema.domain not in _AI_ONNX or schema.deprecated:
            continue
        # The standard's own op (onnxruntime registers those too); `has` builds no
        # schema object, unlike standard_schema (0.025 s over onnxruntime's 646).
        if onnx.defs.has(schema.name, schema.since_version, ""):
            continue
        found.append(schema)
    return tuple(found)


@functools.cache
def _register_private(op_type: str) -> bool:
    """Register the op's extension versions in ``PRIVATE_DOMAIN`` with onnx, once."""
    # onnx's reference evaluator builds its op table when first imported and fails once
    # an op name is registered in two domains: import it before the first registration.
    import onnx.reference

    registered = False
    for schema in _onnxruntime_extension_schemas():
        if schema.name != op_type:
            continue
        with contextlib.suppress(onnx.defs.SchemaError):  # already there (a reloaded module)
            onnx.defs.register_schema(_as_onnx_schema(schema, PRIVATE_DOMAIN))
        registered = True
    return registered


def _as_onnx_schema(schema: Any, domain: str = "") -> onnx.defs.OpSchema:
    """onnxruntime's schema object as an ``onnx.defs.OpSchema`` (no inference function)."""
    OpSchema = onnx.defs.OpSchema
    attributes = []
    for name, attr in schema.attributes.items():
        default = onnx.AttributeProto()
        default.ParseFromString(attr._default_value)
        if default.type != onnx.AttributeProto.UNDEFINED:
            default.name = name
            attributes.append(OpSchema.Attribute(name, default, attr.description))
        else:
            # onnx's stub leaves out the int constructor its pybind11 enums have.
            kind = OpSchema.AttrType(int(attr.type))  # type: ignore[call-arg]
            attributes.append(
                OpSchema.Attribute(name, kind, attr.description, required=attr.required)
            )

    def formal(param: Any) -> onnx.defs.OpSchema.FormalParameter:
        return OpSchema.FormalParameter(
            param.name,
            param.typeStr,
            param.description,
            param_option=OpSchema.FormalParameterOption(int(param.option)),  # type: ignore[call-arg]
            is_homogeneous=param.isHomogeneous,
        )

    return OpSchema(
        schema.name,
        domain,
        schema.since_version,
        schema.doc or "",
        inputs=[formal(p) for p in schema.inputs],
        outputs=[formal(p) for p in schema.outputs],
        type_constraints=[
            (t.type_param_str, list(t.allowed_type_strs), t.description)
            for t in schema.type_constraints
        ],
        attributes=attributes,
    )


def extension_versions(op_type: str) -> tuple[onnx.defs.OpSchema, ...]:
    """Every extension version of an ai.onnx op, oldest first (empty for standard-only ops)."""
    return _extension_versions().get(op_type, ())


@functools.cache
def extension_schema(op_type: str, opset: int) -> onnx.defs.OpSchema | None:
    """onnxruntime's schema of an ai.onnx op at an opset where the standard has none."""
    if standard_schema(op_type, opset) is not None:
        return None
    chosen = None
    for schema in extension_versions(op_type):
        if schema.since_version <= opset:
            chosen = schema
    return chosen


def is_extension(domain: str, op_type: str, opset: int) -> bool:
    """An ai.onnx op onnxruntime defines at ``opset`` where the standard does not."""
    return domain in _AI_ONNX and extension_schema(op_type, opset) is not None


def accepted(target: Target | None, domain: str, op_type: str, opset: int) -> bool:
    """Whether a model may hold this ai.onnx node without a standard schema.

    Only where the standard has no schema at ``opset``, and then: with a target,
    if the target runs the op there; without one (no gating), if onnxruntime
    defines it.
    """
    if domain not in _AI_ONNX or standard_schema(op_type, opset) is not None:
        return False
    if target is None:
        return is_extension(domain, op_type, opset)
    return target.supports("", op_type, opset)


def stand_in(op_type: str) -> tuple[onnx.defs.OpSchema, int] | None:
    """The standard schema (and its opset) that infers this extension op's outputs."""
    found = _STAND_INS.get(op_type)
    if found is None:
        return None
    schema = standard_schema(*found)
    return None if schema is None else (schema, found[1])


# -- the checker's view ------------------------------------------------------------------


def checker_view(model: onnx.ModelProto, target: Target | None) -> onnx.ModelProto | None:
    """A copy of ``model`` whose accepted extension nodes are in ``PRIVATE_DOMAIN``.

    None when the model holds no such node (check the model itself). Graphs
    inside If/Loop/Scan and model-local functions are visited too.
    """
    if not _has_accepted(model, target):
        return None
    view = onnx.ModelProto()
    view.CopyFrom(model)
    opset = _ai_onnx_version(view.opset_import)
    if _move_nodes(view.graph.node, opset, target):
        _import_private(view.opset_import, opset)
    for function in view.functions:
        version = _ai_onnx_version(function.opset_import)
        if _move_nodes(function.node, version, target):
            _import_private(function.opset_import, version)
            _import_private(view.opset_import, version)
    return view


def _has_accepted(model: onnx.ModelProto, target: Target | None) -> bool:
    opset = _ai_onnx_version(model.opset_import)
    if any(_accepted_node(n, opset, target) for n in _walk(model.graph.node)):
        return True
    return any(
        _accepted_node(n, _ai_onnx_version(f.opset_import), target)
        for f in model.functions
        for n in _walk(f.node)
    )


def _accepted_node(node: onnx.NodeProto, opset: int | None, target: Target | None) -> bool:
    return opset is not None and accepted(target, node.domain, node.op_type, opset)


def _walk(nodes: object):
    """Nodes and, recursively, the nodes of their graph attributes."""
    for node in nodes:  # type: ignore[attr-defined]
        yield node
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from _walk(attr.g.node)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for graph in attr.graphs:
                    yield from _walk(graph.node)


def _move_nodes(nodes: object, opset: int | None, target: Target | None) -> bool:
    moved = False
    for node in _walk(nodes):
        if not _accepted_node(node, opset, target):
            continue
        assert opset is not None
        node.domain = PRIVATE_DOMAIN
        schema = extension_schema(node.op_type, opset)
        if schema is not None and _register_private(node.op_type):
            # onnxruntime ignores attributes its own schemas do not define (an old
            # exporter's misspelled `epsion`): so does the check.
            kept = [a for a in node.attribute if a.name in schema.attributes]
            del node.attribute[:]
            node.attribute.extend(kept)
        moved = True
    return moved


def _ai_onnx_version(imports: object) -> int | None:
    for entry in imports:  # type: ignore[attr-defined]
        if entry.domain in _AI_ONNX:
            return int(entry.version)
    return None


def _import_private(imports: object, version: int | None) -> None:
    """Import the private domain at the ai.onnx version: onnx then resolves the
    registered extension schemas as onnxruntime does for ai.onnx."""
    if not any(e.domain == PRIVATE_DOMAIN for e in imports):  # type: ignore[attr-defined]
        imports.append(onnx.helper.make_opsetid(PRIVATE_DOMAIN, version or 1))  # type: ignore[attr-defined]


def holds_accepted(model: ir.Model, target: Target | None) -> bool:
    """Whether an in-memory model holds an extension node ``accepted`` for ``target``."""
    opset = model.opset_imports.get("", model.opset_imports.get("ai.onnx"))
    graphs = [(g, opset) for g in (model.graph, *model.graph.subgraphs())]
    for function in model.functions.values():
        version = function.opset_imports.get("", function.opset_imports.get("ai.onnx"))
        graphs.extend((g, version) for g in (function.graph, *function.graph.subgraphs()))
    return any(
        version is not None and accepted(target, node.domain, node.op_type, version)
        for graph, version in graphs
        for node in graph
    )
