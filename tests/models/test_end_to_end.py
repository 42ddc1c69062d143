"""End to end on real CNNs: optimize with every built-in rule, then check the result.

Models: the nine ``light`` models shipped inside the onnx package (IR version 3, every
weight a ConstantOfShape, every initializer also listed as a graph input), the bundled
sample ResNet, and three CNNs built here with seeded random weights.

For each model the optimized file must pass ``onnx.checker`` (full check), give the same
onnxruntime outputs as the original (both with ORT_DISABLE_ALL) within the per-dtype
tolerance, keep the graph interface, have unique node names, and have strictly fewer
nodes than onnxruntime's own ORT_ENABLE_BASIC output of the same model.

Interface: in IR < 4 an initializer listed as a graph input is a constant, not a runtime
input, so it is not part of the interface (onnxruntime itself drops such inputs when it
saves an optimized IR-3 model). The interface is the inputs that are not initializers,
and all outputs.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from exports.anchors import count_nodes
from helpers import assert_close, make_model, random_feeds, run
from onnx import TensorProto, helper, numpy_helper

from onnxfuse import api
from onnxfuse.rewrite.report import Report

LIGHT_DIR = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
LIGHT_MODELS = sorted(LIGHT_DIR.glob("*.onnx"))


# --------------------------------------------------------------------------- models built here


class _Net:
    """Nodes and seeded random initializers for a CNN built with onnx.helper."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []

    def const(self, name: str, array: np.ndarray) -> str:
        self.initializers.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def op(self, op_type: str, inputs: list[str], name: str, **attrs) -> str:
        self.nodes.append(helper.make_node(op_type, inputs, [name], name=name, **attrs))
        return name

    def conv(self, name, x, c_in, c_out, k, stride=1, pad=None, group=1, bias=False) -> str:
        pad = k // 2 if pad is None else pad
        fan_in = c_in // group * k * k
        w = self.rng.standard_normal((c_out, c_in // group, k, k)) * np.sqrt(2.0 / fan_in)
        inputs = [x, self.const(f"{name}.w", w.astype(np.float32))]
        if bias:
            b = 0.1 * self.rng.standard_normal(c_out)
            inputs.append(self.const(f"{name}.b", b.astype(np.float32)))
        return self.op(
            "Conv",
            inputs,
            name,
            kernel_shape=[k, k],
            strides=[stride, stride],
            pads=[pad] * 4,
            group=group,
        )

    def bn(self, name: str, x: str, c: int) -> str:
        params = (
            self.rng.uniform(0.5, 1.5, c),
            0.1 * self.rng.standard_normal(c),
            0.1 * self.rng.standard_normal(c),
            self.rng.uniform(0.5, 1.5, c),
        )
        inputs = [x] + [
            self.const(f"{name}.{part}", p.astype(np.float32))
            for part, p in zip(("scale", "bias", "mean", "var"), params)
        ]
        return self.op("BatchNormalization", inputs, name, epsilon=1e-5)

    def dense(self, name: str, x: str, n_in: int, n_out: int) -> str:
        w = self.rng.standard_normal((n_in, n_out)) * np.sqrt(1.0 / n_in)
        b = 0.1 * self.rng.standard_normal(n_out)
        y = self.op("MatMul", [x, self.const(f"{name}.w", w.astype(np.float32))], f"{name}.mm")
        return self.op("Add", [y, self.const(f"{name}.b", b.astype(np.float32))], name)

    def model(self, name: str, out: str, out_shape: list[int]) -> onnx.ModelProto:
        graph_inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 32, 32])]
        graph_outputs = [helper.make_tensor_value_info(out, TensorProto.FLOAT, out_shape)]
        model = make_model(self.nodes, graph_inputs, graph_outputs, self.initializers)
        model.graph.name = name
        return model


def vgg_model() -> onnx.ModelProto:
    """VGG-ish: stages of Conv+BN+Relu and MaxPool, then a Flatten/MatMul/Add head."""
    net = _Net(seed=1)
    x, c_in = "x", 3
    for stage, (c_out, convs) in enumerate(((16, 2), (32, 2), (64, 1)), start=1):
        for i in range(convs):
            name = f"s{stage}.c{i}"
            y = net.bn(f"{name}.bn", net.conv(name, x, c_in, c_out, 3), c_out)
            x = net.op("Relu", [y], f"{name}.relu")
            c_in = c_out
        x = net.op("MaxPool", [x], f"s{stage}.pool", kernel_shape=[2, 2], strides=[2, 2])
    x = net.op("Flatten", [x], "flatten", axis=1)  # [1, 64*4*4]
    x = net.op("Relu", [net.dense("fc1", x, 1024, 64)], "fc1.relu")
    x = net.op("Dropout", [x], "fc1.dropout")
    net.dense("logits", x, 64, 10)
    return net.model("vgg_ish", "logits", [1, 10])


def mobilenet_model() -> onnx.ModelProto:
    """MobileNet-ish: depthwise-separable blocks with Clip(0, 6), an inverted residual."""
    net = _Net(seed=2)
    low, high = net.const("clip.min", np.float32(0.0)), net.const("clip.max", np.float32(6.0))

    def conv_bn_clip(name, x, c_in, c_out, k, stride=1, group=1, clip=True):
        y = net.bn(f"{name}.bn", net.conv(name, x, c_in, c_out, k, stride, group=group), c_out)
        return net.op("Clip", [y, low, high], f"{name}.clip") if clip else y

    x = conv_bn_clip("stem", "x", 3, 16, 3, stride=2)  # [1, 16, 16, 16]
    # Inverted residual: expand 1x1, depthwise 3x3, project 1x1, Add the shortcut.
    shortcut = net.op("Identity", [x], "ir1.shortcut")
    y = conv_bn_clip("ir1.expand", x, 16, 48, 1)
    y = conv_bn_clip("ir1.dw", y, 48, 48, 3, group=48)
    y = conv_bn_clip("ir1.project", y, 48, 16, 1, clip=False)
    x = net.op("Add", [y, shortcut], "ir1.add")
    # Depthwise-separable downsampling block; its Clip bounds are Constant nodes.
    net.nodes.append(helper.make_node("Constant", [], ["ds.min"], name="ds.min", value_float=0.0))
    net.nodes.append(helper.make_node("Constant", [], ["ds.max"], name="ds.max", value_float=6.0))
    y = net.bn("ds.dw.bn", net.conv("ds.dw", x, 16, 16, 3, stride=2, group=16), 16)
    y = net.op("Clip", [y, "ds.min", "ds.max"], "ds.dw.clip")
    y = conv_bn_clip("ds.pw", y, 16, 32, 1)  # [1, 32, 8, 8]
    y = net.op("GlobalAveragePool", [y], "pool")
    y = net.op("Flatten", [y], "flatten", axis=1)
    y = net.dense("fc", y, 32, 10)
    net.op("Softmax", [y], "probs", axis=-1)
    return net.model("mobilenet_ish", "probs", [1, 10])


def inception_model() -> onnx.ModelProto:
    """Inception-ish: parallel branches (one with an explicit Pad), Concat, Caffe-style
    scale-and-shift (Conv, Mul, Add), AveragePool and a Gemm head."""
    net = _Net(seed=3)
    x = net.op("Relu", [net.conv("stem", "x", 3, 16, 3, stride=2, bias=True)], "stem.relu")
    b1 = net.op("Relu", [net.conv("b1", x, 16, 8, 1, bias=True)], "b1.relu")
    pads = net.const("b2.pads", np.array([0, 0, 1, 1, 0, 0, 1, 1], dtype=np.int64))
    b2 = net.op("Pad", [x, pads], "b2.pad")
    b2 = net.op("Relu", [net.conv("b2", b2, 16, 8, 3, pad=0, bias=True)], "b2.relu")
    b3 = net.op("MaxPool", [x], "b3.pool", kernel_shape=[3, 3], strides=[1, 1], pads=[1] * 4)
    b3 = net.op("Relu", [net.conv("b3", b3, 16, 8, 1, bias=True)], "b3.relu")
    x = net.op("Concat", [b1, b2, b3], "concat", axis=1)  # [1, 24, 16, 16]
    y = net.conv("mix", x, 24, 32, 3)
    scale = net.rng.uniform(0.5, 1.5, (1, 32, 1, 1)).astype(np.float32)
    shift = (0.1 * net.rng.standard_normal((1, 32, 1, 1))).astype(np.float32)
    y = net.op("Mul", [y, net.const("mix.scale", scale)], "mix.mul")
    y = net.op("Add", [y, net.const("mix.shift", shift)], "mix.add")
    y = net.op("Relu", [y], "mix.relu")
    y = net.op("AveragePool", [y], "avg", kernel_shape=[4, 4], strides=[4, 4])  # [1, 32, 4, 4]
    y = net.op("Reshape", [y, net.const("shape", np.array([1, -1], dtype=np.int64))], "reshape")
    w = (net.rng.standard_normal((10, 512)) / np.sqrt(512)).astype(np.float32)
    b = (0.1 * net.rng.standard_normal(10)).astype(np.float32)
    y = net.op("Gemm", [y, net.const("fc.w", w), net.const("fc.b", b)], "fc", transB=1)
    net.op("Softmax", [y], "probs", axis=1)
    return net.model("inception_ish", "probs", [1, 10])


BUILT = {"vgg_ish": vgg_model, "mobilenet_ish": mobilenet_model, "inception_ish": inception_model}
CASES = [p.stem for p in LIGHT_MODELS] + ["sample_resnet", *BUILT]


# --------------------------------------------------------------------------- fixtures


@dataclass
class Case:
    name: str
    source: Path
    optimized: Path
    report: Report
    original: onnx.ModelProto
    result: onnx.ModelProto


@pytest.fixture(scope="module")
def rules():
    return api.select_rules()


@pytest.fixture(scope="module", params=CASES)
def case(request, rules, tmp_path_factory) -> Case:
    name = request.param
    folder = tmp_path_factory.mktemp(name)
    if name in BUILT:
        source = folder / f"{name}.onnx"
        onnx.save(BUILT[name](), source)
    elif name == "sample_resnet":
        source = api.sample_model_path()
    else:
        source = LIGHT_DIR / f"{name}.onnx"
    optimized = folder / f"{name}.optimized.onnx"
    report = api.optimize_file(source, optimized, rules)
    return Case(name, source, optimized, report, onnx.load(source), onnx.load(optimized))


# --------------------------------------------------------------------------- helpers


def interface(model: onnx.ModelProto) -> tuple[list, list]:
    """(inputs, outputs) as (name, type) pairs; IR < 4 initializers are not inputs."""
    constants = {t.name for t in model.graph.initializer} if model.ir_version < 4 else set()
    inputs = [(v.name, v.type) for v in model.graph.input if v.name not in constants]
    return inputs, [(v.name, v.type) for v in model.graph.output]


def ort_basic_node_count(source: Path, folder: Path) -> int:
    saved = folder / "ort_basic.onnx"
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    options.optimized_model_filepath = str(saved)
    options.log_severity_level = 3
    ort.InferenceSession(str(source), options, providers=["CPUExecutionProvider"])
    return count_nodes(onnx.load(saved, load_external_data=False).graph)


# --------------------------------------------------------------------------- tests


def test_the_light_models_are_what_this_file_assumes():
    assert len(LIGHT_MODELS) == 9, f"expected nine light models in {LIGHT_DIR}"
    for path in LIGHT_MODELS:
        model = onnx.load(path)
        assert model.ir_version < 4, path.name
        initializers = {t.name for t in model.graph.initializer}
        assert initializers <= {v.name for v in model.graph.input}, path.name
        ops = Counter(n.op_type for n in model.graph.node)
        assert ops["ConstantOfShape"] > 0, path.name


@pytest.mark.parametrize("build", BUILT.values(), ids=list(BUILT))
def test_built_models_are_deterministic(build):
    assert build().SerializeToString(deterministic=True) == build().SerializeToString(
        deterministic=True
    )


def test_passes_full_check(case: Case):
    onnx.checker.check_model(str(case.optimized), full_check=True)


def test_same_outputs_as_the_original(case: Case):
    feeds = random_feeds(case.original, seed=0)
    expected = run(case.source, feeds)
    actual = run(case.optimized, feeds)
    assert_close(actual, expected)


def test_interface_unchanged(case: Case):
    assert interface(case.result) == interface(case.original)


def test_node_names_unique(case: Case):
    names = [n.name for n in case.result.graph.node]
    duplicates = [name for name, count in Counter(names).items() if count > 1]
    assert not duplicates, f"duplicate node names: {duplicates[:10]}"


def test_fewer_nodes_than_onnxruntime_basic(case: Case):
    ours = count_nodes(case.result.graph)
    assert ours == case.report.nodes_after
    theirs = ort_basic_node_count(case.source, case.optimized.parent)
    assert ours < theirs, (
        f"{case.name}: onnxfuse leaves {ours} nodes, onnxruntime ORT_ENABLE_BASIC {theirs}; "
        f"onnxfuse ops: {dict(Counter(n.op_type for n in case.result.graph.node))}"
    )
