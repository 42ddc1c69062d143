"""Real exporter output plans given only its inputs' shapes, and runs inside its arena.

torch's legacy exporter computes shapes at run time (Shape, Gather, Range, Slice to a
length) that onnx inference leaves unknown; the dynamo exporter writes dims as sympy
expressions (``Min(64, seq)``). Each export is planned from the shapes of the inputs
it was exported with, then run inside the arena on those inputs.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from exports.export import export_by_name

from onnxfuse.files.model_io import load_model
from onnxfuse.planner import check_plan, plan_model, verify_plan

pytestmark = pytest.mark.slow

# Onnx inference alone left tensors of the legacy ones unsized, and dims of the dynamo
# ones were expressions the planner asked to bind.
EXPORTS = (
    "bert-mask-legacy14",
    "bert-mask-dynamo18",
    "gpt2-past-legacy17",
    "t5-encoder-legacy17",
    "llama-gqa-legacy17",
    "vit-legacy17",
)


@pytest.mark.parametrize("name", EXPORTS)
def test_an_export_plans_from_its_input_shapes(name):
    export = export_by_name(name)
    model = load_model(export.path)
    shapes = {input_name: list(feed.shape) for input_name, feed in export.feeds.items()}
    plan = plan_model(model, input_shapes=shapes)
    assert plan.traced == []
    check_plan(plan, model)
    result = verify_plan(model, plan, feeds=export.feeds)
    assert result.ok, result
