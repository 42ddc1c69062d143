"""Static memory planning: one arena for every intermediate tensor."""

from __future__ import annotations

from typing import TYPE_CHECKING

from onnxfuse.support.lazy_exports import lazy_getattr

if TYPE_CHECKING:
    from onnxfuse.planner.arena_executor import ArenaExecutor, VerifyResult, verify_plan
    from onnxfuse.planner.checker import PlanError, check_plan
    from onnxfuse.planner.embed import METADATA_KEY, embed_plan, read_embedded_plan
    from onnxfuse.planner.plan import Plan, PlannedTensor, plan_model
    from onnxfuse.planner.strategies import STRATEGIES

# Imported on first use: every command line run imports this package (for the `plan`
# subcommand's arguments) and should not load onnxruntime's session machinery then.
_EXPORTS = {
    "ArenaExecutor": "arena_executor",
    "VerifyResult": "arena_executor",
    "verify_plan": "arena_executor",
    "PlanError": "checker",
    "check_plan": "checker",
    "METADATA_KEY": "embed",
    "embed_plan": "embed",
    "read_embedded_plan": "embed",
    "Plan": "plan",
    "PlannedTensor": "plan",
    "plan_model": "plan",
    "STRATEGIES": "strategies",
}
__all__ = [
    "METADATA_KEY",
    "STRATEGIES",
    "ArenaExecutor",
    "Plan",
    "PlanError",
    "PlannedTensor",
    "VerifyResult",
    "check_plan",
    "embed_plan",
    "plan_model",
    "read_embedded_plan",
    "verify_plan",
]


__getattr__ = lazy_getattr(__name__, _EXPORTS)
