"""onnx's inference on the protobuf as loaded stands in for optimize's first inference."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from helpers import make_model, tensor_input
from onnx import helper, numpy_helper

from onnxfuse.api import sample_model_path, select_rules
from onnxfuse.files.model_io import load_model, load_model_and_types, save_model
from onnxfuse.passes.pipeline import Options, optimize
from onnxfuse.targets.capabilities import load_target

RULES = select_rules()


def _reshape_model() -> onnx.ModelProto:
    """A shape computed from constants: data propagation gives the Reshape its shape."""
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Reshape", ["x", "s"], ["r"]),
        helper.make_node("Relu", ["r"], ["y"]),
    ]
    return make_model(nodes, [tensor_input("x", [2, 3])], [tensor_input("y", [2, 3])])


def test_types_as_loaded_are_the_ones_optimize_would_infer(tmp_path: Path) -> None:
    path = tmp_path / "m.onnx"
    onnx.save(_reshape_model(), path)
    _, inferred = load_model_and_types(path)
    assert inferred is not None
    assert inferred["r"].tensor_type.elem_type == onnx.TensorProto.FLOAT
    assert [d.dim_value for d in inferred["r"].tensor_type.shape.dim] == [2, 3]


@pytest.mark.parametrize("path", [sample_model_path()], ids=["sample"])
def test_optimizing_with_types_as_loaded_writes_the_same_bytes(path: Path, tmp_path: Path):
    target = load_target("cpu")
    outputs = []
    for name, use_types in (("with.onnx", True), ("without.onnx", False)):
        if use_types:
            model, inferred = load_model_and_types(path, target)
            assert inferred is not None
        else:
            model, inferred = load_model(path, target=target), None
        optimize(model, RULES, Options(target=target), inferred)
        save_model(model, tmp_path / name, target)
        outputs.append((tmp_path / name).read_bytes())
    assert outputs[0] == outputs[1]


def _out_of_order() -> onnx.ModelProto:
    model = _reshape_model()
    nodes = list(model.graph.node)
    del model.graph.node[:]
    model.graph.node.extend(reversed(nodes))
    return model


def _with_subgraph() -> onnx.ModelProto:
    then = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["t"])], "then", [], [tensor_input("t", [2, 3])]
    )
    other = helper.make_graph(
        [helper.make_node("Neg", ["x"], ["e"])], "else", [], [tensor_input("e", [2, 3])]
    )
    nodes = [
        helper.make_node("ReduceMax", ["x"], ["m"], keepdims=0),
        helper.make_node("Greater", ["m", "zero"], ["c"]),
        helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other),
    ]
    zero = numpy_helper.from_array(np.array(0, np.float32), "zero")
    return make_model(nodes, [tensor_input("x", [2, 3])], [tensor_input("y", [2, 3])], [zero])


def _heavy_in_memory() -> onnx.ModelProto:
    """More than 16 MiB of weights held in memory: 300 small initializers of 60 KB."""
    inits, nodes, last = [], [], "x"
    for k in range(300):
        inits.append(numpy_helper.from_array(np.full(15000, k, np.float32), f"w{k}"))
        nodes.append(helper.make_node("Add", [last, f"w{k}"], [f"a{k}"]))
        last = f"a{k}"
    nodes.append(helper.make_node("Relu", [last], ["y"]))
    return make_model(nodes, [tensor_input("x", [15000])], [tensor_input("y", [15000])], inits)


@pytest.mark.parametrize(
    "build", [_out_of_order, _with_subgraph, _heavy_in_memory], ids=lambda f: f.__name__
)
def test_no_types_as_loaded_where_the_protobuf_is_not_what_optimize_infers(build, tmp_path):
    path = tmp_path / "m.onnx"
    model = build()
    onnx.save(model, path)
    loaded, inferred = load_model_and_types(path)
    assert inferred is None
    assert len(loaded.graph) == len(model.graph.node)


def _ir3_with_weight_inputs() -> onnx.ModelProto:
    """IR 3: each initializer is listed as a graph input too, one declared loosely."""
    nodes = [helper.make_node("Add", ["x", "w"], ["a"]), helper.make_node("Relu", ["a"], ["y"])]
    weight = numpy_helper.from_array(np.arange(6, dtype=np.float32).reshape(2, 3), "w")
    inputs = [tensor_input("x", [2, 3]), helper.make_tensor_value_info("w", 1, ["N", 3])]
    model = make_model(nodes, inputs, [tensor_input("y", [2, 3])], [weight])
    model.ir_version = 3
    model.opset_import[0].version = 8
    return model


def test_an_ir3_model_is_typed_as_loaded_once_its_weights_are_no_longer_inputs(tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save(_ir3_with_weight_inputs(), path)
    written = path.read_bytes()
    loaded, inferred = load_model_and_types(path)
    assert inferred is not None
    assert loaded.ir_version == 4
    assert [v.name for v in loaded.graph.inputs] == ["x"]
    assert [d.dim_value for d in inferred["a"].tensor_type.shape.dim] == [2, 3]
    outputs = []
    for name, use_types in (("with.onnx", True), ("without.onnx", False)):
        model, types = load_model_and_types(path) if use_types else (load_model(path), None)
        optimize(model, RULES, Options(), types)
        save_model(model, tmp_path / name)
        outputs.append((tmp_path / name).read_bytes())
    assert outputs[0] == outputs[1]
    assert path.read_bytes() == written  # the input file is never touched


def test_save_infers_on_what_it_writes_and_keeps_declared_outputs(tmp_path: Path) -> None:
    """The last inference made by the save: values typed, graph outputs as declared."""
    nodes = [helper.make_node("Relu", ["x"], ["t"]), helper.make_node("Neg", ["t"], ["y"])]
    declared = helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["N", 3])
    source = make_model(nodes, [tensor_input("x", [2, 3])], [declared])
    model = _load_from(source, tmp_path)
    assert model.graph.node(0).outputs[0].shape is None  # nothing inferred yet
    save_model(model, tmp_path / "out.onnx", infer=True)
    written = onnx.load(tmp_path / "out.onnx")
    info = {v.name: v for v in written.graph.value_info}
    assert [d.dim_value for d in info["t"].type.tensor_type.shape.dim] == [2, 3]
    assert [d.dim_param for d in written.graph.output[0].type.tensor_type.shape.dim] == ["N", ""]


def _load_from(proto: onnx.ModelProto, folder: Path):
    path = folder / "in.onnx"
    onnx.save(proto, path)
    return load_model(path)
