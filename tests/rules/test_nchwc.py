"""NCHWc blocked layout for the CPU target: target parameters, the layout phase,
and the filters the nchwc pack lays out, compared with onnxruntime's own.

Numerics of every rule are proven by tests/proof at the block size onnxruntime's
kernels use on this machine (8 with AVX2, 16 with AVX-512F); the comparisons with
onnxruntime here use it too. A model laid out for the other block size runs only
where MLAS picks that one: here its layouts are checked structurally, against a numpy
re-layout written from onnxruntime's definition of the filter orders.
"""

from __future__ import annotations

import collections
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxfuse import api
from onnxfuse.cli.main import main
from onnxfuse.errors import OnnxfuseError, RuleError
from onnxfuse.language.packs import read_manifest
from onnxfuse.passes.pipeline import Options, optimize
from onnxfuse.targets.capabilities import load_target
from onnxfuse.targets.cpu_features import block_size_for_flags, detect_block_size
from onnxfuse.targets.params import BLOCK_SIZE_METADATA, parse_params, split_spec

NCHWC = "com.microsoft.nchwc"
# The block size onnxruntime's NCHWc kernels use here; None: this CPU has none.
BLOCK = detect_block_size()
OTHER_BLOCK = 8 if BLOCK == 16 else 16
runs_blocked_here = pytest.mark.skipif(
    BLOCK is None, reason="this CPU has no NCHWc kernels: onnxruntime cannot run blocked models"
)


# -- target parameters ---------------------------------------------------------------


def test_block_parameter_parses():
    assert load_target("cpu:block=8").params == {"block": 8}
    assert load_target("cpu:block=16").params == {"block": 16}
    assert load_target("cpu:block=16").name == "cpu"
    assert load_target("cpu:block=16").spec == "cpu:block=16"
    assert load_target("cpu").params == {}


def test_block_auto_follows_this_machine():
    expected = detect_block_size()
    assert load_target("cpu:block=auto").params == ({} if expected is None else {"block": expected})


@pytest.mark.parametrize(
    ("flags", "block"),
    [
        ({"sse2", "avx", "avx2", "fma", "avx512f"}, 16),
        ({"sse2", "avx", "avx2", "fma"}, 8),
        ({"sse2", "avx"}, 8),
        ({"sse2", "sse4_2"}, None),
        (set(), None),
    ],
)
def test_block_size_from_cpu_flags_as_mlas_chooses(flags, block):
    assert block_size_for_flags(frozenset(flags)) == block


def test_detect_reads_cpuinfo_flags(tmp_path, monkeypatch):
    monkeypatch.setattr("sys.platform", "linux")
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma avx512f\n")
    assert detect_block_size(info) == 16
    info.write_text("processor\t: 0\nflags\t\t: fpu sse2\n")
    assert detect_block_size(info) is None
    assert detect_block_size(tmp_path / "missing") is None


def test_block_auto_is_off_where_cpu_features_are_unknown(monkeypatch):
    monkeypatch.setattr("sys.platform", "darwin")
    assert parse_params("cpu", "block=auto") == {}


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("cpu:block=7", "block='7': expected 8, 16 or auto"),
        (
            "cpu:blk=8",
            "target 'cpu' has no parameter 'blk' (its parameters: block, int8, layout, profile)",
        ),
        (
            "cuda:block=8",
            "target 'cuda' has no parameter 'block' (its parameters: layout, profile)",
        ),
        ("cpu:block=8,block=16", "given twice"),
    ],
)
def test_bad_parameters_are_one_line_errors(spec, message):
    with pytest.raises(OnnxfuseError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_target(spec)


def test_split_spec_keeps_paths_whole():
    assert split_spec("cpu:block=8") == ("cpu", "block=8")
    assert split_spec("cpu") == ("cpu", None)
    assert split_spec(r"C:\targets\npu.yaml") == (r"C:\targets\npu.yaml", None)
    assert split_spec(r"C:\targets\cpu.yaml:block=8") == (r"C:\targets\cpu.yaml", "block=8")


def test_cli_bad_parameter_exits_2(capsys):
    assert main(["optimize", "-q", "--target", "cpu:block=12"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "expected 8, 16 or auto" in err


def test_targets_show_mentions_the_parameter(capsys):
    assert main(["targets", "show", "cpu"]) == 0
    assert "cpu:block=" in capsys.readouterr().out


# -- pack manifest phase ---------------------------------------------------------------


def test_nchwc_pack_runs_in_the_layout_phase():
    rules = [r for r in api.select_rules(target="cpu") if r.pack == "nchwc"]
    assert rules and {r.phase for r in rules} == {"layout"}
    assert {r.phase for r in api.select_rules(target="cpu") if r.pack == "core"} == {"fusion"}


def test_manifest_rejects_an_unknown_phase(tmp_path):
    (tmp_path / "pack.yaml").write_text("phase: late\n")
    with pytest.raises(
        RuleError, match="'phase' must be one of fusion, packing, layout, got 'late'"
    ):
        read_manifest(tmp_path)


# -- small models ------------------------------------------------------------------------


def _model(nodes, initializers, x_shape, y_shape, opset=17) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, x_shape)],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, y_shape)],
        [numpy_helper.from_array(v, k) for k, v in initializers.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def _ours(model: onnx.ModelProto, target: str | None = None) -> onnx.ModelProto:
    target = target or f"cpu:block={BLOCK or 8}"  # 8: layouts alone, where none runs
    loaded = ir.from_proto(model)
    chosen = load_target(target)
    optimize(loaded, api.select_rules(target=chosen), Options(target=chosen))
    return ir.to_proto(loaded)


def _ort_all(model: onnx.ModelProto, tmp_path: Path) -> onnx.ModelProto:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.optimized_model_filepath = str(tmp_path / "ort.onnx")
    options.log_severity_level = 4
    ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return onnx.load(str(tmp_path / "ort.onnx"))


def _run(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 4
    session = ort.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    return session.run(None, {"X": x})[0]


def _nchwc_conv_weights(model: onnx.ModelProto) -> list[np.ndarray]:
    values = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    return [
        values[n.input[1]] for n in model.graph.node if n.domain == NCHWC and n.op_type == "Conv"
    ]


def _ops(model: onnx.ModelProto) -> collections.Counter:
    return collections.Counter(
        f"{n.domain}::{n.op_type}" if n.domain else n.op_type for n in model.graph.node
    )


def _oihwbibo(w: np.ndarray, block: int) -> np.ndarray:
    """onnxruntime's OIHWBiBo: [O/b][I/b][kh][kw][b_in][b_out], output channels zero-padded."""
    o, i, kh, kw = w.shape
    padded = -(-o // block) * block
    full = np.zeros((padded, i, kh, kw), w.dtype)
    full[:o] = w
    blocked = full.reshape(padded // block, block, i // block, block, kh, kw)
    return blocked.transpose(0, 2, 4, 5, 3, 1).reshape(padded, i, kh, kw)


def _oihwbo(w: np.ndarray, block: int) -> np.ndarray:
    """onnxruntime's OIHWBo: [O/b][I][kh][kw][b_out], output channels zero-padded."""
    o, i, kh, kw = w.shape
    padded = -(-o // block) * block
    full = np.zeros((padded, i, kh, kw), w.dtype)
    full[:o] = w
    return (
        full.reshape(padded // block, block, i, kh, kw)
        .transpose(0, 2, 3, 4, 1)
        .reshape(padded, i, kh, kw)
    )


# (name, weight shape [O, I/g, kh, kw], group, input channels, has bias, layout)
CONVS = [
    ("blocked", (16, 16, 3, 3), 1, 16, True, _oihwbibo),
    ("blocked-unpadded-no-bias", (12, 16, 3, 3), 1, 16, False, _oihwbibo),
    ("padded-bias", (12, 16, 3, 3), 1, 16, True, _oihwbibo),
    ("grouped", (32, 16, 3, 3), 2, 32, True, _oihwbibo),
    ("first", (16, 3, 3, 3), 1, 3, True, _oihwbo),
    ("depthwise", (32, 1, 3, 3), 32, 32, True, _oihwbo),
]


def _conv_model(shape, group, channels, bias, seed=0):
    rng = np.random.default_rng(seed)
    w = rng.standard_normal(shape).astype(np.float32)
    initializers = {"W": w}
    inputs = ["X", "W"]
    if bias:
        initializers["B"] = rng.standard_normal(shape[0]).astype(np.float32)
        inputs.append("B")
    node = helper.make_node("Conv", inputs, ["Y"], pads=[1, 1, 1, 1], group=group)
    return _model([node], initializers, [1, channels, 8, 8], [1, shape[0], 8, 8]), w


@runs_blocked_here
@pytest.mark.parametrize(
    ("shape", "group", "channels", "bias", "layout"),
    [c[1:] for c in CONVS],
    ids=[c[0] for c in CONVS],
)
def test_filters_equal_onnxruntimes_bit_for_bit(tmp_path, shape, group, channels, bias, layout):
    model, w = _conv_model(shape, group, channels, bias)
    ours, theirs = _ours(model), _ort_all(model, tmp_path)
    assert _ops(ours) == _ops(theirs)
    [mine], [reference] = _nchwc_conv_weights(ours), _nchwc_conv_weights(theirs)
    assert mine.dtype == reference.dtype and np.array_equal(mine, reference)
    assert np.array_equal(mine, layout(w, BLOCK))
    x = np.random.default_rng(1).standard_normal((1, channels, 8, 8)).astype(np.float32)
    np.testing.assert_allclose(_run(ours, x), _run(model, x), rtol=1e-4, atol=1e-4)


def _fits(shape: tuple[int, ...], block: int) -> bool:
    return shape[0] % block == 0 and (shape[1] % block == 0 or shape[1] < block)


@pytest.mark.parametrize(
    ("shape", "group", "channels", "bias", "layout"),
    [c[1:] for c in CONVS if _fits(c[1], OTHER_BLOCK)],
    ids=[c[0] for c in CONVS if _fits(c[1], OTHER_BLOCK)],
)
def test_the_other_block_sizes_layouts_structurally(shape, group, channels, bias, layout):
    # Structural only: onnxruntime here runs the kernels of this machine's block size,
    # so a model of the other one would compute garbage; its numerics need such a CPU.
    model, w = _conv_model(shape, group, channels, bias)
    ours = _ours(model, f"cpu:block={OTHER_BLOCK}")
    [mine] = _nchwc_conv_weights(ours)
    assert np.array_equal(mine, layout(w, OTHER_BLOCK))
    same_either_way = shape[0] == 16 and shape[1] == 1
    assert not np.array_equal(mine, layout(w, 24 - OTHER_BLOCK)) or same_either_way


@pytest.mark.parametrize("block", [8, 16])
def test_input_channels_off_the_block_stay_nchw(block):
    # Neither a multiple of the block nor fewer than it.
    channels = block + 4
    model, _ = _conv_model((16, channels, 3, 3), 1, channels, True)
    assert not any(n.domain == NCHWC for n in _ours(model, f"cpu:block={block}").graph.node)


@pytest.mark.parametrize("block", [8, 16])
def test_a_conv_with_an_infinite_weight_stays_nchw(block):
    # The blocked kernels give other results on an infinite weight than the NCHW Conv.
    model, w = _conv_model((16, 16, 3, 3), 1, 16, True)
    w[3, 2, 1, 1] = np.inf
    model.graph.initializer[0].CopyFrom(numpy_helper.from_array(w, "W"))
    assert not any(n.domain == NCHWC for n in _ours(model, f"cpu:block={block}").graph.node)


def test_plain_cpu_stays_portable():
    model, _ = _conv_model((16, 16, 3, 3), 1, 16, True)
    assert not any(n.domain == NCHWC for n in _ours(model, "cpu").graph.node)


@runs_blocked_here
def test_depthwise_is_not_taken_for_a_first_conv():
    # A depthwise filter has one input channel, fewer than the block: only the
    # depthwise rule may take it (the first-conv layout would be wrong).
    rng = np.random.default_rng(0)
    nodes = [
        helper.make_node("Conv", ["X", "W1"], ["C"]),
        helper.make_node("Relu", ["C"], ["R"]),
        helper.make_node("Conv", ["R", "W2"], ["Y"], group=32, pads=[1, 1, 1, 1]),
    ]
    inits = {
        "W1": rng.standard_normal((32, 16, 1, 1)).astype(np.float32),
        "W2": rng.standard_normal((32, 1, 3, 3)).astype(np.float32),
    }
    model = _model(nodes, inits, [1, 16, 8, 8], [1, 32, 8, 8])
    ours = _ours(model)
    assert _ops(ours) == {
        f"{NCHWC}::ReorderInput": 1,
        f"{NCHWC}::Conv": 2,
        f"{NCHWC}::ReorderOutput": 1,
    }
    x = rng.standard_normal((1, 16, 8, 8)).astype(np.float32)
    np.testing.assert_allclose(_run(ours, x), _run(model, x), rtol=1e-4, atol=1e-4)


@runs_blocked_here
def test_layout_runs_after_fusion_residual_block(tmp_path):
    # Conv -> Relu -> Conv -> Add(shortcut) -> Relu -> MaxPool: the fusion phase makes
    # FusedConv(Relu) and FusedConv(Z, Relu) first; the layout phase then blocks the
    # whole region with one ReorderInput and one ReorderOutput (onnxruntime, which
    # leaves the Add of a graph input unfused, needs two of each).
    rng = np.random.default_rng(0)
    nodes = [
        helper.make_node("Conv", ["X", "W1", "B1"], ["C1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["C1"], ["R1"]),
        helper.make_node("Conv", ["R1", "W2", "B2"], ["C2"], pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["C2", "X"], ["S"]),
        helper.make_node("Relu", ["S"], ["R2"]),
        helper.make_node("MaxPool", ["R2"], ["Y"], kernel_shape=[2, 2], strides=[2, 2]),
    ]
    inits = {
        "W1": rng.standard_normal((16, 16, 3, 3)).astype(np.float32) * 0.2,
        "B1": rng.standard_normal(16).astype(np.float32),
        "W2": rng.standard_normal((16, 16, 3, 3)).astype(np.float32) * 0.2,
        "B2": rng.standard_normal(16).astype(np.float32),
    }
    model = _model(nodes, inits, [1, 16, 8, 8], [1, 16, 4, 4])
    ours, theirs = _ours(model), _ort_all(model, tmp_path)
    reorders = (f"{NCHWC}::ReorderInput", f"{NCHWC}::ReorderOutput")
    assert [_ops(ours)[op] for op in reorders] == [1, 1]
    assert all(_ops(ours)[op] <= _ops(theirs)[op] for op in reorders)
    assert len(ours.graph.node) <= len(theirs.graph.node)
    convs = [n for n in ours.graph.node if n.op_type == "Conv"]
    activations = [helper.get_attribute_value(a) for n in convs for a in n.attribute]
    assert activations.count(b"Relu") == 2 and len(convs[1].input) == 4
    x = rng.standard_normal((1, 16, 8, 8)).astype(np.float32)
    np.testing.assert_allclose(_run(ours, x), _run(model, x), rtol=1e-4, atol=1e-4)


def test_metadata_records_the_block_size(tmp_path):
    model, _ = _conv_model((16, 16, 3, 3), 1, 16, True)
    source = tmp_path / "conv.onnx"
    onnx.save(model, source)
    for spec, expected in (("cpu:block=8", "8"), ("cpu:block=16", "16"), ("cpu", None)):
        target = load_target(spec)
        out = tmp_path / f"out-{spec.replace(':', '_')}.onnx"
        api.optimize_file(source, out, api.select_rules(target=target), Options(target=target))
        props = {p.key: p.value for p in onnx.load(str(out)).metadata_props}
        assert props.get(BLOCK_SIZE_METADATA) == expected


def test_no_metadata_when_nothing_was_blocked(tmp_path):
    model = _model([helper.make_node("Relu", ["X"], ["Y"])], {}, [1, 16, 4, 4], [1, 16, 4, 4])
    source = tmp_path / "relu.onnx"
    onnx.save(model, source)
    target = load_target("cpu:block=8")
    out = tmp_path / "out.onnx"
    api.optimize_file(source, out, api.select_rules(target=target), Options(target=target))
    assert not any(p.key == BLOCK_SIZE_METADATA for p in onnx.load(str(out)).metadata_props)


def test_pack_readme_lists_every_rule():
    from onnxfuse.language.packs import builtin_rules_dir, load_builtin_rules

    readme = (builtin_rules_dir() / "nchwc" / "README.md").read_text(encoding="utf-8")
    rules = load_builtin_rules(["nchwc"])
    assert len(rules) >= 25
    for rule in rules:
        assert f"`{rule.name}`" in readme, rule.name
        assert rule.references == ["onnxruntime NchwcTransformer"], rule.name


def _graph_case(kind: str) -> onnx.ModelProto:
    rng = np.random.default_rng(3)

    def weight(o, i, k=3):
        return (rng.standard_normal((o, i, k, k)) * 0.2).astype(np.float32)

    pads = [1, 1, 1, 1]
    if kind == "concat3":
        nodes = [
            helper.make_node("Conv", ["X", "Wa"], ["A"], pads=pads),
            helper.make_node("Conv", ["X", "Wb"], ["B"], pads=pads),
            helper.make_node("Conv", ["X", "Wc"], ["C"], pads=pads),
            helper.make_node("Concat", ["A", "B", "C"], ["K"], axis=1),
            helper.make_node("Conv", ["K", "Wd"], ["Y"], pads=pads),
        ]
        # A and C one block each: Concat joins whole blocks.
        inits = {"Wa": weight(BLOCK, 16), "Wb": weight(16, 16), "Wc": weight(BLOCK, 16)}
        inits["Wd"] = weight(16, 2 * BLOCK + 16)
        return _model(nodes, inits, [1, 16, 8, 8], [1, 16, 8, 8])
    if kind == "resize":
        nodes = [
            helper.make_node("Conv", ["X", "Wa"], ["A"], pads=pads),
            helper.make_node(
                "Resize",
                ["A", "", "S"],
                ["U"],
                mode="nearest",
                coordinate_transformation_mode="asymmetric",
                nearest_mode="floor",
            ),
            helper.make_node("Conv", ["U", "Wb"], ["Y"], pads=pads),
        ]
        inits = {"Wa": weight(16, 16), "Wb": weight(16, 16)}
        inits["S"] = np.array([1, 1, 2, 2], np.float32)
        return _model(nodes, inits, [1, 16, 4, 4], [1, 16, 8, 8])
    if kind == "batchnorm":
        nodes = [
            helper.make_node("Conv", ["X", "Wa"], ["A"], pads=pads),
            helper.make_node("Relu", ["A"], ["R"]),
            helper.make_node("BatchNormalization", ["R", "s", "b", "m", "v"], ["N"]),
            helper.make_node("Conv", ["N", "Wb"], ["Y"], pads=pads),
        ]
        inits = {"Wa": weight(16, 16), "Wb": weight(16, 16)}
        inits.update({k: (rng.random(16) + 0.5).astype(np.float32) for k in "sbmv"})
        return _model(nodes, inits, [1, 16, 8, 8], [1, 16, 8, 8])
    if kind == "nhwc-output":
        nodes = [
            helper.make_node("Conv", ["X", "Wa"], ["A"], pads=pads),
            helper.make_node("Transpose", ["A"], ["Y"], perm=[0, 2, 3, 1]),
        ]
        return _model(nodes, {"Wa": weight(16, 16)}, [1, 16, 8, 8], [1, 8, 8, 16])
    raise AssertionError(kind)


@runs_blocked_here
@pytest.mark.parametrize("kind", ["concat3", "resize", "batchnorm", "nhwc-output"])
def test_blocked_regions_like_onnxruntime(kind, tmp_path):
    model = _graph_case(kind)
    ours, theirs = _ours(model), _ort_all(model, tmp_path)
    mine, reference = _ops(ours), _ops(theirs)
    reorders = (f"{NCHWC}::ReorderInput", f"{NCHWC}::ReorderOutput")
    assert sum(mine[op] for op in reorders) <= sum(reference[op] for op in reorders), (
        mine,
        reference,
    )
    assert len(ours.graph.node) <= len(theirs.graph.node), (mine, reference)
    # One blocked region: a reorder in, a reorder out; Concat runs on the blocked tensors.
    assert sum(mine[op] for op in reorders) == 2
    assert all(n.domain == NCHWC or n.op_type == "Concat" for n in ours.graph.node)
    x = np.random.default_rng(4).standard_normal(
        [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    )
    x = x.astype(np.float32)
    np.testing.assert_allclose(_run(ours, x), _run(model, x), rtol=1e-4, atol=1e-4)


def test_every_nchwc_rule_needs_a_block_size():
    from onnxfuse.language.packs import load_builtin_rules

    for rule in load_builtin_rules(["nchwc"]):
        assert rule.guards[0].text == "'block' in target_params", rule.name
        assert rule.verify.get("target_params") == {"block": "auto"}, rule.name


@runs_blocked_here
@pytest.mark.parametrize(
    "rule",
    [pytest.param(r, id=r.name) for r in api.select_rules(target="cpu") if r.pack == "nchwc"],
)
def test_rule_does_not_fire_without_a_block_size(rule):
    from onnxfuse.proof.check import find_firing_instance, optimize_with
    from onnxfuse.proof.domain import parse_domain
    from onnxfuse.proof.instance import build_model

    instance, _ = find_firing_instance(rule, parse_domain(rule), load_target("cpu"), tries=50)
    assert instance is not None, rule.name
    model = build_model(instance.spec)
    assert optimize_with(model, rule, load_target(f"cpu:block={BLOCK}"))[0]
    portable = load_target("cpu")
    assert not optimize_with(model, rule, portable)[0]


def test_proofs_run_at_this_machines_block_size_and_are_skipped_without_one(monkeypatch, capsys):
    import onnxfuse.targets.params as target_params
    from onnxfuse.proof.check import check_rule, unavailable_here, with_domain_params
    from onnxfuse.proof.domain import parse_domain

    [rule] = [r for r in api.select_rules(target="cpu") if r.name == "nchwc-conv"]
    domain = parse_domain(rule)
    for machine in (8, 16):
        monkeypatch.setattr(target_params, "detect_block_size", lambda machine=machine: machine)
        assert with_domain_params(load_target("cpu"), domain).params == {"block": machine}
        assert unavailable_here(load_target("cpu"), domain) is None
    monkeypatch.setattr(target_params, "detect_block_size", lambda: None)
    reason = unavailable_here(load_target("cpu"), domain)
    assert reason == "target parameter block=auto is off on this machine"
    report = check_rule(rule, examples=3, target="cpu")
    assert report.ok and report.fired == 0 and report.unavailable == reason
    assert main(["check", rule.origin.rsplit(":", 1)[0], "--rule", rule.name]) == 0
    assert f"skip  {rule.name}  not checked here: {reason}" in capsys.readouterr().out
