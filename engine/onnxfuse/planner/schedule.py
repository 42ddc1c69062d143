"""Memory-aware scheduling: a topological order of the steps with a lower peak of live bytes."""

from __future__ import annotations

from collections.abc import Callable

import onnx_ir as ir

from onnxfuse.planner.lifetimes import Lifetimes, used_values

# Scores a ready step from (bytes it allocates, bytes it frees, bytes alive before it).
_Score = Callable[[int, int, int], tuple[int, ...]]

_RULES: tuple[_Score, ...] = (
    # Least net growth first: frees big inputs early, defers big outputs.
    lambda alloc, freed, live: (alloc - freed, live + alloc),
    # Lowest bytes alive while the step runs first.
    lambda alloc, freed, live: (live + alloc, alloc - freed),
)


def candidate_orders(lifetimes: Lifetimes) -> list[list[int]]:
    """Greedy list schedules of the steps, one per rule, as graph node indices.

    Each is a valid topological order; the caller keeps whichever gives the
    lowest peak (possibly the graph's own order).
    """
    return [_greedy(lifetimes, rule) for rule in _RULES]


def _greedy(lifetimes: Lifetimes, rule: _Score) -> list[int]:
    steps = lifetimes.steps
    position = {node: i for i, node in enumerate(steps)}
    sizes = {t.name: t.info.nbytes for t in lifetimes.tensors}
    reads: list[set[str]] = []
    preds: list[set[int]] = []
    for node in steps:
        used = used_values(node)
        reads.append({v.name for v in used if v.name in sizes})
        preds.append({position[p] for v in used if (p := v.producer()) in position})
    readers: dict[str, int] = {}
    for names in reads:
        for name in names:
            readers[name] = readers.get(name, 0) + 1
    succs: list[list[int]] = [[] for _ in steps]
    for i, ps in enumerate(preds):
        for pred in ps:
            succs[pred].append(i)
    waiting = [len(ps) for ps in preds]
    ready = {i for i, w in enumerate(waiting) if w == 0}
    live = 0
    order: list[int] = []
    while ready:
        best = min(
            ready, key=lambda i: (*rule(*_effect(steps[i], reads[i], sizes, readers), live), i)
        )
        ready.remove(best)
        alloc, freed = _effect(steps[best], reads[best], sizes, readers)
        live += alloc - freed
        for name in reads[best]:
            readers[name] -= 1
        order.append(best)
        for s in succs[best]:
            waiting[s] -= 1
            if waiting[s] == 0:
                ready.add(s)
    return [lifetimes.step_nodes[i] for i in order]


def _effect(
    node: ir.Node, reads: set[str], sizes: dict[str, int], readers: dict[str, int]
) -> tuple[int, int]:
    alloc = sum(sizes.get(v.name, 0) for v in node.outputs if v.name)
    # An output nobody reads dies at once, as does an input read here for the last time.
    unread = sum(sizes[v.name] for v in node.outputs if v.name in sizes and v.name not in readers)
    freed = sum(sizes[name] for name in reads if readers[name] == 1) + unread
    return alloc, freed
