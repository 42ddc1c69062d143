"""rules/ort/normalization.yaml and rules/ort/quantization.yaml on onnxruntime's own test
models and on hand-built cases: the rules fire where onnxruntime's extended optimizer fuses
(or where it could), the result is no larger than onnxruntime's and holds every fused op it
has, the outputs agree (quantized paths bit for bit), and the negative cases stay alone.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from helpers import assert_close, random_feeds, run
from onnx import TensorProto, helper, numpy_helper

from onnxfuse.api import optimize_file, select_rules
from onnxfuse.files.model_io import check_model
from onnxfuse.language.packs import load_builtin_rules
from onnxfuse.passes.pipeline import Options, optimize
from onnxfuse.targets.capabilities import load_target

DATA = Path(__file__).resolve().parents[1] / "data" / "ort-fusion"
MANIFEST = {e["model"]: e for e in json.loads((DATA / "manifest.json").read_text())}
RULES = {rule.name: rule for rule in load_builtin_rules()}
CPU = load_target("cpu")
F16, F32 = np.float16, np.float32
RNG = np.random.default_rng(7)


def ops(model: onnx.ModelProto) -> Counter[str]:
    return Counter(f"{n.domain}::{n.op_type}" if n.domain else n.op_type for n in model.graph.node)


@pytest.fixture(scope="module")
def all_rules():
    return select_rules()


# -- onnxruntime's test models ---------------------------------------------------------

# model -> (the rule of these files that must fire, our op histogram after all built-in rules)
PEERS = {
    "layer_norm_fp16.onnx": ("ort-layer-norm", {"LayerNormalization": 1}),
    "layer_norm_fusion_scale_bias.onnx": ("ort-layer-norm-cast", {"LayerNormalization": 1}),
    "layer_norm_shared_input.onnx": ("ort-layer-norm", {"LayerNormalization": 1, "Identity": 1}),
    "layer_norm_t5.onnx": ("ort-simplified-layer-norm", {"SimplifiedLayerNormalization": 1}),
    "layer_norm_with_cast_2.onnx": ("ort-layer-norm", {"LayerNormalization": 1}),
    "layer_norm_with_cast_3.onnx": (
        "ort-layer-norm-cast-output",
        {"LayerNormalization": 1, "Cast": 1},
    ),
    "layer_norm_without_scale_bias.onnx": (
        "ort-layer-norm-no-affine",
        {"LayerNormalization": 1},
    ),
    "simplified_layer_norm_with_casts.onnx": (
        "ort-simplified-layer-norm-cast",
        {"SimplifiedLayerNormalization": 1},
    ),
    "skip_layer_norm_format3_no_fusion.onnx": (
        "ort-layer-norm",
        {"Add": 1, "LayerNormalization": 1},
    ),
    "dynamic_quantize_matmul.onnx": (
        "ort-dynamic-quantize-matmul",
        {"com.microsoft::DynamicQuantizeMatMul": 1},
    ),
    "dynamic_quantize_matmul_bias.onnx": (
        "ort-dynamic-quantize-matmul-bias",
        {"com.microsoft::DynamicQuantizeMatMul": 1},
    ),
    "dynamic_quantize_matmul_bias_b_no_zp.onnx": (
        "ort-dynamic-quantize-matmul-bias",
        {"com.microsoft::DynamicQuantizeMatMul": 1},
    ),
    # A [3, 3] bias is not per column: it stays an Add (as in onnxruntime).
    "dynamic_quantize_matmul_bias_ND.onnx": (
        "ort-dynamic-quantize-matmul",
        {"com.microsoft::DynamicQuantizeMatMul": 1, "Add": 1},
    ),
    # DynamicQuantizeLinear feeds three MatMulIntegers (two merged as duplicates): its
    # outputs have other uses, so MatMulIntegerToFloat; the [3, 3] bias stays an Add, and
    # the other bias Add cannot fold into an output that is also a graph output.
    "matmul_integer_to_float.onnx": (
        "ort-matmul-integer-to-float",
        {
            "DynamicQuantizeLinear": 1,
            "com.microsoft::MatMulIntegerToFloat": 2,
            "Add": 2,
        },
    ),
    # Two identical branches: merged, then DynamicQuantizeLinear has one consumer left.
    "matmul_integer_extension.onnx": (
        "ort-dynamic-quantize-matmul",
        {"com.microsoft::DynamicQuantizeMatMul": 1, "Identity": 1},
    ),
}


def _optimize_peer(name: str, rules, tmp_path: Path):
    out = tmp_path / name
    report = optimize_file(DATA / name, out, rules, Options(target=CPU))
    return report, onnx.load(out), out


@pytest.mark.parametrize("name", sorted(PEERS))
def test_peer_model_fuses_no_larger_than_onnxruntime(name, all_rules, tmp_path):
    rule, expected = PEERS[name]
    report, result, out = _optimize_peer(name, all_rules, tmp_path)
    assert report.rules[rule].applied >= 1, f"{rule} did not fire"
    assert ops(result) == Counter(expected)
    entry = MANIFEST[name]
    ort_ops = entry["ops_after_ort_cpu_extended"]
    assert sum(ops(result).values()) <= sum(ort_ops.values())
    for op in ort_ops:  # every fused op onnxruntime has (its unfused leftovers aside)
        if op.startswith("com.microsoft::") or "Normalization" in op:
            assert op in ops(result), (op, dict(ops(result)))
    source = onnx.load(DATA / name)
    feeds = random_feeds(source, seed=3, dims=entry["dims"])
    actual, expected_out = run(out, feeds), run(DATA / name, feeds)
    if "quantize" in name or "integer" in name:
        for a, e in zip(actual, expected_out):
            np.testing.assert_array_equal(a, e)  # the integer path is exact
    else:
        assert_close(actual, expected_out)


@pytest.mark.parametrize("name", ["attention_distilbert.onnx", "attention_mask_no_cast.onnx"])
def test_attention_models_with_an_opset_12_layer_norm_load_and_keep_it(name, all_rules, tmp_path):
    _, result, out = _optimize_peer(name, all_rules, tmp_path)
    ort_ops = MANIFEST[name]["ops_after_ort_cpu_extended"]
    assert ops(result)["LayerNormalization"] == ort_ops["LayerNormalization"] == 1
    assert sum(ops(result).values()) <= sum(ort_ops.values())
    if name == "attention_mask_no_cast.onnx":  # the other declares shapes it cannot run
        feeds = random_feeds(onnx.load(DATA / name))
        assert_close(run(out, feeds), run(DATA / name, feeds))


def test_rms_norm_with_a_runtime_epsilon_is_left_alone(all_rules, tmp_path):
    # simplified_layer_norm_fp16_pow_edge: the "epsilon" is a graph input of shape
    # [1, 4, 1] and the scale is [1, 4, 1], not the last axis: onnxruntime does not fuse.
    name = "simplified_layer_norm_fp16_pow_edge.onnx"
    report, result, _ = _optimize_peer(name, all_rules, tmp_path)
    assert not any(n.startswith("ort-simplified") and s.applied for n, s in report.rules.items())
    assert "SimplifiedLayerNormalization" not in ops(result)


def test_graph_without_outputs_optimizes_to_nothing(all_rules, tmp_path):
    # matmul_integer_to_float_large_tensor declares no outputs: everything is dead code
    # (onnxruntime keeps a DynamicQuantizeMatMul that computes nothing anyone reads).
    report, result, _ = _optimize_peer(
        "matmul_integer_to_float_large_tensor.onnx", all_rules, tmp_path
    )
    assert report.rules["ort-dynamic-quantize-matmul"].applied == 1
    assert len(result.graph.node) == 0


# -- hand-built layer norms --------------------------------------------------------------


def _model(nodes, inputs, inits, output="Y", opset=12, extra=()):
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(n, t, s) for n, (s, t) in inputs.items()],
        [helper.make_value_info(output, onnx.TypeProto())],
        [numpy_helper.from_array(np.asarray(a), n) for n, a in inits.items()],
    )
    opsets = [helper.make_opsetid("", opset), *extra]
    probe = helper.make_model(graph, opset_imports=opsets, ir_version=8)
    inferred = onnx.shape_inference.infer_shapes(probe, strict_mode=True)
    probe.graph.output[0].CopyFrom(inferred.graph.output[0])
    onnx.checker.check_model(probe, full_check=True)
    return probe


def layer_norm(
    shape=(2, 3, 8),
    dtype=F32,
    opset=12,
    axes=(-1,),
    gamma_shape=None,
    eps=1e-5,
    residual=False,
    affine=True,
):
    """X [-> Add residual] -> decomposed LayerNormalization (-> Mul gamma -> Add beta)."""
    hidden = shape[-1]
    code = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    inputs = {"X": (list(shape), code)}
    inits = {
        "two": np.array(2.0, dtype),
        "eps": np.array(eps, dtype),
        "gamma": RNG.standard_normal(gamma_shape or (hidden,)).astype(dtype),
        "beta": RNG.standard_normal((hidden,)).astype(dtype),
    }
    nodes = []
    x = "X"
    if residual:
        inputs["R"] = (list(shape), code)
        nodes.append(helper.make_node("Add", ["X", "R"], ["L"]))
        x = "L"
    nodes += [
        helper.make_node("ReduceMean", [x], ["M"], axes=list(axes)),
        helper.make_node("Sub", [x, "M"], ["D"]),
        helper.make_node("Pow", ["D", "two"], ["P"]),
        helper.make_node("ReduceMean", ["P"], ["V"], axes=list(axes)),
        helper.make_node("Add", ["V", "eps"], ["E"]),
        helper.make_node("Sqrt", ["E"], ["S"]),
        helper.make_node("Div", ["D", "S"], ["N" if affine else "Y"]),
    ]
    if affine:
        nodes += [
            helper.make_node("Mul", ["N", "gamma"], ["G"]),
            helper.make_node("Add", ["G", "beta"], ["Y"]),
        ]
    else:
        del inits["gamma"], inits["beta"]
    return _model(nodes, inputs, inits, opset=opset)


def rms_norm(
    shape=(2, 3, 8), dtype=F32, opset=12, sub_input=False, casts=False, recip=False, back=None
):
    """X -> Pow 2 -> ReduceMean -> Add eps -> Sqrt -> Div (or Reciprocal, Mul) -> Mul gamma;
    with ``casts`` X is cast to float32 first and the result back (to ``back``, default X's
    type) before the Mul."""
    code = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    back = back or dtype
    compute = F32 if casts else dtype
    inits = {
        "two": np.array(2.0, compute),
        "eps": np.array(1e-6, compute),
        "gamma": RNG.standard_normal(shape[-1]).astype(back),
    }
    axes: dict[str, list[int]] = {"axes": [-1]}
    reduce_inputs = ["P"]
    if opset >= 18:  # ReduceMean takes its axes as an input
        inits["axes"] = np.array([-1], np.int64)
        axes, reduce_inputs = {}, ["P", "axes"]
    inputs = {"X": (list(shape), code)}
    nodes, x = [], "X"
    if sub_input:
        inputs["Z"] = (list(shape), code)
        nodes.append(helper.make_node("Sub", ["X", "Z"], ["XS"]))
        x = "XS"
    if casts:
        nodes.append(helper.make_node("Cast", [x], ["XF"], to=TensorProto.FLOAT))
        x = "XF"
    nodes += [
        helper.make_node("Pow", [x, "two"], ["P"]),
        helper.make_node("ReduceMean", reduce_inputs, ["V"], **axes),
        helper.make_node("Add", ["V", "eps"], ["E"]),
        helper.make_node("Sqrt", ["E"], ["S"]),
    ]
    if recip:
        nodes += [
            helper.make_node("Reciprocal", ["S"], ["RS"]),
            helper.make_node("Mul", [x, "RS"], ["N"]),
        ]
    else:
        nodes.append(helper.make_node("Div", [x, "S"], ["N"]))
    n = "N"
    if casts:
        back_code = helper.np_dtype_to_tensor_dtype(np.dtype(back))
        nodes.append(helper.make_node("Cast", ["N"], ["NC"], to=back_code))
        n = "NC"
    nodes.append(helper.make_node("Mul", [n, "gamma"], ["Y"]))
    return _model(nodes, inputs, inits, opset=opset)


def optimized(model, rule_names=None, target=CPU):
    rules = list(RULES.values()) if rule_names is None else [RULES[n] for n in rule_names]
    ir_model = ir.from_proto(model)
    # What the rules compute, whether or not a target profile lets them fire.
    report = optimize(ir_model, rules, Options(target=target, gate_by_profile=False))
    check_model(ir_model, target)
    return report, ir.serde.serialize_model(ir_model)


def agrees(model, result):
    feeds = random_feeds(model, seed=5)
    assert_close(run(result, feeds), run(model, feeds))


@pytest.mark.parametrize("dtype", [F32, F16])
@pytest.mark.parametrize("opset", [10, 12, 16])
def test_decomposed_layer_norm_becomes_one_node_before_opset_17(dtype, opset):
    model = layer_norm(dtype=dtype, opset=opset)
    report, result = optimized(model)
    assert report.rules["ort-layer-norm"].applied == 1
    assert ops(result) == Counter({"LayerNormalization": 1})
    agrees(model, result)


def test_no_simplified_layer_norm_inside_a_layer_norm():
    # The RMS pattern matches the tail of a LayerNormalization (X - mean is its input),
    # anchored before the Add beta: its guard leaves the whole pattern to ort-layer-norm.
    model = layer_norm()
    report, _ = optimized(model, ["ort-simplified-layer-norm"])
    assert report.rules["ort-simplified-layer-norm"].applied == 0


def test_a_residual_add_makes_it_skip_layer_norm():
    model = layer_norm(residual=True)
    report, result = optimized(model)
    assert ops(result) == Counter({"com.microsoft::SkipLayerNormalization": 1})
    assert report.rules["ort-layer-norm"].applied == 0
    agrees(model, result)


@pytest.mark.parametrize(
    "change",
    [
        {"axes": (1,)},  # not the last axis
        {"gamma_shape": (1, 8)},  # a 2-D gamma broadcasts differently
        {"opset": 17},  # the standard op: the onnx pack's rule
    ],
    ids=["axis", "gamma-2d", "opset17"],
)
def test_layer_norm_negatives(change):
    report, _ = optimized(layer_norm(**change), ["ort-layer-norm"])
    assert report.rules["ort-layer-norm"].applied == 0


def test_layer_norm_with_a_runtime_epsilon_does_not_fuse():
    model = layer_norm()
    model.graph.initializer.remove(next(t for t in model.graph.initializer if t.name == "eps"))
    model.graph.input.append(helper.make_tensor_value_info("eps", TensorProto.FLOAT, []))
    report, _ = optimized(model, ["ort-layer-norm"])
    assert report.rules["ort-layer-norm"].applied == 0


def test_layer_norm_needs_a_target_that_runs_the_extension_op():
    report, result = optimized(layer_norm(), ["ort-layer-norm"], target=load_target("onnx"))
    assert report.rules["ort-layer-norm"].applied == 0
    assert "LayerNormalization" not in ops(result)


def test_layer_norm_without_affine_part():
    model = layer_norm(affine=False)
    report, result = optimized(model)
    assert report.rules["ort-layer-norm-no-affine"].applied == 1
    assert ops(result) == Counter({"LayerNormalization": 1})
    agrees(model, result)


def test_layer_norm_without_affine_part_leaves_a_following_mul_alone():
    # A Div feeding a Mul is left to ort-layer-norm: with a gamma it cannot use (2-D) the
    # whole decomposition stays rather than half of it.
    model = layer_norm(gamma_shape=(1, 8))
    report, result = optimized(model)
    assert report.rules["ort-layer-norm-no-affine"].applied == 0
    assert "LayerNormalization" not in ops(result)


@pytest.mark.parametrize("recip", [False, True], ids=["div", "reciprocal"])
@pytest.mark.parametrize("opset", [12, 18])
def test_rms_norm_becomes_simplified_layer_norm(recip, opset):
    model = rms_norm(opset=opset, recip=recip)
    report, result = optimized(model)
    name = "ort-simplified-layer-norm" + ("-opset18" if opset >= 18 else "")
    assert report.rules[name].applied == 1
    assert ops(result) == Counter({"SimplifiedLayerNormalization": 1})
    agrees(model, result)


@pytest.mark.parametrize("recip", [False, True], ids=["div", "reciprocal-t5"])
def test_float16_rms_norm_computed_in_float32(recip):
    model = rms_norm(dtype=F16, casts=True, recip=recip)
    report, result = optimized(model)
    assert report.rules["ort-simplified-layer-norm-cast"].applied == 1
    assert ops(result) == Counter({"SimplifiedLayerNormalization": 1})
    agrees(model, result)


def test_rms_norm_of_a_difference_is_left_alone():
    report, _ = optimized(rms_norm(sub_input=True), ["ort-simplified-layer-norm"])
    assert report.rules["ort-simplified-layer-norm"].applied == 0


def test_rms_norm_cast_back_to_another_type_does_not_fuse():
    model = rms_norm(dtype=F16, casts=True, back=np.float64)
    report, _ = optimized(model, ["ort-simplified-layer-norm-cast"])
    assert report.rules["ort-simplified-layer-norm-cast"].applied == 0


# -- hand-built dynamic quantization -----------------------------------------------------


def dq_matmul(
    m=4,
    k=64,
    n=16,
    b_dtype=np.uint8,
    b_scale_shape=(1,),
    bias=None,
    scale_used_elsewhere=False,
    foreign_zero_point=False,
):
    info = np.iinfo(b_dtype)
    inits = {
        "B": RNG.integers(info.min, info.max + 1, (k, n)).astype(b_dtype),
        "b_scale": (np.abs(RNG.standard_normal(b_scale_shape)) * 0.02 + 1e-3).astype(F32),
        "b_zp": np.array(RNG.integers(info.min, info.max + 1), b_dtype),
    }
    a_zp = "a_zp" if foreign_zero_point else "z"
    nodes = [
        helper.make_node("DynamicQuantizeLinear", ["A"], ["q", "s", "z"]),
        helper.make_node("MatMulInteger", ["q", "B", a_zp, "b_zp"], ["I"]),
        helper.make_node("Mul", ["s", "b_scale"], ["M"]),
        helper.make_node("Cast", ["I"], ["F"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["F", "M"], ["P"]),
    ]
    out = "P"
    if foreign_zero_point:  # A's zero point is not DynamicQuantizeLinear's
        inits["a_zp"] = np.array(128, np.uint8)
    if bias is not None:
        inits["bias"] = RNG.standard_normal(bias).astype(F32)
        nodes.append(helper.make_node("Add", ["P", "bias"], ["Y"]))
        out = "Y"
    if scale_used_elsewhere:
        nodes.append(helper.make_node("Mul", [out, "s"], ["Y2"]))
        out = "Y2"
    return _model(nodes, {"A": ([2, m, k], TensorProto.FLOAT)}, inits, output=out, opset=21)


def exact(model, result):
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    feeds = {"A": (RNG.standard_normal(shape) * 3).astype(F32)}
    for a, e in zip(run(result, feeds), run(model, feeds)):
        np.testing.assert_array_equal(a, e)


@pytest.mark.parametrize("b_dtype", [np.uint8, np.int8])
@pytest.mark.parametrize("b_scale_shape", [(), (1,), (16,)], ids=["scalar", "one", "column"])
@pytest.mark.parametrize("bias", [None, (16,)], ids=["no-bias", "bias"])
def test_dynamic_quantize_matmul_is_exact(b_dtype, b_scale_shape, bias):
    model = dq_matmul(b_dtype=b_dtype, b_scale_shape=b_scale_shape, bias=bias)
    report, result = optimized(model)
    assert ops(result) == Counter({"com.microsoft::DynamicQuantizeMatMul": 1})
    if bias is not None:
        assert report.rules["ort-dynamic-quantize-matmul-bias"].applied == 1
    exact(model, result)


def test_a_bias_that_is_not_per_column_stays_an_add():
    model = dq_matmul(bias=(4, 16))
    _, result = optimized(model)
    assert ops(result) == Counter({"com.microsoft::DynamicQuantizeMatMul": 1, "Add": 1})
    exact(model, result)


def test_a_scale_used_elsewhere_keeps_dynamic_quantize_linear():
    # As onnxruntime: DynamicQuantizeLinear's outputs have another use, so only
    # MatMulInteger, Cast and the scale Mul fuse (MatMulIntegerToFloat).
    model = dq_matmul(scale_used_elsewhere=True)
    report, result = optimized(model)
    assert report.rules["ort-dynamic-quantize-matmul"].applied == 0
    assert ops(result) == Counter(
        {"DynamicQuantizeLinear": 1, "com.microsoft::MatMulIntegerToFloat": 1, "Mul": 1}
    )
    exact(model, result)


def test_a_2d_scale_does_not_fuse():
    model = dq_matmul(b_scale_shape=(4, 16))  # per row and column: beyond per-column
    report, result = optimized(model)
    assert report.rules["ort-dynamic-quantize-matmul"].applied == 0
    assert report.rules["ort-matmul-integer-to-float"].applied == 0
    assert not any(op.startswith("com.microsoft::") for op in ops(result))


def test_a_foreign_zero_point_keeps_dynamic_quantize_linear():
    model = dq_matmul(foreign_zero_point=True)
    report, result = optimized(model)
    assert report.rules["ort-dynamic-quantize-matmul"].applied == 0
    assert ops(result)["com.microsoft::MatMulIntegerToFloat"] == 1
    exact(model, result)


def test_matmul_integer_to_float_takes_the_kernel_type_pairs_only():
    # int8 A with uint8 B: MatMulInteger runs it, the MatMulIntegerToFloat kernel does not.
    # (A's scale is a graph input: two constant scales would fold into one.)
    inits = {"B": RNG.integers(0, 256, (8, 4)).astype(np.uint8), "sb": np.array(0.2, F32)}
    nodes = [
        helper.make_node("MatMulInteger", ["A", "B"], ["I"]),
        helper.make_node("Mul", ["sa", "sb"], ["M"]),
        helper.make_node("Cast", ["I"], ["F"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["F", "M"], ["Y"]),
    ]
    inputs = {"A": ([3, 8], TensorProto.INT8), "sa": ([], TensorProto.FLOAT)}
    model = _model(nodes, inputs, inits, opset=21)
    report, _ = optimized(model)
    assert report.rules["ort-matmul-integer-to-float"].applied == 0
    model.graph.input[0].type.tensor_type.elem_type = TensorProto.UINT8
    report, result = optimized(model)
    assert report.rules["ort-matmul-integer-to-float"].applied == 1
    feeds = {"A": RNG.integers(0, 256, (3, 8)).astype(np.uint8), "sa": np.array(0.1, F32)}
    for a, e in zip(run(result, feeds), run(model, feeds)):
        np.testing.assert_array_equal(a, e)


def test_quantization_rules_need_com_microsoft():
    report, result = optimized(dq_matmul(), target=load_target("onnx"))
    assert report.rules["ort-dynamic-quantize-matmul"].applied == 0
    assert ops(result)["DynamicQuantizeLinear"] == 1
