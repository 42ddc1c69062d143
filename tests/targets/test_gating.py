"""Gating by target: each target gets the best fused form it runs, with no rule change.

The same built-in rules, optimizing the same model, leave com.microsoft fused
ops where a provider has them (for the element types it has them for), the
standard LayerNormalization/Gelu where it has only those, and nothing fused
where it has neither; stated limits (constant inputs, ranks, attributes)
block a rewrite whose new node would break them.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from helpers import assert_close, random_feeds, rules_from_text, run
from onnx import helper, numpy_helper

from onnxfuse.api import select_rules
from onnxfuse.files.model_io import check_model
from onnxfuse.passes.normalize import normalize
from onnxfuse.passes.pipeline import Options, op_histogram, optimize
from onnxfuse.rewrite.conditions import RuleMatcher
from onnxfuse.rewrite.matcher import ModelContext
from onnxfuse.rewrite.plan import plan_replacement
from onnxfuse.targets.capabilities import load_target

F32, F16 = np.float32, np.float16


@pytest.fixture(scope="module")
def rules():
    return select_rules()


def _model(nodes, inputs, outputs, inits, opset, functions=(), domains=()):
    graph = helper.make_graph(nodes, "m", inputs, outputs, inits)
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid(d, v) for d, v in (("", opset), *domains)],
        ir_version=8,
        functions=list(functions),
    )
    onnx.checker.check_model(model, full_check=True)
    return model


def encoder_block(opset: int = 17, dtype=F32, hidden: int = 8) -> onnx.ModelProto:
    """A residual Add, a decomposed layer norm, MatMul + bias, erf-Gelu, Dropout, Identity."""
    rng = np.random.default_rng(0)
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    inits: list[onnx.TensorProto] = []
    nodes: list[onnx.NodeProto] = []

    def const(name, value, kind=dtype):
        inits.append(numpy_helper.from_array(np.asarray(value, kind), name))
        return name

    def node(op, inputs, out, **attrs):
        nodes.append(helper.make_node(op, inputs, [out], name=out, **attrs))
        return out

    def mean(x, out):
        if opset >= 18:
            return node("ReduceMean", [x, const(f"{out}.axes", [-1], np.int64)], out)
        return node("ReduceMean", [x], out, axes=[-1])

    res = node("Add", ["X", "skip"], "res")
    diff = node("Sub", [res, mean(res, "mean")], "diff")
    var = mean(node("Pow", [diff, const("two", 2.0)], "sq"), "var")
    std = node("Sqrt", [node("Add", [var, const("eps", 1e-5)], "var_eps")], "std")
    norm = node("Div", [diff, std], "norm")
    scaled = node("Mul", [norm, const("gamma", 1 + 0.1 * rng.standard_normal(hidden))], "scaled")
    ln = node("Add", [scaled, const("beta", 0.1 * rng.standard_normal(hidden))], "ln")
    mm = node("MatMul", [ln, const("W", 0.3 * rng.standard_normal((hidden, hidden)))], "mm")
    h = node("Add", [mm, const("bias", 0.1 * rng.standard_normal(hidden))], "h")
    erf = node("Erf", [node("Mul", [h, const("rsqrt2", 0.70710677)], "h_s")], "erf")
    gate = node("Add", [erf, const("one", 1.0)], "gate")
    gelu = node("Mul", [node("Mul", [h, const("half", 0.5)], "half_h"), gate], "gelu")
    node("Identity", [node("Dropout", [gelu], "drop")], "Y")
    shape = [2, 4, hidden]
    return _model(
        nodes,
        [helper.make_tensor_value_info(n, elem, shape) for n in ("X", "skip")],
        [helper.make_tensor_value_info("Y", elem, shape)],
        inits,
        opset,
    )


def conv_relu(dtype=F32, spatial: int = 2, weight_constant: bool = True) -> onnx.ModelProto:
    rng = np.random.default_rng(1)
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    kernel = [3] * spatial
    inits = [numpy_helper.from_array(rng.standard_normal([4]).astype(dtype), "b")]
    inputs = [helper.make_tensor_value_info("x", elem, [1, 3, *([6] * spatial)])]
    weight = rng.standard_normal([4, 3, *kernel]).astype(dtype)
    if weight_constant:
        inits.append(numpy_helper.from_array(weight, "w"))
    else:
        inputs.append(helper.make_tensor_value_info("w", elem, list(weight.shape)))
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", pads=[1] * 2 * spatial),
        helper.make_node("Relu", ["c"], ["y"], name="relu"),
    ]
    outputs = [helper.make_tensor_value_info("y", elem, [1, 4, *([6] * spatial)])]
    return _model(nodes, inputs, outputs, inits, 17)


def optimized(
    model: onnx.ModelProto, rules, target: str, gate_by_profile: bool = True
) -> tuple[dict[str, int], ir.Model]:
    result = ir.from_proto(model)
    optimize(result, rules, Options(target=load_target(target), gate_by_profile=gate_by_profile))
    check_model(result)  # full onnx checker
    return op_histogram(result), result


LAYER_NORM_ONLY = {"Add": 3, "Erf": 1, "LayerNormalization": 1, "MatMul": 1, "Mul": 3}
DECOMPOSED = {
    "Add": 5,
    "Div": 1,
    "Erf": 1,
    "MatMul": 1,
    "Mul": 4,
    "Pow": 1,
    "ReduceMean": 2,
    "Sqrt": 1,
    "Sub": 1,
}
SKIP_AND_BIAS_GELU = {
    "MatMul": 1,
    "com.microsoft::BiasGelu": 1,
    "com.microsoft::SkipLayerNormalization": 1,
}


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        # SkipLayerNormalization needs a measurement on cpu (needs_profile): slower than
        # Add + LayerNormalization on some CPUs
        ("cpu", {"Add": 1, "LayerNormalization": 1, "MatMul": 1, "com.microsoft::BiasGelu": 1}),
        ("cuda", SKIP_AND_BIAS_GELU),
        ("dml", SKIP_AND_BIAS_GELU),
        ("webgpu", SKIP_AND_BIAS_GELU),
        # JS has no BiasGelu: Gelu after the bias Add instead
        (
            "js",
            {
                "Add": 1,
                "MatMul": 1,
                "com.microsoft::Gelu": 1,
                "com.microsoft::SkipLayerNormalization": 1,
            },
        ),
        ("coreml", LAYER_NORM_ONLY),
        ("qnn", LAYER_NORM_ONLY),
        ("webnn", LAYER_NORM_ONLY),
        ("tensorrt", LAYER_NORM_ONLY),
        ("onnx", LAYER_NORM_ONLY),
        # neither fused form: the norm stays decomposed; Dropout and Identity still go
        ("nnapi", DECOMPOSED),
        ("xnnpack", DECOMPOSED),
    ],
)
def test_each_target_gets_the_fused_form_it_runs(rules, target, expected):
    model = encoder_block()
    ops, result = optimized(model, rules, target)
    assert ops == expected
    if not any(op.startswith("com.microsoft::") for op in ops) or target == "cpu":
        feeds = random_feeds(model)
        assert_close(run(result, feeds), run(model, feeds))


def test_float16_gets_no_float_only_kernel_on_cpu_but_does_on_cuda(rules):
    model = encoder_block(dtype=F16)
    cpu, _ = optimized(model, rules, "cpu", gate_by_profile=False)
    cuda, _ = optimized(model, rules, "cuda")
    # onnxruntime's CPU BiasGelu and Gelu are float32 kernels; SkipLayerNormalization
    # also runs float16 there. CUDA has all three for float16.
    assert "com.microsoft::BiasGelu" not in cpu and "Erf" in cpu
    assert cpu["com.microsoft::SkipLayerNormalization"] == 1
    assert cuda == SKIP_AND_BIAS_GELU


def test_opset_20_brings_standard_gelu_to_coreml_and_opset_21_is_past_tensorrt(rules):
    coreml, _ = optimized(encoder_block(opset=20), rules, "coreml")
    assert coreml == {"Add": 2, "Gelu": 1, "LayerNormalization": 1, "MatMul": 1}
    tensorrt, _ = optimized(encoder_block(opset=21), rules, "tensorrt")
    assert tensorrt == DECOMPOSED  # the TensorRT 10.1 parser: models of opset 9 to 20


@pytest.mark.parametrize(
    ("target", "dtype", "fused"),
    [
        ("cpu", F32, True),
        ("cpu", F16, False),  # FusedConv: float32 kernel only
        ("cuda", F32, True),
        ("cuda", F16, False),  # CUDA's FusedConv is registered for float only, too
        ("webgpu", F16, True),  # WebGPU's is float32 and float16
        ("js", F16, True),
        ("dml", F32, False),  # no FusedConv at all
        ("coreml", F32, False),
    ],
)
def test_fused_conv_follows_the_capability_file(rules, target, dtype, fused):
    ops, _ = optimized(conv_relu(dtype), rules, target)
    assert ("com.microsoft::FusedConv" in ops) is fused


def test_one_rule_gets_each_verdict_its_facts_call_for(rules):
    """The target's verdicts are kept per rule by facts: a float32 Conv + Relu fuses
    on cpu and a float16 one beside it in the same model does not, in either order."""
    for first, second in ((F32, F16), (F16, F32)):
        parts = [conv_relu(first), conv_relu(second)]
        nodes, inputs, outputs, inits = [], [], [], []
        for k, part in enumerate(parts):
            rename = {n: f"{n}{k}" for n in ("x", "w", "b", "c", "y")}
            for node in part.graph.node:
                copy = onnx.NodeProto()
                copy.CopyFrom(node)
                copy.name = f"{node.name}{k}"
                copy.input[:] = [rename[i] for i in node.input]
                copy.output[:] = [rename[o] for o in node.output]
                nodes.append(copy)
            for infos, out in ((part.graph.input, inputs), (part.graph.output, outputs)):
                for info in infos:
                    out.append(onnx.ValueInfoProto())
                    out[-1].CopyFrom(info)
                    out[-1].name = rename[info.name]
            for tensor in part.graph.initializer:
                inits.append(onnx.TensorProto())
                inits[-1].CopyFrom(tensor)
                inits[-1].name = rename[tensor.name]
        ops, _ = optimized(_model(nodes, inputs, outputs, inits, 17), rules, "cpu")
        assert ops == {"Conv": 1, "Relu": 1, "com.microsoft::FusedConv": 1}


def _with_bn(model: onnx.ModelProto) -> onnx.ModelProto:
    """conv_relu with a BatchNormalization between Conv and Relu (folds into the Conv)."""
    channels = 4
    rng = np.random.default_rng(2)
    graph = model.graph
    names = ("scale", "beta", "mean", "var")
    values = (
        1 + 0.1 * rng.standard_normal(channels),
        0.1 * rng.standard_normal(channels),
        0.1 * rng.standard_normal(channels),
        1 + 0.1 * rng.random(channels),
    )
    elem = graph.input[0].type.tensor_type.elem_type
    dtype = helper.tensor_dtype_to_np_dtype(elem)
    inits = list(graph.initializer) + [
        numpy_helper.from_array(np.asarray(v, dtype), n) for n, v in zip(names, values)
    ]
    conv, relu = graph.node
    bn = helper.make_node("BatchNormalization", ["c", *names], ["n"], name="bn")
    nodes = [conv, bn, helper.make_node("Relu", ["n"], ["y"], name="relu")]
    del relu
    return _model(nodes, list(graph.input), list(graph.output), inits, 17)


@pytest.mark.parametrize(
    ("target", "spatial", "folds"),
    [
        ("coreml", 2, True),
        ("coreml", 3, False),  # CoreML Conv: 1-D/2-D only
        ("nnapi", 2, True),
        ("nnapi", 1, False),  # NNAPI Conv: 2-D only (4-D input)
        ("xnnpack", 2, True),
        ("xnnpack", 3, False),  # XNNPACK Conv: input rank 3 or 4
        ("cpu", 3, True),
    ],
)
def test_conv_limits_gate_the_batchnorm_fold(rules, target, spatial, folds):
    ops, result = optimized(_with_bn(conv_relu(spatial=spatial)), rules, target)
    assert ("BatchNormalization" not in ops) is folds
    if folds and target != "cpu":
        feeds = random_feeds(_with_bn(conv_relu(spatial=spatial)))
        assert_close(run(result, feeds), run(_with_bn(conv_relu(spatial=spatial)), feeds))


def matmul_add(weight_constant: bool) -> onnx.ModelProto:
    rng = np.random.default_rng(3)
    inputs = [helper.make_tensor_value_info("a", onnx.TensorProto.FLOAT, [3, 5])]
    inits = [numpy_helper.from_array(rng.standard_normal(4).astype(F32), "c")]
    weight = rng.standard_normal([5, 4]).astype(F32)
    if weight_constant:
        inits.append(numpy_helper.from_array(weight, "b"))
    else:
        inputs.append(helper.make_tensor_value_info("b", onnx.TensorProto.FLOAT, [5, 4]))
    nodes = [
        helper.make_node("MatMul", ["a", "b"], ["m"], name="mm"),
        helper.make_node("Add", ["m", "c"], ["y"], name="add"),
    ]
    outputs = [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [3, 4])]
    return _model(nodes, inputs, outputs, inits, 17)


@pytest.mark.parametrize("target", ["coreml", "xnnpack"])
def test_gemm_needs_a_constant_weight_where_the_source_says_so(rules, target):
    constant, _ = optimized(matmul_add(weight_constant=True), rules, target)
    runtime, _ = optimized(matmul_add(weight_constant=False), rules, target)
    assert constant == {"Gemm": 1}
    assert runtime == {"Add": 1, "MatMul": 1}  # "B must be constant initializer"
    cpu, _ = optimized(matmul_add(weight_constant=False), rules, "cpu")
    assert cpu == {"Gemm": 1}


TRANSPOSE_INTO_GEMM = """
rules:
  - name: transpose-into-gemm
    source: |
      f (A, B) => (Y) {
        T = Transpose<perm = [1, 0]>(A)
        Y = Gemm(T, B)
      }
    target: |
      f (A, B) => (Y) {
        Y = Gemm<transA = 1>(A, B)
      }
"""
RELU_RELU = """
rules:
  - name: relu-twice
    source: |
      f (X) => (Y) {
        T = Relu(X)
        Y = Relu(T)
      }
    target: |
      f (X) => (Y) {
        Y = Relu(X)
      }
"""


def test_attribute_limit_blocks_a_new_gemm_with_transA():
    rng = np.random.default_rng(4)
    inits = [numpy_helper.from_array(rng.standard_normal([5, 4]).astype(F32), "b")]
    nodes = [
        helper.make_node("Transpose", ["a"], ["t"], name="t", perm=[1, 0]),
        helper.make_node("Gemm", ["t", "b"], ["y"], name="g"),
    ]
    model = _model(
        nodes,
        [helper.make_tensor_value_info("a", onnx.TensorProto.FLOAT, [5, 3])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [3, 4])],
        inits,
        17,
    )
    rule = rules_from_text(TRANSPOSE_INTO_GEMM)
    cpu, _ = optimized(model, rule, "cpu")
    coreml, _ = optimized(model, rule, "coreml")
    assert cpu == {"Gemm": 1}
    assert coreml == {"Gemm": 1, "Transpose": 1}  # CoreML Gemm: "transA==0"
    explained = RuleMatcher(rule[0], ModelContext(8, {"": 17}), load_target("coreml"))
    normalized = ir.from_proto(model)
    normalize(normalized)
    gemm = next(n for n in normalized.graph if n.op_type == "Gemm")
    assert explained.match(gemm) is None
    assert "attribute transA=1" in str(explained.mismatch)


@pytest.mark.parametrize(("rank", "fires"), [(4, True), (5, False)])
def test_nnapi_max_rank(rank, fires):
    shape = [2] * rank
    nodes = [
        helper.make_node("Relu", ["x"], ["t"], name="r1"),
        helper.make_node("Relu", ["t"], ["y"], name="r2"),
    ]
    model = _model(
        nodes,
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, shape)],
        [],
        17,
    )
    ops, _ = optimized(model, rules_from_text(RELU_RELU), "nnapi")
    assert ops == ({"Relu": 1} if fires else {"Relu": 2})


def test_explain_names_the_element_type(rules):
    model = ir.from_proto(encoder_block(dtype=F16))
    normalize(model)
    rule = next(r for r in rules if r.name == "ort-bias-gelu")
    matcher = RuleMatcher(rule, ModelContext(8, {"": 17}), load_target("cpu"))
    anchors = [n for n in model.graph if (n.domain, n.op_type) in rule.anchor_keys]
    assert all(matcher.match(n) is None for n in anchors)
    # the erf chain is not fused yet, so BiasGelu's own anchor (a Gelu) is absent;
    # fuse it first the way the optimizer would, with a target that allows float16
    optimize(model, [r for r in rules if r.name == "ort-gelu-erf"], Options(target=None))
    gelu = next(n for n in model.graph if n.op_type == "Gelu")
    assert matcher.match(gelu) is None
    assert "com.microsoft::BiasGelu for T=float16" in str(matcher.mismatch)


RELU_TO_GELU = """
rules:
  - name: relu-to-gelu-for-test
    imports: {com.microsoft: 1}
    source: |
      f (X) => (Y) {
        Y = Relu(X)
      }
    target: |
      f (X) => (Y) {
        Y = com.microsoft.Gelu(X)
      }
"""


def test_unknown_element_types_fall_back_to_opset_gating():
    (rule,) = rules_from_text(RELU_TO_GELU)
    typed = ir.Value(name="x", type=ir.TensorType(ir.DataType.FLOAT16), shape=ir.Shape([2]))
    untyped = ir.Value(name="x")
    cpu = load_target("cpu")
    opsets = {"": 17, "com.microsoft": 1}
    assert cpu.unsupported(
        plan_replacement(rule, set(), opsets, values={"X": typed}).kernels()
    ) == ["com.microsoft::Gelu for T=float16"]
    assert (
        cpu.unsupported(plan_replacement(rule, set(), opsets, values={"X": untyped}).kernels())
        == []
    )
    assert load_target("nnapi").unsupported(
        plan_replacement(rule, set(), opsets, values={"X": untyped}).kernels()
    )
    (facts,) = plan_replacement(rule, set(), opsets, values={"X": untyped}).kernels()
    assert facts.inputs[0].dtype is None


def test_function_bodies_are_gated_by_op_and_opset():
    """Values inside a model-local function carry no types: a float16 Relu there is
    rewritten for cpu (op and opset allow it), the same Relu in the main graph is not."""
    half = onnx.TensorProto.FLOAT16
    function = helper.make_function(
        "local",
        "act",
        ["X"],
        ["Y"],
        [helper.make_node("Relu", ["X"], ["Y"])],
        opset_imports=[helper.make_opsetid("", 17)],
    )
    model = _model(
        [
            helper.make_node("act", ["x"], ["f"], domain="local", name="call"),
            helper.make_node("Relu", ["f"], ["y"], name="relu"),
        ],
        [helper.make_tensor_value_info("x", half, [2, 3])],
        [helper.make_tensor_value_info("y", half, [2, 3])],
        [],
        17,
        functions=[function],
        domains=[("local", 1)],
    )
    rules = rules_from_text(RELU_TO_GELU)
    for target, in_function in (("cpu", True), ("nnapi", False)):
        result = ir.from_proto(model)
        optimize(result, rules, Options(target=load_target(target)))
        body = [n.op_type for n in result.functions[("local", "act", "")]]
        assert body == (["Gelu"] if in_function else ["Relu"]), target
        assert [n.op_type for n in result.graph] == ["act", "Relu"], target
