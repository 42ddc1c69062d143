"""The fuzz oracle excuses the original's own rounding noise, and nothing more."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from onnxfuse.fuzz import noise, oracle
from onnxfuse.language.rulefile import load_rule_file

ROOT = Path(__file__).resolve().parents[2]

# Rewrites x / sqrt(2) as x * 0.7072: off by 1e-4 relative, a wrong constant.
NEARLY_RIGHT = """
rules:
  - name: div-sqrt2-as-rounded-mul
    source: |
      f (X) => (Y) {
        r = Constant<value_float = 1.4142135>()
        Y = Div(X, r)
      }
    target: |
      f (X) => (Y) {
        k = Constant<value_float = 0.7072>()
        Y = Mul(X, k)
      }
"""


def _div_model() -> onnx.ModelProto:
    nodes = [
        helper.make_node("Constant", [], ["r"], value_float=1.4142135),
        helper.make_node("Div", ["X", "r"], ["D"]),
        helper.make_node("Tanh", ["D"], ["Y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [3, 5])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [3, 5])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _original(model: onnx.ModelProto) -> oracle.Original:
    feeds = [("normal", oracle.make_feeds(model, 0, False))]
    original = oracle.validate(model, feeds)
    assert isinstance(original, oracle.Original)
    return original


def test_a_slightly_wrong_constant_is_still_a_mismatch(tmp_path):
    path = tmp_path / "nearly.yaml"
    path.write_text(NEARLY_RIGHT)
    rules = load_rule_file(path)
    outcome = oracle.check(_original(_div_model()), "cpu", rules)
    assert outcome.kind == "mismatch", outcome
    assert "rounding noise" in outcome.message
    assert outcome.applied == ["div-sqrt2-as-rounded-mul"]


def test_noise_is_a_few_ulps_on_a_well_conditioned_model():
    model = _div_model()
    feeds = [("normal", oracle.make_feeds(model, 0, False))]
    floors = noise.noise_floor(model, lambda data: oracle.run_all(data, feeds))
    assert floors is not None
    expected = oracle.run_all(model.SerializeToString(), feeds)[0][0]
    relative = floors[0][0] / np.maximum(np.abs(expected), 1e-3)
    assert 0 < relative.max() < 16 * np.finfo(np.float32).eps


def test_values_computed_from_constants_are_not_perturbed():
    nodes = [
        helper.make_node("Constant", [], ["two"], value_float=2.0),
        helper.make_node("Identity", ["two"], ["exponent"]),
        helper.make_node("Pow", ["X", "exponent"], ["Y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [4])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    perturbed = noise.perturbed(model, 1.0)
    noisy = [n.output[0] for n in perturbed.graph.node if n.op_type == "Sin"]
    assert noisy == ["Y__wave"]
    feeds = [("normal", {"X": np.array([-2.0, -1.5, 0.5, 3.0], np.float32)})]
    (outputs,) = oracle.run_all(perturbed.SerializeToString(), feeds)
    assert np.all(np.isfinite(outputs[0]))


def test_only_a_domain_that_says_the_rule_differs_on_nan_is_compared_on_plain_inputs() -> None:
    """special_values: {differs: true} (the blocked max pool, as onnxruntime's own NCHWc
    rewrite) is compared on plain inputs only; a domain that merely leaves NaN/inf out
    (ort-attention-sdpa) is compared on special inputs too."""
    applied = ["nchwc-global-maxpool", "ort-attention-sdpa", "relu-relu"]
    assert oracle.nonfinite_deviations(applied) == ["nchwc-global-maxpool"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--max-steps", "0"], "--max-steps must be >= 1"),
        (["--each-rule", "1", "--table", "/nonexistent/x.tsv"], "not a file in an existing dir"),
        (["--qdq", "--each-rule", "1"], "--qdq generates models for --iterations"),
    ],
)
def test_bad_fuzzer_arguments_exit_2_without_a_traceback(args, message):
    result = subprocess.run(
        [sys.executable, "-m", "fuzz", "graphs", "--iterations", "1", "--no-save", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr and message in result.stderr
