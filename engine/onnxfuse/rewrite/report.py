"""What a run did: per-rule counts, node counts, why rewriting stopped early, and what
was repaired in the model as read."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from onnxfuse.targets.coverage import Coverage


class StopKind(enum.Enum):
    """Why rewriting stopped before a fixpoint (no StopReason at all: it reached one)."""

    ITERATION_CAP = "iteration-cap"
    REWRITE_CAP = "rewrite-cap"
    OSCILLATION = "oscillate"


@dataclass(frozen=True)
class StopReason:
    """A typed early stop: callers match on ``kind`` and ``rules``, never on the text."""

    kind: StopKind
    limit: int | None = None  # the cap that was reached
    rules: tuple[str, ...] = ()  # the rules that undo each other's rewrites

    def __str__(self) -> str:
        if self.kind is StopKind.ITERATION_CAP:
            return (
                f"iteration cap reached ({self.limit}); "
                "the result is valid but may not be a fixpoint"
            )
        if self.kind is StopKind.REWRITE_CAP:
            return f"rewrite cap reached ({self.limit})"
        return "rules oscillate (they undo each other's rewrites): " + ", ".join(self.rules)

    def to_json(self) -> dict[str, object]:
        return {
            "kind": self.kind.value,
            "limit": self.limit,
            "rules": list(self.rules),
            "message": str(self),
        }


# The model's meta entry holding the Repairs made when it was read (files/repair.py).
REPAIRS_META = "onnxfuse.repairs"
# Places a repair's one line names before "and N more"; the JSON lists them all.
_PLACES_SHOWN = 3


@dataclass(frozen=True)
class Repair:
    """A defect of the model as read that onnxruntime runs through, mended: ``kind`` to
    match on, ``what`` was done, ``places`` it was done at (values, nodes, opsets)."""

    kind: str
    what: str
    places: tuple[str, ...]

    def __str__(self) -> str:
        shown = ", ".join(self.places[:_PLACES_SHOWN])
        more = len(self.places) - _PLACES_SHOWN
        return f"repaired: {self.what}, {shown}" + (f" and {more} more" if more > 0 else "")

    def to_json(self) -> dict[str, object]:
        return {
            "kind": self.kind,
            "what": self.what,
            "places": list(self.places),
            "message": str(self),
        }


@dataclass
class RuleStats:
    matched: int = 0
    applied: int = 0
    seconds: float = 0.0
    blocked: int = 0  # matches whose rewrite would break an invariant, not applied
    blocked_reason: str | None = None  # the first such reason
    # The first block that is the rule's own mistake (apply.IllTyped): `check` fails on it.
    ill_typed: str | None = None

    @property
    def tried(self) -> bool:
        """The rule matched somewhere, or would have but was blocked."""
        return bool(self.matched or self.applied or self.blocked)


@dataclass(frozen=True)
class TraceStep:
    """One rewrite, in the order made: the rule, the node it anchored on, the nodes it
    removed and those it left in the graph (``folded``: created nodes computed on
    constants, folded at once)."""

    rule: str
    anchor: str
    replaced: tuple[str, ...]
    created: tuple[str, ...]
    folded: int = 0
    graph: str = ""  # "" for the main graph

    def __str__(self) -> str:
        where = f" in graph '{self.graph}'" if self.graph else ""
        folded = f" ({self.folded} folded)" if self.folded else ""
        return (
            f"{self.rule} at '{self.anchor}'{where}: replaced {_names(self.replaced)}; "
            f"created {_names(self.created)}{folded}"
        )

    def to_json(self) -> dict[str, object]:
        return {
            "rule": self.rule,
            "anchor": self.anchor,
            "graph": self.graph,
            "replaced": list(self.replaced),
            "created": list(self.created),
            "folded": self.folded,
        }


def _names(names: tuple[str, ...]) -> str:
    return ", ".join(f"'{name}'" for name in names) or "nothing"


@dataclass
class Report:
    nodes_before: int = 0
    nodes_after: int = 0
    iterations: int = 0
    rewrites: int = 0
    folded: int = 0
    seconds: float = 0.0
    stopped: StopReason | None = None
    rules: dict[str, RuleStats] = field(default_factory=dict)
    ops_before: dict[str, int] = field(default_factory=dict)
    ops_after: dict[str, int] = field(default_factory=dict)
    # Bytes on disk of the input and of the written output (None: nothing written), and
    # what made the output larger, when it is.
    bytes_before: int | None = None
    bytes_after: int | None = None
    larger_because: list[str] = field(default_factory=list)
    repairs: list[Repair] = field(default_factory=list)
    trace: list[TraceStep] | None = None  # each rewrite, when asked for (None: not)
    # What the target cannot run, before the rules and after (None: no target).
    coverage_before: Coverage | None = None
    coverage_after: Coverage | None = None

    def inlined_created(self) -> dict[str, int]:
        """Ops the run added that the target runs only as their ONNX function body:
        onnxruntime inlines them again when it loads the model."""
        if self.coverage_before is None or self.coverage_after is None:
            return {}
        before = self.coverage_before.inlined
        return {
            op: count - before.get(op, 0)
            for op, count in self.coverage_after.inlined.items()
            if count > before.get(op, 0)
        }

    def to_json(self, all_rules: bool = False) -> dict[str, object]:
        """The report as JSON: ``rules`` holds the rules tried (matched or blocked), or
        every rule of the run with ``all_rules``; ``trace`` only when one was kept."""
        found: dict[str, object] = {
            "nodes_before": self.nodes_before,
            "nodes_after": self.nodes_after,
            "iterations": self.iterations,
            "rewrites": self.rewrites,
            "folded": self.folded,
            "seconds": round(self.seconds, 6),
            "stopped": self.stopped.to_json() if self.stopped is not None else None,
            "rules": {
                name: {
                    "matched": s.matched,
                    "applied": s.applied,
                    "blocked": s.blocked,
                    "blocked_reason": s.blocked_reason,
                    "seconds": round(s.seconds, 6),
                }
                for name, s in self.rules.items()
                if all_rules or s.tried
            },
            "ops_before": self.ops_before,
            "ops_after": self.ops_after,
            "bytes_before": self.bytes_before,
            "bytes_after": self.bytes_after,
            "larger_because": self.larger_because,
            "repairs": [repair.to_json() for repair in self.repairs],
        }
        if self.coverage_before is not None and self.coverage_after is not None:
            found["coverage"] = {
                "before": self.coverage_before.to_json(),
                "after": self.coverage_after.to_json(),
                "inlined_created": self.inlined_created(),
            }
        if self.trace is not None:
            found["trace"] = [step.to_json() for step in self.trace]
        return found
