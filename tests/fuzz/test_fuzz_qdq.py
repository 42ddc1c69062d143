"""Whole QDQ models in the graph fuzzer: onnxruntime's quantizer writes them, the oracle
allows each unit the step its fused kernel may round differently, and nothing more."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from helpers import make_model, tensor_input
from hypothesis import HealthCheck, Phase, given, seed, settings
from onnx import helper

from onnxfuse.fuzz import graph_runner, noise, oracle
from onnxfuse.fuzz.qdq_graphs import QuantForm, qdq_graph_cases, quantize
from onnxfuse.language.rulefile import load_rule_file

ROOT = Path(__file__).resolve().parents[2]
U8S8 = QuantForm("uint8", "int8", False, False, False, False, False)


def _add_model(dead: bool = False) -> onnx.ModelProto:
    """Sigmoid(x) + LeakyRelu(x), quantized U8S8: an Add unit of two activations whose
    zero points differ (the Sigmoid's is 0, the sum's is not); ``dead``: and a Sigmoid
    unit whose result nothing uses."""
    nodes = [
        helper.make_node("Sigmoid", ["x"], ["s"], name="sigmoid"),
        helper.make_node("LeakyRelu", ["x"], ["r"], name="leaky", alpha=0.3),
        helper.make_node("Add", ["s", "r"], ["y"], name="add"),
    ]
    if dead:
        nodes.append(helper.make_node("Sigmoid", ["r"], ["unused"], name="dead"))
    model = make_model(nodes, [tensor_input("x", [2, 16])], [tensor_input("y", [2, 16])])
    calibration = [oracle.make_feeds(model, 100 + i, False) for i in range(3)]
    return quantize(model, U8S8, calibration)


def _original(model: onnx.ModelProto) -> oracle.Original:
    original = oracle.validate(model, [("normal", oracle.make_feeds(model, 0, False))])
    assert isinstance(original, oracle.Original)
    return original


def _wrong_add(tmp_path: Path, y_scale: str, y_zero: str) -> Path:
    """The built-in qdq-add, its output's scale or zero point taken from the wrong input,
    ahead of the right one; its verify domain still claims one step."""
    text = (ROOT / "rules/qdq/elementwise.yaml").read_text()
    block = text[text.index("  - name: qdq-add\n") : text.index("  - name: qdq-mul\n")]
    right = "QLinearAdd(a, sa, za, b, sb, zb, ys, yz)"
    assert right in block
    block = block.replace("name: qdq-add", "name: wrong-qdq-add").replace(
        "benefit: 20", "benefit: 99"
    )
    block = block.replace(right, f"QLinearAdd(a, sa, za, b, sb, zb, {y_scale}, {y_zero})")
    path = tmp_path / "wrong.yaml"
    path.write_text("rules:\n" + block)
    return path


def test_a_qdq_model_is_onnxruntimes_own_quantization():
    ops = Counter(n.op_type for n in _add_model().graph.node)
    assert ops["Add"] == 1 and ops["QuantizeLinear"] == 4 and ops["DequantizeLinear"] == 4


def test_the_right_fusion_passes_within_one_step():
    outcome = oracle.check(_original(_add_model()), "cpu")
    assert outcome.status == "pass", outcome
    assert "qdq-add" in outcome.applied


@pytest.mark.parametrize(
    ("y_scale", "y_zero", "what"),
    [("ys", "za", "zero point"), ("sa", "yz", "scale")],
)
def test_a_fusion_with_a_wrong_output_parameter_is_a_mismatch(tmp_path, y_scale, y_zero, what):
    original = _original(_add_model())
    path = _wrong_add(tmp_path, y_scale, y_zero)
    oracle.use_rules([path])  # the run's rules: the oracle reads the steps it declares
    try:
        outcome = oracle.check(original, "cpu", load_rule_file(path))
    finally:
        oracle.use_rules([])
    assert outcome.kind == "mismatch", (what, outcome)
    assert "1 step(s) at each of its quantized units" in outcome.message
    assert outcome.applied == ["wrong-qdq-add"]


def test_the_qdq_fuzzer_finds_a_wrong_zero_point(tmp_path):
    oracle.use_rules([_wrong_add(tmp_path, "ys", "za")])
    try:
        tally = graph_runner.run_chunk(3, 0, 40, ["cpu"], None, qdq=True)
    finally:
        oracle.use_rules([])
    assert any("wrong-qdq-add" in signature for signature in tally.failures), tally.failures


def test_a_short_qdq_campaign_passes_for_cpu_and_the_unit_consumers():
    tally = graph_runner.run_chunk(1, 0, 12, ["cpu", "cpu:int8=on", "qnn"], None, qdq=True)
    assert tally.failed == 0, tally.failures
    assert tally.passed == 12 and tally.discarded <= 1
    fused = tally.fired["cpu"]
    assert sum(n for rule, n in fused.items() if rule.startswith("qdq-")) >= 10
    assert not tally.fired.get("qnn") or all(
        rule.startswith(("qdq-dequantize", "qdq-propagate")) for rule in tally.fired["qnn"]
    )


def test_the_requantized_model_moves_its_last_unit_by_exactly_one_step():
    model = _add_model()
    feeds = [("normal", oracle.make_feeds(model, 0, False))]
    (base,) = oracle.run_all(model.SerializeToString(), feeds)
    (moved,) = oracle.run_all(noise.requantized(model, 1, 1, True).SerializeToString(), feeds)
    (untouched,) = oracle.run_all(noise.requantized(model, 1, 1, False).SerializeToString(), feeds)
    scale = next(
        onnx.numpy_helper.to_array(i) for i in model.graph.initializer if i.name == "y_scale"
    )
    step = np.abs(moved[0] - base[0]) / scale
    below_top = base[0] < (255 - 128) * scale  # not saturated
    assert np.allclose(step[below_top], 1.0, atol=1e-3) and below_top.any()
    # The Add's inputs come from the Sigmoid and LeakyRelu units, which move them.
    assert not np.array_equal(untouched[0], base[0])


def test_onnxruntimes_own_qdq_fusions_pass_the_oracle(tmp_path):
    """The oracle's bound is no tighter than onnxruntime's own QDQ fusions on the
    generated models (ORT_ENABLE_EXTENDED, which fuses units into QLinear* kernels)."""
    seen: Counter = Counter()

    @seed(5)
    @settings(
        max_examples=30,
        database=None,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(qdq_graph_cases())
    def check(case):
        if case.error:
            return
        original = oracle.validate(case.model, oracle.feeds_for(case))
        assert isinstance(original, oracle.Original)
        path = tmp_path / "fused.onnx"
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
        options.optimized_model_filepath = str(path)
        options.log_severity_level = 4
        ort.InferenceSession(case.model.SerializeToString(), options, ["CPUExecutionProvider"])
        fused = onnx.load(path)
        seen.update(n.op_type for n in fused.graph.node if n.domain == "com.microsoft")
        outputs = oracle.run_all(fused.SerializeToString(), original.feed_sets)
        values = list(case.model.graph.output)
        problem = oracle.beyond_rounding_noise(
            original, outputs, original.outputs, values, original.feed_sets, original.tolerances, 1
        )
        assert problem is None, (case, problem)

    check()
    assert sum(seen.values()) >= 20, seen


def test_a_unit_that_is_no_longer_a_unit_is_named():
    model = _add_model()
    assert oracle.broken_unit(model, ir.from_proto(model)) is None
    renamed = ir.from_proto(model)
    next(node for node in renamed.graph if node.op_type == "Add").name = "other"
    assert oracle.broken_unit(model, renamed) == "the QDQ node unit of Add 'add' is gone"
    exposed = ir.from_proto(model)
    add = next(node for node in exposed.graph if node.op_type == "Add")
    exposed.graph.outputs.append(add.outputs[0])  # a float output: no longer quantized only
    message = "Add 'add' is no longer between DQ and Q nodes"
    assert oracle.broken_unit(model, exposed) == message


def test_a_dead_unit_may_go_for_a_target_that_keeps_units():
    model = _add_model(dead=True)
    assert Counter(n.op_type for n in model.graph.node)["Sigmoid"] == 2
    outcome = oracle.check(_original(model), "qnn")
    assert outcome.status == "pass", outcome
