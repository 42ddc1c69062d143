"""onnxruntime's fusion test models, optimized for every target.

For each target, every loadable model of tests/data/ort-fusion where some
rule can fire at all (probed once without gating) is optimized with all
built-in packs. Then:

- each node the optimization created runs on the target: its op, opset,
  element types (read from the result's types) and the target's limits
  are checked node by node;
- the result passes onnx's full checker;
- where the result uses standard ops only (always for `cpu`), onnxruntime's
  CPU provider runs it and its outputs match the original's.

The only created nodes not checked are the Identity copies the cleanup writes
when two graph outputs would otherwise be one value (common subexpressions):
they are no rewrite's doing, and every runtime runs an Identity (a provider
without one leaves that copy to the CPU fallback).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from helpers import assert_close, random_feeds, run

from onnxfuse.api import select_rules
from onnxfuse.errors import ModelError
from onnxfuse.files.model_io import check_model, load_model
from onnxfuse.graph.traversal import all_graphs
from onnxfuse.passes.pipeline import Options, optimize
from onnxfuse.targets.capabilities import builtin_target_names, load_target
from onnxfuse.targets.facts import NodeFacts, value_facts

DATA = Path(__file__).parents[1] / "data" / "ort-fusion"
MANIFEST = json.loads((DATA / "manifest.json").read_text())
LOADABLE = [e for e in MANIFEST if e["ops_after_ort_cpu_extended"] is not None]
# As in test_peer_models: a fused kernel's last-bit differences summed by a later op.
LOOSER = {"bias_gelu_fusion_recompute.onnx": (1.3e-6, 1e-4)}


def _comparable(entry: dict) -> bool:
    notes = entry["notes"] or ""
    return not any(m in notes for m in ("random", "ORT run fail", "not executed"))


class _Corpus:
    """The models worth optimizing per target, and outputs computed once each."""

    def __init__(self) -> None:
        self.rules = select_rules()
        self.models: list[tuple[dict, onnx.ModelProto]] = []
        for entry in LOADABLE:
            try:
                model = load_model(DATA / entry["model"])
            except ModelError:
                continue  # not valid ONNX: test_peer_models covers the refusal
            proto = ir.serde.serialize_model(model)
            probe = ir.from_proto(proto)
            if optimize(probe, self.rules, Options(target=None)).rewrites:
                self.models.append((entry, proto))
        self.outputs: dict[str, list[np.ndarray]] = {}

    def run(self, model: onnx.ModelProto, entry: dict) -> list[np.ndarray]:
        key = hashlib.sha256(model.SerializeToString()).hexdigest()
        if key not in self.outputs:
            feeds = random_feeds(onnx.load(DATA / entry["model"]), dims=entry["dims"])
            self.outputs[key] = run(model, feeds)
        return self.outputs[key]


@pytest.fixture(scope="module")
def corpus() -> _Corpus:
    return _Corpus()


def _facts(node: ir.Node, model: ir.Model) -> NodeFacts:
    ir_version = model.ir_version or 10
    used = [o if o.uses() or o.is_graph_output() else None for o in node.outputs]
    return NodeFacts(
        node.domain,
        node.op_type,
        model.opset_imports.get(node.domain, 1),
        [value_facts(v, ir_version) for v in node.inputs],
        [value_facts(v, ir_version) for v in used],
        {name: attr.value for name, attr in node.attributes.items()},
    )


def _interface_copy(node: ir.Node) -> bool:
    return node.op_type == "Identity" and all(o.is_graph_output() for o in node.outputs)


def unsupported_created_nodes(model: ir.Model, before: set[str], target, label: str) -> list[str]:
    """Each node the optimization created (not in ``before``) that ``target`` cannot run."""
    problems = []
    for graph in all_graphs(model):
        for node in graph:
            if node.name in before or node.op_type == "Constant" or _interface_copy(node):
                continue
            problem = target.check_node(_facts(node, model))
            if problem is not None:
                problems.append(f"{label}: node '{node.name}': {problem}")
    return problems


def test_the_probe_keeps_enough_models(corpus):
    assert len(corpus.models) >= 40


@pytest.mark.parametrize("target_name", builtin_target_names())
def test_every_created_node_runs_on_the_target(corpus, target_name):
    target = load_target(target_name)
    problems: list[str] = []
    compared = 0
    for entry, proto in corpus.models:
        model = ir.from_proto(proto)
        before = {n.name for g in all_graphs(model) for n in g}
        optimize(model, corpus.rules, Options(target=target))
        check_model(model)  # onnx's full checker
        problems += unsupported_created_nodes(model, before, target, entry["model"])
        standard = all(n.domain in ("", "ai.onnx") for g in all_graphs(model) for n in g)
        if (target_name == "cpu" or standard) and _comparable(entry):
            result = ir.serde.serialize_model(model)
            actual, expected = corpus.run(result, entry), corpus.run(proto, entry)
            rtol, atol = LOOSER.get(entry["model"], (None, None))
            if rtol is None:
                assert_close(actual, expected)
            else:
                for a, e in zip(actual, expected):
                    np.testing.assert_allclose(a, e, rtol=rtol, atol=atol, equal_nan=True)
            compared += 1
    assert not problems, "\n".join(problems)
    assert compared >= 20, f"only {compared} results were run in onnxruntime"
