"""Repairs: defects of a model as read that onnxruntime loads and runs through.

Each is mended with one ``Repair`` (rewrite/report.py), which the run's report holds and
the command line prints as a warning. On every load, in the protobuf (``repair_structure``):

- opset imports no node uses are dropped (never the ai.onnx one); a domain imported
  twice is imported once, at the last version imported: the one onnxruntime, onnx's
  checker and onnx_ir all read;
- value_info entries without a type, or with a tensor type without an element type
  (onnxruntime refuses the latter), are dropped;
- unnamed nodes are named, and nodes whose name an earlier node of their graph holds
  are renamed (onnxruntime refuses duplicates).

On every load too, before the checker sees the model (``repair_attributes``):

- a Squeeze of opset 1-10 whose `axes` are not in ascending order gets them sorted: the
  same op (the order means nothing), but onnx's shape inference of that version keeps a
  squeezed dimension when they are unsorted, and would refuse the model, or the
  optimized one once a rewrite makes the input's shape known.

When onnx's checker refuses the model, in the protobuf, then checked again
(``repair_declarations``):

- a graph output without a type or a shape gets the one inferred (the checker requires
  both; onnxruntime takes the values as computed);
- a value_info whose type or shape contradicts what the nodes compute is replaced by
  the inferred one, and one that contradicts its constant's tensor (an initializer's, a
  Constant node's) is dropped: the tensor is the value;
- a graph output's declared shape that inference contradicts is replaced by the
  inferred one: onnxruntime returns the computed shape whatever was declared, so a
  caller sees no other tensor, only the declaration corrected.

After optimizing (``repair_computed_outputs``), a graph output whose declared shape
contradicts what its producer now computes (folding makes a shape computation
constant) likewise gets the computed shape.

Refused instead (ModelError), as onnxruntime refuses them or as no repair has a single
meaning: a graph output declared with another element type than it computes (a caller
would get another type; onnxruntime refuses it); a graph input, or a graph output whose
shape inference cannot find, without a shape (the checker requires one, and nothing it
accepts says "any rank"); and everything else the checker finds.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import onnx
import onnx_ir as ir

from onnxfuse.errors import ModelError
from onnxfuse.ops import extension as extension_ops
from onnxfuse.ops import schemas
from onnxfuse.ops.inference import infer_node, infer_shapes
from onnxfuse.rewrite.report import REPAIRS_META, Repair

_AI_ONNX = ("", "ai.onnx")


def record(model: ir.Model, repairs: list[Repair]) -> None:
    """Keep ``repairs`` with the model for the run's report (each once: a step that
    runs twice on a model finds the same ones again)."""
    kept = list(model.meta.get(REPAIRS_META, ()))
    kept += [repair for repair in repairs if repair not in kept]
    if kept:
        model.meta[REPAIRS_META] = kept


# -- every load ---------------------------------------------------------------------------


def repair_structure(proto: onnx.ModelProto) -> list[Repair]:
    """Opset imports, empty value_info entries and node names, mended in ``proto``."""
    repairs = _repair_opsets(proto)
    repairs += _drop_untyped_value_info(proto.graph)
    repairs += _name_nodes(proto.graph)
    return repairs


def _repair_opsets(proto: onnx.ModelProto) -> list[Repair]:
    versions: dict[str, list[int]] = {}
    for opset in proto.opset_import:
        versions.setdefault(opset.domain, []).append(opset.version)
    used = _used_domains(proto)
    twice = sorted(d for d, found in versions.items() if len(found) > 1)
    unused = sorted(d for d in versions if d not in used and d not in _AI_ONNX)
    if not twice and not unused:
        return []
    # The last import of a domain is kept: onnxruntime, onnx's checker and onnx_ir all
    # run the model's nodes at it.
    kept = {opset.domain: opset for opset in proto.opset_import if opset.domain not in unused}
    del proto.opset_import[:]
    proto.opset_import.extend(kept.values())
    repairs = []
    merged = [d for d in twice if len(set(versions[d])) == 1]
    if merged:
        places = tuple(f"'{d}' version {versions[d][0]}" for d in merged)
        repairs.append(Repair("duplicate-opset", "opset imported twice, kept once", places))
    differing = [d for d in twice if len(set(versions[d])) > 1]
    if differing:
        places = tuple(
            f"'{d}' versions {', '.join(map(str, versions[d]))}: {versions[d][-1]}"
            for d in differing
        )
        what = "opset imported at two versions, the last kept (as onnxruntime runs it)"
        repairs.append(Repair("conflicting-opset", what, places))
    if unused:
        places = tuple(f"'{d}'" for d in unused)
        repairs.append(Repair("unused-opset", "unused opset import dropped", places))
    return repairs


def _used_domains(proto: onnx.ModelProto) -> set[str]:
    used = {function.domain for function in proto.functions}
    for function in proto.functions:
        used.update(node.domain for node in _walk_nodes(function.node))
    used.update(node.domain for node in _walk_nodes(proto.graph.node))
    return used


def _walk_nodes(nodes: Iterable[onnx.NodeProto]) -> Iterator[onnx.NodeProto]:
    """Every node of ``nodes`` and of the graphs inside them."""
    pending = [list(nodes)]
    while pending:
        for node in pending.pop():
            yield node
            for attr in node.attribute:
                for graph in (attr.g,) if attr.HasField("g") else attr.graphs:
                    pending.append(list(graph.node))


def _graphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    """``graph`` and every graph inside its nodes."""
    pending = [graph]
    while pending:
        current = pending.pop()
        yield current
        for node in current.node:
            for attr in node.attribute:
                pending.extend((attr.g,) if attr.HasField("g") else attr.graphs)


def _drop_untyped_value_info(graph: onnx.GraphProto) -> list[Repair]:
    dropped: list[str] = []
    for current in _graphs(graph):
        kept = [info for info in current.value_info if _typed(info)]
        if len(kept) < len(current.value_info):
            dropped += [f"'{i.name}'" for i in current.value_info if not _typed(i)]
            del current.value_info[:]
            current.value_info.extend(kept)
    if not dropped:
        return []
    return [Repair("untyped-value-info", "value_info without a type dropped", tuple(dropped))]


def _typed(info: onnx.ValueInfoProto) -> bool:
    kind = info.type.WhichOneof("value") if info.HasField("type") else None
    return kind is not None and (kind != "tensor_type" or info.type.tensor_type.elem_type != 0)


def _name_nodes(graph: onnx.GraphProto) -> list[Repair]:
    """Unnamed nodes named by their first output (as Netron shows them; ``<op>_<n>``
    without one, or ``<output>_<n>`` if taken); in each graph, a node whose name an
    earlier node holds renamed ``<name>_<n>`` (onnxruntime requires them unique per
    graph)."""
    taken = {node.name for node in _walk_nodes(graph.node) if node.name}
    counters: dict[str, int] = {}

    def fresh(base: str) -> str:
        counter = counters.get(base, 0)
        while f"{base}_{counter}" in taken:
            counter += 1
        counters[base] = counter + 1
        name = f"{base}_{counter}"
        taken.add(name)
        return name

    named: list[str] = []
    renamed: list[str] = []
    for current in _graphs(graph):
        seen: set[str] = set()
        for node in current.node:
            if not node.name:
                output = next((name for name in node.output if name), None)
                if output is not None and output not in taken:
                    taken.add(output)
                    node.name = output
                else:
                    node.name = fresh(output or node.op_type or "node")
                named.append(f"'{node.name}'")
            elif node.name in seen:
                old, node.name = node.name, fresh(node.name)
                renamed.append(f"'{old}' -> '{node.name}'")
            seen.add(node.name)
    repairs = []
    if named:
        repairs.append(Repair("unnamed-node", "unnamed node named", tuple(named)))
    if renamed:
        repairs.append(Repair("duplicate-node-name", "duplicate node name renamed", tuple(renamed)))
    return repairs


def repair_attributes(proto: onnx.ModelProto) -> list[Repair]:
    """Node attributes onnx's inference misreads, rewritten as the same op in ``proto``."""
    return _sort_squeeze_axes(proto)


def _sort_squeeze_axes(proto: onnx.ModelProto) -> list[Repair]:
    version = next((o.version for o in proto.opset_import if o.domain in _AI_ONNX), None)
    if version is None or version >= 11:
        return []
    sorted_in: list[str] = []
    for node in _walk_nodes(proto.graph.node):
        if node.op_type != "Squeeze" or node.domain not in _AI_ONNX:
            continue
        for attr in node.attribute:
            if attr.name == "axes" and list(attr.ints) != sorted(attr.ints):
                attr.ints[:] = sorted(attr.ints)
                sorted_in.append(f"'{node.name}'")
    if not sorted_in:
        return []
    what = "Squeeze axes sorted (onnx's Squeeze-1 inference misreads unsorted ones)"
    return [Repair("unsorted-squeeze-axes", what, tuple(sorted_in))]


# -- when the checker refuses the model ------------------------------------------------------


def repair_declarations(proto: onnx.ModelProto) -> list[Repair]:
    """The main graph's declared types mended where inference (or an initializer's
    tensor) contradicts them, or the checker finds none on a graph output. Raises
    ModelError for a graph output whose repair a caller would see (module docstring)."""
    graph = proto.graph
    for value in graph.input:
        if value.type.WhichOneof("value") == "tensor_type" and not _has_shape(value.type):
            raise ModelError(
                f"graph input '{value.name}' declares no shape: onnx's checker requires one, "
                "and its rank is the model's to say"
            )
    computed = _computed_types(proto)
    tensors = {t.name: _tensor_type(t) for t in graph.initializer}
    for node in graph.node:  # a Constant's output is its tensor, as inferred
        if node.op_type == "Constant" and node.domain in _AI_ONNX and node.output[0] in computed:
            tensors.setdefault(node.output[0], computed[node.output[0]])
    inputs = {value.name for value in graph.input}
    repairs: list[Repair] = []
    kept: list[onnx.ValueInfoProto] = []
    contradicted: list[str] = []
    by_tensor: list[str] = []
    for info in graph.value_info:
        if info.name in inputs:  # a graph input's declaration is its own
            kept.append(info)
        elif info.name in tensors:
            if _contradicts(info.type, tensors[info.name]):
                by_tensor.append(_change(info.name, info.type, tensors[info.name]))
            else:
                kept.append(info)
        elif info.name in computed and _contradicts(info.type, computed[info.name]):
            contradicted.append(_change(info.name, info.type, computed[info.name]))
            replaced = onnx.ValueInfoProto(name=info.name, doc_string=info.doc_string)
            replaced.type.CopyFrom(computed[info.name])
            kept.append(replaced)
        else:
            kept.append(info)
    del graph.value_info[:]
    graph.value_info.extend(kept)
    if by_tensor:
        what = "value_info contradicting its constant's tensor dropped (the tensor wins)"
        repairs.append(Repair("declared-vs-tensor", what, tuple(by_tensor)))
    if contradicted:
        what = "value_info contradicting inference replaced (the inferred type wins)"
        repairs.append(Repair("declared-vs-inferred", what, tuple(contradicted)))
    repairs += _repair_outputs(graph, {**computed, **tensors})
    return repairs


def _repair_outputs(graph: onnx.GraphProto, computed: dict[str, onnx.TypeProto]) -> list[Repair]:
    filled: list[str] = []
    reshaped: list[str] = []
    for output in graph.output:
        found = computed.get(output.name)
        declared = output.type
        if not _typed(output) or not _has_shape(declared):
            if declared.WhichOneof("value") not in (None, "tensor_type"):
                continue  # a sequence or map: the checker requires no shape of it
            if found is None or not _has_shape(found):
                raise ModelError(
                    f"graph output '{output.name}' declares no "
                    f"{'shape' if _typed(output) else 'type'} and inference finds none: "
                    "onnx's checker requires one"
                )
            if _typed(output) and _contradicts(declared, found):
                raise _type_changed(output.name, declared, found)
            filled.append(_change(output.name, declared, found))
            output.type.CopyFrom(found)
        elif found is not None and _contradicts(declared, found):
            if declared.tensor_type.elem_type != found.tensor_type.elem_type:
                raise _type_changed(output.name, declared, found)
            reshaped.append(_change(output.name, declared, found))
            output.type.tensor_type.shape.CopyFrom(found.tensor_type.shape)
    repairs = []
    if filled:
        what = "graph output without a type or shape given the inferred one"
        repairs.append(Repair("output-undeclared", what, tuple(filled)))
    if reshaped:
        repairs.append(Repair("output-shape", _OUTPUT_SHAPE, tuple(reshaped)))
    return repairs


# onnxruntime returns an output at its computed shape whatever the declaration says: the
# caller sees the same tensor, only its declaration corrected.
_OUTPUT_SHAPE = "graph output's shape contradicting inference replaced (the inferred one wins)"


def _type_changed(name: str, declared: onnx.TypeProto, found: onnx.TypeProto) -> ModelError:
    return ModelError(
        f"graph output '{name}' is declared {_describe(declared)} but computes "
        f"{_describe(found)}: a caller would get another element type (onnxruntime "
        "refuses it too)"
    )


def _computed_types(proto: onnx.ModelProto) -> dict[str, onnx.TypeProto]:
    """What inference finds for the main graph's values with no declaration to go by:
    only the outputs of nodes onnxfuse cannot infer (another domain's ops, functions)
    keep theirs, as the checker would go by those."""
    probe = onnx.ModelProto(ir_version=proto.ir_version)  # without the weights' data
    probe.opset_import.extend(proto.opset_import)
    probe.functions.extend(proto.functions)
    graph = probe.graph
    graph.name = proto.graph.name
    graph.node.extend(proto.graph.node)
    graph.input.extend(proto.graph.input)
    graph.initializer.extend(_typed_like(t) for t in proto.graph.initializer)
    opsets = {o.domain: o.version for o in proto.opset_import}
    opaque = {
        output
        for node in proto.graph.node
        if not _inferable(node, opsets)
        for output in node.output
    }
    graph.value_info.extend(v for v in proto.graph.value_info if v.name in opaque)
    graph.output.extend(
        o if o.name in opaque else onnx.ValueInfoProto(name=o.name) for o in proto.graph.output
    )
    try:
        model = ir.from_proto(probe)
    except Exception:  # onnx_ir raises many types on malformed graphs: the checker says why
        return {}
    infer_shapes(model)
    found: dict[str, onnx.TypeProto] = {}
    for node in model.graph:
        for value in node.outputs:
            if value.name and value.type is not None:
                found[value.name] = _type_proto(value)
    return found


def _has_shape(type_proto: onnx.TypeProto) -> bool:
    return type_proto.tensor_type.HasField("shape")


def _inferable(node: onnx.NodeProto, opsets: dict[str, int]) -> bool:
    if node.domain in _AI_ONNX:
        opset = opsets.get("", opsets.get("ai.onnx", 1))
        return schemas.get_schema("", node.op_type, opset) is not None or (
            extension_ops.is_extension("", node.op_type, opset)
        )
    return schemas.get_schema(node.domain, node.op_type, opsets.get(node.domain, 1)) is not None


def _typed_like(tensor: onnx.TensorProto) -> onnx.TensorProto:
    """``tensor``'s name, type and shape; its data only if small (inference reads the
    data of shape inputs, one element per dimension)."""
    if _elements(tensor) <= 64:
        return tensor
    stub = onnx.TensorProto(name=tensor.name, data_type=tensor.data_type, dims=tensor.dims)
    entry = stub.external_data.add()
    entry.key, entry.value = "location", "onnxfuse-repair-probe"
    stub.data_location = onnx.TensorProto.EXTERNAL
    return stub


def _elements(tensor: onnx.TensorProto) -> int:
    count = 1
    for dim in tensor.dims:
        count *= dim
    return count


def _tensor_type(tensor: onnx.TensorProto) -> onnx.TypeProto:
    return onnx.helper.make_tensor_type_proto(tensor.data_type, list(tensor.dims))


def _type_proto(value: ir.Value) -> onnx.TypeProto:
    found = onnx.TypeProto()
    assert value.type is not None
    ir.serde.serialize_type_into(found, value.type)
    if value.shape is not None and found.HasField("tensor_type"):
        ir.serde.serialize_shape_into(found, value.shape)
    return found


def _contradicts(declared: onnx.TypeProto, found: onnx.TypeProto) -> bool:
    """Whether a declared tensor type says what ``found`` rules out: another element type,
    rank, or fixed size of a dimension. Symbolic and unknown dimensions agree with any."""
    if declared.WhichOneof("value") != "tensor_type" or found.WhichOneof("value") != "tensor_type":
        return False
    left, right = declared.tensor_type, found.tensor_type
    if left.elem_type and right.elem_type and left.elem_type != right.elem_type:
        return True
    if not left.HasField("shape") or not right.HasField("shape"):
        return False
    if len(left.shape.dim) != len(right.shape.dim):
        return True
    return any(
        a.HasField("dim_value") and b.HasField("dim_value") and a.dim_value != b.dim_value
        for a, b in zip(left.shape.dim, right.shape.dim)
    )


def _change(name: str, declared: onnx.TypeProto, found: onnx.TypeProto) -> str:
    return f"'{name}' {_describe(declared)} -> {_describe(found)}"


def _describe(type_proto: onnx.TypeProto) -> str:
    """``float[1,N,?]``; ``float`` without a shape, ``?`` without a type."""
    if type_proto.WhichOneof("value") != "tensor_type":
        return "?" if type_proto.WhichOneof("value") is None else type_proto.WhichOneof("value")
    tensor = type_proto.tensor_type
    name = onnx.helper.tensor_dtype_to_string(tensor.elem_type) if tensor.elem_type else "?"
    name = name.removeprefix("TensorProto.").lower()
    if not tensor.HasField("shape"):
        return name
    dims_of = tensor.shape.dim
    dims = [str(d.dim_value) if d.HasField("dim_value") else d.dim_param or "?" for d in dims_of]
    return f"{name}[{','.join(dims)}]"


# -- after optimizing ------------------------------------------------------------------------


def repair_computed_outputs(model: ir.Model) -> list[Repair]:
    """Graph outputs whose declared shape contradicts what their producers compute now
    (shape computations folded to constants show it) get the computed shape."""
    opsets = dict(model.opset_imports)
    reshaped: list[str] = []
    for output in model.graph.outputs:
        node = output.producer()
        if node is None or output.type is None or output.shape is None:
            continue
        declared, computed = _type_proto(output), _computed_by(node, output, opsets)
        if computed is None or not _contradicts(declared, computed):
            continue
        name = output.name or ""
        if declared.tensor_type.elem_type != computed.tensor_type.elem_type:
            raise _type_changed(name, declared, computed)
        reshaped.append(_change(name, declared, computed))
        output.shape = ir.serde.deserialize_type_proto_for_shape(computed)
    return [Repair("output-shape", _OUTPUT_SHAPE, tuple(reshaped))] if reshaped else []


def _computed_by(node: ir.Node, output: ir.Value, opsets: dict[str, int]) -> onnx.TypeProto | None:
    """The type of ``output`` as ``node`` computes it, inferred afresh; None if unknown."""
    saved = [(value, value.type, value.shape) for value in node.outputs]
    try:
        for value in node.outputs:
            value.type, value.shape = None, None
        domain = "" if node.domain in _AI_ONNX else node.domain
        infer_node(node, opsets.get(domain, opsets.get("ai.onnx", 1)))
        computed = None if output.shape is None else _type_proto(output)
    finally:
        for value, value_type, shape in saved:
            value.type, value.shape = value_type, shape
    return computed
