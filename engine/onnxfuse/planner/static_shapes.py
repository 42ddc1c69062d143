"""The shapes static analysis can give once the input shapes are concrete.

Three sources, in this order, each used only where the ones before left a dim unknown:

1. onnx shape inference (strict, with data propagation): the standard's own rules,
   fast, and it rejects a model whose declared shapes contradict it. Its data
   propagation follows few ops, so a shape computed at run time from ``Shape`` (a
   Reshape to ``Concat(Shape(x)[0], ReduceProd(Shape(x)[1:]))``, a Range to a length,
   a Pad by computed pads) comes out unknown (``unk__N``) even when every input shape
   is known.
2. Shape computations folded: with concrete input shapes, ``Shape``/``Size`` of a
   sized tensor is a constant, and so is every small deterministic node that reads
   only constants, and an If whose condition is one takes its branch; such nodes are
   evaluated (one-node onnxruntime sessions) and become initializers, and inference
   runs again, until nothing more folds.
3. onnxruntime's SymbolicShapeInference, for what is still unknown: it knows
   onnxruntime's contrib ops (``com.microsoft``), which onnx inference skips. It is not
   the first choice: it stops with an assertion on models it does not expect, and with
   ``auto_merge`` and ``guess_output_rank`` it guesses, so it only fills gaps, and a
   shape it gives must agree with every dim onnx inference fixed.
4. The contrib ops neither of them infers (``RECURRENT_CONTRIB_OPS``: an LSTM whose
   weights are int8), sized like the standard op they quantize: from the input's shape
   and the op's attributes.

Measured on the 62 torch exports of the test set (BERT, GPT-2, T5, Llama, ViT and CNNs
by the legacy and dynamo exporters) and 10 silero-vad and PP-OCR models, with only the
input dims bound: onnx inference alone leaves 2 to 140 tensors unsized in 26 of them
(the 19 legacy transformer exports and 7 of the 10 others); with folding, none is left.
SymbolicShapeInference alone sizes every model it runs on, but stops with an assertion
on 4 of the 10 (a Concat of shapes on an axis other than 0, a Conv after a Pad by
computed pads).

What is left depends on values known only when the model runs (NonZero, a Loop's
scan outputs, an If on an input's value whose branches differ): the caller binds it
or traces it.
"""

from __future__ import annotations

import contextlib
import logging
import math
import re
from collections.abc import Iterator, Mapping

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort

from onnxfuse.errors import ModelError
from onnxfuse.planner.bindings import Resolved, main_values, with_axes
from onnxfuse.planner.dim_expressions import parse_dim
from onnxfuse.planner.lifetimes import NONDETERMINISTIC
from onnxfuse.support.ir_types import tensor_shape, value_name

# Initializers and folded values up to this size are what shape computations read
# (shapes, axes, indices); bigger ones are passed to inference as typed inputs without
# their data and never folded.
SMALL_BYTES = 1024

Types = dict[str, onnx.TypeProto]

# The graph outputs whose declared shapes inference contradicted: ``clone.meta`` key.
DROPPED_OUTPUT_SHAPES = "onnxfuse.planner.dropped_output_shapes"


def light_clone(model: ir.Model) -> ir.Model:
    """A copy of ``model`` whose big initializers are typed graph inputs without data:
    inference reads their shapes only, and serializing it each round stays cheap."""
    clone = model.clone()
    graph = clone.graph
    for name, value in list(graph.initializers.items()):
        tensor = value.const_value
        if tensor is None or isinstance(tensor, ir.ExternalTensor) or tensor.nbytes > SMALL_BYTES:
            if tensor is not None:
                value.dtype, value.shape = tensor.dtype, tensor_shape(tensor)
            if value not in graph.inputs:
                graph.inputs.append(value)
            graph.initializers.pop(name)
    return clone


def static_types(clone: ir.Model, resolved: Resolved) -> tuple[Types, str | None]:
    """The type of every main-graph value of ``clone`` (a light clone with the bindings
    written in), from the sources above, and what strict onnx inference rejects in the
    end, if anything (the likely reason a tensor stays unsized). ``clone`` gains the
    folded constants."""
    types, error = _fold_to_fixpoint(clone, resolved)
    if not all(is_sized(types.get(name)) for name in _main_names(clone)):
        symbolic = _symbolic_shapes(clone)
        if symbolic and _adopt(clone, types, symbolic, resolved):
            types, error = _fold_to_fixpoint(clone, resolved)
    while _size_recurrent_contrib_ops(clone, types):
        types, error = _fold_to_fixpoint(clone, resolved)
    return types, error


# com.microsoft ops that onnx inference skips and SymbolicShapeInference has no rule for,
# whose outputs are a standard LSTM's: Y [seq, directions, batch, hidden], Y_h and Y_c
# [directions, batch, hidden], in X's element type (X = [seq, batch, input]).
RECURRENT_CONTRIB_OPS = frozenset({"DynamicQuantizeLSTM"})


def _size_recurrent_contrib_ops(clone: ir.Model, types: Types) -> bool:
    """Give the unsized outputs of RECURRENT_CONTRIB_OPS nodes their shapes, where X is
    sized and the node has its hidden_size; whether any was given."""
    sized = False
    for node in clone.graph:
        if node.domain != "com.microsoft" or node.op_type not in RECURRENT_CONTRIB_OPS:
            continue
        x = _shape_of(node.inputs[0], types)
        found = types.get(value_name(node.inputs[0])) if node.inputs[0] is not None else None
        if x is None or len(x) != 3 or found is None:
            continue
        hidden = node.attributes.get_int("hidden_size", None)
        if hidden is None:  # onnxruntime's kernel requires it
            continue
        bidirectional = node.attributes.get_string("direction", "forward") == "bidirectional"
        directions = 2 if bidirectional else 1
        seq, batch, _ = x
        shapes = [(seq, directions, batch, hidden), (directions, batch, hidden)]
        for output, shape in zip(node.outputs, [shapes[0], shapes[1], shapes[1]]):
            if not output.name or is_sized(types.get(output.name)):
                continue
            _set_shape(output, found, ir.Shape(shape))
            sized = True
    return sized


def concrete_shape(type_proto: onnx.TypeProto | None) -> tuple[int, ...] | None:
    """The shape of a tensor type if every dim is a known, non-negative number."""
    if type_proto is None or not type_proto.HasField("tensor_type"):
        return None
    tensor_type = type_proto.tensor_type
    if not tensor_type.HasField("shape"):
        return None
    dims = tensor_type.shape.dim
    if all(d.HasField("dim_value") and d.dim_value >= 0 for d in dims):
        return tuple(d.dim_value for d in dims)
    return None


def is_sized(type_proto: onnx.TypeProto | None) -> bool:
    """A tensor of known element type and concrete shape."""
    shape = concrete_shape(type_proto)
    return shape is not None and type_proto is not None and bool(type_proto.tensor_type.elem_type)


def _fold_to_fixpoint(clone: ir.Model, resolved: Resolved) -> tuple[Types, str | None]:
    unfoldable: set[ir.Node] = set()  # tried: onnxruntime cannot run it, or it is big
    while True:
        types, error = _infer(clone)
        changed = _apply_axes(clone, types, resolved.axes)
        if not changed and all(is_sized(types.get(name)) for name in _main_names(clone)):
            return types, error  # the common case: one round of inference, nothing to fold
        if not _fold(clone, types, unfoldable) and not changed:
            return types, error


def _infer(clone: ir.Model) -> tuple[Types, str | None]:
    """Types from onnx inference, and what strict inference rejected in an If's branch.

    Strict inference rejects a branch that will never run once its shapes are
    concrete (torch's legacy "squeeze if that dim is 1" If); that If folds in a
    later round, so such a rejection matters only if it stays and leaves a tensor
    unsized, and until then the lenient result is used. Any other rejection is an
    error. The graph outputs' declared shapes are left out of inference and
    reconciled with what it computes (``_reconcile_outputs``).
    """
    proto = ir.serde.serialize_model(clone)
    declared = _strip_output_shapes(proto)
    error = None
    try:
        inferred = onnx.shape_inference.infer_shapes(proto, strict_mode=True, data_prop=True)
    except (onnx.shape_inference.InferenceError, onnx.checker.ValidationError) as exc:
        error = str(exc).strip().splitlines()[0][:300]
        # onnx names the node that failed, the outermost first: "(op_type:If, node name: n)"
        failed = re.search(r"\(op_type:(\w+), node name: ([^)]*)\)", error)
        if failed is None or failed.group(1) != "If":
            raise ModelError(f"shape inference failed: {error}") from None
        inferred = onnx.shape_inference.infer_shapes(proto, data_prop=True)
    types: Types = {}
    _collect_types(inferred.graph, types, set())
    _reconcile_outputs(clone, types, declared)
    return types, error


def _strip_output_shapes(proto: onnx.ModelProto) -> dict[str, onnx.TensorShapeProto]:
    """The graph outputs' declared shapes, taken off ``proto``: inference then gives the
    shapes it computes, where onnx would keep a declared [1, seqlen] over a computed
    [16, 1, 8210] without a word."""
    declared: dict[str, onnx.TensorShapeProto] = {}
    for output in proto.graph.output:
        tensor = output.type.tensor_type
        if output.type.HasField("tensor_type") and tensor.HasField("shape"):
            declared[output.name] = onnx.TensorShapeProto()
            declared[output.name].CopyFrom(tensor.shape)
            tensor.ClearField("shape")
    return declared


def _reconcile_outputs(
    clone: ir.Model, types: Types, declared: Mapping[str, onnx.TensorShapeProto]
) -> None:
    """Each graph output's shape: the computed one, its unknown dims filled in from the
    declared shape; the declared one where inference computed none. A declared shape the
    computed one contradicts is dropped (onnxruntime returns the computed shape whatever
    is declared: an export's declaration written for other inputs), and the output is
    listed under DROPPED_OUTPUT_SHAPES in ``clone.meta``."""
    for name, shape in declared.items():
        found = types.get(name)
        if found is None or not found.HasField("tensor_type"):
            continue
        tensor = found.tensor_type
        if not tensor.HasField("shape"):
            tensor.shape.CopyFrom(shape)
            continue
        computed = tensor.shape.dim
        if len(computed) != len(shape.dim) or any(
            c.HasField("dim_value") and d.HasField("dim_value") and c.dim_value != d.dim_value
            for c, d in zip(computed, shape.dim)
        ):
            dropped = clone.meta.get(DROPPED_OUTPUT_SHAPES, [])
            clone.meta[DROPPED_OUTPUT_SHAPES] = [*dropped, *([name] if name not in dropped else [])]
            continue
        for c, d in zip(computed, shape.dim):
            if not c.HasField("dim_value"):
                c.CopyFrom(d)


def _main_names(clone: ir.Model) -> list[str]:
    # An optional output a node does not produce is a value without a name.
    return [v.name for v in main_values(clone.graph) if v.name]


def _collect_types(graph: onnx.GraphProto, types: Types, ambiguous: set[str]) -> None:
    """The types of the graph's values and, for folding there, of its If branches'
    (a name two branches both define is left out: which one a Shape reads is unclear)."""
    found = [(vi.name, vi.type) for vi in (*graph.input, *graph.value_info, *graph.output)]
    found += [
        (init.name, onnx.helper.make_tensor_type_proto(init.data_type, list(init.dims)))
        for init in graph.initializer
    ]
    for name, type_proto in found:
        if (name in types and types[name] != type_proto) or name in ambiguous:
            ambiguous.add(name)
            types.pop(name, None)
        else:
            types[name] = type_proto
    for node in graph.node:
        if node.op_type == "If" and node.domain in ("", "ai.onnx"):
            for attr in node.attribute:
                _collect_types(attr.g, types, ambiguous)


def _apply_axes(clone: ir.Model, types: Types, axes: Mapping[str, Mapping[int, int]]) -> bool:
    """Bind ``--dim TENSOR:AXIS`` once inference knows the tensor's rank."""
    changed = False
    for value in main_values(clone.graph):
        bound = axes.get(value_name(value))
        found = types.get(value_name(value))
        if not bound or found is None or not found.tensor_type.HasField("shape"):
            continue
        dims = [
            d.dim_value if d.HasField("dim_value") else ir.SymbolicDim(None)
            for d in found.tensor_type.shape.dim
        ]
        shape = with_axes(value_name(value), ir.Shape(dims), bound)
        if value.shape != shape:
            _set_shape(value, found, shape)
            changed = True
    return changed


def _set_shape(value: ir.Value, found: onnx.TypeProto | None, shape: ir.Shape) -> None:
    """Fix a value's shape for the next round; its element type too, without which onnx_ir
    does not write the shape out."""
    if value.dtype is None and found is not None and found.tensor_type.elem_type:
        value.dtype = ir.DataType(found.tensor_type.elem_type)
    value.shape = shape


def _fold(clone: ir.Model, types: Types, unfoldable: set[ir.Node]) -> bool:
    """Turn the nodes that compute small values from constants into initializers, and an
    If whose condition is now constant into the branch it takes."""
    return _fold_graph(clone, clone.graph, {}, types, unfoldable)


def _fold_graph(
    clone: ir.Model,
    graph: ir.Graph,
    known: dict[ir.Value, np.ndarray],
    types: Types,
    unfoldable: set[ir.Node],
) -> bool:
    """Fold in ``graph`` and in the branches of its Ifs (run once, unlike a Loop's body,
    so a Shape there is as constant as in the main graph)."""
    known.update(
        (v, v.const_value.numpy())
        for v in graph.initializers.values()
        if v.const_value is not None and not v.is_graph_input()
    )
    folded, changed = [], False
    for node in list(graph):
        if node.op_type == "If" and node.domain in ("", "ai.onnx"):
            condition = node.inputs[0]
            if condition is not None and condition in known:
                _inline_if(graph, node, bool(known[condition]))
                changed = True
            else:
                for branch in node.attributes.values():
                    changed |= _fold_graph(clone, branch.as_graph(), known, types, unfoldable)
            continue
        if node in unfoldable or not _foldable(node, known, types):
            continue
        outputs = _evaluate(clone, node, known, types)
        if outputs is None:
            unfoldable.add(node)
            continue
        folded.append(node)
        known.update(zip(node.outputs, outputs, strict=True))
    for node in folded:
        for value in node.outputs:
            array = known.pop(value)
            constant = ir.Value(
                name=value.name,
                shape=ir.Shape(array.shape),
                type=ir.TensorType(ir.DataType.from_numpy(array.dtype)),
                const_value=ir.tensor(array, name=value.name),
            )
            value.replace_all_uses_with(constant, replace_graph_outputs=True)
            value.name = None  # the name is the constant's now
            graph.register_initializer(constant)
            known[constant] = array
        graph.remove(node, safe=True)
    return changed or bool(folded)


def _inline_if(graph: ir.Graph, node: ir.Node, condition: bool) -> None:
    """Replace ``node`` by the nodes of the branch it takes; its outputs keep their names
    (an Identity of each branch output), so their shapes are found under them."""
    branch = node.attributes["then_branch" if condition else "else_branch"].as_graph()
    moved = list(branch)
    branch.remove(moved)
    graph.insert_before(node, moved)
    for value in list(branch.initializers.values()):
        branch.initializers.pop(value_name(value))
        graph.register_initializer(value)
    for out, result in zip(node.outputs, branch.outputs, strict=True):
        identity = ir.Node("", "Identity", [result])
        graph.insert_before(node, identity)
        renamed = identity.outputs[0]
        name = out.name
        out.replace_all_uses_with(renamed, replace_graph_outputs=True)
        out.name = None
        renamed.name = name
    graph.remove(node, safe=True)


def _foldable(node: ir.Node, known: Mapping[ir.Value, np.ndarray], types: Types) -> bool:
    """A Shape or Size of a sized tensor, or a deterministic node without bodies that
    reads small known values only and whose outputs are not known to be big."""
    if node.domain not in ("", "ai.onnx") or node.op_type in NONDETERMINISTIC:
        return False
    if not all(o.name for o in node.outputs) or any(
        a.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS)
        for a in node.attributes.values()
    ):
        return False
    if node.op_type in ("Shape", "Size"):
        return node.inputs[0] is not None and _shape_of(node.inputs[0], types) is not None
    inputs = [v for v in node.inputs if v is not None]
    return all(v in known and known[v].nbytes <= SMALL_BYTES for v in inputs) and all(
        _nbytes(types.get(value_name(o))) <= SMALL_BYTES for o in node.outputs
    )


def _evaluate(
    clone: ir.Model, node: ir.Node, known: Mapping[ir.Value, np.ndarray], types: Types
) -> list[np.ndarray] | None:
    """The outputs of a foldable node, or None if it cannot be computed or is big."""
    if node.op_type in ("Shape", "Size"):
        shape = _shape_of(node.inputs[0], types)
        assert shape is not None, "only a Shape or Size of a sized tensor folds"
        if node.op_type == "Size":
            return [np.array(math.prod(shape), np.int64)]
        start, end = node.attributes.get_int("start", 0), node.attributes.get_int("end", None)
        return [np.array(shape[start:end], np.int64)]
    results = _run_node(clone, node, known)
    if results is None or any(r.nbytes > SMALL_BYTES for r in results):
        return None
    return results


def _shape_of(value: ir.Value | None, types: Types) -> tuple[int, ...] | None:
    return None if value is None else concrete_shape(types.get(value_name(value)))


def _nbytes(type_proto: onnx.TypeProto | None) -> int:
    """Bytes of a tensor type whose shape is known; 0 when it is not (run it and see)."""
    shape = concrete_shape(type_proto)
    if shape is None or type_proto is None or not type_proto.tensor_type.elem_type:
        return 0
    return math.ceil(ir.DataType(type_proto.tensor_type.elem_type).itemsize * math.prod(shape))


def _run_node(
    clone: ir.Model, node: ir.Node, known: Mapping[ir.Value, np.ndarray]
) -> list[np.ndarray] | None:
    """Run one node on constants with onnxruntime; None if onnxruntime cannot."""
    inputs = list(dict.fromkeys(v for v in node.inputs if v is not None))
    graph = onnx.helper.make_graph(
        [ir.to_proto(node)],
        "fold",
        [],
        [onnx.ValueInfoProto(name=o.name) for o in node.outputs],
        [onnx.numpy_helper.from_array(known[v], value_name(v)) for v in inputs],
    )
    proto = onnx.helper.make_model(
        graph,
        ir_version=clone.ir_version,
        opset_imports=[onnx.helper.make_opsetid(d, v) for d, v in clone.opset_imports.items()],
    )
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 4
    options.intra_op_num_threads = 1
    try:
        session = ort.InferenceSession(
            proto.SerializeToString(), options, providers=["CPUExecutionProvider"]
        )
        results = session.run(None, {})
    except Exception:  # onnxruntime raises several unrelated types; the node stays unfolded
        return None
    if not all(isinstance(r, np.ndarray) for r in results):
        return None
    return [np.asarray(r) for r in results]


def _symbolic_shapes(clone: ir.Model) -> dict[str, tuple[int, list[int | str | None]]] | None:
    """The element types and shapes SymbolicShapeInference gives, dims as numbers or
    sympy texts; None if it cannot run on the model."""
    from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference

    proto = ir.serde.serialize_model(clone)
    opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), 0)
    if opset < 7:  # what SymbolicShapeInference supports
        return None
    # Its infer_shapes, without two things: on an incomplete result it writes the model
    # to sym_shape_infer_temp.onnx in the working directory and raises, losing the
    # shapes it did infer. The partial result is what fills gaps here.
    inference = SymbolicShapeInference(
        int_max=2**31 - 1, auto_merge=True, guess_output_rank=True, verbose=0
    )
    try:
        with _quiet("onnxruntime.tools.symbolic_shape_infer"):
            inference._preprocess(proto)
            while inference.run_:
                inference._infer_impl()
            inference._update_output_from_vi()
    except Exception:  # an assertion, a KeyError, ...: it does not handle this model
        return None
    graph = inference.out_mp_.graph
    shapes: dict[str, tuple[int, list[int | str | None]]] = {}
    for vi in (*graph.value_info, *graph.output):
        tensor_type = vi.type.tensor_type
        if vi.type.HasField("tensor_type") and tensor_type.HasField("shape"):
            shapes[vi.name] = (
                tensor_type.elem_type,
                [
                    d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
                    for d in tensor_type.shape.dim
                ],
            )
    return shapes


@contextlib.contextmanager
def _quiet(logger_name: str) -> Iterator[None]:
    logger = logging.getLogger(logger_name)
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)


def _adopt(
    clone: ir.Model,
    types: Types,
    symbolic: Mapping[str, tuple[int, list[int | str | None]]],
    resolved: Resolved,
) -> bool:
    """Give the values onnx left unsized the shapes SymbolicShapeInference computed,
    where every dim evaluates and agrees with the dims onnx did fix."""
    adopted = False
    for value in main_values(clone.graph):
        name = value_name(value)
        found = types.get(name)
        if is_sized(found) or name not in symbolic:
            continue
        dims = [_evaluated(d, resolved) for d in symbolic[name][1]]
        if any(d is None for d in dims) or not _agrees(found, dims):
            continue
        elem_type, _ = symbolic[name]
        _set_shape(
            value, found or onnx.helper.make_tensor_type_proto(elem_type, None), ir.Shape(dims)
        )
        adopted |= value.dtype is not None
    return adopted


def _evaluated(dim: int | str | None, resolved: Resolved) -> int | None:
    if dim is None or isinstance(dim, int):
        return dim
    try:
        return parse_dim(dim).value(resolved.dims)
    except ModelError:  # an expression it wrote that does not come out whole
        return None


def _agrees(found: onnx.TypeProto | None, dims: list[int | None]) -> bool:
    if found is None or not found.tensor_type.HasField("shape"):
        return True
    known = found.tensor_type.shape.dim
    return len(known) == len(dims) and all(
        not k.HasField("dim_value") or k.dim_value == d for k, d in zip(known, dims, strict=True)
    )
