"""MatMul/Gemm fusions: FusedMatMul (ort/matmul.yaml), Transposes and Sums into Gemm
(core/gemm_transpose.yaml, core/gemm_sum.yaml), and the language powers they use
(`keep`, `alternative`, com.microsoft attribute defaults).

On onnxruntime's own test models each fusion fires where onnxruntime's does, the
result has no more nodes than onnxruntime 1.32's ORT_ENABLE_EXTENDED result and
every fused op it has, and the outputs are unchanged; on its negative models
nothing fires. Hand-built models cover the guards onnxruntime's models do not.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from core_pack_support import build, node, special_feeds
from helpers import assert_close, optimize_proto, random_feeds, rules_from_text, run
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from onnxfuse.errors import RuleError
from onnxfuse.language.packs import load_builtin_rules
from onnxfuse.ops import schemas
from onnxfuse.targets.capabilities import load_target

DATA = Path(__file__).resolve().parent.parent / "data" / "ort-fusion"
MANIFEST = {e["model"][:-5]: e for e in json.loads((DATA / "manifest.json").read_text())}
ALL_RULES = load_builtin_rules()
RULES = {rule.name: rule for rule in ALL_RULES}
CPU = load_target("cpu")
F32 = np.float32
FMM = "com.microsoft::FusedMatMul"
MS = {"com.microsoft": 1}

# Peer model -> (our op histogram, the rules that fire). onnxruntime's histogram is
# the manifest's; where ours differs it has fewer nodes (noted).
FUSED = {
    "matmul_scale_in0": ({FMM: 1}, {"matmul-scale-a"}),
    "matmul_scale_in0_in1": ({FMM: 1}, {"matmul-scale-a", "fusedmatmul-scale-b"}),
    "matmul_scale_in0_in1_out": (
        {FMM: 1},
        {"matmul-scale-a", "fusedmatmul-scale-b", "fusedmatmul-scale-out"},
    ),
    # the scaled input feeds two MatMuls: both fuse, the Mul goes with the last
    "matmul_scale_reused_input_scale": ({FMM: 2}, {"matmul-scale-a"}),
    "matmul_scale_transposescalematmul_in0_in1_out": (
        {FMM: 1},
        {"fusedmatmul-scale-a", "fusedmatmul-scale-b", "fusedmatmul-scale-out"},
    ),
    "transpose_matmul_2d_fusion_from_transpose_scale_matmul": (
        {FMM: 1},
        {"fusedmatmul-transpose-a"},
    ),
    # the Transpose also feeds an Identity: kept (the Identity itself is eliminated)
    "transpose_matmul_2d_fusion_with_preserved_transpose": (
        {FMM: 1, "Transpose": 1},
        {"matmul-transpose-a"},
    ),
    "transpose_matmul_trans_batch_fusion1": (
        {FMM: 1},
        {"matmul-transpose-a", "fusedmatmul-transpose-b"},
    ),
    "transpose_matmul_trans_batch_fusion2": (
        {FMM: 1},
        {"matmul-transpose-a", "fusedmatmul-transpose-b"},
    ),
    "transpose_matmul_trans_batch_fusion3": ({FMM: 1}, {"fusedmatmul-transpose-a"}),
    # the float MatMul of the two Transposes fuses; the float16 one cannot (see below)
    "transpose_cast_matmul_4d_fusion4": (
        {FMM: 1, "MatMul": 1, "Transpose": 2, "Cast": 2},
        {"matmul-transpose-a", "fusedmatmul-transpose-b"},
    ),
    # Cast(float16 -> float) of a Transpose: the Cast moves before it, the Transpose folds
    "transpose_cast_matmul_4d_fusion5": (
        {FMM: 1, "MatMul": 1, "Transpose": 2, "Cast": 2},
        {"matmul-transpose-b", "fusedmatmul-cast-transpose-a"},
    ),
    "gemm_sum_basic": ({"Gemm": 1}, {"gemm-sum"}),
    "gemm_sum_attributes": ({"Gemm": 1}, {"gemm-sum"}),
    "gemm_sum_fusion_broadcast": ({"Gemm": 1}, {"gemm-sum"}),
    "gemm_sum_internal_nodes": ({"Gemm": 1}, {"gemm-sum"}),
    "gemm_transpose_2inputs_transposed": ({"Gemm": 1}, {"transpose-gemm-a", "transpose-gemm-b"}),
    "gemm_transpose_2outputs_from_transpose": (
        {"Gemm": 1, "Transpose": 1},
        {"transpose-gemm-a", "transpose-gemm-b"},
    ),
    "gemm_transpose_2outputs_from_transpose_to_2gemms": (
        {"Gemm": 2, "Transpose": 1},
        {"transpose-gemm-a", "transpose-gemm-b"},
    ),
    "gemm_transpose_inputs_output_transposed": (
        {"Gemm": 1},
        {"transpose-gemm-a", "gemm-transpose"},
    ),
    "gemm_transpose_inputs_output_transposed_2": (
        {"Gemm": 1},
        {"transpose-gemm-a", "gemm-transpose"},
    ),
    "gemm_transpose_output_transposed": ({"Gemm": 1}, {"gemm-transpose"}),
    # C is a scalar: it stays C when the Gemm absorbs the output Transpose
    # (onnxruntime leaves this Transpose)
    "gemm_transpose_transform": ({"Gemm": 1}, {"gemm-transpose"}),
}

# Peer models where onnxruntime fuses nothing of this kind, and neither do we.
UNFUSED = [
    "matmul_scale_int32",
    "matmul_scale_unfusable_div_not_scale",
    "matmul_scale_unfusable_scale_broadcasting_changes_shape",
    "matmul_scale_unfusable_scale_not_constant",
    "matmul_scale_unfusable_scale_not_scalar",
    "matmul_scale_with_scale_input",
    "transpose_matmul_4d_fusion_invalid_datatype_int32",
    "transpose_matmul_4d_fusion_invalid_datatype_int64",
    "transpose_matmul_4d_fusion_invalid_default_perm",
    "transpose_matmul_trans_batch_fusion_invalid_case1",
    "transpose_matmul_trans_batch_fusion_invalid_case2",
    "transpose_matmul_trans_batch_fusion_invalid_case3",
    "gemm_sum_no_fusion_broadcast_failure",
    "gemm_sum_no_fusion_c_used",
    "gemm_sum_no_fusion_sum_multiple_inputs",
    "transpose_cast_matmul_4d_fusion3",
]

# float16 MatMuls: onnxruntime's result has one node fewer than ours, by dropping
# the float16 rounding of their inputs (test_float16_matmul_keeps_its_input_rounding).
FLOAT16_MATMUL = [
    "transpose_cast_matmul_4d_fusion0",
    "transpose_cast_matmul_4d_fusion1",
    "transpose_cast_matmul_4d_fusion2",
]
FLOAT16_EXTRA = {"transpose_cast_matmul_4d_fusion4": 1}

MY_RULES = {
    name
    for name in RULES
    if RULES[name]
    .origin.split(":")[0]
    .endswith(("ort/matmul.yaml", "core/gemm_transpose.yaml", "core/gemm_sum.yaml"))
}


def histogram(model: onnx.ModelProto) -> dict[str, int]:
    return dict(
        Counter(f"{n.domain}::{n.op_type}" if n.domain else n.op_type for n in model.graph.node)
    )


def optimize_peer(name: str):
    model = onnx.load(DATA / f"{name}.onnx")
    report, result = optimize_proto(model, ALL_RULES, target=CPU)
    fired = {rule for rule, stats in report.rules.items() if stats.applied and rule in MY_RULES}
    return model, result, fired


def same_outputs(model, result, name: str, seed: int = 0) -> None:
    feeds = random_feeds(model, seed, dims=MANIFEST[name]["dims"])
    assert_close(run(result, feeds), run(model, feeds))


# -- onnxruntime's models ------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(FUSED))
def test_peer_model_fuses_like_onnxruntime(name):
    model, result, fired = optimize_peer(name)
    expected_ops, expected_rules = FUSED[name]
    assert histogram(result) == expected_ops
    assert fired == expected_rules
    ort_ops = MANIFEST[name]["ops_after_ort_cpu_extended"]
    assert len(result.graph.node) <= sum(ort_ops.values()) + FLOAT16_EXTRA.get(name, 0)
    for op in (FMM, "Gemm"):
        assert (op in ort_ops) <= (op in histogram(result)), f"onnxruntime has {op}"
    same_outputs(model, result, name)
    same_outputs(model, result, name, seed=1)


@pytest.mark.parametrize("name", UNFUSED)
def test_peer_negative_model_stays(name):
    model, result, fired = optimize_peer(name)
    assert fired == set()
    assert histogram(result).get(FMM, 0) == histogram(model).get(FMM, 0)
    assert len(result.graph.node) <= sum(MANIFEST[name]["ops_after_ort_cpu_extended"].values())


def test_scale_alpha_multiplies_through_every_position():
    # FusedMatMul<alpha=3>(x*3, y/(1/3)) * 3 = 81 * x@y
    _, result, _ = optimize_peer("matmul_scale_transposescalematmul_in0_in1_out")
    (fused,) = result.graph.node
    attrs = {a.name: helper.get_attribute_value(a) for a in fused.attribute}
    assert attrs["alpha"] == pytest.approx(81.0, rel=1e-6)


def test_trans_batch_flags_match_onnxruntime():
    # Transpose [1, 2, 0] on A (first axis last: transBatchA + transA), [0, 2, 1] on B
    _, result, _ = optimize_peer("transpose_matmul_trans_batch_fusion1")
    (fused,) = result.graph.node
    attrs = {a.name: helper.get_attribute_value(a) for a in fused.attribute}
    assert (attrs["transA"], attrs["transBatchA"], attrs["transB"]) == (1, 1, 1)
    assert attrs.get("transBatchB", 0) == 0


@pytest.mark.parametrize("name", FLOAT16_MATMUL)
def test_float16_matmul_keeps_its_input_rounding(name, tmp_path):
    """Not fused, on purpose. onnxruntime has no float16 MatMul on CPU: at session
    load (at every optimization level) it computes the MatMul in float and drops the
    float -> float16 -> float Cast pair on its inputs, hence one node fewer. That
    loses the float16 rounding of the inputs the model asks for: under the ONNX
    semantics (onnx.reference) its graph computes something else. Ours does not."""
    model, result, fired = optimize_peer(name)
    assert fired == set()
    ort_nodes = sum(MANIFEST[name]["ops_after_ort_cpu_extended"].values())
    assert len(result.graph.node) == ort_nodes + 1
    rng = np.random.default_rng(0)
    feeds = {
        i.name: (rng.standard_normal((3, 2, 5, 5)) * 10).astype(F32) for i in model.graph.input
    }
    reference = ReferenceEvaluator(model).run(None, feeds)[0]
    np.testing.assert_array_equal(ReferenceEvaluator(result).run(None, feeds)[0], reference)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    options.optimized_model_filepath = str(tmp_path / "ort.onnx")
    ort.InferenceSession(str(DATA / f"{name}.onnx"), options, providers=["CPUExecutionProvider"])
    theirs = onnx.load(tmp_path / "ort.onnx")
    assert len(theirs.graph.node) == ort_nodes
    assert not np.array_equal(ReferenceEvaluator(theirs).run(None, feeds)[0], reference)


# -- FusedMatMul rules on hand-built models ----------------------------------------------


def matmul_model(nodes, inputs, inits=None, outputs=("y",)):
    return build(nodes, inputs, outputs=outputs, inits=inits)


def fired_rules(model, rules=None):
    report, result = optimize_proto(model, rules or ALL_RULES, target=CPU)
    return {r for r, s in report.rules.items() if s.applied and r in MY_RULES}, result


def check_same(model, result, special=False):
    for seed in (0, 1):
        feeds = special_feeds(model, seed) if special else random_feeds(model, seed)
        assert_close(run(result, feeds), run(model, feeds))


def test_transpose_with_1d_b_is_not_fused():
    # onnxruntime 1.32's FusedMatMul computes transA with a 1-D B wrongly (and its own
    # MatmulTransposeFusion produces exactly that), so the rule refuses it.
    model = matmul_model(
        [node("Transpose", ["x"], "t", perm=[1, 0]), node("MatMul", ["t", "b"], "y")],
        {"x": ([4, 3], F32), "b": ([4], F32)},
    )
    fired, result = fired_rules(model)
    assert fired == set()
    check_same(model, result)


def test_onnxruntime_fusedmatmul_trans_a_with_1d_b_is_still_wrong():
    """Why the guard above exists; if this starts failing, onnxruntime fixed it."""
    fused = helper.make_node("FusedMatMul", ["x", "b"], ["y"], domain="com.microsoft", transA=1)
    graph = helper.make_graph(
        [fused],
        "g",
        [helper.make_tensor_value_info("x", 1, [4, 3]), helper.make_tensor_value_info("b", 1, [4])],
        [helper.make_tensor_value_info("y", 1, None)],
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)],
        ir_version=8,
    )
    x = np.arange(12, dtype=F32).reshape(4, 3)
    b = np.arange(4, dtype=F32)
    assert not np.allclose(run(model, {"x": x, "b": b})[0], x.T @ b)


def test_trans_batch_needs_equal_ranks():
    # perm [1, 2, 0] on a 3-D A with a 4-D B: the kernel rejects transBatch there
    model = matmul_model(
        [node("Transpose", ["x"], "t", perm=[1, 2, 0]), node("MatMul", ["t", "b"], "y")],
        {"x": ([6, 3, 4], F32), "b": ([2, 3, 6, 5], F32)},
    )
    fired, _ = fired_rules(model)
    assert fired == set()


@pytest.mark.parametrize(
    ("perm", "fires"),
    [
        ([0, 2, 1], True),
        ([1, 0, 2], True),
        ([1, 2, 0], True),
        ([2, 1, 0], False),
        ([2, 0, 1], False),
    ],
)
def test_only_perms_fusedmatmul_expresses(perm, fires):
    shape = [4, 4, 4]
    model = matmul_model(
        [node("Transpose", ["x"], "t", perm=perm), node("MatMul", ["t", "b"], "y")],
        {"x": (shape, F32), "b": ([4, 4, 4], F32)},
    )
    fired, result = fired_rules(model)
    assert (fired == {"matmul-transpose-a"}) is fires
    check_same(model, result, special=True)


def test_float16_and_integer_matmuls_are_not_fused():
    for dtype in (np.float16, np.int32):
        model = matmul_model(
            [node("Transpose", ["x"], "t"), node("MatMul", ["t", "b"], "y")],
            {"x": ([4, 3], dtype), "b": ([4, 5], dtype)},
        )
        fired, _ = fired_rules(model)
        assert fired == set(), dtype


def test_the_target_decides_the_element_type():
    # no float16 FusedMatMul on CPU; CUDA has one
    model = matmul_model(
        [node("Transpose", ["x"], "t"), node("MatMul", ["t", "b"], "y")],
        {"x": ([4, 3], np.float16), "b": ([4, 5], np.float16)},
    )
    report, result = optimize_proto(model, ALL_RULES, target=load_target("cuda"))
    assert report.rules["matmul-transpose-a"].applied == 1
    assert [n.op_type for n in result.graph.node] == ["FusedMatMul"]


def test_double_matmul_transpose_fuses():
    model = matmul_model(
        [node("Transpose", ["x"], "t"), node("MatMul", ["t", "b"], "y")],
        {"x": ([4, 3], np.float64), "b": ([4, 5], np.float64)},
    )
    fired, result = fired_rules(model)
    assert fired == {"matmul-transpose-a"}
    check_same(model, result)


def test_cast_to_float16_between_transpose_and_matmul_is_not_fused():
    model = matmul_model(
        [
            node("Transpose", ["x"], "t", perm=[0, 2, 1]),
            node("Cast", ["t"], "c", to=onnx.TensorProto.FLOAT16),
            node("MatMul", ["c", "b"], "y"),
        ],
        {"x": ([2, 4, 3], F32), "b": ([2, 4, 5], np.float16)},
    )
    fired, _ = fired_rules(model)
    assert fired == set()


def test_cast_used_elsewhere_blocks_the_cast_fusion():
    model = matmul_model(
        [
            node("Transpose", ["x"], "t", perm=[0, 2, 1]),
            node("Cast", ["t"], "c", to=onnx.TensorProto.FLOAT),
            node("MatMul", ["c", "b"], "y"),
            node("Relu", ["c"], "z"),
        ],
        {"x": ([2, 4, 3], np.float16), "b": ([2, 4, 5], F32)},
        outputs=("y", "z"),
    )
    fired, result = fired_rules(model)
    assert fired == set()
    check_same(model, result)


def scale_model(op, scale, shape=(2, 4, 6), scale_first=False, dtype=F32):
    inputs = ["s", "x"] if scale_first else ["x", "s"]
    return matmul_model(
        [node(op, inputs, "sx"), node("MatMul", ["sx", "b"], "y")],
        {"x": (list(shape), dtype), "b": ([2, 6, 5], dtype)},
        inits={"s": np.asarray(scale, dtype=dtype)},
    )


@pytest.mark.parametrize(
    ("op", "scale", "alpha"),
    [("Mul", 3.0, 3.0), ("Mul", [[0.125]], 0.125), ("Div", 4.0, 0.25), ("Div", [-0.5], -2.0)],
)
def test_scale_becomes_alpha(op, scale, alpha):
    fired, result = fired_rules(scale_model(op, scale))
    assert fired == {"matmul-scale-a"}
    (fused,) = result.graph.node
    assert helper.get_attribute_value(fused.attribute[0]) == pytest.approx(alpha)
    check_same(scale_model(op, scale), result)


@pytest.mark.parametrize(
    ("op", "scale", "kwargs", "why"),
    [
        ("Mul", [3.0, 3.0, 3.0, 3.0, 3.0, 3.0], {}, "not a scalar"),
        ("Mul", [[[[3.0]]]], {}, "rank 4 grows the 3-D input"),
        ("Div", 3.0, {"scale_first": True}, "3 / x is no scale"),
        ("Div", 0.0, {}, "1 / 0"),
        ("Mul", np.inf, {}, "not finite"),
        ("Mul", 3.0, {"dtype": np.float64}, "alpha is float32: a double scale would be rounded"),
        ("Mul", 3, {"dtype": np.int32}, "no integer FusedMatMul"),
    ],
)
def test_scale_negatives(op, scale, kwargs, why):
    model = scale_model(op, scale, **kwargs)
    fired, _ = fired_rules(model)
    assert fired == set(), why


def test_runtime_scale_is_not_folded():
    model = matmul_model(
        [node("Mul", ["x", "s"], "sx"), node("MatMul", ["sx", "b"], "y")],
        {"x": ([4, 6], F32), "s": ([], F32), "b": ([6, 5], F32)},
    )
    fired, _ = fired_rules(model)
    assert fired == set()


def test_output_scale_used_elsewhere_is_not_folded():
    model = matmul_model(
        [node("MatMul", ["x", "b"], "p"), node("Mul", ["p", "s"], "y"), node("Relu", ["p"], "z")],
        {"x": ([4, 6], F32), "b": ([6, 5], F32)},
        inits={"s": np.asarray(2.0, F32)},
        outputs=("y", "z"),
    )
    fired, _ = fired_rules(model)
    assert fired == set()


def test_transposes_and_scales_fold_into_one_fusedmatmul():
    # MatMul(Transpose(x) / 8, Transpose(w)) * 0.5 = FusedMatMul(x, w, 1/16, transA, transB)
    model = matmul_model(
        [
            node("Transpose", ["x"], "t", perm=[0, 2, 1]),
            node("Div", ["t", "d"], "td"),
            node("Transpose", ["w"], "wt", perm=[0, 2, 1]),
            node("MatMul", ["td", "wt"], "p"),
            node("Mul", ["p", "s"], "y"),
        ],
        {"x": ([2, 6, 4], F32), "w": ([2, 5, 6], F32)},
        inits={"d": np.asarray(8.0, F32), "s": np.asarray([0.5], F32)},
    )
    _, result = fired_rules(model)
    (fused,) = result.graph.node
    attrs = {a.name: helper.get_attribute_value(a) for a in fused.attribute}
    assert (fused.op_type, list(fused.input)) == ("FusedMatMul", ["x", "w"])
    assert (attrs["alpha"], attrs["transA"], attrs["transB"]) == (0.0625, 1, 1)
    check_same(model, result)


def test_2d_transposed_matmul_with_bias_becomes_gemm_in_any_order():
    # matmul-transpose-a may run before matmul-add-gemm: fusedmatmul-add-gemm catches it
    model = matmul_model(
        [
            node("Transpose", ["x"], "t"),
            node("MatMul", ["t", "w"], "p"),
            node("Add", ["p", "c"], "y"),
        ],
        {"x": ([6, 4], F32)},
        inits={"w": np.ones((6, 5), F32), "c": np.arange(5, dtype=F32)},
    )
    for rules in (ALL_RULES, [RULES["matmul-transpose-a"], RULES["fusedmatmul-add-gemm"]]):
        _, result = fired_rules(model, rules)
        (gemm,) = result.graph.node
        assert gemm.op_type == "Gemm"
        assert {a.name: helper.get_attribute_value(a) for a in gemm.attribute}["transA"] == 1
        check_same(model, result)


def test_batched_fusedmatmul_plus_bias_is_not_a_gemm():
    model = matmul_model(
        [
            node("Transpose", ["x"], "t", perm=[0, 2, 1]),
            node("MatMul", ["t", "w"], "p"),
            node("Add", ["p", "c"], "y"),
        ],
        {"x": ([2, 6, 4], F32), "w": ([2, 6, 5], F32)},
        inits={"c": np.arange(5, dtype=F32)},
    )
    fired, result = fired_rules(model)
    assert fired == {"matmul-transpose-a"}
    assert sorted(n.op_type for n in result.graph.node) == ["Add", "FusedMatMul"]


# -- Gemm rules on hand-built models ----------------------------------------------------


def test_gemm_output_transpose_with_constant_vector_c():
    model = matmul_model(
        [node("Gemm", ["a", "b", "c"], "p", alpha=2.0, beta=0.5), node("Transpose", ["p"], "y")],
        {"a": ([3, 4], F32), "b": ([4, 5], F32)},
        inits={"c": np.arange(5, dtype=F32)},
    )
    fired, result = fired_rules(model)
    assert fired == {"gemm-transpose-const-c"}
    (gemm,) = result.graph.node
    assert gemm.input[:2] == ["b", "a"]
    c = {t.name: numpy_helper.to_array(t) for t in result.graph.initializer}[gemm.input[2]]
    assert c.shape == (5, 1)
    check_same(model, result, special=True)


def test_gemm_output_transpose_keeps_a_runtime_matrix_c():
    model = matmul_model(
        [node("Gemm", ["a", "b", "c"], "p"), node("Transpose", ["p"], "y")],
        {"a": ([3, 4], F32), "b": ([4, 5], F32), "c": ([3, 5], F32)},
    )
    fired, _ = fired_rules(model)
    assert fired == set()


def test_gemm_input_transpose_with_other_consumer_is_kept():
    model = matmul_model(
        [node("Transpose", ["a"], "t"), node("Gemm", ["t", "b"], "y"), node("Relu", ["t"], "z")],
        {"a": ([4, 3], F32), "b": ([4, 5], F32)},
        outputs=("y", "z"),
    )
    fired, result = fired_rules(model)
    assert fired == {"transpose-gemm-a"}
    assert sorted(n.op_type for n in result.graph.node) == ["Gemm", "Relu", "Transpose"]
    check_same(model, result)


def test_gemm_sum_takes_add_too_and_respects_broadcasting():
    def gemm_add(c_shape, op="Add"):
        return matmul_model(
            [
                node("Gemm", ["a", "b"], "p", transB=1, alpha=0.5, beta=7.0),
                node(op, ["d", "p"], "y"),
            ],
            {"a": ([3, 4], F32), "b": ([5, 4], F32), "d": (c_shape, F32)},
        )

    for shape in ([5], [3, 1], [1, 5], [3, 5], []):
        model = gemm_add(shape)
        fired, result = fired_rules(model)
        assert fired == {"gemm-sum"}, shape
        (gemm,) = result.graph.node
        assert {a.name: helper.get_attribute_value(a) for a in gemm.attribute}["beta"] == 1.0
        check_same(model, result, special=True)
    for shape in ([2, 3, 5], [3, 1, 1]):
        fired, _ = fired_rules(gemm_add(shape))
        assert fired == set(), shape


def test_gemm_zero_c_needs_zeros_and_a_finite_beta():
    def gemm(c, beta):
        return matmul_model(
            [node("Gemm", ["a", "b", "c"], "y", beta=beta)],
            {"a": ([3, 4], F32), "b": ([4, 5], F32)},
            inits={"c": np.asarray(c, F32)},
        )

    fired, result = fired_rules(gemm(np.zeros(5), 0.0), [RULES["gemm-zero-c"]])
    assert fired == {"gemm-zero-c"} and len(result.graph.node[0].input) == 2
    check_same(gemm(np.zeros(5), 0.0), result)
    assert fired_rules(gemm(np.ones(5), 0.0), [RULES["gemm-zero-c"]])[0] == set()
    assert fired_rules(gemm(np.zeros(5), float("inf")), [RULES["gemm-zero-c"]])[0] == set()


# -- language powers: keep, alternative, com.microsoft defaults ----------------------------

KEEP_RULE = """
rules:
  - name: relu-neg
    keep: [{keep}]
    source: |
      f (X) => (Y) {{
        T = Neg(X)
        U = Abs(T)
        Y = Relu(U)
      }}
    target: |
      f (X) => (Y) {{
        Y = Abs(X)
      }}
"""


def test_keep_must_name_an_intermediate_whose_inputs_survive():
    rules_from_text(KEEP_RULE.format(keep="T"))
    rules_from_text(KEEP_RULE.format(keep="T, U"))
    with pytest.raises(RuleError, match="not an intermediate"):
        rules_from_text(KEEP_RULE.format(keep="Y"))
    with pytest.raises(RuleError, match="not an intermediate"):
        rules_from_text(KEEP_RULE.format(keep="X"))
    with pytest.raises(RuleError, match="computed from 'T'"):
        rules_from_text(KEEP_RULE.format(keep="U"))


def test_kept_node_stays_only_while_used():
    (rule,) = rules_from_text(KEEP_RULE.format(keep="T"))
    used = build(
        [
            node("Neg", ["x"], "t"),
            node("Abs", ["t"], "u"),
            node("Relu", ["u"], "y"),
            node("Exp", ["t"], "z"),
        ],
        {"x": ([4], F32)},
        outputs=("y", "z"),
    )
    report, result = optimize_proto(used, [rule])
    assert report.rules["relu-neg"].applied == 1
    assert sorted(n.op_type for n in result.graph.node) == ["Abs", "Exp", "Neg"]
    check_same(used, result)
    alone = build(
        [node("Neg", ["x"], "t"), node("Abs", ["t"], "u"), node("Relu", ["u"], "y")],
        {"x": ([4], F32)},
    )
    report, result = optimize_proto(alone, [rule])
    assert [n.op_type for n in result.graph.node] == ["Abs"]
    # U is not kept: its other use still blocks the match
    blocked = build(
        [
            node("Neg", ["x"], "t"),
            node("Abs", ["t"], "u"),
            node("Relu", ["u"], "y"),
            node("Exp", ["u"], "z"),
        ],
        {"x": ([4], F32)},
        outputs=("y", "z"),
    )
    report, _ = optimize_proto(blocked, [rule])
    assert report.rules["relu-neg"].applied == 0


def test_alternative_names_the_source_that_matched():
    (rule,) = rules_from_text(
        """
rules:
  - name: scale-to-leaky
    sources:
      - |
        f (X, s) => (Y) {
          Y = Mul(X, s)
        }
      - |
        f (X, s) => (Y) {
          Y = Div(X, s)
        }
    let:
      a: "scalar(s) if alternative == 0 else 1.0 / scalar(s)"
    where: is_constant(s)
    target: |
      f <a> (X, s) => (Y) {
        Y = LeakyRelu<alpha: float = @a>(X)
      }
"""
    )
    for op, expected in (("Mul", 4.0), ("Div", 0.25)):
        model = build(
            [node(op, ["x", "s"], "y")], {"x": ([4], F32)}, inits={"s": np.asarray(4.0, F32)}
        )
        _, result = optimize_proto(model, [rule])
        (leaky,) = result.graph.node
        assert helper.get_attribute_value(leaky.attribute[0]) == pytest.approx(expected)


def test_com_microsoft_attribute_defaults_come_from_onnxruntime():
    assert schemas.attribute_default("com.microsoft", "FusedMatMul", 1, "alpha") == 1.0
    assert schemas.attribute_default("com.microsoft", "FusedMatMul", 1, "transBatchB") == 0
    assert not schemas.input_is_optional("com.microsoft", "FusedMatMul", 1, 1)
