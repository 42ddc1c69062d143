"""`onnxfuse explain`: what a failed guard read, the model after the other rules, and a
rule its target's packs leave out."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from helpers import make_model, tensor_input
from onnx import helper, numpy_helper

from onnxfuse.cli.main import main

MUL_BY_ONE = """
rules:
  - name: mul-by-one
    description: x * 1 is x
    source: |
      f (X, a) => (Y) {
        Y = Mul(X, a)
      }
    where: ["scalar(a) == 1.0", "shape(Y) == shape(X)"]
    replacement: |
      f (X) => (Y) {
        Y = Identity(X)
      }
    verify:
      dtypes: [float]
      inputs: {X: [3], a: {shape: [], constant: true, value: 1.0}}
"""


def _explain(capsys, *args: str) -> tuple[int, str, str]:
    code = main(["explain", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_a_false_guard_shows_what_it_read_and_unnamed_nodes_by_their_output(tmp_path: Path, capsys):
    scale = numpy_helper.from_array(np.array(0.2, np.float32), "a")
    model = make_model(
        [helper.make_node("Mul", ["x", "a"], ["y"])],  # unnamed
        [tensor_input("x", [3])],
        [tensor_input("y", [3])],
        [scale],
    )
    onnx.save(model, tmp_path / "m.onnx")
    (tmp_path / "rules.yaml").write_text(MUL_BY_ONE)
    code, out, _ = _explain(
        capsys,
        str(tmp_path / "m.onnx"),
        "--rule",
        "mul-by-one",
        "--rules",
        str(tmp_path / "rules.yaml"),
        "--no-builtin",
    )
    assert code == 0
    assert out.strip() == "Mul 'y': no match: guard 'scalar(a) == 1.0' is false (a = 0.2)"


def _conv_bn_relu(path: Path) -> str:
    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.random((4, 3, 3, 3)).astype(np.float32), "w")]
    weights += [
        numpy_helper.from_array((rng.random(4) + 0.5).astype(np.float32), name) for name in "sbmv"
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
        helper.make_node("BatchNormalization", ["c", "s", "b", "m", "v"], ["n"], name="bn"),
        helper.make_node("Relu", ["n"], ["y"], name="relu"),
    ]
    model = make_model(
        nodes, [tensor_input("x", [1, 3, 8, 8])], [tensor_input("y", [1, 4, 6, 6])], weights
    )
    onnx.save(model, path)
    return str(path)


def test_after_rules_explains_the_model_the_other_rules_leave(tmp_path: Path, capsys):
    model = _conv_bn_relu(tmp_path / "m.onnx")
    _, out, _ = _explain(capsys, model, "--rule", "fused-conv-relu")
    assert "Relu 'relu': no match: expected Conv -> C, found BatchNormalization 'bn'" in out
    code, out, _ = _explain(capsys, model, "--rule", "fused-conv-relu", "--after-rules")
    assert code == 0
    assert out.splitlines()[0].startswith("after the other rules (conv-bn-fold"), out
    assert out.splitlines()[1] == "Relu 'relu': matches", out


def test_a_rule_whose_pack_is_for_another_target_is_named(tmp_path: Path, capsys):
    model = _conv_bn_relu(tmp_path / "m.onnx")
    code, out, err = _explain(capsys, model, "--rule", "nchwc-conv", "--target", "cuda")
    assert code == 2 and out == ""
    assert err.strip() == (
        "onnxfuse: error: rule 'nchwc-conv' is in pack 'nchwc', which is only for "
        "target(s) cpu, not 'cuda' (give --target cpu)"
    )


@pytest.mark.parametrize(("target", "tried"), [("cpu", False), ("cpu:block=8", True)])
def test_a_rule_the_targets_parameters_leave_out_is_not_tried(
    tmp_path: Path, capsys, target, tried
):
    model = _conv_bn_relu(tmp_path / "m.onnx")
    code, out, _ = _explain(capsys, model, "--rule", "nchwc-conv", "--target", target)
    assert code == 0
    refused = "nchwc-conv: not tried on target 'cpu': the guard \"'block' in target_params\""
    assert (refused in out) is not tried, out
