"""The peers onnxfuse is measured against, as the tests and benchmarks import them: they
live in the package (onnxfuse.zoo.peers), which `onnxfuse zoo --peers` runs."""

from onnxfuse.zoo.peers import (
    ANCHORS,
    ATOL,
    RTOL,
    TOOLS,
    Result,
    best_anchor,
    compare,
    count_nodes,
    latency_ms,
    op_histogram,
    quiet,
    round_robin,
    run,
    session,
    worst_error,
)

__all__ = [
    "ANCHORS",
    "ATOL",
    "RTOL",
    "TOOLS",
    "Result",
    "best_anchor",
    "compare",
    "count_nodes",
    "latency_ms",
    "op_histogram",
    "quiet",
    "round_robin",
    "run",
    "session",
    "worst_error",
]
