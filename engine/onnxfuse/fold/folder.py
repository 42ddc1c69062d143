"""Constant folding: nodes whose inputs are all constant become initializers.

Values are computed with onnx's reference evaluator, one node at a time, at the model's
own opset. ``Shape`` and ``Size`` of a value whose shape is fully known fold too, and so
does any shape computation whose elements are all known (``language.symbolic``), though
a dimension elsewhere in the shape is not. An ``If`` of a constant condition is replaced
by the branch it takes, a ``Loop`` of a constant 0 or 1 trips by what it computes
(``fold.branches``), and an ``Identity`` of a weight by the weight itself (no copy).
Outputs above a size limit are left as nodes. Inside a ``spill.spilling`` context, large
results become external tensors in a temporary file, and external weights a fold read
are unmapped after it. A fold of uniform values (fills) is computed on one element
(``folding_uniform``) and is a fill again. A rewrite's new nodes fold together
(``Folder.fold_nodes``): values that only they read are handed on as tensors and never
become initializers.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import onnx_ir as ir
from onnx import helper

from onnxfuse.fold import branches, spill
from onnxfuse.fold import uniform as folding_uniform
from onnxfuse.fold.numpy_ops import numpy_result
from onnxfuse.graph.names import NameSource
from onnxfuse.language import symbolic
from onnxfuse.language.guards import constant_tensor
from onnxfuse.support.ir_types import tensor_shape

DEFAULT_FOLD_LIMIT_BYTES = 256 * 1024 * 1024
# A folded result at least this big, beside a constant input at least this big that a
# node left in the graph still reads, stores that weight's bytes a second time (a tied
# embedding table transposed for the LM head): such a node is not folded.
SHARED_COPY_MIN_BYTES = 64 * 1024

# Ops that must never be folded: random, stateful or not plain tensor functions.
_NEVER_FOLD = frozenset(
    {
        "RandomNormal",
        "RandomUniform",
        "RandomNormalLike",
        "RandomUniformLike",
        "Multinomial",
        "Bernoulli",
        "If",
        "Loop",
        "Scan",
        "SequenceConstruct",
        "SequenceEmpty",
        "SequenceInsert",
        "SequenceAt",
        "SplitToSequence",
        "ConcatFromSequence",
        "Optional",
        "OptionalGetElement",
        "OptionalHasElement",
    }
)


class _AboveLimit(Exception):
    """A result known to be above the fold limit before computing it."""


@dataclass
class _Batch:
    """Results of ``Folder.fold_nodes`` not yet placed in the graph: by id of the value
    they replace, that value, its new name and the tensor; and the folded nodes, in order."""

    held: dict[int, tuple[ir.Value, str, ir.TensorProtocol]]
    nodes: list[ir.Node]


@dataclass
class FoldContext:
    ir_version: int
    opsets: dict[str, int]
    limit_bytes: int = DEFAULT_FOLD_LIMIT_BYTES
    # A DequantizeLinear of constants (or a Cast of an 8-bit weight to float) is a
    # quantized weight: folding it would store the float weight and undo the
    # quantization, so it stays unless the user asks.
    dequantize: bool = False


class Folder:
    """Folds nodes in place; keeps a counter of how many it folded."""

    def __init__(
        self, context: FoldContext, names: NameSource, function_graphs: frozenset[int] = frozenset()
    ):
        self.context = context
        self.names = names
        # Function bodies cannot hold initializers: constants there stay Constant nodes.
        self.function_graphs = function_graphs
        self.folded = 0
        self._batch: _Batch | None = None

    def fold_graph(self, graph: ir.Graph | ir.Function) -> None:
        for node in list(graph):
            self.fold_node(node)

    def fold_nodes(self, nodes: Iterable[ir.Node]) -> list[ir.Node]:
        """Fold what can be folded; return the nodes that remain in the graph. A result
        read only by nodes folded here too never becomes an initializer: it is handed
        on as a tensor (conv-bn-fold computes 9 values to make its 2 weights). Names
        are taken as folding one node at a time takes them, so the model is the same."""
        self._batch = _Batch(held={}, nodes=[])
        try:
            return [node for node in nodes if not self.fold_node(node)]
        finally:
            self._settle()

    def fold_node(self, node: ir.Node) -> bool:
        graph = node.graph
        if graph is None or node.domain != "":
            return False
        if node.op_type in ("If", "Loop") and self._batch is None:
            return self._fold_control_flow(node)
        if node.op_type in _NEVER_FOLD:
            return False
        if node.op_type == "Identity" and self._batch is None and _alias_initializer(node):
            self.folded += 1
            return True
        if not self.context.dequantize and _dequantizes_a_weight(node):
            return False
        in_function = id(graph) in self.function_graphs
        if in_function and node.op_type == "Constant":
            return False
        results = self._shape_result(node)
        if results is None:
            results = self._castlike_result(node)
        if results is None:
            try:
                results = self._constant_of_shape_result(node)
            except _AboveLimit:
                return False  # the evaluator would build the whole array, then drop it
        if results is None:
            results = self._constant_node_result(node)
        if results is None:
            results = self._evaluated_result(node)
        if results is None:
            results = self._symbolic_result(node)
            if results is None:
                return False
        if sum(r.nbytes for r in results) > self.context.limit_bytes:
            return False
        if self._batch is None and _copies_a_shared_weight(node, results):
            return False
        sources = [v.const_value for v in node.inputs if v is not None]
        if self._batch is not None and not in_function:
            self._hold(node, results)
        else:
            self._replace_outputs(node, results, in_function)
            graph.remove(node, safe=True)
        self.folded += 1
        if spill.active() is not None:
            # Mapped pages of the weights just read count in memory until unmapped;
            # results still viewing a mapping keep it (release leaves it open).
            del results
            for tensor in sources:
                spill.release(tensor)
        return True

    def _hold(self, node: ir.Node, results: list[np.ndarray]) -> None:
        assert self._batch is not None
        for output, array in zip(node.outputs, results):
            name = self._take_name(output)
            self._batch.held[id(output)] = (output, name, _tensor(array, name))
        self._batch.nodes.append(node)

    def _settle(self) -> None:
        """Place the held results that a graph output or an unfolded node reads as
        initializers; remove the folded nodes."""
        batch, self._batch = self._batch, None
        assert batch is not None
        folded = {id(node) for node in batch.nodes}
        by_graph: dict[int, tuple[ir.Graph, list[ir.Node]]] = {}
        for node in batch.nodes:
            graph = node.graph
            assert graph is not None
            for output in node.outputs:
                _, name, tensor = batch.held[id(output)]
                if output.is_graph_output() or any(
                    id(consumer) not in folded for consumer in output.consumers()
                ):
                    self._place(graph, output, name, tensor)
            by_graph.setdefault(id(graph), (graph, []))[1].append(node)
        for graph, nodes in by_graph.values():
            graph.remove(nodes, safe=True)

    def _input_tensor(self, value: ir.Value | None) -> ir.TensorProtocol | None:
        if self._batch is not None and value is not None:
            held = self._batch.held.get(id(value))
            if held is not None and held[0] is value:
                return held[2]
        return constant_tensor(value, self.context.ir_version)

    def _replace_outputs(self, node: ir.Node, results: list[np.ndarray], in_function: bool) -> None:
        assert node.graph is not None
        for output, array in zip(node.outputs, results):
            if in_function:
                self._replace_with_constant_node(node, output, array)
            else:
                self._replace_with_initializer(node.graph, output, array)

    def _evaluated_result(self, node: ir.Node) -> list[np.ndarray] | None:
        tensors = self._constant_tensors(node)
        if tensors is None:
            return None
        # Uniform inputs (fills): one element computed, the result a fill again.
        opset = self.context.opsets.get("", 21)
        results = folding_uniform.uniform_result(node, tensors, opset, self._evaluate)
        if results is not None:
            return results
        return self._evaluate(node, [None if t is None else t.numpy() for t in tensors])

    def _constant_tensors(self, node: ir.Node) -> list[ir.TensorProtocol | None] | None:
        tensors = [None if value is None else self._input_tensor(value) for value in node.inputs]
        if any(t is None and v is not None for t, v in zip(tensors, node.inputs)):
            return None  # decided before reading any weight: lazy data stays on disk
        if node.op_type != "Constant" and not any(t is not None for t in tensors):
            # Generators without inputs (e.g. ConstantOfShape needs one) are not folded here.
            return None
        return tensors

    def _shape_result(self, node: ir.Node) -> list[np.ndarray] | None:
        if node.op_type not in ("Shape", "Size") or not node.inputs or node.inputs[0] is None:
            return None
        shape = node.inputs[0].shape
        if shape is None or not all(isinstance(d, int) for d in shape):
            return None
        dims = list(shape.numpy())
        if node.op_type == "Size":
            size = math.prod(dims)
            return [np.array(size, dtype=np.int64)] if size < 2**63 else None
        rank = len(dims)
        start_attr = node.attributes.get("start")
        end_attr = node.attributes.get("end")
        start = start_attr.as_int() if start_attr is not None else 0
        end = end_attr.as_int() if end_attr is not None else rank
        start = min(max(start + rank if start < 0 else start, 0), rank)
        end = min(max(end + rank if end < 0 else end, 0), rank)
        return [np.array(dims[start:end], dtype=np.int64)]

    def _symbolic_result(self, node: ir.Node) -> list[np.ndarray] | None:
        """A shape computation whose every element is known although its inputs are not
        all constant: Gather(Shape(x), 1) where only x's batch dimension is symbolic."""
        if node.op_type not in symbolic.FOLLOWED_OPS or len(node.outputs) != 1:
            return None
        output = node.outputs[0]
        if output.dtype is None or node.op_type == "Identity":
            return None  # an Identity is a rewrite's to remove, not a fold's
        found = symbolic.elements(output, self._input_tensor)
        if found is None:
            return None
        rank, items = found
        if not all(isinstance(item, int) for item in items):
            return None
        array = np.array(items, dtype=output.dtype.numpy())
        return [array.reshape(()) if rank == 0 else array]

    def _fold_control_flow(self, node: ir.Node) -> bool:
        """An If of a constant condition becomes the branch it takes, a Loop of a constant
        0 or 1 trips what it computes; the nodes moved in then fold in its place."""
        if node.op_type == "If":
            moved = branches.inline_taken_branch(node, self._input_tensor, self.names)
        else:
            opset = self.context.opsets.get("", 21)
            moved = branches.inline_decided_loop(node, self._input_tensor, self.names, opset)
        if moved is None:
            return False
        self.folded += 1
        for inlined in moved:
            if inlined.graph is not None:
                self.fold_node(inlined)
        return True

    def _castlike_result(self, node: ir.Node) -> list[np.ndarray] | None:
        """CastLike needs only the dtype of its second input, not its value."""
        if node.op_type != "CastLike" or len(node.inputs) != 2 or node.inputs[1] is None:
            return None
        tensor = self._input_tensor(node.inputs[0])
        like = node.inputs[1].dtype
        if tensor is None or like is None or like.numpy() is None:
            return None
        try:
            return [tensor.numpy().astype(like.numpy())]
        except (TypeError, ValueError):
            return None

    def _constant_of_shape_result(self, node: ir.Node) -> list[np.ndarray] | None:
        """ConstantOfShape is a plain fill: no evaluator needed (weights of big models)."""
        if node.op_type != "ConstantOfShape" or not node.inputs or node.inputs[0] is None:
            return None
        shape = self._input_tensor(node.inputs[0])
        if shape is None:
            return None
        dims = [int(d) for d in shape.numpy().reshape(-1)]
        attr = node.attributes.get("value")
        fill = attr.value.numpy().reshape(-1) if attr is not None else np.zeros(1, np.float32)
        if fill.size != 1 or any(d < 0 for d in dims):
            return None
        nbytes = math.prod(dims) * fill.dtype.itemsize  # Python ints: no overflow
        if nbytes > min(self.context.limit_bytes, sys.maxsize):  # no array is larger
            raise _AboveLimit
        if fill.dtype.kind in "biufc" and nbytes >= spill.FILL_MIN_BYTES:
            # A view of one value: it becomes a FillTensor, made only when read or written.
            return [np.broadcast_to(fill[:1].reshape(()), dims)]
        if fill.dtype.kind in "biufc" and not any(fill.tobytes()):
            # All-zero bytes (0, never -0.0): calloc'd pages, written only when saved.
            return [np.zeros(dims, dtype=fill.dtype)]
        return [np.full(dims, fill[0], dtype=fill.dtype)]

    def _constant_node_result(self, node: ir.Node) -> list[np.ndarray] | None:
        """A Constant's value read directly: rule targets write value_ints or
        value_float, which the model's opset (before 12) may not know."""
        if node.op_type != "Constant" or len(node.outputs) != 1:
            return None
        try:
            tensor = ir.convenience.get_const_tensor(node.outputs[0])
        except Exception:  # an attribute onnx_ir cannot read: leave it to the evaluator
            return None
        return None if tensor is None else [tensor.numpy()]

    def _evaluate(self, node: ir.Node, inputs: list[np.ndarray | None]) -> list[np.ndarray] | None:
        # IEEE results (x / 0 = inf, nan casts) are what the op computes: numpy's warnings
        # about them would only reach the user's terminal.
        with np.errstate(all="ignore"):
            arrays = numpy_result(node, inputs, self.context.opsets.get("", 21))
            if arrays is None:
                arrays = self._reference_result(node, inputs)
        if arrays is None:
            return None
        for output, array in zip(node.outputs, arrays):
            if output.dtype is not None and _dtype_of(array) not in (None, output.dtype):
                return None
            # An evaluator that broadcasts where the op does not (onnx's reference Clip
            # with [1]-shaped bounds on a scalar) would change the value's shape.
            shape = output.shape
            if shape is not None and shape.is_static() and tuple(shape.numpy()) != array.shape:
                return None
        return arrays

    def _reference_result(
        self, node: ir.Node, inputs: list[np.ndarray | None]
    ) -> list[np.ndarray] | None:
        ReferenceEvaluator = reference_evaluator()
        names = [f"i{k}" if a is not None else "" for k, a in enumerate(inputs)]
        outputs = [f"o{k}" for k in range(len(node.outputs))]
        proto = ir.serde.serialize_node(node)
        del proto.input[:]
        proto.input.extend(names)
        del proto.output[:]
        proto.output.extend(outputs)
        feeds = {n: a for n, a in zip(names, inputs) if n}
        function = helper.make_function(
            "onnxfuse.fold",
            "fold",
            [n for n in names if n],
            outputs,
            [proto],
            [helper.make_opsetid("", self.context.opsets.get("", 21))],
        )
        try:
            evaluator = ReferenceEvaluator(function)
            results = evaluator.run(None, feeds, attributes={})
        except Exception:  # the reference evaluator cannot run this node: keep it
            return None
        return [np.asarray(r) for r in results]

    def _replace_with_initializer(
        self, graph: ir.Graph | ir.Function, old: ir.Value, array: np.ndarray
    ) -> None:
        name = self._take_name(old)
        self._place(graph, old, name, _tensor(array, name))

    def _place(
        self, graph: ir.Graph | ir.Function, old: ir.Value, name: str, tensor: ir.TensorProtocol
    ) -> None:
        """``tensor`` as the initializer ``name``, read where ``old`` was."""
        area = spill.active()
        if area is not None:
            tensor = area.spill(tensor) or tensor
        value = ir.Value(
            name=name,
            type=ir.TensorType(tensor.dtype),
            shape=tensor_shape(tensor),
            const_value=tensor,
        )
        if isinstance(graph, ir.Function):
            graph = graph.graph
        graph.register_initializer(value)
        # A graph output may be an initializer: it keeps its name (as onnxruntime folds it).
        old.replace_all_uses_with(value, replace_graph_outputs=True)

    def _take_name(self, old: ir.Value) -> str:
        """A graph output's name moves to its folded value; other values get a fresh one."""
        if old.is_graph_output() and old.name:
            name = old.name
            old.name = self.names.fresh(f"{name}__folded")
            return name
        return self.names.fresh(old.name or "folded")

    def _replace_with_constant_node(self, node: ir.Node, old: ir.Value, array: np.ndarray) -> None:
        name = self._take_name(old)
        tensor = ir.Tensor(np.ascontiguousarray(array), name=name)  # no broadcast views
        constant = ir.Node(
            "", "Constant", [], [ir.AttrTensor("value", tensor)], name=self.names.fresh(name)
        )
        value = constant.outputs[0]
        value.name, value.type, value.shape = name, ir.TensorType(tensor.dtype), tensor.shape
        assert node.graph is not None
        node.graph.insert_before(node, constant)
        old.replace_all_uses_with(value, replace_graph_outputs=True)


# Integer weights that a Cast to float makes into a dequantized weight: 8 bits or fewer.
_QUANTIZED_WEIGHT_TYPES = frozenset(
    {ir.DataType.INT8, ir.DataType.UINT8, ir.DataType.INT4, ir.DataType.UINT4}
)
_FLOAT_TYPES = frozenset(
    {ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.BFLOAT16, ir.DataType.DOUBLE}
)
# A shape constant or lookup table this small is no quantized weight.
_QUANTIZED_WEIGHT_ELEMENTS = 1024


def _dequantizes_a_weight(node: ir.Node) -> bool:
    """A DequantizeLinear, or a Cast of a constant 8-bit (or 4-bit) integer tensor to
    float (weight-only quantization written by hand, Cast then Mul by a scale): folding
    it would store the float weight, 2-8 times larger, and undo the quantization."""
    if node.op_type == "DequantizeLinear":
        return True
    if node.op_type != "Cast" or not node.inputs or node.inputs[0] is None:
        return False
    source = node.inputs[0]
    to = node.attributes.get("to")
    return (
        source.dtype in _QUANTIZED_WEIGHT_TYPES
        and source.const_value is not None
        and source.const_value.size > _QUANTIZED_WEIGHT_ELEMENTS
        and to is not None
        and to.as_int() in {t.value for t in _FLOAT_TYPES}
    )


def _copies_a_shared_weight(node: ir.Node, results: list[np.ndarray]) -> bool:
    """Whether folding ``node`` would store a big result beside a big constant input that
    another node still reads, so that the model holds that weight twice. (A rewrite's new
    nodes, folded together, make a fused op its own weights: they are not asked.)"""
    if sum(r.nbytes for r in results) < SHARED_COPY_MIN_BYTES:
        return False
    for value in node.inputs:
        tensor = constant_tensor(value) if value is not None else None
        if value is None or tensor is None or tensor.nbytes < SHARED_COPY_MIN_BYTES:
            continue
        if value.is_graph_output() or any(c is not node for c in value.consumers()):
            return True
    return False


def _alias_initializer(node: ir.Node) -> bool:
    """An Identity of an initializer: its readers read the initializer itself. Folding it
    to a new initializer would copy the weight once per Identity (legacy exports of
    ALBERT read each shared weight through one Identity per layer: 8 copies)."""
    source, output = node.inputs[0] if node.inputs else None, node.outputs[0]
    if source is None or not source.is_initializer() or output.is_graph_output():
        return False
    output.replace_all_uses_with(source)
    assert node.graph is not None
    node.graph.remove(node, safe=True)
    return True


def _tensor(array: np.ndarray, name: str) -> ir.TensorProtocol:
    if array.dtype.kind in "OSU":  # strings: onnx_ir's passes read them as bytes
        data = [v.encode() if isinstance(v, str) else bytes(v) for v in array.reshape(-1)]
        return ir.StringTensor(data, shape=ir.Shape(array.shape), name=name)
    return spill.fill_tensor(array, name) or ir.Tensor(array, name=name)


def reference_evaluator() -> type:
    """onnx's ReferenceEvaluator, imported on first use (0.3 s). Its import builds an op
    table from onnx's registered schemas and fails once one op name is registered in
    two domains: the checker's private extension domain (``extension_ops``) makes that
    so, and must be registered after this import."""
    from onnx.reference import ReferenceEvaluator

    return ReferenceEvaluator


def _dtype_of(array: np.ndarray) -> ir.DataType | None:
    try:
        return ir.DataType.from_numpy(array.dtype)
    except (TypeError, ValueError):
        return None
