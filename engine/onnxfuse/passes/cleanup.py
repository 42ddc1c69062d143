"""Cleanup: dead nodes, duplicates, unused opsets, topological order; the last inference."""

from __future__ import annotations

import onnx_ir as ir
import onnx_ir.passes.common as common_passes

from onnxfuse.ops.inference import infer_shapes
from onnxfuse.passes.normalize import merge_duplicates


class CleanupPass(ir.passes.InPlacePass):
    """onnx_ir's common passes, in the order that leaves nothing for a second round.
    ``infer``: False leaves the last shape inference to the save, which makes it on the
    protobuf it writes. ``keeps_qdq_units``: the target consumes QDQ node units, whose
    Qs and DQs CSE leaves apart (``merge_duplicates``)."""

    def __init__(self, infer: bool = True, keeps_qdq_units: bool = False):
        super().__init__()
        self.infer = infer
        self.keeps_qdq_units = keeps_qdq_units

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        common_passes.RemoveUnusedNodesPass()(model)
        merge_duplicates(model, self.keeps_qdq_units)
        common_passes.RemoveUnusedNodesPass()(model)
        common_passes.RemoveUnusedOpsetsPass()(model)
        common_passes.TopologicalSortPass()(model)
        if self.infer:
            infer_shapes(model)  # through onnxruntime's ai.onnx extension ops too
        return ir.passes.PassResult(model, modified=True)
