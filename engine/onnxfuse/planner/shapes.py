"""Concrete dtype and shape of every main-graph value, with the dims bound."""

from __future__ import annotations

import onnx
import onnx_ir as ir

from onnxfuse.errors import ModelError
from onnxfuse.files.repair import record
from onnxfuse.planner.bindings import (
    Bindings,
    Resolved,
    bind_model,
    dim_name,
    fix_input_values,
    graph_inputs,
    main_values,
    resolve,
)
from onnxfuse.planner.dim_expressions import DimExpression
from onnxfuse.planner.static_shapes import (
    DROPPED_OUTPUT_SHAPES,
    concrete_shape,
    light_clone,
    static_types,
)
from onnxfuse.planner.tensor_info import TensorInfo
from onnxfuse.rewrite.report import Repair
from onnxfuse.support.ir_types import value_name


def infer_tensor_infos(model: ir.Model, bindings: Bindings) -> dict[str, TensorInfo | str]:
    """The dtype and concrete shape of every main-graph value, with ``bindings`` bound.

    Returns, for every value, its TensorInfo or, when it is not fully known, a reason
    (used to name the tensor in the error only if it matters), which names the node
    that makes it. An input not fully bound is an error at once. The caller's model is
    not modified.
    """
    resolved = resolve(model, bindings)
    clone = light_clone(model)
    bind_model(clone, bindings, resolved)
    _check_inputs(model, clone, resolved)
    fix_input_values(clone, bindings.input_values)
    types, rejected = static_types(clone, resolved)
    dropped = clone.meta.get(DROPPED_OUTPUT_SHAPES, ())
    if dropped:
        what = "graph output's declared shape, which the bound input shapes contradict, left out"
        record(
            model, [Repair("output-shape-at-bound-dims", what, tuple(f"'{n}'" for n in dropped))]
        )
    because = f" (onnx shape inference: {rejected})" if rejected else ""
    originals = {value_name(v): v for v in main_values(model.graph)}
    producers = {value_name(o): node for node in model.graph for o in node.outputs if o.name}
    infos: dict[str, TensorInfo | str] = {}
    untyped = onnx.TypeProto()  # a node output inference gave nothing (an op it does not know)
    for name, type_proto in {**dict.fromkeys(producers, untyped), **types}.items():
        info = _info_from_type(type_proto)
        if info is None:
            info = _unknown_dim(name, type_proto, originals.get(name), resolved)
        if isinstance(info, str) and name in producers:
            info = f"made by {_node_text(producers[name])} {info}{because}"
        infos[name] = info
    _add_loop_carried(clone.graph, infos)
    return infos


def _node_text(node: ir.Node) -> str:
    op = node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}.{node.op_type}"
    return f"{op} node {node.name!r}" if node.name else f"an unnamed {op} node"


def _check_inputs(model: ir.Model, clone: ir.Model, resolved: Resolved) -> None:
    """Every input a caller feeds needs a concrete shape before anything is inferred."""
    bound = {value_name(v): v for v in clone.graph.inputs}
    for original in graph_inputs(model):
        name = value_name(original)
        value = bound[name]
        if not isinstance(value.type, ir.TensorType) or value.dtype == ir.DataType.STRING:
            continue  # said by the planner when it lists the input
        if value.shape is None:
            raise ModelError(
                f"input {name!r} has no shape in the model: "
                f"give it with --input-shape {name}=D0,D1,..."
            )
        template = ",".join(
            str(d) if isinstance(d, int) and d >= 0 else f"D{axis}"
            for axis, d in enumerate(value.shape)
        )
        give = f"give its shape with --input-shape {name}={template}"
        for axis, dim in enumerate(value.shape):
            if isinstance(dim, int) and dim >= 0:
                continue
            text = dim_name(original.shape[axis]) if original.shape is not None else None
            if not text:
                raise ModelError(f"input {name!r} has an unnamed dynamic dim (axis {axis}): {give}")
            bind = _bind_hint(resolved.declared[text], resolved)
            raise ModelError(f"input {name!r} {bind}, or {give}")


def _bind_hint(expression: DimExpression, resolved: Resolved) -> str:
    """What to bind for a dim the model names: its unbound names, or the name itself."""
    missing = sorted(expression.names - resolved.dims.keys())
    if expression.is_name or expression.path_like() or not missing:
        text = expression.text
        return f"has unknown dim {text!r}: bind it with --dim {text}=VALUE"
    binds = " ".join(f"--dim {m}=VALUE" for m in missing)
    return (
        f"has dim {expression.text!r} with unbound {', '.join(missing)}: bind "
        f"{'it' if len(missing) == 1 else 'them'} with {binds}"
    )


def _unknown_dim(
    name: str, type_proto: onnx.TypeProto, original: ir.Value | None, resolved: Resolved
) -> str:
    """Why a tensor of known rank is not sized: the first unknown dim and how to fix it."""
    dims = type_proto.tensor_type.shape.dim
    axis = next(i for i, d in enumerate(dims) if not d.HasField("dim_value") or d.dim_value < 0)
    text = None
    if original is not None and original.shape is not None and len(original.shape) == len(dims):
        text = dim_name(original.shape[axis])
    trace = "or measure it with --trace-shapes"
    if text:
        return f"{_bind_hint(resolved.declared[text], resolved)}, {trace}"
    return (
        f"has dim {axis} unknown before the model runs: "
        f"bind it with --dim {name}:{axis}=VALUE, {trace}"
    )


def _add_loop_carried(graph: ir.Graph, infos: dict[str, TensorInfo | str]) -> None:
    """onnx shape inference drops the shapes of a Loop's carried values (they may change
    from one iteration to the next); when the body declares a fixed shape, use it."""
    for node in graph:
        if node.op_type != "Loop" or node.domain not in ("", "ai.onnx"):
            continue
        body_outputs = node.attributes["body"].as_graph().outputs
        n_carried = len(node.inputs) - 2
        for out, declared in zip(node.outputs[:n_carried], body_outputs[1:], strict=False):
            shape = declared.shape
            name = value_name(out)
            if isinstance(infos.get(name), TensorInfo) or declared.dtype is None:
                continue
            if shape is not None and all(isinstance(d, int) for d in shape):
                infos[name] = TensorInfo(declared.dtype, shape.numpy())


def _info_from_type(type_proto: onnx.TypeProto) -> TensorInfo | str | None:
    """The TensorInfo, the reason it has none, or None for a tensor with an unknown dim."""
    kind = type_proto.WhichOneof("value")
    if kind is None:
        return "has no type after shape inference: measure it with --trace-shapes"
    if kind != "tensor_type":
        return f"is a {kind}, not a tensor"
    tensor_type = type_proto.tensor_type
    if not tensor_type.elem_type:
        return "has an unknown element type: measure it with --trace-shapes"
    if tensor_type.elem_type == onnx.TensorProto.STRING:
        return "is a string tensor: its size is not known before it is computed"
    if not tensor_type.HasField("shape"):
        return "has an unknown rank: measure it with --trace-shapes"
    shape = concrete_shape(type_proto)
    if shape is None:
        return None
    return TensorInfo(ir.DataType(tensor_type.elem_type), shape)
