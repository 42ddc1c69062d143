"""Channels-last (NHWC): the preferred_layout key and the layout parameter, the
`reuses` manifest key, reference definitions, and the nhwc pack on small models
(where it fires, where it must not, and that the Transposes it adds cancel)."""

from __future__ import annotations

import collections

import numpy as np
import onnx
import pytest
from helpers import make_model, optimize_proto, run, tensor_input
from onnx import helper, numpy_helper

from onnxfuse import api
from onnxfuse.errors import OnnxfuseError
from onnxfuse.language.packs import load_builtin_packs, resolve_packs
from onnxfuse.language.yaml_lines import load_yaml
from onnxfuse.proof.check import check_rule
from onnxfuse.proof.reference_ops import reference_functions, with_reference_definitions
from onnxfuse.targets.capabilities import TargetError, load_target, parse_target

OPSET = 17


# -- targets ------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["xnnpack", "qnn", "webgpu", "js"])
def test_nhwc_preferring_targets_default_to_layout_nhwc(name):
    target = load_target(name)
    assert target.preferred_layout == "NHWC"
    assert target.params == {"layout": "nhwc"}
    assert load_target(f"{name}:layout=nchw").params == {"layout": "nchw"}


@pytest.mark.parametrize("name", ["cpu", "cuda", "dml", "coreml", "nnapi", "tensorrt", "onnx"])
def test_other_targets_prefer_nchw_and_take_the_parameter(name):
    target = load_target(name)
    assert target.preferred_layout == "NCHW" and "layout" not in target.params
    assert load_target(f"{name}:layout=NHWC").params == {"layout": "nhwc"}


def test_layout_combines_with_the_block_size():
    assert load_target("cpu:block=8,layout=nhwc").params == {"block": 8, "layout": "nhwc"}


def test_bad_layout_values_are_one_line_errors(tmp_path):
    with pytest.raises(OnnxfuseError, match="layout='nhcw': expected nhwc or nchw"):
        load_target("cuda:layout=nhcw")
    path = tmp_path / "npu.yaml"
    path.write_text("name: npu\npreferred_layout: NWHC\nops: []\n")
    with pytest.raises(TargetError, match=r"npu.yaml:2: 'preferred_layout' must be NCHW or NHWC"):
        parse_target(load_yaml(path.read_text()), path)


# -- reuses -------------------------------------------------------------------------


def test_the_nhwc_pack_reuses_the_transpose_rules_in_its_phase():
    packs = load_builtin_packs()
    core_before = {r.name: r for p in packs if p.name == "core" for r in p.rules}
    resolved = resolve_packs(packs, "cuda")
    core = {r.name: r for p in resolved if p.name == "core" for r in p.rules}
    assert core["transpose-transpose"].runs_in("layout")
    assert core["transpose-noop"].runs_in("layout")
    relu = core["transpose-unary[Relu]"]
    assert relu.runs_in("fusion") and relu.runs_in("layout")
    assert not any(r.runs_in("layout") for n, r in core.items() if not n.startswith("transpose-"))
    # The loaded rules are copied, not changed.
    assert not core_before["transpose-transpose"].also_phases


def test_a_pack_that_is_not_active_reuses_nothing(tmp_path):
    pack = tmp_path / "npu"
    pack.mkdir()
    (pack / "pack.yaml").write_text("targets: [npu]\nphase: layout\nreuses: [transpose-*]\n")
    (pack / "rules.yaml").write_text(_PACK_RULE)
    from onnxfuse.language.packs import load_packs

    packs = load_builtin_packs(["core"]) + load_packs([pack])
    resolved = resolve_packs(packs, "cpu")
    assert not any(r.also_phases for p in resolved for r in p.rules)
    resolved = resolve_packs(packs, "npu")
    reused = [r for p in resolved for r in p.rules if r.runs_in("layout")]
    assert any(r.name == "transpose-transpose" for r in reused)


_PACK_RULE = """
rules:
  - name: npu-relu-relu
    source: |
      rr (X) => (Y) {
        R = Relu(X)
        Y = Relu(R)
      }
    target: |
      rr (X) => (Y) {
        Y = Relu(X)
      }
    verify:
      dtypes: [float]
      inputs:
        X: [2, 3]
"""


# -- reference definitions ------------------------------------------------------------


def _nhwc_conv_model(weights: np.ndarray, group: int = 1) -> onnx.ModelProto:
    node = helper.make_node("NhwcConv", ["X", "W"], ["Y"], domain="com.microsoft", group=group)
    return make_model(
        [node],
        [tensor_input("X", [1, 5, 6, weights.shape[3] * group])],
        [
            tensor_input(
                "Y", [1, 5 - weights.shape[1] + 1, 6 - weights.shape[2] + 1, weights.shape[0]]
            )
        ],
        [numpy_helper.from_array(weights, "W")],
        opset=OPSET,
        extra_opsets={"com.microsoft": 1},
    )


def test_reference_definition_of_nhwc_conv_is_conv_on_transposed_data():
    assert ("com.microsoft", "NhwcConv") in reference_functions()
    rng = np.random.default_rng(0)
    w_ohwi = rng.standard_normal([4, 3, 2, 3]).astype(np.float32)
    x = rng.standard_normal([1, 5, 6, 3]).astype(np.float32)
    expanded = with_reference_definitions(_nhwc_conv_model(w_ohwi))
    assert all(n.domain != "com.microsoft" for n in expanded.graph.node)
    (got,) = run(expanded, {"X": x})
    conv = make_model(
        [helper.make_node("Conv", ["X", "W"], ["Y"])],
        [tensor_input("X", [1, 3, 5, 6])],
        [tensor_input("Y", [1, 4, 3, 5])],
        [numpy_helper.from_array(w_ohwi.transpose(0, 3, 1, 2), "W")],
    )
    (want,) = run(conv, {"X": x.transpose(0, 3, 1, 2)})
    np.testing.assert_allclose(got, want.transpose(0, 2, 3, 1), rtol=1e-5, atol=1e-5)


def test_a_model_without_such_ops_is_returned_unchanged():
    model = make_model(
        [helper.make_node("Relu", ["X"], ["Y"])], [tensor_input("X", [2])], [tensor_input("Y", [2])]
    )
    assert with_reference_definitions(model) is model


WRONG_LAYOUT_RULE = """
rules:
  - name: nhwc-conv-wrong-weights
    opset: {"": 11}
    imports: {com.microsoft: 1}
    copy_attributes: {Y: Z}
    source: |
      conv (X, W) => (Y) {
        Y = Conv(X, W)
      }
    where:
      - rank(W) == 4 and is_constant(W)
    target: |
      conv (X, W) => (Y) {
        Xt = Transpose<perm = [0, 2, 3, 1]>(X)
        Z = com.microsoft.NhwcConv(Xt, W)
        Y = Transpose<perm = [0, 3, 1, 2]>(Z)
      }
    verify:
      target: cuda
      dtypes: [float]
      dims:
        K: {rank: 2, each: 2..3}
      node_attributes:
        Y: {kernel_shape: [K, None]}
      inputs:
        X: [1, 3, 5, 5]
        W: {shape: [4, 3, K], constant: true}
"""


def test_the_proof_rejects_nhwc_conv_with_oihw_weights(tmp_path):
    """The weights must be OHWI: a rule passing OIHW weights fails its proof."""
    from helpers import rules_from_text

    (rule,) = rules_from_text(WRONG_LAYOUT_RULE)
    report = check_rule(rule, examples=10, target="cpu", negative=False, shrink_seconds=2)
    assert not report.ok and report.failure is not None
    assert report.failure.kind in ("numerics", "not-runnable")


# -- where the pack fires -------------------------------------------------------------


def _conv_model(x_shape, w_shape, constant_w=True) -> onnx.ModelProto:
    rng = np.random.default_rng(1)
    w = numpy_helper.from_array(rng.standard_normal(w_shape).astype(np.float32), "W")
    inputs = [tensor_input("X", x_shape)]
    if not constant_w:
        inputs.append(tensor_input("W", w_shape))
    nodes = [
        helper.make_node("Conv", ["X", "W"], ["C1"], pads=[1] * (2 * (len(x_shape) - 2))),
        helper.make_node("Relu", ["C1"], ["R"]),
        helper.make_node("Conv", ["R", "W2"], ["Y"]),
    ]
    c = w_shape[0]
    w2 = numpy_helper.from_array(
        rng.standard_normal([c, c] + [1] * (len(x_shape) - 2)).astype(np.float32), "W2"
    )
    return make_model(
        nodes,
        inputs,
        [tensor_input("Y", [x_shape[0], c, *x_shape[2:]])],
        [w2] + ([w] if constant_w else []),
    )


def _optimize(model, spec):
    target = load_target(spec)
    rules = api.select_rules(target=target)
    return optimize_proto(model, rules, target=target)[1]


def _ops(model):
    return collections.Counter(
        f"{n.domain}::{n.op_type}" if n.domain else n.op_type for n in model.graph.node
    )


def test_two_convs_for_cuda_nhwc_keep_transposes_only_at_the_borders():
    model = _conv_model([1, 3, 8, 8], [4, 3, 3, 3])
    ours = _optimize(model, "cuda:layout=nhwc")
    ops = _ops(ours)
    assert ops["com.microsoft::NhwcConv"] == 2 and ops["Transpose"] == 2, ops
    first, last = ours.graph.node[0], ours.graph.node[-1]
    assert first.op_type == "Transpose" and first.input[0] == "X"
    assert last.op_type == "Transpose" and last.output[0] == "Y"
    x = np.random.default_rng(2).standard_normal([1, 3, 8, 8]).astype(np.float32)
    (want,) = run(model, {"X": x})
    (got,) = run(with_reference_definitions(ours), {"X": x})
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("spec", "why"),
    [
        ("cuda", "no layout parameter: cuda prefers NCHW"),
        ("cuda:layout=nchw", "asked for NCHW"),
        ("xnnpack", "prefers NHWC but has no public NhwcConv"),
        ("cpu:layout=nhwc", "no NhwcConv kernel on the CPU"),
    ],
)
def test_nhwc_conv_does_not_fire(spec, why):
    ours = _optimize(_conv_model([1, 3, 8, 8], [4, 3, 3, 3]), spec)
    assert _ops(ours)["com.microsoft::NhwcConv"] == 0, why
    assert _ops(ours)["Transpose"] == 0, why


@pytest.mark.parametrize(
    ("x_shape", "w_shape", "constant_w"),
    [
        ([1, 3, 8], [4, 3, 3], True),  # 1-D conv
        ([1, 3, 6, 6, 6], [4, 3, 3, 3, 3], True),  # 3-D conv
        ([1, 3, 8, 8], [4, 3, 3, 3], False),  # weights are a graph input
    ],
    ids=["conv1d", "conv3d", "runtime-weights"],
)
def test_nhwc_conv_leaves_other_convs(x_shape, w_shape, constant_w):
    ours = _optimize(_conv_model(x_shape, w_shape, constant_w), "cuda:layout=nhwc")
    ops = _ops(ours)
    first_conv = next(n for n in ours.graph.node if n.input and n.input[0] == "X")
    assert first_conv.op_type in ("Conv", "FusedConv"), ops


def _qconv_model() -> onnx.ModelProto:
    """QuantizeLinear, two QLinearConv, uint8 MaxPool, DequantizeLinear."""
    rng = np.random.default_rng(3)

    def const(name, value, dtype):
        return numpy_helper.from_array(np.asarray(value, dtype=dtype), name)

    inits = [
        const("s", 0.05, np.float32),
        const("z", 128, np.uint8),
        const("w1", rng.integers(0, 255, [8, 3, 3, 3]), np.uint8),
        const("w2", rng.integers(-127, 127, [8, 8, 1, 1]), np.int8),
        const("ws", 0.01, np.float32),
        const("wz1", 128, np.uint8),
        const("wz2", 0, np.int8),
        const("ys", 0.2, np.float32),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["X", "s", "z"], ["q"]),
        helper.make_node(
            "QLinearConv", ["q", "s", "z", "w1", "ws", "wz1", "ys", "z"], ["c1"], pads=[1] * 4
        ),
        helper.make_node("MaxPool", ["c1"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("QLinearConv", ["p", "ys", "z", "w2", "ws", "wz2", "ys", "z"], ["c2"]),
        helper.make_node("DequantizeLinear", ["c2", "ys", "z"], ["Y"]),
    ]
    y = tensor_input("Y", [1, 8, 4, 4])
    return make_model(nodes, [tensor_input("X", [1, 3, 8, 8])], [y], inits)


def test_quantized_chain_on_the_cpu_runs_channels_last_with_two_transposes():
    model = _qconv_model()
    ours = _optimize(model, "cpu:layout=nhwc")
    ops = _ops(ours)
    assert ops["com.microsoft::QLinearConv"] == 2 and ops["com.microsoft::NhwcMaxPool"] == 1, ops
    assert ops["QLinearConv"] == 0 and ops["MaxPool"] == 0 and ops["Transpose"] == 2, ops
    assert all(
        helper.get_attribute_value(a) == 1
        for n in ours.graph.node
        if n.op_type == "QLinearConv"
        for a in n.attribute
        if a.name == "channels_last"
    )
    x = np.random.default_rng(4).standard_normal([1, 3, 8, 8]).astype(np.float32)
    np.testing.assert_array_equal(run(ours, {"X": x})[0], run(model, {"X": x})[0])


def test_quantized_chain_without_the_parameter_is_left_alone():
    ops = _ops(_optimize(_qconv_model(), "cpu"))
    assert ops["QLinearConv"] == 2 and ops["Transpose"] == 0


def test_an_attribute_the_definition_does_not_declare_is_refused():
    """Inlining would drop it silently while the provider's kernel rejects it."""
    from onnxfuse.proof.reference_ops import DefinitionMismatch

    model = _nhwc_conv_model(np.ones([4, 3, 2, 3], np.float32))
    model.graph.node[0].attribute.append(helper.make_attribute("activation", "Relu"))
    with pytest.raises(DefinitionMismatch, match="activation"):
        with_reference_definitions(model)
