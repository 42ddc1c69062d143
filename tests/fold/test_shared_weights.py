"""Shared weights stay shared: no fold or rewrite leaves two copies of one weight.

Hand-built models here; the ALBERT and tied-embedding GPT-2 exports are checked in
tests/models/test_shared_weight_exports.py.
"""

from __future__ import annotations

import numpy as np
import onnx
from helpers import assert_same_outputs, make_model, optimize_proto, tensor_input
from onnx import helper, numpy_helper

from onnxfuse.api import select_rules

RNG = np.random.default_rng(0)
LAYERS = 4


def _weight(name: str, seed: int = 0, shape=(48, 48)) -> onnx.TensorProto:
    array = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    return numpy_helper.from_array(array, name)


def _large(model: onnx.ModelProto) -> list[onnx.TensorProto]:
    return [t for t in model.graph.initializer if numpy_helper.to_array(t).size > 1024]


def _weight_bytes(model: onnx.ModelProto) -> int:
    return sum(t.ByteSize() for t in model.graph.initializer)


def _layers_through_identity() -> onnx.ModelProto:
    """A legacy ALBERT export's form: each layer reads the shared weight through its own
    Identity."""
    nodes, previous = [], "x"
    for layer in range(LAYERS):
        nodes.append(helper.make_node("Identity", ["W"], [f"w{layer}"]))
        nodes.append(helper.make_node("MatMul", [previous, f"w{layer}"], [f"h{layer}"]))
        previous = f"h{layer}"
    return make_model(
        nodes,
        [tensor_input("x", ["batch", 48])],
        [tensor_input(previous, ["batch", 48])],
        [_weight("W")],
    )


def test_identity_of_a_shared_weight_is_not_copied():
    model = _layers_through_identity()
    _, optimized = optimize_proto(model, [])
    assert [t.name for t in _large(optimized)] == ["W"]
    assert [n.op_type for n in optimized.graph.node] == ["MatMul"] * LAYERS
    assert _weight_bytes(optimized) == _weight_bytes(model)
    assert_same_outputs(model, optimized)


def test_identity_of_a_weight_that_is_a_graph_output_keeps_the_output():
    """The graph output needs its own name: the copy is the output, not a duplicate."""
    model = make_model(
        [
            helper.make_node("Identity", ["W"], ["w_out"]),
            helper.make_node("MatMul", ["x", "W"], ["y"]),
        ],
        [tensor_input("x", [2, 48])],
        [tensor_input("y", [2, 48]), tensor_input("w_out", [48, 48])],
        [_weight("W")],
    )
    _, optimized = optimize_proto(model, [])
    assert [o.name for o in optimized.graph.output] == ["y", "w_out"]
    assert_same_outputs(model, optimized)


def _tied_embedding(vocab: int = 256) -> onnx.ModelProto:
    """A tied LM head: the table W [vocab, 128] embeds the ids (Gather) and, transposed,
    projects the hidden state back to the vocabulary."""
    nodes = [
        helper.make_node("Gather", ["W", "ids"], ["e"]),
        helper.make_node("Relu", ["e"], ["h"]),
        helper.make_node("Transpose", ["W"], ["wt"], perm=[1, 0]),
        helper.make_node("MatMul", ["h", "wt"], ["logits"]),
    ]
    return make_model(
        nodes,
        [tensor_input("ids", [2, 3], onnx.TensorProto.INT64)],
        [tensor_input("logits", [2, 3, vocab])],
        [_weight("W", shape=(vocab, 128))],
    )


def test_a_tied_table_is_not_stored_transposed_beside_itself():
    """Folding Transpose(W) would keep W for the Gather and add Wᵀ: the table twice."""
    model = _tied_embedding()
    _, optimized = optimize_proto(model, [])
    assert [t.name for t in _large(optimized)] == ["W"]
    assert _weight_bytes(optimized) == _weight_bytes(model)
    assert_same_outputs(model, optimized)
    # With its own target's rules the head reads W itself (FusedMatMul transB).
    _, fused = optimize_proto(model, select_rules(target="cpu"))
    assert [t.name for t in _large(fused)] == ["W"]
    assert_same_outputs(model, fused)


def test_a_small_table_read_twice_still_folds():
    """Below SHARED_COPY_MIN_BYTES a transposed copy costs less than a Transpose per run."""
    model = _tied_embedding(vocab=8)
    _, optimized = optimize_proto(model, [])
    assert "Transpose" not in [n.op_type for n in optimized.graph.node]
    assert_same_outputs(model, optimized)


def test_equal_large_weights_are_stored_once():
    """Two initializers of one content (as a rewrite that packs shared weights per layer
    leaves them) become one; readers read the one kept."""
    model = make_model(
        [
            helper.make_node("MatMul", ["x", "A"], ["a"]),
            helper.make_node("MatMul", ["x", "B"], ["b"]),
            helper.make_node("Add", ["a", "b"], ["y"]),
        ],
        [tensor_input("x", [2, 48])],
        [tensor_input("y", [2, 48])],
        [_weight("A", seed=1), _weight("B", seed=1)],
    )
    _, optimized = optimize_proto(model, [])
    assert len(_large(optimized)) == 1
    assert_same_outputs(model, optimized)


def test_weights_of_one_shape_but_other_content_stay_apart():
    """Negative cases: equal on the probed elements but not elsewhere; -0.0 against 0.0
    (equal as floats, not as stored bytes); and NaN, which is not equal to itself as a
    float but is the same weight when its bytes are."""
    base = np.random.default_rng(2).standard_normal((64, 64)).astype(np.float32)
    other = base.copy()
    other[0, 1] += 1.0  # off the probe's stride of 16
    zero, negative_zero = np.zeros((64, 64), np.float32), np.zeros((64, 64), np.float32)
    negative_zero[5, 5] = -0.0
    nan_a = base.copy()
    nan_a[3, 3] = np.nan
    nan_b = nan_a.copy()
    weights = {"P": base, "Q": other, "Z": zero, "N": negative_zero, "NA": nan_a, "NB": nan_b}
    nodes, outputs = [], []
    for name in weights:
        nodes.append(helper.make_node("MatMul", ["x", name], [f"y_{name}"]))
        outputs.append(tensor_input(f"y_{name}", [2, 64]))
    model = make_model(
        nodes,
        [tensor_input("x", [2, 64])],
        outputs,
        [numpy_helper.from_array(a, n) for n, a in weights.items()],
    )
    _, optimized = optimize_proto(model, [])
    kept = sorted(t.name for t in _large(optimized))
    assert kept == ["N", "NA", "P", "Q", "Z"]  # only the two NaN weights are one


def test_an_overridable_weight_is_not_merged():
    """An initializer that is also a graph input is a default the caller may replace: it
    is not the same weight as an equal constant."""
    weight = _weight("W", seed=3)
    default = _weight("D", seed=3)
    model = make_model(
        [
            helper.make_node("MatMul", ["x", "W"], ["a"]),
            helper.make_node("MatMul", ["x", "D"], ["b"]),
            helper.make_node("Add", ["a", "b"], ["y"]),
        ],
        [tensor_input("x", [2, 48]), tensor_input("D", [48, 48])],
        [tensor_input("y", [2, 48])],
        [weight, default],
    )
    _, optimized = optimize_proto(model, [])
    assert sorted(t.name for t in _large(optimized)) == ["D", "W"]


def test_shared_weights_through_every_builtin_rule():
    """The built-in packs on the Identity form: still one copy, same outputs."""
    model = _layers_through_identity()
    _, optimized = optimize_proto(model, select_rules())
    assert len(_large(optimized)) == 1
    assert_same_outputs(model, optimized)
