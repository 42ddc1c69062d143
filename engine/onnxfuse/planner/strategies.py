"""Placement strategies: give every block an offset so that blocks alive together never overlap.

A block is one buffer: a tensor, or a chain of tensors sharing a buffer in place.
All strategies place blocks one at a time, in some order, into the smallest gap
left by the already placed blocks they overlap in time (best fit, as TFLite's
greedy-by-size planner does); they differ in the order.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from onnxfuse.errors import OnnxfuseError
from onnxfuse.planner.lifetimes import peak


@dataclass(frozen=True)
class Block:
    size: int  # bytes, already rounded up to the alignment
    first: int
    last: int


@dataclass(frozen=True)
class Placement:
    offsets: list[int]
    arena: int


def lower_bound(blocks: Sequence[Block], n_steps: int) -> int:
    return peak([(b.first, b.last, b.size) for b in blocks], n_steps)


def conflicts(blocks: Sequence[Block]) -> list[list[int]]:
    """For each block, the blocks alive at some common step (sizes > 0 only)."""
    result: list[list[int]] = [[] for _ in blocks]
    by_first = sorted((i for i, b in enumerate(blocks) if b.size), key=lambda i: blocks[i].first)
    for pos, i in enumerate(by_first):
        last = blocks[i].last
        for j in by_first[pos + 1 :]:
            if blocks[j].first > last:
                break
            result[i].append(j)
            result[j].append(i)
    return result


def place(blocks: Sequence[Block], order: Sequence[int], conflict: list[list[int]]) -> Placement:
    """Best fit in ``order``: the smallest gap that fits, else on top of the overlapping blocks."""
    offsets = [-1] * len(blocks)
    arena = 0
    for b in order:
        size = blocks[b].size
        if size == 0:
            offsets[b] = 0
            continue
        taken = sorted(
            (offsets[c], offsets[c] + blocks[c].size) for c in conflict[b] if offsets[c] >= 0
        )
        best, best_gap, top = -1, 0, 0
        for start, end in taken:
            gap = start - top
            if gap >= size and (best < 0 or gap < best_gap):
                best, best_gap = top, gap
            top = max(top, end)
        offset = best if best >= 0 else top
        offsets[b] = offset
        arena = max(arena, offset + size)
    return Placement(offsets, arena)


def greedy_by_size(blocks: Sequence[Block], n_steps: int) -> Placement:
    """The baseline: largest block first."""
    order = sorted(range(len(blocks)), key=lambda i: (-blocks[i].size, blocks[i].first))
    return place(blocks, order, conflicts(blocks))


def search(
    blocks: Sequence[Block], n_steps: int, iterations: int = 400, seed: int = 0
) -> Placement:
    """Several orders, then local search on the best; stops at the lower bound.

    Local search moves a block that ends at the arena's top earlier in the order
    (it was placed too late to find a low gap) and keeps moves that do not grow
    the arena. Seeded, so the result is reproducible.
    """
    bound = lower_bound(blocks, n_steps)
    conflict = conflicts(blocks)
    breadth = _breadth(blocks, n_steps)
    n = range(len(blocks))
    keys: list[Callable[[int], tuple]] = [
        lambda i: (-blocks[i].size, blocks[i].first),
        lambda i: (-breadth[i], -blocks[i].size, blocks[i].first),
        lambda i: (-blocks[i].size * (blocks[i].last - blocks[i].first + 1), blocks[i].first),
        lambda i: (blocks[i].first - blocks[i].last, -blocks[i].size),
        lambda i: (blocks[i].first, -blocks[i].size),
    ]
    best_order: list[int] = []
    best = Placement([], -1)
    for key in keys:
        order = sorted(n, key=key)
        result = place(blocks, order, conflict)
        if best.arena < 0 or result.arena < best.arena:
            best_order, best = order, result
        if best.arena == bound:
            return best
    rng = random.Random(seed)
    for _ in range(iterations):
        top = [b for b in n if blocks[b].size and best.offsets[b] + blocks[b].size == best.arena]
        moved = rng.choice(top)
        order = list(best_order)
        pos = order.index(moved)
        order.insert(rng.randrange(pos + 1), order.pop(pos))
        result = place(blocks, order, conflict)
        if result.arena <= best.arena:
            best_order, best = order, result
            if best.arena == bound:
                break
    return best


def _breadth(blocks: Sequence[Block], n_steps: int) -> list[int]:
    """For each block, the most bytes alive at any step of its life."""
    live = [0] * n_steps
    for b in blocks:
        for step in range(b.first, b.last + 1):
            live[step] += b.size
    return [max(live[b.first : b.last + 1], default=0) for b in blocks]


STRATEGIES: dict[str, Callable[[Sequence[Block], int], Placement]] = {
    "greedy-size": greedy_by_size,
    "search": search,
}


def get_strategy(name: str) -> Callable[[Sequence[Block], int], Placement]:
    if name not in STRATEGIES:
        raise OnnxfuseError(f"unknown strategy {name!r} (choose from: {', '.join(STRATEGIES)})")
    return STRATEGIES[name]
