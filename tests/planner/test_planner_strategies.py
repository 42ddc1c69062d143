"""Placement strategies on bare blocks: optimality where known, soundness always."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from onnxfuse.planner.strategies import STRATEGIES, Block, greedy_by_size, lower_bound, search

# Greedy by size puts the 64-byte block on top (448); 384 is the peak, so optimal.
HARD = [Block(192, 1, 1), Block(256, 3, 5), Block(192, 1, 2), Block(64, 2, 3)]


def test_search_reaches_the_bound_where_greedy_by_size_does_not():
    assert lower_bound(HARD, 6) == 384
    assert greedy_by_size(HARD, 6).arena == 448
    assert search(HARD, 6).arena == 384


def _assert_sound(blocks: list[Block], offsets: list[int], arena: int) -> None:
    for i, a in enumerate(blocks):
        assert offsets[i] >= 0 and offsets[i] + a.size <= arena
        for j in range(i):
            b = blocks[j]
            if a.size and b.size and a.first <= b.last and b.first <= a.last:
                assert offsets[i] + a.size <= offsets[j] or offsets[j] + b.size <= offsets[i]


blocks_strategy = st.lists(
    st.tuples(st.integers(0, 8), st.integers(0, 11), st.integers(0, 3)).map(
        lambda t: Block(t[0] * 64, t[1], t[1] + t[2])
    ),
    max_size=25,
)


@given(blocks_strategy)
def test_every_strategy_places_soundly_and_search_never_loses(blocks):
    arenas = {}
    for name, strategy in STRATEGIES.items():
        placement = strategy(blocks, 15)
        _assert_sound(blocks, placement.offsets, placement.arena)
        assert placement.arena >= lower_bound(blocks, 15)
        arenas[name] = placement.arena
    assert arenas["search"] <= arenas["greedy-size"]
