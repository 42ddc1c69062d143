"""The guard function meets_transpose(Y, T, perm): a shared Transpose may sink through one
of its uses when the Transpose it leaves on Y merges with another right away."""

from __future__ import annotations

from pathlib import Path

import onnx
from helpers import assert_same_outputs, make_model, optimize_proto, rules_from_text, tensor_input
from onnx import helper

CORE = Path(__file__).resolve().parents[2] / "rules" / "core"
NCHW, NHWC, TO_NHWC = [1, 3, 4, 5], [1, 4, 5, 3], [0, 2, 3, 1]

# A shared Transpose sinks through Neg when the moved one meets another (`keep`).
SHARED_NEG = """
rules:
  - name: shared-neg
    description: Neg(Transpose(X)) becomes Transpose(Neg(X)), also for a shared Transpose.
    benefit: 2
    references: [math]
    keep: [T]
    source: |
      f <perm> (X) => (Y) {
        T = Transpose<perm = @perm>(X)
        Y = Neg(T)
      }
    where:
      - consumers(T) == 1 or (perm is not None and meets_transpose(Y, T, perm))
    target: |
      f <perm> (X) => (Y) {
        Z = Neg(X)
        Y = Transpose<perm = @perm>(Z)
      }
"""


def _core_transpose_rules() -> list:
    """Core's moves and merges, read from their files (cheaper than every pack)."""
    found = []
    for name in ("transpose.yaml", "merge.yaml", "eliminate.yaml"):
        path = CORE / name
        found += [r for r in rules_from_text(path.read_text(), str(path)) if "transpose" in r.name]
    return found


def _model(nodes, inputs, outputs) -> onnx.ModelProto:
    return make_model(
        nodes,
        [tensor_input(n, s) for n, s in inputs],
        [tensor_input(n, s) for n, s in outputs],
    )


def _shared(other_perm=TO_NHWC, other_extra_use=False, meeting_op="Add") -> onnx.ModelProto:
    """t = Transpose(x), used by Neg and Relu; Neg's output meets Transpose(w)."""
    nodes = [
        helper.make_node("Transpose", ["x"], ["t"], perm=TO_NHWC),
        helper.make_node("Neg", ["t"], ["a"]),
        helper.make_node("Relu", ["t"], ["r"]),
        helper.make_node("Transpose", ["w"], ["u"], perm=other_perm),
        helper.make_node(meeting_op, ["a", "u"], ["y"]),
    ]
    outputs = [("y", NHWC), ("r", NHWC)]
    if other_extra_use:
        nodes.append(helper.make_node("Sigmoid", ["u"], ["s"]))
        outputs.append(("s", NHWC))
    return _model(
        nodes, [("x", NCHW), ("w", NCHW if other_perm == TO_NHWC else [1, 5, 3, 4])], outputs
    )


def _fired(model: onnx.ModelProto, rules=None) -> tuple[int, onnx.ModelProto]:
    report, result = optimize_proto(model, rules or rules_from_text(SHARED_NEG))
    return report.rules["shared-neg"].applied, result


def test_shared_transpose_moves_when_it_meets_one_of_its_perm():
    applied, result = _fired(_shared())
    assert applied == 1
    assert_same_outputs(_shared(), result)


def test_other_perm_does_not_meet():
    applied, _ = _fired(_shared(other_perm=[0, 3, 1, 2]))
    assert applied == 0


def test_other_transpose_with_another_use_does_not_meet():
    # It would stay for its other use: the moved Transpose would be one more.
    applied, _ = _fired(_shared(other_extra_use=True))
    assert applied == 0


def test_consumer_transpose_meets():
    nodes = [
        helper.make_node("Transpose", ["x"], ["t"], perm=TO_NHWC),
        helper.make_node("Neg", ["t"], ["a"]),
        helper.make_node("Relu", ["t"], ["r"]),
        helper.make_node("Transpose", ["a"], ["y"], perm=[0, 3, 1, 2]),
    ]
    model = _model(nodes, [("x", NCHW)], [("y", NCHW), ("r", NHWC)])
    applied, result = _fired(model)
    assert applied == 1
    assert_same_outputs(model, result)


def _diamond(extra_use: bool) -> onnx.ModelProto:
    """Sub(T, Neg(T)): after the move both Sub inputs are Transposes of one perm."""
    nodes = [
        helper.make_node("Transpose", ["x"], ["t"], perm=TO_NHWC),
        helper.make_node("Neg", ["t"], ["a"]),
        helper.make_node("Sub", ["t", "a"], ["y"]),
    ]
    outputs = [("y", NHWC)]
    if extra_use:
        nodes.append(helper.make_node("Relu", ["t"], ["r"]))
        outputs.append(("r", NHWC))
    return _model(nodes, [("x", NCHW)], outputs)


def test_diamond_meets_the_shared_transpose_itself():
    applied, result = _fired(_diamond(extra_use=False))
    assert applied == 1
    assert_same_outputs(_diamond(extra_use=False), result)


def test_diamond_with_a_third_use_does_not_meet():
    applied, _ = _fired(_diamond(extra_use=True))
    assert applied == 0


def test_two_uses_of_the_moved_output_do_not_meet():
    nodes = [
        helper.make_node("Transpose", ["x"], ["t"], perm=TO_NHWC),
        helper.make_node("Neg", ["t"], ["a"]),
        helper.make_node("Relu", ["t"], ["r"]),
        helper.make_node("Transpose", ["w"], ["u"], perm=TO_NHWC),
        helper.make_node("Add", ["a", "u"], ["y"]),
        helper.make_node("Exp", ["a"], ["e"]),
    ]
    model = _model(nodes, [("x", NCHW), ("w", NCHW)], [("y", NHWC), ("r", NHWC), ("e", NHWC)])
    applied, _ = _fired(model)
    assert applied == 0


def test_with_the_transpose_rules_the_region_loses_every_transpose():
    """A channels-last region read back as NCHW: with core's rules the moved Transpose
    merges, the shared one then sinks through Relu alone, and all cancel (4 -> 0)."""
    rules = rules_from_text(SHARED_NEG) + _core_transpose_rules()
    nodes = [
        helper.make_node("Transpose", ["x"], ["t"], perm=TO_NHWC),
        helper.make_node("Neg", ["t"], ["a"]),
        helper.make_node("Relu", ["t"], ["r"]),
        helper.make_node("Transpose", ["w"], ["u"], perm=TO_NHWC),
        helper.make_node("Add", ["a", "u"], ["s"]),
        helper.make_node("Transpose", ["s"], ["y"], perm=[0, 3, 1, 2]),
        helper.make_node("Transpose", ["r"], ["z"], perm=[0, 3, 1, 2]),
    ]
    model = _model(nodes, [("x", NCHW), ("w", NCHW)], [("y", NCHW), ("z", NCHW)])
    applied, result = _fired(model, rules)
    assert applied == 1
    assert [n.op_type for n in result.graph.node if n.op_type == "Transpose"] == []
    assert_same_outputs(model, result)

    # Without the meeting Transpose the shared one stays: nothing is added.
    alone = _model(nodes[:3] + nodes[6:], [("x", NCHW)], [("a", NHWC), ("z", NCHW)])
    applied, result = _fired(alone, rules)
    assert applied == 0
    assert sum(n.op_type == "Transpose" for n in result.graph.node) <= 2
