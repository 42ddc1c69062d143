"""Rewrite: one phase's rules to a fixpoint, and folding what the rewrites left constant."""

from __future__ import annotations

import onnx_ir as ir

from onnxfuse.graph.traversal import all_graphs
from onnxfuse.language.rule import Rule
from onnxfuse.passes.state import RunState
from onnxfuse.rewrite.driver import Driver, Limits, order_rules


class RewritePass(ir.passes.InPlacePass):
    """The rules that run in ``phase`` (fusion, packing, then layout), each phase to its own
    fixpoint; nothing runs once an earlier phase stopped early."""

    def __init__(self, state: RunState, phase: str, rules: list[Rule], limits: Limits):
        super().__init__()
        self.state = state
        self.phase = phase
        self.rules = [r for r in rules if r.runs_in(phase)]
        self.limits = limits

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        report = self.state.report
        if not self.rules or report.stopped:
            return ir.passes.PassResult(model, modified=False)
        before = report.rewrites
        driver = Driver(
            model,
            order_rules(self.rules),
            self.limits,
            report,
            self.state.names,
            self.state.require_folder(),
        )
        driver.run(self.state.matchers)
        return ir.passes.PassResult(model, modified=report.rewrites > before)


class FoldPass(ir.passes.InPlacePass):
    """Fold every graph again: what rewrites made constant."""

    def __init__(self, state: RunState):
        super().__init__()
        self.state = state

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        folder = self.state.require_folder()
        before = folder.folded
        for graph in all_graphs(model):
            folder.fold_graph(graph)
        return ir.passes.PassResult(model, modified=folder.folded > before)
