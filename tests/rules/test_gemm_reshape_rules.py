"""reshape-gemm-reshape-matmul (rules/core/gemm_reshape.yaml) on graphs built as the
exporters write GPT-2's Conv1D: the 3-D input flattened by Reshape(X, Concat([-1],
Slice(Shape(X), -1))), a Gemm, and a Reshape back to Concat(batch, seq, [N]) taken
from X's own shape at run time. The rule must turn it into MatMul + Add on the 3-D
input and leave other reshapes alone.
"""

from __future__ import annotations

import numpy as np
import pytest
from core_pack_support import F32, RULES, build, fire, no_fire, node, ops
from helpers import optimize_proto

RULE = "reshape-gemm-reshape-matmul"
I64 = np.int64
K, N = 8, 12


def conv1d(
    back: tuple[int, int] = (0, 1),
    gemm_attrs: dict | None = None,
    bias_shape: tuple[int, ...] = (N,),
    first_shape: str = "computed",
) -> object:
    """X [batch, seq, K] → Reshape [-1, K] → Gemm(W [K, N], C) → Reshape to
    (dims(X)[back[0]], dims(X)[back[1]], N), shapes computed from Shape(X)."""
    rng = np.random.default_rng(0)
    inits = {
        "W": rng.standard_normal((K, N)).astype(F32),
        "C": rng.standard_normal(bias_shape).astype(F32),
        "minus1": np.array([-1], I64),
        "last": np.array([-1], I64),
        "big": np.array([2**62], I64),
        "n": np.array([N], I64),
        "zero": np.array([0], I64),
        "one": np.array([1], I64),
    }
    nodes = [node("Shape", ["X"], "shx")]
    if first_shape == "computed":
        nodes += [
            node("Slice", ["shx", "last", "big"], "k"),
            node("Concat", ["minus1", "k"], "s1", axis=0),
        ]
    else:  # a constant shape given as text: "transposed" keeps K first
        inits["s1"] = np.array([K, -1], I64)
    idx = {0: "zero", 1: "one"}
    nodes += [
        node("Gather", ["shx", idx[back[0]]], "d0", axis=0),
        node("Gather", ["shx", idx[back[1]]], "d1", axis=0),
        node("Concat", ["d0", "d1", "n"], "s2", axis=0),
        node("Reshape", ["X", "s1"], "f"),
        node("Gemm", ["f", "W", "C"], "g", **(gemm_attrs or {})),
        node("Reshape", ["g", "s2"], "y"),
    ]
    return build(nodes, {"X": (["batch", "seq", K], F32)}, inits=inits)


def test_fires_on_the_exporters_conv1d():
    model = conv1d()
    result = fire(
        model, RULE, feeds={"X": np.random.default_rng(1).standard_normal((2, 5, K)).astype(F32)}
    )
    kept = ops(result)
    assert "Gemm" not in kept and "Reshape" not in kept
    assert kept.count("MatMul") == 1 and kept.count("Add") == 1


@pytest.mark.parametrize("bias_shape", [(1, N), (1,), ()])
def test_bias_shapes_that_broadcast_alike(bias_shape):
    result = fire(conv1d(bias_shape=bias_shape), RULE, special=True)
    assert "Gemm" not in ops(result)


def test_fires_with_special_values():
    fire(conv1d(), RULE, special=True)


def test_swapped_leading_dims_do_not_fire():
    # Reshape back to (seq, batch, N): a transpose of the rows, not the input's layout.
    no_fire(conv1d(back=(1, 0)), RULE)


def test_not_a_flatten_does_not_fire():
    no_fire(conv1d(first_shape="transposed"), RULE)


@pytest.mark.parametrize("attrs", [{"alpha": 2.0}, {"beta": 0.5}], ids=["alpha", "beta"])
def test_other_gemm_attributes_do_not_fire(attrs):
    no_fire(conv1d(gemm_attrs=attrs), RULE)


def test_per_row_bias_does_not_fire():
    # A [batch*seq, N] bias cannot be written as a 3-D Add without knowing batch*seq.
    model = build(
        [
            node("Reshape", ["X", "s1"], "f"),
            node("Gemm", ["f", "W", "C"], "g"),
            node("Reshape", ["g", "s2"], "y"),
        ],
        {"X": ([2, 3, K], F32), "C": ([6, N], F32)},
        inits={
            "W": np.ones((K, N), F32),
            "s1": np.array([-1, K], I64),
            "s2": np.array([2, 3, N], I64),
        },
    )
    no_fire(model, RULE)


def test_never_leaves_a_gemm_on_a_3d_input():
    """With the whole core pack (matmul-add-gemm included), the MatMul stays a MatMul."""
    _, result = optimize_proto(conv1d(), list(RULES.values()))
    assert "Gemm" not in ops(result)


# -- heads merged into the flatten (reshape-gemm-reshape-matmul-heads) -----------

HEADS = "reshape-gemm-reshape-matmul-heads"


def conv1d_heads(back: tuple[int, int] = (0, 1), heads: int = 2) -> object:
    """X [batch, seq, heads, K / heads] → Reshape [-1, K] → Gemm → Reshape to
    (dims(X)[back[0]], dims(X)[back[1]], N), as the dynamo export of GPT-2's c_proj
    reads once its merge-heads Reshape and the Conv1D flatten are one Reshape."""
    rng = np.random.default_rng(2)
    inits = {
        "W": rng.standard_normal((K, N)).astype(F32),
        "C": rng.standard_normal((N,)).astype(F32),
        "s1": np.array([-1, K], I64),
        "n": np.array([N], I64),
    }
    starts = {0: (0, 1), 1: (1, 2)}
    nodes = []
    for i, axis in enumerate(back):
        nodes.append(node("Shape", ["X"], f"d{i}", start=starts[axis][0], end=starts[axis][1]))
    nodes += [
        node("Concat", ["d0", "d1", "n"], "s2", axis=0),
        node("Reshape", ["X", "s1"], "f", allowzero=1),
        node("Gemm", ["f", "W", "C"], "g"),
        node("Reshape", ["g", "s2"], "y", allowzero=1),
    ]
    return build(nodes, {"X": (["batch", "seq", heads, K // heads], F32)}, inits=inits, opset=18)


def test_heads_fire_and_merge_the_heads_once():
    result = fire(conv1d_heads(), HEADS, special=True, rules=[HEADS])
    kept = ops(result)
    assert "Gemm" not in kept
    assert kept.count("Reshape") == 1 and kept.count("MatMul") == 1 and kept.count("Add") == 1


def test_heads_with_swapped_leading_dims_do_not_fire():
    no_fire(conv1d_heads(back=(1, 0)), HEADS)


# -- reshape-same-dims -----------------------------------------------------------

SAME = "reshape-same-dims"


def mask_reshape(source: str = "M", second: str = "minus1", allowzero: int = 1) -> object:
    """Reshape(M, Concat(Shape(source)[0:1], second)): the dynamo exporter's mask view."""
    inits = {"minus1": np.array([-1], I64), "zero": np.array([0], I64)}
    nodes = [
        node("Shape", [source], "b", start=0, end=1),
        node("Concat", ["b", second], "s", axis=0),
        node("Reshape", ["M", "s"], "r", allowzero=allowzero),
        # A graph output cannot be renamed onto the graph input M: a consumer in between.
        node("Identity", ["r"], "y"),
    ]
    inputs = {"M": (["batch", "seq"], np.int64), "O": (["batch", "seq"], np.int64)}
    return build(nodes, inputs, inits=inits, opset=18)


def test_same_dims_removes_the_mask_view():
    from core_pack_support import RULES as CORE

    model = mask_reshape()
    report, result = optimize_proto(model, [CORE[SAME]])
    assert report.rules[SAME].applied == 1
    assert ops(result) == ["Identity"]
    fire(
        model, SAME, feeds={"M": np.arange(6, dtype=I64).reshape(2, 3), "O": np.zeros((2, 3), I64)}
    )


def test_same_dims_needs_the_dimension_of_the_same_value():
    # Another input's batch dimension, though it has the same dim_param name, is not
    # proven equal to M's: the shape stays.
    no_fire(mask_reshape(source="O"), SAME)


def test_same_dims_zero_copies_only_without_allowzero():
    fire(mask_reshape(second="zero", allowzero=0), SAME)
    no_fire(mask_reshape(second="zero", allowzero=1), SAME)
