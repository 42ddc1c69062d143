"""Normalize: the model as rules expect to see it.

IR < 4 initializer-inputs adopted as constants, Constant nodes lifted to initializers,
small constants read into memory, shapes inferred, constant subgraphs folded, and
duplicate computations merged, so that a rule sees one node where an exporter wrote
the same computation twice.
"""

from __future__ import annotations

from typing import cast

import onnx_ir as ir
import onnx_ir.passes.common as common_passes

from onnxfuse.fold.folder import DEFAULT_FOLD_LIMIT_BYTES, FoldContext, Folder
from onnxfuse.graph.names import NameSource
from onnxfuse.graph.traversal import all_graphs, owned_graphs
from onnxfuse.ops.inference import InferredTypes, infer_shapes
from onnxfuse.passes.shared_weights import deduplicate_large_initializers
from onnxfuse.passes.state import RunState
from onnxfuse.rewrite.qdq_units import QDQ_OPS, in_unit


class NormalizePass(ir.passes.InPlacePass):
    """Normalize the model and leave the run's folder on ``state`` for the passes after."""

    def __init__(self, state: RunState):
        super().__init__()
        self.state = state

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        self.state.folder = normalize(
            model,
            self.state.names,
            self.state.fold_limit_bytes,
            self.state.inferred,
            self.state.dequantize,
            self.state.keeps_qdq_units,
        )
        return ir.passes.PassResult(model, modified=True)


def adopt_ir4_initializers(model: ir.Model) -> None:
    """IR < 4 lists every initializer as a graph input, by convention only: those
    are constants. Drop them from the inputs and write IR 4, where an initializer
    that is also an input would be an overridable default instead."""
    if (model.ir_version or 10) >= 4:
        return
    common_passes.RemoveInitializersFromInputsPass()(model)
    model.ir_version = 4
    # Typed as the input was declared (maybe loosely, ["N", 3]): a constant's type and
    # shape are its tensor's, as loading the protobuf made IR 4 gives them.
    for graph in all_graphs(model):
        for value in graph.initializers.values():
            tensor = value.const_value
            if tensor is not None:
                value.type = ir.TensorType(tensor.dtype)
                value.shape = cast(ir.Shape, tensor.shape)  # a tensor's shape is a Shape


def normalize(
    model: ir.Model,
    names: NameSource | None = None,
    fold_limit_bytes: int = DEFAULT_FOLD_LIMIT_BYTES,
    inferred: InferredTypes | None = None,
    dequantize: bool = False,
    keeps_qdq_units: bool = False,
) -> Folder:
    """Constants as initializers, constant subgraphs folded, shapes inferred
    (``inferred``: onnx's inference of the model as loaded, if unchanged since;
    ``keeps_qdq_units``: the target consumes QDQ node units, see ``merge_duplicates``)."""
    adopt_ir4_initializers(model)
    _LiftConstants(lift_all_constants=True, size_limit=0)(model)
    _small_constants_in_memory(model)
    infer_shapes(model, inferred)
    function_graphs = frozenset(id(g) for g, _, owner in owned_graphs(model) if owner is not None)
    folder = Folder(
        FoldContext(
            model.ir_version or 10, dict(model.opset_imports), fold_limit_bytes, dequantize
        ),
        names or NameSource(model),
        function_graphs,
    )
    for graph in all_graphs(model):
        folder.fold_graph(graph)
    # A value whose shape onnx could not infer before (a Pad or Reshape reading a shape
    # computed at run time) may be known now that the computation is constant: infer
    # again, and fold what that makes constant, until nothing more folds.
    for _ in range(_MAX_REFOLDS):
        folded = folder.folded
        if not infer_shapes(model):
            break
        for graph in all_graphs(model):
            folder.fold_graph(graph)
        if folder.folded == folded:
            break
    # Rules then see one node where exporters wrote the same computation twice.
    merge_duplicates(model, keeps_qdq_units)
    return folder


# Rounds of inference and folding after the first: each round can only fold what the
# last made constant (a chain through several shape-dependent ops needs one round each).
_MAX_REFOLDS = 4


# Constants this small are read again and again by guards (shape arithmetic, axes).
_SMALL_CONSTANT_ELEMENTS = 64
_PLAIN_DTYPES = frozenset(
    ir.DataType[name]
    for name in (
        "FLOAT",
        "DOUBLE",
        "FLOAT16",
        "BOOL",
        "INT8",
        "INT16",
        "INT32",
        "INT64",
        "UINT8",
        "UINT16",
        "UINT32",
        "UINT64",
    )
)


def _small_constants_in_memory(model: ir.Model) -> None:
    """Small initializers still backed by their protobuf become plain arrays: reading a
    protobuf tensor decodes it anew each time (~50 us), and guards read the same shape
    constants at every candidate node (BERT-base legacy: ~1,000 reads)."""
    for graph in all_graphs(model):
        for value in graph.initializers.values():
            tensor = value.const_value
            if (
                type(tensor) is ir.serde.TensorProtoTensor
                and tensor.size <= _SMALL_CONSTANT_ELEMENTS
                and tensor.dtype in _PLAIN_DTYPES
            ):
                value.const_value = ir.Tensor(
                    tensor.numpy(),
                    name=tensor.name,
                    doc_string=tensor.doc_string,
                    metadata_props=dict(tensor.metadata_props),
                )


class _LiftConstants(common_passes.LiftConstantsToInitializersPass):
    """onnx_ir's pass, without a runtime Protocol check per Constant: a TENSOR attribute
    holds a tensor (the IR's own invariant), and the check cost 0.1-0.2 ms each (BERT's
    297 Constants: ~30 ms)."""

    def _constant_node_attribute_to_tensor(
        self, node: ir.Node, attr_name: str, attr_value: ir.Attr, initializer_name: str
    ) -> ir.TensorProtocol | None:
        if attr_name == "value" and attr_value.type == ir.AttributeType.TENSOR:
            tensor = attr_value.value
            return tensor if tensor.size >= self.size_limit else None
        return super()._constant_node_attribute_to_tensor(
            node, attr_name, attr_value, initializer_name
        )


def merge_duplicates(model: ir.Model, keeps_qdq_units: bool = False) -> None:
    """Equal initializers first, so that CSE sees their users as equal. Subgraph
    initializers move to the main graph first (every subgraph sees it): a weight folded
    the same way in two If branches is then one weight, and one no branch reads any more
    goes with the main graph's dead initializers. ``keeps_qdq_units``: every Q and DQ,
    and every node of a QDQ node unit, stays its own node, for a target that consumes
    units (a DQ belongs to one unit: a model written with one DQ per consumer, as
    onnxruntime's EnsureUniqueDQForNodeUnit makes it, keeps them; two equal units on one
    DQ stay two, not one float op feeding both Qs)."""
    common_passes.LiftSubgraphInitializersToMainGraphPass()(model)
    common_passes.DeduplicateInitializersPass()(model)
    deduplicate_large_initializers(model)
    marked = _mark_qdq_distinct(model) if keeps_qdq_units else []
    try:
        common_passes.CommonSubexpressionEliminationPass()(model)
    finally:
        for node in marked:
            node.attributes.pop(_DISTINCT)


# An attribute of a distinct value on each Q and DQ while CSE runs (onnx_ir's pass takes
# no filter): nodes whose attributes differ are never merged.
_DISTINCT = "_onnxfuse_distinct"


def _mark_qdq_distinct(model: ir.Model) -> list[ir.Node]:
    marked: list[ir.Node] = []
    for graph in all_graphs(model):
        for node in graph:
            if (node.domain in ("", "ai.onnx") and node.op_type in QDQ_OPS) or in_unit(node):
                node.attributes[_DISTINCT] = ir.AttrInt64(_DISTINCT, len(marked))
                marked.append(node)
    return marked
