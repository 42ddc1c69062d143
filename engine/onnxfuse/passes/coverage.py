"""Coverage: what the target cannot run of the model, measured into the run's report
after normalizing (before the rules) and at the end (targets/coverage.py)."""

from __future__ import annotations

import onnx_ir as ir

from onnxfuse.passes.state import RunState
from onnxfuse.targets.capabilities import Target
from onnxfuse.targets.coverage import coverage


class CoveragePass(ir.passes.InPlacePass):
    """The first run fills ``report.coverage_before``, the next ``coverage_after``."""

    def __init__(self, state: RunState, target: Target):
        super().__init__()
        self.state = state
        self.target = target

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        report = self.state.report
        found = coverage(model, self.target)
        if report.coverage_before is None:
            report.coverage_before = found
        else:
            report.coverage_after = found
        return ir.passes.PassResult(model, modified=False)
