"""Real exports (tests/exports) optimized for every target: every created node runs there.

The node-by-node check of test_targets_peer_models, on a BERT, a GPT-2 and a CNN
export: op, opset, element types and the target's limits for each node the
optimization created; the result passes onnx's full checker; a result in
standard ops only (and every cpu result) runs in onnxruntime's CPU provider
with the original's outputs.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest
from helpers import run
from test_targets_peer_models import unsupported_created_nodes

from onnxfuse.api import select_rules
from onnxfuse.files.model_io import check_model, load_model
from onnxfuse.graph.traversal import all_graphs
from onnxfuse.passes.pipeline import Options, optimize
from onnxfuse.targets.capabilities import builtin_target_names, load_target

pytest.importorskip("torch")
pytest.importorskip("transformers")

from exports.export import get_export
from exports.models import MODELS_BY_NAME

pytestmark = pytest.mark.slow

EXPORTS = (("bert-mask", "dynamo", 18), ("gpt2", "legacy", 14), ("resnet-small", "dynamo", 18))


@pytest.fixture(scope="module")
def exports():
    found = []
    for name, exporter, opset in EXPORTS:
        export = get_export(MODELS_BY_NAME[name], exporter, opset)
        found.append((export, run(str(export.path), export.feeds)))
    return found


@pytest.fixture(scope="module")
def rules():
    return select_rules()


@pytest.mark.parametrize("target_name", builtin_target_names())
def test_every_created_node_of_an_export_runs_on_the_target(exports, rules, target_name):
    target = load_target(target_name)
    problems: list[str] = []
    for export, expected in exports:
        model = load_model(export.path)
        before = {n.name for g in all_graphs(model) for n in g}
        optimize(model, rules, Options(target=target))
        check_model(model)
        problems += unsupported_created_nodes(model, before, target, export.name)
        standard = all(n.domain in ("", "ai.onnx") for g in all_graphs(model) for n in g)
        if target_name == "cpu" or standard:
            actual = run(ir.serde.serialize_model(model), export.feeds)
            for a, e in zip(actual, expected):
                np.testing.assert_allclose(a, e, rtol=1e-4, atol=1e-5)
    assert not problems, "\n".join(problems)
