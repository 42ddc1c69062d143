"""The Transpose rules of the core pack (rules/core/transpose.yaml), on hand-written graphs.

Each family has positive cases (the rule fires, onnxruntime outputs agree) and negative
ones (wrong perm, other uses, broadcasting that cannot be remapped). Whole-pack cases
check the direction: chains collapse to no Transpose, a shared Transpose is not
duplicated, and the pack reaches a fixpoint without oscillating.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from core_pack_support import CORE_RULES, F32, RULES, build, fire, no_fire, node, ops
from helpers import assert_close, optimize_proto, random_feeds, run

from onnxfuse.language.packs import builtin_rules_dir
from onnxfuse.language.rulefile import load_rule_file

UNARY = [
    "Relu", "Sigmoid", "Tanh", "Abs", "Neg", "Exp", "Log", "Sqrt", "Erf", "Reciprocal", "Floor",
    "Ceil", "Round", "Sign", "Softplus", "Softsign", "Sin", "Cos", "Not", "IsNaN", "LeakyRelu",
    "Elu", "Selu", "Celu", "ThresholdedRelu", "HardSigmoid", "Gelu", "IsInf", "Cast",
]  # fmt: skip
COMMUTATIVE = ["Add", "Mul", "Max", "Min", "Equal", "And", "Or", "Xor"]
ORDERED = ["Sub", "Div", "Pow", "Greater", "Less", "GreaterOrEqual", "LessOrEqual"]
REDUCE = ["ReduceMean", "ReduceMax", "ReduceMin", "ReduceSum"]
# The op-set families expand to one rule per member, `family[Op]`.
TRANSPOSE_RULES = {
    "transpose-transpose-shared",
    *(f"transpose-unary[{op}]" for op in UNARY),
    "transpose-clip",
    *(f"transpose-binary-const-a[{op}]" for op in COMMUTATIVE + ORDERED),
    *(f"transpose-binary-const-b[{op}]" for op in ORDERED),
    *(f"transpose-binary-transpose[{op}]" for op in COMMUTATIVE + ORDERED),
    "transpose-concat-transpose",
    "transpose-concat3-transpose",
    *(f"transpose-reduce{form}[{op}]" for op in REDUCE for form in ("", "-axes-input")),
    "transpose-pad",
    "transpose-slice",
    "transpose-where-const-cond",
    "transpose-where-const-x",
    "transpose-where-const-y",
    "transpose-where-transpose",
}

NHWC, NCHW = [0, 2, 3, 1], [0, 3, 1, 2]
PEER_MODELS = Path(__file__).resolve().parent.parent / "data" / "ort-fusion"


def transposes(model) -> int:
    return ops(model).count("Transpose")


def whole_pack(model):
    """The core pack to its fixpoint: outputs kept, no oscillation, and idempotent."""
    report, result = optimize_proto(model, CORE_RULES)
    assert report.stopped is None, report.stopped
    feeds = random_feeds(model)
    assert_close(run(result, feeds), run(model, feeds))
    again, twice = optimize_proto(result, CORE_RULES)
    assert again.rewrites == 0 and ops(twice) == ops(result)
    return result


def test_file_holds_exactly_the_listed_rules():
    path = builtin_rules_dir() / "core" / "transpose.yaml"
    assert {r.name for r in load_rule_file(path, pack="core")} == TRANSPOSE_RULES


# -- unary -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("op", "attrs"),
    [("Relu", {}), ("Exp", {}), ("LeakyRelu", {"alpha": 0.3}), ("HardSigmoid", {"beta": 0.1})],
)
def test_unary_sinks_the_transpose(op, attrs):
    m = build(
        [node("Transpose", ["x"], "t", perm=NHWC), node(op, ["t"], "y", **attrs)],
        {"x": ([2, 3, 4, 5], F32)},
    )
    out = fire(m, f"transpose-unary[{op}]")
    assert ops(out) == [op, "Transpose"]


def test_cast_keeps_its_target_type():
    m = build(
        [node("Transpose", ["x"], "t", perm=[1, 0]), node("Cast", ["t"], "y", to=7)],
        {"x": ([3, 4], F32)},
    )
    out = fire(m, "transpose-unary[Cast]")
    assert out.graph.output[0].type.tensor_type.elem_type == 7


def test_unary_with_a_shared_transpose_does_not_fire():
    m = build(
        [
            node("Transpose", ["x"], "t", perm=NHWC),
            node("Relu", ["t"], "y"),
            node("Exp", ["t"], "z"),
        ],
        {"x": ([2, 3, 4, 5], F32)},
        outputs=("y", "z"),
    )
    no_fire(m, "transpose-unary[Relu]")
    assert transposes(whole_pack(m)) == 1


# -- binary with a constant ---------------------------------------------------------


def _const_model(op, c, first=True, opset=17, x_shape=(2, 3, 4, 5)):
    inputs = ["t", "c"] if first else ["c", "t"]
    return build(
        [node("Transpose", ["x"], "t", perm=NHWC), node(op, inputs, "y")],
        {"x": (list(x_shape), F32)},
        inits={"c": c},
        opset=opset,
    )


@pytest.mark.parametrize(
    "shape", [[], [1], [3], [5, 3], [4, 1, 3], [1, 4, 5, 3], [2, 4, 5, 3], [1, 1, 1, 1]]
)
def test_constant_of_any_broadcast_rank_is_remapped(shape):
    c = np.random.default_rng(0).standard_normal(shape).astype(F32)
    # x's batch axis is 1: a [2, ...] constant grows the output, which stays exact.
    m = _const_model("Add", c, x_shape=(1, 3, 4, 5))
    out = fire(m, "transpose-binary-const-a[Add]")
    assert ops(out) == ["Add", "Transpose"]  # the transposed constant is folded


@pytest.mark.parametrize("op", ["Sub", "Div", "Pow", "Greater"])
def test_noncommutative_constant_on_either_side(op):
    c = np.random.default_rng(1).uniform(0.5, 2.0, [5, 3]).astype(F32)
    fire(_const_model(op, c, first=True), f"transpose-binary-const-a[{op}]")
    fire(_const_model(op, c, first=False), f"transpose-binary-const-b[{op}]")
    # The other side's rule does not match the mirrored graph.
    no_fire(_const_model(op, c, first=True), f"transpose-binary-const-b[{op}]")


def test_constant_with_more_axes_than_x_is_refused():
    c = np.ones([2, 1, 4, 5, 3], F32)
    m = build(
        [node("Transpose", ["x"], "t", perm=NHWC), node("Add", ["t", "c"], "y")],
        {"x": ([2, 3, 4, 5], F32)},
        inits={"c": c},
    )
    no_fire(m, "transpose-binary-const-a[Add]")


def test_runtime_operand_is_refused():
    m = build(
        [node("Transpose", ["x"], "t", perm=NHWC), node("Mul", ["t", "w"], "y")],
        {"x": ([2, 3, 4, 5], F32), "w": ([3], F32)},
    )
    no_fire(m, "transpose-binary-const-a[Mul]")


# -- two Transposes meeting at a binary op ---------------------------------------------


def _tt_model(perm_a, perm_b, shared=False, b_shape=(2, 3, 4, 5)):
    nodes = [
        node("Transpose", ["a"], "ta", perm=perm_a),
        node("Transpose", ["b"], "tb", perm=perm_b),
        node("Add", ["ta", "tb"], "y"),
    ]
    outputs = ("y",)
    if shared:
        nodes.append(node("Relu", ["ta"], "z"))
        outputs = ("y", "z")
    return build(nodes, {"a": ([2, 3, 4, 5], F32), "b": (list(b_shape), F32)}, outputs=outputs)


def test_same_perm_transposes_become_one():
    out = fire(_tt_model(NHWC, NHWC), "transpose-binary-transpose[Add]")
    assert ops(out) == ["Add", "Transpose"]


def test_different_perms_do_not_merge():
    # Both Transposes give [2, 4, 5, 3], from differently ordered inputs.
    no_fire(_tt_model(NHWC, [0, 2, 1, 3], b_shape=(2, 5, 4, 3)), "transpose-binary-transpose[Add]")


def test_shared_transpose_is_kept_for_its_other_consumer():
    out = fire(_tt_model(NHWC, NHWC, shared=True), "transpose-binary-transpose[Add]")
    assert transposes(out) == 2  # never more than before


def test_convnext_residual_loses_two_transposes():
    """ConvNeXt: x_nchw = T(ln); y = x_nchw + T(mlp); T(y) feeds the next NHWC norm."""
    m = build(
        [
            node("Transpose", ["ln"], "x_nchw", perm=NCHW),
            node("Relu", ["x_nchw"], "conv_stand_in"),
            node("Transpose", ["mlp"], "m_nchw", perm=NCHW),
            node("Add", ["x_nchw", "m_nchw"], "res"),
            node("Transpose", ["res"], "res_nhwc", perm=NHWC),
            node("Sigmoid", ["res_nhwc"], "y"),
        ],
        {"ln": ([1, 4, 4, 8], F32), "mlp": ([1, 4, 4, 8], F32)},
        outputs=("y", "conv_stand_in"),
    )
    assert transposes(m) == 3
    assert transposes(whole_pack(m)) == 1


def test_shared_transposes_on_both_sides_do_not_fire():
    m = build(
        [
            node("Transpose", ["a"], "ta", perm=NHWC),
            node("Transpose", ["b"], "tb", perm=NHWC),
            node("Add", ["ta", "tb"], "y"),
            node("Relu", ["ta"], "u"),
            node("Relu", ["tb"], "v"),
        ],
        {"a": ([2, 3, 4, 5], F32), "b": ([2, 3, 4, 5], F32)},
        outputs=("y", "u", "v"),
    )
    no_fire(m, "transpose-binary-transpose[Add]")


# -- merges -------------------------------------------------------------------------


def test_shared_inner_transpose_merges_into_every_transpose_consumer():
    m = build(
        [
            node("Transpose", ["x"], "t", perm=NHWC),
            node("Transpose", ["t"], "u", perm=NCHW),
            node("Transpose", ["t"], "v", perm=[0, 2, 1, 3]),
            node("Relu", ["u"], "y"),
            node("Relu", ["v"], "z"),
        ],
        {"x": ([2, 3, 4, 5], F32)},
        outputs=("y", "z"),
    )
    out = whole_pack(m)
    assert transposes(out) == 1  # x -> Relu directly, and one merged Transpose


def test_shared_inner_transpose_with_other_consumers_only_cancels():
    m = build(
        [
            node("Transpose", ["x"], "t", perm=NHWC),
            node("Transpose", ["t"], "v", perm=[0, 2, 1, 3]),
            node("Exp", ["t"], "e"),
            node("Relu", ["v"], "y"),
        ],
        {"x": ([2, 3, 4, 5], F32)},
        outputs=("y", "e"),
    )
    no_fire(m, "transpose-transpose-shared")


def test_chain_collapses_to_no_transpose():
    c = np.random.default_rng(2).standard_normal([3]).astype(F32)
    m = build(
        [
            node("Transpose", ["x"], "t", perm=NHWC),
            node("Relu", ["t"], "r"),
            node("Add", ["r", "c"], "a"),
            node("Sigmoid", ["a"], "s"),
            node("Transpose", ["w"], "tw", perm=NHWC),
            node("Mul", ["s", "tw"], "m"),
            node("Pad", ["m", "pads"], "p"),
            node("Transpose", ["p"], "y", perm=NCHW),
        ],
        {"x": ([2, 3, 4, 5], F32), "w": ([2, 3, 4, 5], F32)},
        inits={"c": c, "pads": np.array([0, 1, 0, 0, 0, 0, 2, 0], np.int64)},
    )
    assert transposes(m) == 3
    out = whole_pack(m)
    assert transposes(out) == 0, ops(out)


# -- Concat, reductions, Pad, Slice ------------------------------------------------------


@pytest.mark.parametrize("axis", [3, -1, 1])
def test_concat_axis_is_remapped(axis):
    m = build(
        [
            node("Transpose", ["a"], "ta", perm=NHWC),
            node("Transpose", ["b"], "tb", perm=NHWC),
            node("Concat", ["ta", "tb"], "y", axis=axis),
        ],
        {"a": ([2, 3, 4, 5], F32), "b": ([2, 3, 4, 5], F32)},
    )
    out = fire(m, "transpose-concat-transpose")
    concat = next(n for n in out.graph.node if n.op_type == "Concat")
    assert concat.attribute[0].i == NHWC[axis]


@pytest.mark.parametrize("keepdims", [0, 1])
@pytest.mark.parametrize("axes", [[1, 2], [-1], [0, 3]])
def test_reduce_axes_are_remapped(keepdims, axes):
    m = build(
        [
            node("Transpose", ["x"], "t", perm=NHWC),
            node("ReduceMax", ["t"], "y", axes=axes, keepdims=keepdims),
        ],
        {"x": ([2, 3, 4, 5], F32)},
        opset=17,
    )
    fire(m, "transpose-reduce[ReduceMax]")


@pytest.mark.parametrize("keepdims", [0, 1])
def test_reduce_sum_axes_input(keepdims):
    m = build(
        [
            node("Transpose", ["x"], "t", perm=[2, 0, 3, 1]),
            node("ReduceSum", ["t", "ax"], "y", keepdims=keepdims),
        ],
        {"x": ([2, 3, 4, 5], F32)},
        inits={"ax": np.array([1, 3], np.int64)},
        opset=13,
    )
    fire(m, "transpose-reduce-axes-input[ReduceSum]")


def test_reduce_with_runtime_axes_is_refused():
    m = build(
        [node("Transpose", ["x"], "t", perm=NHWC), node("ReduceMean", ["t", "ax"], "y")],
        {"x": ([2, 3, 4, 5], F32), "ax": ([1], np.int64)},
        opset=18,
        output_shapes={"y": ["a", "b", "c", "d"]},
    )
    no_fire(m, "transpose-reduce-axes-input[ReduceMean]")


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge"])
def test_pad_pads_are_remapped(mode):
    m = build(
        [
            node("Transpose", ["x"], "t", perm=NHWC),
            node("Pad", ["t", "pads"], "y", mode=mode),
        ],
        {"x": ([2, 3, 4, 5], F32)},
        inits={"pads": np.array([0, 1, 2, 0, 1, 0, 2, 1], np.int64)},
    )
    fire(m, "transpose-pad")


def test_slice_axes_remapped_with_runtime_starts():
    m = build(
        [
            node("Transpose", ["x"], "t", perm=NHWC),
            node("Slice", ["t", "s", "e", "ax"], "y"),
        ],
        {"x": ([2, 3, 4, 5], F32), "s": ([2], np.int64), "e": ([2], np.int64)},
        inits={"ax": np.array([-1, 1], np.int64)},
    )
    feeds = {
        "x": np.random.default_rng(3).standard_normal([2, 3, 4, 5]).astype(F32),
        "s": np.array([1, 0], np.int64),
        "e": np.array([3, 4], np.int64),
    }
    fire(m, "transpose-slice", feeds=feeds)


def test_slice_with_runtime_axes_is_refused():
    m = build(
        [
            node("Transpose", ["x"], "t", perm=NHWC),
            node("Slice", ["t", "s", "e", "ax"], "y"),
        ],
        {"x": ([2, 3, 4, 5], F32), "ax": ([1], np.int64)},
        inits={"s": np.array([1], np.int64), "e": np.array([2], np.int64)},
        output_shapes={"y": ["a", "b", "c", "d"]},
    )
    no_fire(m, "transpose-slice")


def test_pack_is_listed_in_readme():
    readme = (builtin_rules_dir() / "core" / "README.md").read_text(encoding="utf-8")
    # An op-set family is one row: its name, and each member's op.
    for rule in load_rule_file(builtin_rules_dir() / "core" / "transpose.yaml", pack="core"):
        assert f"`{rule.family or rule.name}`" in readme, rule.name
        for op in rule.op_bindings.values():
            assert op in readme, rule.name


def test_every_rule_is_in_the_pack():
    assert set(RULES) >= TRANSPOSE_RULES


# -- Where ---------------------------------------------------------------------------


def test_where_mask_transposed_with_constant_branches():
    m = build(
        [
            node("Transpose", ["mask"], "t", perm=NHWC),
            node("Where", ["t", "neg", "c"], "y"),
        ],
        {"mask": ([2, 3, 4, 5], np.bool_)},
        inits={"neg": np.array(-1e4, F32), "c": np.arange(3, dtype=F32)},
    )
    out = fire(m, "transpose-where-const-cond")
    assert ops(out) == ["Where", "Transpose"]


def test_where_data_transposed_with_runtime_mask_is_refused():
    m = build(
        [
            node("Transpose", ["x"], "t", perm=NHWC),
            node("Where", ["mask", "t", "c"], "y"),
        ],
        {"x": ([2, 3, 4, 5], F32), "mask": ([2, 4, 5, 3], np.bool_)},
        inits={"c": np.array(0.0, F32)},
    )
    no_fire(m, "transpose-where-const-x")


def test_where_of_three_transposes():
    m = build(
        [
            node("Transpose", ["mask"], "tm", perm=NHWC),
            node("Transpose", ["a"], "ta", perm=NHWC),
            node("Transpose", ["b"], "tb", perm=NHWC),
            node("Where", ["tm", "ta", "tb"], "y"),
        ],
        {"mask": ([2, 3, 4, 5], np.bool_), "a": ([2, 3, 4, 5], F32), "b": ([1, 3, 1, 5], F32)},
    )
    out = fire(m, "transpose-where-transpose")
    assert transposes(out) == 1


# -- peer models ----------------------------------------------------------------------


def test_cast_before_matmul_is_left_to_the_matmul_fusions():
    """onnxruntime's transpose_cast_matmul model: the Transpose stays before the Cast."""
    path = PEER_MODELS / "transpose_cast_matmul_4d_fusion0.onnx"
    model = onnx.load(path)
    no_fire(model, "transpose-unary[Cast]")
    assert ops(model)[:2] == ["Transpose", "Cast"]


def test_cast_elsewhere_still_sinks():
    m = build(
        [
            node("Transpose", ["x"], "t", perm=[0, 1, 3, 2]),
            node("Cast", ["t"], "c", to=10),
            node("Relu", ["c"], "y"),
        ],
        {"x": ([3, 2, 4, 4], F32)},
    )
    fire(m, "transpose-unary[Cast]")


# -- constants and direction ----------------------------------------------------------


def test_transpose_of_a_constant_is_folded():
    w = np.random.default_rng(4).standard_normal([3, 4]).astype(F32)
    m = build(
        [node("Transpose", ["w"], "wt", perm=[1, 0]), node("MatMul", ["x", "wt"], "y")],
        {"x": ([2, 4], F32)},
        inits={"w": w},
    )
    assert ops(whole_pack(m)) == ["MatMul"]


def test_diamond_and_alternating_chain_reach_a_fixpoint():
    """Transposes and their inverses alternate with unary ops and rejoin: no oscillation."""
    m = build(
        [
            node("Transpose", ["x"], "t1", perm=NHWC),
            node("Relu", ["t1"], "r1"),
            node("Transpose", ["r1"], "t2", perm=NCHW),
            node("Tanh", ["t2"], "r2"),
            node("Transpose", ["r2"], "t3", perm=NHWC),
            node("Exp", ["t3"], "e"),
            node("Neg", ["t3"], "n"),
            node("Add", ["e", "n"], "s"),
            node("Transpose", ["s"], "y", perm=NCHW),
        ],
        {"x": ([2, 3, 4, 5], F32)},
    )
    out = whole_pack(m)
    # t1/t2 cancel; t3 is shared by Exp and Neg, so it stays and y's Transpose with it.
    assert transposes(out) == 2, ops(out)


def test_scalar_scaling_before_matmul_is_left_to_the_scale_folds():
    """SDPA's decomposition scales Transpose(K) by a number before the MatMul."""

    def model(scale_shape):
        return build(
            [
                node("Transpose", ["k"], "kt", perm=[0, 2, 1]),
                node("Mul", ["kt", "s"], "ks"),
                node("MatMul", ["q", "ks"], "y"),
            ],
            {"q": ([2, 3, 4], F32), "k": ([2, 5, 4], F32)},
            inits={"s": np.full(scale_shape, 0.5, F32)},
        )

    no_fire(model([]), "transpose-binary-const-a[Mul]")
    fire(model([1, 5]), "transpose-binary-const-a[Mul]")
