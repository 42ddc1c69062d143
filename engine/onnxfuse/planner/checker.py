"""Proof that a plan is sound: no two tensors alive at the same step share a byte.

The checker trusts nothing in the plan but the offsets: given the model's
lifetimes it also checks that every intermediate is planned with the right
first and last step and size, and that every in-place claim is one the op allows.
"""

from __future__ import annotations

from collections import defaultdict

import onnx_ir as ir

from onnxfuse.errors import OnnxfuseError
from onnxfuse.planner.inplace import allows_inplace, inplace_inputs
from onnxfuse.planner.lifetimes import Lifetimes, compute_lifetimes
from onnxfuse.planner.plan import Plan, PlannedTensor
from onnxfuse.planner.shapes import infer_tensor_infos


class PlanError(OnnxfuseError):
    """A plan that would corrupt tensors (or does not describe the model)."""


def check_plan(plan: Plan, model: ir.Model | None = None) -> None:
    """Raise PlanError naming the first problem found, if any.

    With ``model``, the lifetimes are recomputed from the model (with the plan's
    dims, input shapes and order) instead of trusting the plan's own first and last
    steps; a shape the plan says a traced run gave is taken from the plan.
    """
    lifetimes = None
    if model is not None:
        infos = infer_tensor_infos(model, plan.bindings())
        order = [s.node for s in plan.steps]
        lifetimes = compute_lifetimes(model, infos, order, plan.fold_constants)
    problems = plan_problems(plan, lifetimes)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise PlanError(f"invalid plan: {problems[0]}{more}")


def plan_problems(plan: Plan, lifetimes: Lifetimes | None = None) -> list[str]:
    problems = [p for t in plan.tensors for p in _bounds_problems(plan, t)]
    if lifetimes is not None:
        problems += _model_problems(plan, lifetimes)
    by_name = {t.name: t for t in plan.tensors}
    # The input a valid in-place output takes over is dead at the output's step.
    handed_over: set[tuple[str, int]] = set()
    for t in plan.tensors:
        if t.inplace_of is None:
            continue
        problem = _inplace_problem(plan, t, by_name.get(t.inplace_of), lifetimes)
        if problem:
            problems.append(problem)
        else:
            handed_over.add((t.inplace_of, t.first))
    return problems + _overlap_problems(plan, handed_over)


def _bounds_problems(plan: Plan, t: PlannedTensor) -> list[str]:
    problems = []
    if t.offset < 0 or t.offset % plan.alignment:
        problems.append(f"{t.name!r}: offset {t.offset} is not a multiple of {plan.alignment}")
    if t.size < t.nbytes:
        problems.append(f"{t.name!r}: size {t.size} is below its {t.nbytes} bytes")
    if t.offset + t.size > plan.arena_bytes:
        problems.append(f"{t.name!r}: ends at {t.offset + t.size}, past the arena's end")
    if not 0 <= t.first <= t.last < len(plan.steps):
        problems.append(f"{t.name!r}: steps {t.first}..{t.last} out of range")
    return problems


def _model_problems(plan: Plan, lifetimes: Lifetimes) -> list[str]:
    if [s.node for s in plan.steps] != lifetimes.step_nodes:
        return ["the plan's steps are not the model's execution order"]
    problems = []
    planned = {t.name: t for t in plan.tensors}
    for life in lifetimes.tensors:
        t = planned.pop(life.name, None)
        if t is None:
            problems.append(f"intermediate {life.name!r} is not planned")
        elif (t.first, t.last, t.nbytes) != (life.first, life.last, life.info.nbytes):
            problems.append(
                f"{life.name!r}: planned as steps {t.first}..{t.last}, {t.nbytes} bytes; "
                f"the model has {life.first}..{life.last}, {life.info.nbytes} bytes"
            )
    problems += [f"{name!r} is planned but is not an intermediate" for name in planned]
    return problems


def _inplace_problem(
    plan: Plan, out: PlannedTensor, src: PlannedTensor | None, lifetimes: Lifetimes | None
) -> str | None:
    claim = f"{out.name!r} in place of {out.inplace_of!r}"
    if src is None:
        return f"{claim}: no such tensor"
    if src.last != out.first or (src.offset, src.size) != (out.offset, out.size):
        return f"{claim}: the input must die where the output is born, at the same offset and size"
    if src.dtype != out.dtype or src.nbytes != out.nbytes:
        return f"{claim}: dtype or byte size differ"
    op = plan.steps[out.first].op
    if lifetimes is None:
        allowed = allows_inplace(op)
    else:
        node = lifetimes.steps[out.first]
        inputs = [node.inputs[p] for p in inplace_inputs(node) if p < len(node.inputs)]
        allowed = node.outputs[0].name == out.name and any(
            v is not None and v.name == src.name for v in inputs
        )
    return None if allowed else f"{claim}: {op} may not write its output over that input"


def _overlap_problems(plan: Plan, handed_over: set[tuple[str, int]]) -> list[str]:
    alive: dict[int, list[PlannedTensor]] = defaultdict(list)
    for t in plan.tensors:
        if t.size:  # a zero-size tensor occupies no bytes
            for step in range(max(t.first, 0), min(t.last, len(plan.steps) - 1) + 1):
                if (t.name, step) not in handed_over:
                    alive[step].append(t)
    problems = []
    reported: set[tuple[str, str]] = set()
    for step in sorted(alive):
        ranked = sorted(alive[step], key=lambda t: t.offset)
        highest = ranked[0]
        for t in ranked[1:]:
            pair = (highest.name, t.name)
            if t.offset < highest.offset + highest.size and pair not in reported:
                reported.add(pair)
                problems.append(
                    f"{highest.name!r} [{highest.offset}, {highest.offset + highest.size}) and "
                    f"{t.name!r} [{t.offset}, {t.offset + t.size}) overlap, "
                    f"both alive at step {step}"
                )
            if t.offset + t.size > highest.offset + highest.size:
                highest = t
    return problems
