"""The core rule pack's foldings: BatchNormalization/Add/Mul into Conv, MatMul+Add into
Gemm, Pad into Conv/AveragePool; and the whole pack on a small network.

onnxruntime's CPU provider runs Conv, ConvTranspose and AveragePool in float32
only, so the numerics of those rules are checked in float32.
"""

from __future__ import annotations

import numpy as np
import pytest
from core_pack_support import (
    CORE_RULES,
    F16,
    F32,
    F64,
    RULES,
    build,
    fire,
    no_fire,
    node,
    ops,
)
from helpers import assert_close, optimize_proto, run
from hypothesis import given
from hypothesis import strategies as st
from onnx import numpy_helper
from onnx.reference import ReferenceEvaluator

I64 = np.int64
RNG = np.random.default_rng(1234)


@pytest.fixture(autouse=True)
def _fresh_rng():
    """Each test draws the same values whatever ran before it (and under xdist)."""
    global RNG
    RNG = np.random.default_rng(1234)


def randn(*shape, dtype=F32):
    return RNG.standard_normal(shape).astype(dtype)


def bn_params(channels: int, dtype=F32) -> dict[str, np.ndarray]:
    return {
        "scale": (RNG.uniform(0.5, 1.5, channels) * RNG.choice([-1, 1], channels)).astype(dtype),
        "bias": randn(channels, dtype=dtype),
        "mean": randn(channels, dtype=dtype),
        "var": RNG.uniform(0.2, 2.0, channels).astype(dtype),
    }


BN_INPUTS = ["c", "scale", "bias", "mean", "var"]


# -- Conv + BatchNormalization ---------------------------------------------------


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize(
    ("x_shape", "w_shape", "attrs"),
    [
        ([1, 4, 6, 6], [6, 4, 3, 3], {"pads": [1, 1, 1, 1]}),
        ([2, 4, 7, 5], [4, 2, 3, 1], {"group": 2, "strides": [2, 1]}),
        ([1, 3, 9], [5, 3, 3], {"dilations": [2]}),
        ([1, 2, 4, 4, 4], [3, 2, 2, 2, 2], {}),
        ([1, 4, 5, 5], [4, 1, 3, 3], {"group": 4, "auto_pad": "SAME_UPPER"}),
    ],
)
@pytest.mark.parametrize("opset", [9, 15])
def test_conv_bn_fold_fires(bias, x_shape, w_shape, attrs, opset):
    m = w_shape[0]
    inits = {"w": randn(*w_shape), **bn_params(m)}
    conv_inputs = ["x", "w"]
    if bias:
        inits["b"] = randn(m)
        conv_inputs.append("b")
    model = build(
        [
            node("Conv", conv_inputs, "c", **attrs),
            node("BatchNormalization", BN_INPUTS, "y", epsilon=1e-3, momentum=0.8),
        ],
        {"x": (x_shape, F32)},
        inits=inits,
        opset=opset,
    )
    name = "conv-bn-fold" if bias else "conv-bn-fold-nobias"
    result = fire(model, name)
    assert ops(result) == ["Conv"]
    conv = result.graph.node[0]
    assert {a.name for a in conv.attribute} == set(attrs)


@pytest.mark.parametrize("name", ["conv-bn-fold", "convtranspose-bn-fold"])
@pytest.mark.parametrize("dtype", [F64, F16])
def test_bn_folds_in_other_float_types_against_the_reference_evaluator(name, dtype):
    """onnxruntime CPU has no float64/float16 Conv: use onnx's reference evaluator.

    float64 must agree with the source; float16 re-rounds the folded weights, so
    the folded model must be about as close to an exact float64 result as the
    source is (within one float16 ulp of the output's magnitude).
    """
    op = "Conv" if name == "conv-bn-fold" else "ConvTranspose"
    # The reference evaluator has no grouped ConvTranspose; groups are checked in float32.
    w_shape = (6, 4, 3, 3) if op == "Conv" else (4, 3, 3, 3)
    m = w_shape[0] if op == "Conv" else w_shape[1]
    attrs = {"pads": [1, 1, 1, 1]} if op == "Conv" else {"strides": [2, 2]}
    inits = {"w": randn(*w_shape), "b": randn(m), **bn_params(m)}

    def model(dt):
        return build(
            [node(op, ["x", "w", "b"], "c", **attrs), node("BatchNormalization", BN_INPUTS, "y")],
            {"x": ([1, 4, 5, 5], dt)},
            inits={k: v.astype(dt) for k, v in inits.items()},
            opset=15,
        )

    source = model(dtype)
    report, result = optimize_proto(source, [RULES[name]])
    assert report.rules[name].applied == 1
    x = randn(1, 4, 5, 5)
    exact = ReferenceEvaluator(model(F64)).run(None, {"x": x})[0]
    before = ReferenceEvaluator(source).run(None, {"x": x.astype(dtype)})[0]
    after = ReferenceEvaluator(result).run(None, {"x": x.astype(dtype)})[0]
    assert after.dtype == dtype
    if dtype == F64:
        np.testing.assert_allclose(after, before, rtol=1e-7, atol=1e-7)
    else:
        ulp = float(np.spacing(np.float16(np.max(np.abs(exact)))))
        source_error = float(np.max(np.abs(before - exact)))
        assert float(np.max(np.abs(after - exact))) <= source_error + ulp


def test_conv_bn_fold_ir3_initializers_are_constants():
    # IR 3 lists every initializer as a graph input; they are still constants there.
    inits = {"w": randn(4, 3, 3, 3), "b": randn(4), **bn_params(4)}
    model = build(
        [node("Conv", ["x", "w", "b"], "c"), node("BatchNormalization", BN_INPUTS, "y")],
        {"x": ([1, 3, 5, 5], F32)},
        inits=inits,
        opset=8,
        ir_version=3,
        inits_as_inputs=True,
    )
    assert ops(fire(model, "conv-bn-fold")) == ["Conv"]


def _conv_bn(conv_inputs=("x", "w", "b"), inputs=None, inits=None, outputs=("y",), bn_attrs=None):
    base = {"w": randn(4, 3, 3, 3), "b": randn(4), **bn_params(4)}
    for name in inputs or {}:
        base.pop(name, None)
    base.update(inits or {})
    return build(
        [
            node("Conv", list(conv_inputs), "c"),
            node("BatchNormalization", BN_INPUTS, "y", **(bn_attrs or {})),
        ],
        {"x": ([1, 3, 5, 5], F32), **(inputs or {})},
        list(outputs),
        inits=base,
        opset=15,
    )


@pytest.mark.parametrize(
    "model",
    [
        pytest.param(lambda: _conv_bn(inputs={"w": ([4, 3, 3, 3], F32)}), id="runtime-weight"),
        pytest.param(lambda: _conv_bn(inputs={"mean": ([4], F32)}), id="runtime-mean"),
        pytest.param(lambda: _conv_bn(outputs=("y", "c")), id="conv-output-escapes"),
        pytest.param(
            lambda: _conv_bn(inits={"scale": randn(4, dtype=F64), "bias": randn(4, dtype=F64)}),
            id="mixed-dtypes",
        ),
    ],
)
def test_conv_bn_fold_not(model):
    no_fire(model(), "conv-bn-fold")


def _with_inf(values: np.ndarray) -> np.ndarray:
    values = values.copy()
    values[1] = np.inf
    return values


@pytest.mark.parametrize("name", ["scale", "var", "w"])
def test_conv_bn_fold_not_with_a_non_finite_constant(name):
    # Folded, inf * 0 would be NaN in the weights where the source gives inf or 0.
    base = {"w": randn(4, 3, 3, 3), "b": randn(4), **bn_params(4)}
    no_fire(_conv_bn(inits={name: _with_inf(base[name])}), "conv-bn-fold")


@pytest.mark.parametrize("bias", [True, False])
def test_conv_mul_fold_not_with_a_non_finite_scale(bias):
    name = "conv-mul-fold" + ("" if bias else "-nobias")
    model = _conv_then("Mul", [4, 1, 1], bias)
    k = next(t for t in model.graph.initializer if t.name == "k")
    values = numpy_helper.to_array(k).copy()
    values[0] = np.inf
    k.CopyFrom(numpy_helper.from_array(values, "k"))
    no_fire(model, name)


def test_conv_bn_fold_not_in_training_mode():
    model = build(
        [
            node("Conv", ["x", "w", "b"], "c"),
            node("BatchNormalization", BN_INPUTS, ["y", "rm", "rv"], training_mode=1),
        ],
        {"x": ([1, 3, 5, 5], F32)},
        inits={"w": randn(4, 3, 3, 3), "b": randn(4), **bn_params(4)},
        opset=15,
    )
    no_fire(model, "conv-bn-fold")


def test_conv_bn_fold_not_for_overridable_initializers():
    inits = {"w": randn(4, 3, 3, 3), "b": randn(4), **bn_params(4)}
    model = build(
        [node("Conv", ["x", "w", "b"], "c"), node("BatchNormalization", BN_INPUTS, "y")],
        {"x": ([1, 3, 5, 5], F32)},
        inits=inits,
        opset=15,
        inits_as_inputs=True,
    )
    no_fire(model, "conv-bn-fold")


def test_conv_bn_fold_nobias_not_with_runtime_weight():
    model = build(
        [node("Conv", ["x", "w"], "c"), node("BatchNormalization", BN_INPUTS, "y")],
        {"x": ([1, 3, 5, 5], F32), "w": ([4, 3, 3, 3], F32)},
        inits=bn_params(4),
    )
    no_fire(model, "conv-bn-fold-nobias")


# -- ConvTranspose + BatchNormalization ------------------------------------------


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize(
    ("x_shape", "w_shape", "attrs"),
    [
        ([1, 4, 5, 5], [4, 6, 3, 3], {}),
        ([1, 4, 5, 5], [4, 3, 3, 3], {"group": 2, "strides": [2, 2], "output_padding": [1, 0]}),
        ([2, 6, 4, 3], [6, 2, 2, 3], {"group": 3, "pads": [1, 0, 0, 1]}),
        ([1, 4, 7], [4, 5, 3], {"group": 1, "strides": [3]}),
        ([1, 2, 3, 3, 3], [2, 3, 2, 2, 2], {"group": 2}),
    ],
)
def test_convtranspose_bn_fold_fires(bias, x_shape, w_shape, attrs):
    m = w_shape[1] * attrs.get("group", 1)
    inits = {"w": randn(*w_shape), **bn_params(m)}
    conv_inputs = ["x", "w"]
    if bias:
        inits["b"] = randn(m)
        conv_inputs.append("b")
    model = build(
        [
            node("ConvTranspose", conv_inputs, "c", **attrs),
            node("BatchNormalization", BN_INPUTS, "y", epsilon=1e-4),
        ],
        {"x": (x_shape, F32)},
        inits=inits,
        opset=14,
    )
    name = "convtranspose-bn-fold" if bias else "convtranspose-bn-fold-nobias"
    assert ops(fire(model, name)) == ["ConvTranspose"]


@pytest.mark.parametrize("bias", [True, False])
def test_convtranspose_bn_fold_not_with_runtime_weight(bias):
    conv_inputs = ["x", "w", "b"] if bias else ["x", "w"]
    model = build(
        [node("ConvTranspose", conv_inputs, "c"), node("BatchNormalization", BN_INPUTS, "y")],
        {"x": ([1, 4, 5, 5], F32), "w": ([4, 6, 3, 3], F32)},
        inits={"b": randn(6), **bn_params(6)} if bias else bn_params(6),
    )
    no_fire(model, "convtranspose-bn-fold" if bias else "convtranspose-bn-fold-nobias")


def test_convtranspose_bn_fold_not_when_output_escapes():
    model = build(
        [node("ConvTranspose", ["x", "w", "b"], "c"), node("BatchNormalization", BN_INPUTS, "y")],
        {"x": ([1, 4, 5, 5], F32)},
        ["y", "c"],
        inits={"w": randn(4, 6, 3, 3), "b": randn(6), **bn_params(6)},
    )
    no_fire(model, "convtranspose-bn-fold")


# -- Conv + Add / Mul --------------------------------------------------------------

# Constant shapes that vary only along the output channel (M = 4 for a 2-D conv).
CHANNEL_SHAPES = [[4, 1, 1], [1, 4, 1, 1], [], [1], [1, 1, 1, 1], [1, 1]]
# Shapes that broadcast along other axes, or add an axis: must not fold.
OTHER_SHAPES = [[5], [1, 4, 5, 5], [1, 1, 1, 5], [2, 4, 1, 1], [1, 1, 4, 1, 1]]


def _conv_then(op, const_shape, bias=True, **options):
    inits = {"w": randn(4, 3, 3, 3), "k": randn(*const_shape)}
    conv_inputs = ["x", "w"]
    if bias:
        inits["b"] = randn(4)
        conv_inputs.append("b")
    return build(
        [node("Conv", conv_inputs, "c", pads=[1, 1, 1, 1]), node(op, ["c", "k"], "y")],
        {"x": ([2, 3, 5, 5], F32)},
        inits=inits,
        **options,
    )


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", CHANNEL_SHAPES)
@pytest.mark.parametrize("op", ["Add", "Mul"])
def test_conv_add_mul_fold_fires(op, shape, bias):
    name = f"conv-{op.lower()}-fold" + ("" if bias else "-nobias")
    model = _conv_then(op, shape, bias)
    assert ops(fire(model, name)) == ["Conv"]


@pytest.mark.parametrize("op", ["Add", "Mul"])
def test_conv_add_mul_fold_fires_with_constant_first(op):
    model = build(
        [node("Conv", ["x", "w", "b"], "c"), node(op, ["k", "c"], "y")],
        {"x": ([1, 3, 5], F32)},
        inits={"w": randn(4, 3, 2), "b": randn(4), "k": randn(4, 1)},
    )
    assert ops(fire(model, f"conv-{op.lower()}-fold")) == ["Conv"]


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", OTHER_SHAPES)
@pytest.mark.parametrize("op", ["Add", "Mul"])
def test_conv_add_mul_fold_not_for_other_broadcasts(op, shape, bias):
    name = f"conv-{op.lower()}-fold" + ("" if bias else "-nobias")
    no_fire(_conv_then(op, shape, bias), name)


@pytest.mark.parametrize("op", ["Add", "Mul"])
def test_conv_add_mul_fold_not_with_runtime_operand(op):
    model = build(
        [node("Conv", ["x", "w", "b"], "c"), node(op, ["c", "k"], "y")],
        {"x": ([1, 3, 5, 5], F32), "k": ([4, 1, 1], F32)},
        inits={"w": randn(4, 3, 3, 3), "b": randn(4)},
    )
    no_fire(model, f"conv-{op.lower()}-fold")


@pytest.mark.parametrize("op", ["Add", "Mul"])
def test_conv_add_mul_fold_not_when_conv_output_escapes(op):
    model = build(
        [node("Conv", ["x", "w"], "c"), node(op, ["c", "k"], "y"), node("Relu", ["c"], "z")],
        {"x": ([1, 3, 5, 5], F32)},
        ["y", "z"],
        inits={"w": randn(4, 3, 3, 3), "k": randn(4, 1, 1)},
    )
    no_fire(model, f"conv-{op.lower()}-fold-nobias")


@given(
    shape=st.sampled_from(CHANNEL_SHAPES + OTHER_SHAPES),
    op=st.sampled_from(["Add", "Mul"]),
    bias=st.booleans(),
)
def test_conv_add_mul_fold_property(shape, op, bias):
    name = f"conv-{op.lower()}-fold" + ("" if bias else "-nobias")
    model = _conv_then(op, shape, bias)
    report, result = optimize_proto(model, [RULES[name]])
    assert report.rules[name].applied == (1 if shape in CHANNEL_SHAPES else 0)
    feeds = {"x": randn(2, 3, 5, 5)}
    assert_close(run(result, feeds), run(model, feeds))


# -- MatMul + Add -> Gemm ----------------------------------------------------------


@pytest.mark.parametrize("dtype", [F32, F64])
@pytest.mark.parametrize("c_shape", [[5], [1, 5], [3, 5], [3, 1], [], [1], [1, 1]])
@pytest.mark.parametrize("c_const", [True, False])
def test_matmul_add_gemm_fires(dtype, c_shape, c_const):
    inputs = {"a": ([3, 4], dtype)}
    inits = {"b": randn(4, 5, dtype=dtype)}
    if c_const:
        inits["c"] = randn(*c_shape, dtype=dtype)
    else:
        inputs["c"] = (c_shape, dtype)
    model = build(
        [node("MatMul", ["a", "b"], "p"), node("Add", ["p", "c"], "y")], inputs, inits=inits
    )
    assert ops(fire(model, "matmul-add-gemm", special=True)) == ["Gemm"]


def test_matmul_add_gemm_fires_with_symbolic_rows_and_runtime_weights():
    model = build(
        [node("MatMul", ["a", "b"], "p"), node("Add", ["c", "p"], "y")],
        {"a": (["m", 4], F32), "b": ([4, "n"], F32), "c": (["m", "n"], F32)},
    )
    feeds = {"a": randn(6, 4), "b": randn(4, 2), "c": randn(6, 2)}
    assert ops(fire(model, "matmul-add-gemm", feeds=feeds)) == ["Gemm"]


@pytest.mark.parametrize(
    ("a_shape", "b_shape", "c_shape"),
    [
        ([2, 3, 4], [4, 5], [5]),  # A is 3-D
        ([3, 4], [2, 4, 5], [5]),  # B is 3-D
        ([1, 4], [4, 5], [3, 5]),  # C broadcasts the product up to [3, 5]
        ([3, 4], [4, 1], [3, 5]),
        ([3, 4], [4, 5], [2, 3, 5]),  # C adds an axis
        (["m", 4], [4, 5], ["k", 5]),  # dimensions not provably equal
        ([3, 4], [4], [3]),  # B is 1-D
    ],
)
def test_matmul_add_gemm_not(a_shape, b_shape, c_shape):
    model = build(
        [node("MatMul", ["a", "b"], "p"), node("Add", ["p", "c"], "y")],
        {"a": (a_shape, F32), "b": (b_shape, F32), "c": (c_shape, F32)},
    )
    no_fire(model, "matmul-add-gemm")


def test_matmul_add_gemm_not_for_unknown_rank():
    # The Reshape's target shape is a runtime input of unknown length: A's rank is unknown.
    model = build(
        [
            node("Reshape", ["x", "s"], "a"),
            node("MatMul", ["a", "b"], "p"),
            node("Add", ["p", "c"], "y"),
        ],
        {"x": ([3, 4], F32), "s": (["k"], I64)},
        inits={"b": randn(4, 5), "c": randn(5)},
        output_shapes={"y": ["m", "n"]},
    )
    no_fire(model, "matmul-add-gemm")


def test_matmul_add_gemm_not_when_product_escapes():
    model = build(
        [node("MatMul", ["a", "b"], "p"), node("Add", ["p", "c"], "y")],
        {"a": ([3, 4], F32)},
        ["y", "p"],
        inits={"b": randn(4, 5), "c": randn(5)},
    )
    no_fire(model, "matmul-add-gemm")


def test_matmul_add_gemm_not_for_integers():
    model = build(
        [node("MatMul", ["a", "b"], "p"), node("Add", ["p", "c"], "y")],
        {"a": ([3, 4], I64), "b": ([4, 5], I64), "c": ([5], I64)},
    )
    no_fire(model, "matmul-add-gemm")


# -- Pad into Conv / AveragePool ---------------------------------------------------


def _pad_then(op_node, pads, x_shape=(1, 2, 5, 6), value=0.0, mode=None, inits=None, **kw):
    pad_inputs = ["x", "pads"]
    base = {"pads": np.array(pads, I64)}
    if value is not None:
        pad_inputs.append("v")
        base["v"] = np.array(value, F32)
    base.update(inits or {})
    attrs = {} if mode is None else {"mode": mode}
    return build(
        [node("Pad", pad_inputs, "p", **attrs), op_node],
        {"x": (list(x_shape), F32)},
        inits=base,
        **kw,
    )


PAD_CONV_CASES = [
    # (pads, conv attributes, x_shape, weight shape)
    ([0, 0, 1, 1, 0, 0, 1, 1], {}, (1, 2, 5, 6), (3, 2, 3, 3)),
    (
        [0, 0, 2, 0, 0, 0, 1, 3],
        {"pads": [1, 0, 0, 1], "strides": [2, 2]},
        (1, 2, 5, 6),
        (3, 2, 3, 3),
    ),
    ([0, 0, 1, 2, 0, 0, 0, 1], {"group": 2, "dilations": [2, 1]}, (2, 4, 6, 5), (4, 2, 2, 3)),
    ([0, 0, 3, 0, 0, 2], {"pads": [1, 1]}, (1, 2, 7), (3, 2, 3)),
    ([0, 0, 1, 0, 1, 0, 0, 1, 0, 1], {}, (1, 2, 3, 4, 3), (2, 2, 2, 2, 2)),
]


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("value", [0.0, -0.0, None])
@pytest.mark.parametrize(("pads", "attrs", "x_shape", "w_shape"), PAD_CONV_CASES)
@pytest.mark.parametrize("opset", [11, 18])
def test_pad_conv_fold_fires(pads, attrs, x_shape, w_shape, value, bias, opset):
    inits = {"w": randn(*w_shape)}
    conv_inputs = ["p", "w"]
    if bias:
        inits["b"] = randn(w_shape[0])
        conv_inputs.append("b")
    model = _pad_then(
        node("Conv", conv_inputs, "y", **attrs), pads, x_shape, value, inits=inits, opset=opset
    )
    result = fire(model, "pad-conv-fold", special=True)
    assert ops(result) == ["Conv"]


def _pad_conv(pads, value=0.0, mode=None, conv_attrs=None, opset=17, **kw):
    return _pad_then(
        node("Conv", ["p", "w"], "y", **(conv_attrs or {})),
        pads,
        value=value,
        mode=mode,
        inits={"w": randn(3, 2, 3, 3)},
        opset=opset,
        **kw,
    )


@pytest.mark.parametrize(
    "model",
    [
        pytest.param(lambda: _pad_conv([0, 0, 1, 1, 0, 0, 1, 1], value=1.0), id="nonzero-value"),
        pytest.param(lambda: _pad_conv([0, 1, 1, 1, 0, 0, 1, 1]), id="channel-pad"),
        pytest.param(lambda: _pad_conv([1, 0, 1, 1, 0, 0, 1, 1]), id="batch-pad"),
        pytest.param(lambda: _pad_conv([0, 0, -1, 1, 0, 0, 1, 1]), id="negative-pad"),
        pytest.param(lambda: _pad_conv([0, 0, 1, 1, 0, 0, 1, 1], mode="reflect"), id="reflect"),
        pytest.param(lambda: _pad_conv([0, 0, 1, 1, 0, 0, 1, 1], mode="edge"), id="edge"),
        pytest.param(
            lambda: _pad_conv([0, 0, 1, 1, 0, 0, 1, 1], conv_attrs={"auto_pad": "SAME_UPPER"}),
            id="auto-pad",
        ),
        pytest.param(
            lambda: _pad_conv([0, 0, 1, 1, 0, 0, 1, 1], outputs=["y", "p"]), id="pad-escapes"
        ),
    ],
)
def test_pad_conv_fold_not(model):
    no_fire(model(), "pad-conv-fold")


def test_pad_conv_fold_not_with_runtime_pads_or_value():
    for inputs in ({"pads": ([8], I64)}, {"v": ([], F32)}):
        inits = {"w": randn(3, 2, 3, 3), "pads": np.array([0, 0, 1, 1, 0, 0, 1, 1], I64)}
        inits["v"] = np.array(0.0, F32)
        for name in inputs:
            inits.pop(name)
        model = build(
            [node("Pad", ["x", "pads", "v"], "p"), node("Conv", ["p", "w"], "y")],
            {"x": ([1, 2, 5, 6], F32), **inputs},
            inits=inits,
        )
        no_fire(model, "pad-conv-fold")


def test_pad_conv_fold_not_with_axes_input():
    model = build(
        [node("Pad", ["x", "pads", "", "axes"], "p"), node("Conv", ["p", "w"], "y")],
        {"x": ([1, 2, 5, 6], F32)},
        inits={
            "pads": np.array([1, 1, 1, 1], I64),
            "axes": np.array([2, 3], I64),
            "w": randn(3, 2, 3, 3),
        },
        opset=18,
    )
    no_fire(model, "pad-conv-fold")


def _avgpool(pads, pool_attrs, value=0.0, x_shape=(1, 2, 6, 7), **kw):
    pool = node("AveragePool", ["p"], "y", **pool_attrs)
    return _pad_then(pool, pads, x_shape, value, **kw)


PAD_POOL_CASES = [
    ([0, 0, 1, 1, 0, 0, 1, 1], {"kernel_shape": [3, 3]}),
    ([0, 0, 1, 0, 0, 0, 0, 1], {"kernel_shape": [2, 2], "strides": [2, 2]}),
    ([0, 0, 1, 1, 0, 0, 0, 1], {"kernel_shape": [3, 3], "count_include_pad": 1}),
    (
        [0, 0, 1, 0, 0, 0, 0, 1],
        {"kernel_shape": [3, 3], "count_include_pad": 1, "pads": [1, 1, 1, 0]},
    ),
    ([0, 0, 2, 0, 0, 0], {"kernel_shape": [3], "strides": [2]}),
    ([0, 0, 0, 0, 0, 0, 1, 1], {"kernel_shape": [2, 2], "pads": [0, 0, 0, 0]}),
]


@pytest.mark.parametrize(("pads", "attrs"), PAD_POOL_CASES)
@pytest.mark.parametrize("value", [0.0, None])
@pytest.mark.parametrize("opset", [11, 19])
def test_pad_avgpool_fold_fires(pads, attrs, value, opset):
    x_shape = (1, 2, 6, 7)[: len(pads) // 2]
    result = fire(_avgpool(pads, attrs, value, x_shape, opset=opset), "pad-avgpool-fold")
    assert ops(result) == ["AveragePool"]
    pool = result.graph.node[0]
    assert {a.name: a.i for a in pool.attribute}.get("count_include_pad") == 1


@pytest.mark.parametrize(
    ("pads", "attrs", "value"),
    [
        # The pool excludes its own pads from the count: the merged pads could not tell.
        ([0, 0, 1, 1, 0, 0, 1, 1], {"kernel_shape": [3, 3], "pads": [1, 0, 0, 0]}, 0.0),
        ([0, 0, 1, 1, 0, 0, 1, 1], {"kernel_shape": [3, 3], "ceil_mode": 1}, 0.0),
        # A merged pad of 2 would not be smaller than the kernel (onnxruntime rejects it).
        ([0, 0, 2, 0, 0, 0, 0, 0], {"kernel_shape": [2, 2]}, 0.0),
        ([0, 0, 1, 1, 0, 0, 1, 1], {"kernel_shape": [3, 3]}, 0.5),
        ([0, 1, 1, 1, 0, 0, 1, 1], {"kernel_shape": [3, 3]}, 0.0),
        ([0, 0, 1, 1, 0, 0, 1, 1], {"kernel_shape": [3, 3], "auto_pad": "VALID"}, 0.0),
    ],
)
def test_pad_avgpool_fold_not(pads, attrs, value):
    no_fire(_avgpool(pads, attrs, value), "pad-avgpool-fold")


def test_pad_avgpool_fold_not_with_dilations():
    model = _avgpool(
        [0, 0, 1, 1, 0, 0, 1, 1], {"kernel_shape": [2, 2], "dilations": [2, 2]}, opset=19
    )
    no_fire(model, "pad-avgpool-fold")


@pytest.mark.parametrize("value", [0.0, float("-inf")])
def test_pack_never_folds_pad_into_maxpool(value):
    model = _pad_then(
        node("MaxPool", ["p"], "y", kernel_shape=[3, 3]), [0, 0, 1, 1, 0, 0, 1, 1], value=value
    )
    report, result = optimize_proto(model, CORE_RULES)
    assert report.rewrites == 0
    assert ops(result) == ["Pad", "MaxPool"]


# -- the whole pack ----------------------------------------------------------------


def test_pack_on_a_small_network():
    """Pad -> Conv -> BN -> Mul -> Add -> Relu -> Relu -> Dropout -> Identity ->
    Transpose -> Transpose -> Reshape -> Reshape -> MatMul -> Add."""
    inits = {
        "pads": np.array([0, 0, 1, 1, 0, 0, 1, 1], I64),
        # Weights scaled like a real initialization (fan-in), so outputs stay O(1).
        "w": randn(4, 3, 3, 3) / 27**0.5,
        "b": randn(4),
        **bn_params(4),
        "k": randn(4, 1, 1),
        "k2": randn(1, 4, 1, 1),
        "s1": np.array([2, 4, 36], I64),
        "s2": np.array([2, -1], I64),
        "fc": randn(144, 10) / 12,
        "fcb": randn(10),
    }
    nodes = [
        node("Pad", ["x", "pads"], "p"),
        node("Conv", ["p", "w", "b"], "c"),
        node("BatchNormalization", BN_INPUTS, "n"),
        node("Mul", ["n", "k"], "m"),
        node("Add", ["k2", "m"], "a"),
        node("Relu", ["a"], "r1"),
        node("Relu", ["r1"], "r2"),
        node("Dropout", ["r2"], "d"),
        node("Identity", ["d"], "i"),
        node("Transpose", ["i"], "t1", perm=[0, 2, 3, 1]),
        node("Transpose", ["t1"], "t2", perm=[0, 3, 1, 2]),
        node("Reshape", ["t2", "s1"], "f1"),
        node("Reshape", ["f1", "s2"], "f2"),
        node("MatMul", ["f2", "fc"], "mm"),
        node("Add", ["mm", "fcb"], "y"),
    ]
    model = build(nodes, {"x": ([2, 3, 6, 6], F32)}, inits=inits, opset=13)
    report, result = optimize_proto(model, CORE_RULES)
    assert ops(result) == ["Conv", "Relu", "Reshape", "Gemm"]
    assert report.stopped is None
    feeds = {"x": randn(2, 3, 6, 6)}
    assert_close(run(result, feeds), run(model, feeds))
