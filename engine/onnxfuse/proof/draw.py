"""Drawing values from draw specs, with hypothesis or with a seeded generator.

The instance builder only asks a ``Drawer`` for integers, floats, choices and
permutations. ``HypothesisDrawer`` answers from ``st.data()`` (so hypothesis
can shrink a failing instance to a small one); ``RandomDrawer`` answers from a
NumPy generator (quick sampling, e.g. to find one firing instance).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Protocol

import numpy as np

from onnxfuse.proof.domain import (
    Broadcast,
    Computed,
    ListOf,
    Literal,
    OneOf,
    Permutation,
    Range,
    Spec,
    Subset,
)
from onnxfuse.proof.expr import ExprError

_MAX_LIST = 64


class Reject(Exception):
    """The drawn instance is outside what can be built (not a failure of the rule)."""


class Drawer(Protocol):
    def integer(self, low: int, high: int) -> int: ...

    def floating(self, low: float, high: float) -> float: ...

    def index(self, count: int) -> int: ...

    def permutation(self, count: int) -> list[int]: ...


class RandomDrawer:
    def __init__(self, seed: int = 0):
        self.rng = np.random.default_rng(seed)

    def integer(self, low: int, high: int) -> int:
        return int(self.rng.integers(low, high + 1))

    def floating(self, low: float, high: float) -> float:
        return float(self.rng.uniform(low, high)) if high > low else float(low)

    def index(self, count: int) -> int:
        return int(self.rng.integers(0, count))

    def permutation(self, count: int) -> list[int]:
        return [int(i) for i in self.rng.permutation(count)]


class HypothesisDrawer:
    def __init__(self, data: Any):
        from hypothesis import strategies as st

        self.data = data
        self.st = st

    def integer(self, low: int, high: int) -> int:
        return self.data.draw(self.st.integers(low, high))

    def floating(self, low: float, high: float) -> float:
        if high <= low:
            return float(low)
        return self.data.draw(
            self.st.floats(low, high, allow_nan=False, allow_infinity=False, allow_subnormal=False)
        )

    def index(self, count: int) -> int:
        return self.data.draw(self.st.integers(0, count - 1)) if count > 1 else 0

    def permutation(self, count: int) -> list[int]:
        return list(self.data.draw(self.st.permutations(list(range(count)))))


def draw(spec: Spec, env: Mapping[str, Any], drawer: Drawer, where: str) -> Any:
    """A value of ``spec``, drawn with ``drawer``; expressions see ``env``."""
    if isinstance(spec, Literal):
        return spec.value
    if isinstance(spec, Computed):
        return evaluate(spec.expr, env, where)
    if isinstance(spec, OneOf):
        return draw(spec.options[drawer.index(len(spec.options))], env, drawer, where)
    if isinstance(spec, Range):
        low = evaluate(spec.low, env, where)
        high = evaluate(spec.high, env, where)
        if not all(isinstance(b, (int, float)) and not isinstance(b, bool) for b in (low, high)):
            raise ExprError(f"{where}: range bounds must be numbers, got {low!r}..{high!r}")
        if high < low:
            raise Reject(f"{where}: empty range {low}..{high}")
        if isinstance(low, int) and isinstance(high, int):
            return drawer.integer(low, high)
        if not (math.isfinite(low) and math.isfinite(high)):
            raise ExprError(f"{where}: a float range needs finite bounds")
        return drawer.floating(float(low), float(high))
    if isinstance(spec, ListOf):
        rank = _count(draw(spec.rank, env, drawer, where), where)
        return [draw(spec.each, env, drawer, where) for _ in range(rank)]
    if isinstance(spec, Permutation):
        return drawer.permutation(_count(draw(spec.size, env, drawer, where), where))
    if isinstance(spec, Subset):
        pool = draw(spec.pool, env, drawer, where)
        items = list(range(pool)) if isinstance(pool, int) else list(pool)
        size = _count(draw(spec.size, env, drawer, where), where)
        if size > len(items):
            raise Reject(f"{where}: cannot pick {size} of {len(items)} items")
        chosen = sorted(drawer.permutation(len(items))[:size])
        return [items[i] for i in chosen]
    if isinstance(spec, Broadcast):
        shape = [int(d) for d in draw(spec.shape, env, drawer, where)]
        keep = len(shape) - drawer.integer(0, len(shape))
        tail = shape[len(shape) - keep :]
        return [1 if drawer.index(3) == 0 else d for d in tail]
    raise TypeError(f"unknown spec {spec!r}")


def evaluate(expr: Any, env: Mapping[str, Any], where: str) -> Any:
    try:
        return expr.evaluate(env)
    except ExprError as exc:
        raise ExprError(f"{where}: '{expr.text}': {exc}") from None


def _count(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0 or value > _MAX_LIST:
        raise ExprError(f"{where}: a count must be an integer in 0..{_MAX_LIST}, got {value!r}")
    return value
