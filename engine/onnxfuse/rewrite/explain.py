"""Explain: for each node where a rule could anchor, whether it matches, and if not,
the furthest failure (a ``Mismatch``) as the rule's own words."""

from __future__ import annotations

from dataclasses import dataclass

import onnx_ir as ir

from onnxfuse.errors import OnnxfuseError
from onnxfuse.graph.names import node_label
from onnxfuse.graph.traversal import owned_graphs
from onnxfuse.language.rule import Rule
from onnxfuse.rewrite.conditions import RuleMatcher
from onnxfuse.rewrite.matcher import ModelContext, Rank
from onnxfuse.targets.capabilities import Target


@dataclass
class Explanation:
    node: str
    op_type: str
    graph: str  # "" for the main graph
    matched: bool
    reason: str | None
    rank: Rank | None = None  # how far the failed match got (None: it matched)


def explain_rule(
    model: ir.Model, rule: Rule, node_name: str | None = None, target: Target | None = None
) -> list[Explanation]:
    """``rule`` tried at each node it could anchor on (or at ``node_name`` only), each
    graph at its own opsets (a function body at the function's)."""
    version = model.ir_version or 10
    results = []
    for graph, opsets, _ in owned_graphs(model):
        matcher = RuleMatcher(rule, ModelContext(version, opsets), target)
        for node in graph:
            if node_name is not None and node.name != node_name:
                continue
            if node_name is None and (node.domain, node.op_type) not in rule.anchor_keys:
                continue
            match = matcher.match(node)
            results.append(
                Explanation(
                    node=node_label(node),
                    op_type=node.op_type,
                    graph="" if graph is model.graph else (graph.name or "<subgraph>"),
                    matched=match is not None,
                    reason=None if match is not None else str(matcher.mismatch),
                    rank=None
                    if match is not None or matcher.mismatch is None
                    else matcher.mismatch.rank,
                )
            )
    if node_name is not None and not results:
        raise OnnxfuseError(f"no node named '{node_name}' in the model")
    return results
