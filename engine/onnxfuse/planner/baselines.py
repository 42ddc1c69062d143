"""What the arena would need without a planner: no reuse, or onnxruntime's reuse policy."""

from __future__ import annotations

from collections import defaultdict

from onnxfuse.planner.lifetimes import Lifetimes


def align_up(nbytes: int, alignment: int) -> int:
    return -(-nbytes // alignment) * alignment


def naive_bytes(lifetimes: Lifetimes, alignment: int) -> int:
    """Every intermediate in a buffer of its own."""
    return sum(align_up(t.info.nbytes, alignment) for t in lifetimes.tensors)


def ort_policy_bytes(lifetimes: Lifetimes, alignment: int) -> int:
    """Simulate reusing a freed buffer only when its byte size is exactly the tensor's.

    Buffers are freed after the step that last uses them, so a step's outputs
    never take its own inputs' buffers (no in-place). Each new buffer adds its
    aligned size to the total.
    """
    born: dict[int, list[int]] = defaultdict(list)
    dying: dict[int, list[int]] = defaultdict(list)
    for t in lifetimes.tensors:
        born[t.first].append(t.info.nbytes)
        dying[t.last].append(t.info.nbytes)
    free: dict[int, int] = defaultdict(int)  # byte size -> freed buffers of that size
    total = 0
    for step in range(len(lifetimes.steps)):
        for nbytes in born[step]:
            if free[nbytes]:
                free[nbytes] -= 1
            else:
                total += align_up(nbytes, alignment)
        for nbytes in dying[step]:
            free[nbytes] += 1
    return total
