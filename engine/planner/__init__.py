"""Static memory planning: one arena for every intermediate tensor."""

from onnxfuse.planner.arena_executor import ArenaExecutor, VerifyResult, verify_plan
from onnxfuse.planner.checker import PlanError, check_plan
from onnxfuse.planner.embed import METADATA_KEY, embed_plan, read_embedded_plan
from onnxfuse.planner.plan import Plan, PlannedTensor, plan_model
from onnxfuse.planner.strategies import STRATEGIES

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
