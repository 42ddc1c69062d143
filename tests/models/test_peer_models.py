"""onnxruntime's own fusion test models: optimizing them never breaks them,
and matches onnxruntime's own optimizer.

For every model of tests/data/ort-fusion that onnxruntime can load (the ones onnx's
checker refuses are repaired first, REPAIRED), the optimized model (all built-in
packs, --target cpu) passes the full checker, computes the same outputs where the model is
deterministic and runnable at its declared shapes, and meets the parity
criterion of peer_parity.py: no more nodes than onnxruntime's
ORT_ENABLE_EXTENDED result, every op type onnxruntime created in it (unless
onnxfuse fused further), and the models meant not to fuse left with
onnxruntime's ops. peer_parity.KNOWN_GAPS lists, exactly, the models that miss
it and why.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from helpers import assert_close, random_feeds, run
from peer_parity import KNOWN_GAPS, op_histogram, parity_failures

from onnxfuse.api import optimize_file, select_rules
from onnxfuse.errors import ModelError
from onnxfuse.passes.pipeline import Options
from onnxfuse.targets.capabilities import load_target

DATA = Path(__file__).parents[1] / "data" / "ort-fusion"
MANIFEST = json.loads((DATA / "manifest.json").read_text())
LOADABLE = [e for e in MANIFEST if e["ops_after_ort_cpu_extended"] is not None]


# Models where a fused kernel's last-bit differences are summed by a later op.
LOOSER = {
    # BiasGelu differs from the decomposed form by <= 2.4e-7 per element (both
    # are as close to exact Gelu); the following MatMul sums 3072 of them into
    # outputs near 100.
    "bias_gelu_fusion_recompute.onnx": (1.3e-6, 1e-4),
}


# Models onnxruntime runs that onnx's checker refuses, and what onnxfuse repairs in each
# (files/repair.py) before optimizing them like the rest.
REPAIRED = {
    # Graph outputs declared without a shape.
    "conv_clip11.onnx": ["output-undeclared"],
    "conv_hardsigmoid.onnx": ["output-undeclared"],
    # A declared output shape the graph does not compute (folding makes it visible).
    "reshape_fusion_concat_subgraph_not_triggered.onnx": ["output-shape"],
    "reshape_fusion_with_graph_inputs.onnx": ["output-shape"],
}


def _not_comparable(entry: dict) -> str | None:
    notes = entry["notes"] or ""
    for marker in ("random", "ORT run fail", "not executed"):
        if marker in notes:
            return notes
    return None


@pytest.fixture(scope="module")
def rules():
    return select_rules()


@pytest.mark.parametrize("entry", LOADABLE, ids=[e["model"] for e in LOADABLE])
def test_optimized_peer_model_is_valid_and_equivalent(entry, rules, tmp_path):
    path = DATA / entry["model"]
    out = tmp_path / "out.onnx"
    # Saving runs onnx's full checker on the result before it is renamed into place.
    # Parity measures what the rules fuse: the rules that wait for a profile's
    # measurement on cpu (SkipLayerNormalization) fire too.
    options = Options(target=load_target("cpu"), gate_by_profile=False)
    report = optimize_file(path, out, rules, options)
    kinds = [r.kind for r in report.repairs if r.kind in _CHECKER_REPAIRS]
    assert kinds == REPAIRED.get(entry["model"], [])
    assert report.nodes_after <= entry["nodes_before"]
    original = onnx.load(path)
    if not _not_comparable(entry):
        _assert_same_outputs(entry, original, out)
    ours = op_histogram(onnx.load(out).graph)
    failed = parity_failures(
        entry["model"], entry["ops_before"], entry["ops_after_ort_cpu_extended"], ours
    )
    known, reason = KNOWN_GAPS.get(entry["model"], (frozenset(), ""))
    assert failed == known, (
        f"parity with onnxruntime: fails {sorted(failed)}, known gaps {sorted(known)} "
        f"({reason or 'none'}); ours {dict(ours)}, onnxruntime's "
        f"{entry['ops_after_ort_cpu_extended']}"
    )


# The repairs of a model onnx's checker refuses; names and unused opset imports are mended
# in many of these models, which the checker accepts.
_CHECKER_REPAIRS = {
    "output-undeclared",
    "output-shape",
    "declared-vs-inferred",
    "declared-vs-tensor",
}


def test_a_model_onnxruntime_refuses_is_refused():
    # A node reads a value nothing defines (the generator commented its producer out).
    entry = next(e for e in MANIFEST if e["model"] == "layer_norm_weight_test_activation.onnx")
    assert entry["ops_after_ort_cpu_extended"] is None
    with pytest.raises(ModelError, match="fails the ONNX checker: Nodes in a graph must be"):
        optimize_file(DATA / entry["model"], None, [])


def test_known_gaps_name_loadable_models():
    names = {e["model"] for e in LOADABLE}
    assert set(KNOWN_GAPS) <= names


def _assert_same_outputs(entry: dict, original: onnx.ModelProto, out: Path) -> None:
    feeds = random_feeds(original, dims=entry["dims"])
    actual, expected = run(out, feeds), run(original, feeds)
    if entry["model"] in LOOSER:
        rtol, atol = LOOSER[entry["model"]]
        for a, e in zip(actual, expected):
            np.testing.assert_allclose(a, e, rtol=rtol, atol=atol, equal_nan=True)
    else:
        assert_close(actual, expected)


@pytest.mark.parametrize(
    ("model", "before", "ort", "ours", "failed"),
    [
        # Fused like onnxruntime, or with fewer nodes of the same ops: parity.
        ("m.onnx", {"MatMul": 1, "Add": 1}, {"Gemm": 1}, {"Gemm": 1}, set()),
        # One node more than onnxruntime.
        ("m.onnx", {"Add": 2, "Dropout": 1}, {"Add": 2}, {"Add": 2, "Dropout": 1}, {"more nodes"}),
        # onnxruntime's fused op missing, and no fusion of our own beside it.
        ("m.onnx", {"MatMul": 1, "Add": 1}, {"Gemm": 1}, {"MatMul": 1}, {"lacks fused ops"}),
        # Missing, but ours fused further: fewer nodes and an op neither has.
        (
            "m.onnx",
            {"ReduceMean": 2, "Sub": 1, "Cast": 1},
            {"ReduceMean": 2, "Sub": 1, "Cast": 2},
            {"LayerNormalization": 1},
            set(),
        ),
        # An op of our own does not excuse a missing one at the same node count.
        (
            "m.onnx",
            {"A": 2},
            {"com.microsoft::F": 1, "A": 1},
            {"B": 1, "A": 1},
            {"lacks fused ops"},
        ),
        # Nothing left at all (a graph without outputs).
        ("m.onnx", {"MatMulInteger": 1}, {"com.microsoft::DynamicQuantizeMatMul": 1}, {}, set()),
        # Meant not to fuse: onnxruntime's ops, a dead node fewer at most.
        ("x_no_fusion.onnx", {"Add": 1, "Neg": 1}, {"Add": 1, "Neg": 1}, {"Add": 1}, set()),
        (
            "x_no_fusion.onnx",
            {"Add": 1, "Identity": 1},
            {"Add": 1, "Identity": 1},
            {"Add": 1, "Dropout": 1},
            {"not left as onnxruntime leaves it"},
        ),
    ],
)
def test_parity_criterion(model, before, ort, ours, failed):
    assert parity_failures(model, before, ort, ours) == failed
