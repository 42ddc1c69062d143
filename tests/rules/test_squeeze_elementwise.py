"""rules/core/squeeze_elementwise.yaml: Squeeze, an op with a one-element operand, Unsqueeze.

The derived property tests (tests/proof) draw ranks, axes and operands; here:
onnxruntime's constant_folding_with_scalar_shape_to_initializer test model
(Squeeze, x + 0, Unsqueeze at opset 12), where the rule leaves one Add and so
keeps the -0.0 to +0.0 of x + 0, and the shapes that must stay.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from core_pack_support import F32, build, fire, no_fire, node, ops
from helpers import optimize_proto, run

from onnxfuse.api import select_rules

PEER = Path(__file__).parent.parent / "data" / "ort-fusion"
I64 = np.int64


def test_peer_model_becomes_one_add_and_keeps_signed_zero():
    model = onnx.load(PEER / "constant_folding_with_scalar_shape_to_initializer.onnx")
    _, result = optimize_proto(model, select_rules())
    assert ops(result) == ["Add"]
    x = np.array([-0.0], dtype=np.float32)
    (expected,), (actual,) = run(model, {"input": x}), run(result, {"input": x})
    assert actual[0] == 0.0 and not np.signbit(actual[0]) and not np.signbit(expected[0])


def _chain(x_shape, axes, unsqueeze_axes, c_shape, op="Add", opset=17, attr=False):
    if attr:
        nodes = [
            node("Squeeze", ["x"], "s", axes=axes),
            node(op, ["s", "c"], "t"),
            node("Unsqueeze", ["t"], "y", axes=unsqueeze_axes),
        ]
        inits = {}
    else:
        nodes = [
            node("Squeeze", ["x", "a"], "s"),
            node(op, ["s", "c"], "t"),
            node("Unsqueeze", ["t", "b"], "y"),
        ]
        inits = {"a": np.array(axes, I64), "b": np.array(unsqueeze_axes, I64)}
    inputs = {"x": (x_shape, F32), "c": (c_shape, F32)}
    return build(nodes, inputs, inits=inits, opset=opset)


@pytest.mark.parametrize(
    ("op", "x_shape", "axes", "back", "c_shape"),
    [
        ("Add", [1, 3, 1, 4], [0, 2], [2, 0], []),
        ("Sub", [3, 1], [-1], [1], [1]),
        ("Mul", [1, 5], [0], [-2], [1]),
        ("Div", [2, 1, 3], [1], [1], []),
    ],
)
@pytest.mark.parametrize("attr", [False, True])
def test_the_op_moves_onto_the_input(op, x_shape, axes, back, c_shape, attr):
    model = _chain(x_shape, axes, back, c_shape, op, opset=12 if attr else 17, attr=attr)
    name = ("squeeze-unsqueeze-attr" if attr else "squeeze-unsqueeze") + f"[{op}]"
    assert ops(fire(model, name, special=True)) == [op]


@pytest.mark.parametrize(
    ("x_shape", "axes", "back", "c_shape"),
    [
        ([1, 3, 1], [0], [2], []),  # the unit axis comes back elsewhere
        ([3, 1], [1], [1], [3]),  # c has three elements: it would align with another axis
        ([1, 1], [0], [0], [1, 1]),  # c has more dimensions than the squeezed value
    ],
)
def test_shapes_that_stay(x_shape, axes, back, c_shape):
    no_fire(_chain(x_shape, axes, back, c_shape), "squeeze-unsqueeze[Add]")


def test_a_squeezed_value_with_other_users_stays():
    nodes = [
        node("Squeeze", ["x", "a"], "s"),
        node("Add", ["s", "c"], "t"),
        node("Unsqueeze", ["t", "a"], "y"),
        node("Neg", ["s"], "z"),
    ]
    model = build(
        nodes,
        {"x": ([1, 3], F32), "c": ([], F32)},
        outputs=["y", "z"],
        inits={"a": np.array([0], I64)},
    )
    no_fire(model, "squeeze-unsqueeze[Add]")
