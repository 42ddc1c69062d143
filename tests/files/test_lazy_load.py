"""Large main-graph weights stay in the model file at load (``source_weights.split_weights``):
protobuf never parses them, they are read from the file when a rule needs them, and
the verdicts and written bytes are the ones of a model loaded whole."""

from __future__ import annotations

import os
from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxfuse.api import optimize_file, select_rules
from onnxfuse.cli.main import main
from onnxfuse.errors import ModelError
from onnxfuse.files import model_io
from onnxfuse.files import writer as model_writer
from onnxfuse.files.model_io import load_model, save_model
from onnxfuse.files.source_weights import LAZY_MIN_BYTES, SourceTensor

BIG = LAZY_MIN_BYTES // 4 + 5  # float32 elements: above the lazy size
RNG = np.random.default_rng(3)


def _weights() -> dict[str, np.ndarray]:
    """Large weights of every plain element type family, and one small one."""
    return {
        "f32": RNG.standard_normal(BIG).astype(np.float32),
        "f16": RNG.standard_normal((2, BIG)).astype(np.float16),
        "bf16": RNG.standard_normal(2 * BIG).astype(ml_dtypes.bfloat16),
        "i64": RNG.integers(-9, 9, (BIG // 2, 1)).astype(np.int64),
        "flags": RNG.random(4 * BIG) > 0.5,
        "c64": (RNG.standard_normal(BIG // 2) + 1j).astype(np.complex64),
        "small": np.arange(10, dtype=np.float32),
    }


def _identity_model(weights: dict[str, np.ndarray], ir_version: int = 8) -> onnx.ModelProto:
    """Each weight goes to its own output through Identity."""
    nodes = [helper.make_node("Identity", [name], [f"{name}_out"], name=name) for name in weights]
    outputs = [
        helper.make_tensor_value_info(
            f"{name}_out", helper.np_dtype_to_tensor_dtype(array.dtype), array.shape
        )
        for name, array in weights.items()
    ]
    initializers = [numpy_helper.from_array(array, name) for name, array in weights.items()]
    graph = helper.make_graph(nodes, "g", [], outputs, initializers)
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    proto.ir_version = ir_version
    return proto


def _save(proto: onnx.ModelProto, path: Path) -> Path:
    onnx.save(proto, path)
    return path


@pytest.fixture
def whole(monkeypatch):
    """Load models whole, as before weights were left in the file."""

    def load_whole() -> None:
        monkeypatch.setattr(model_io, "split_weights", lambda *args, **kwargs: None)

    return load_whole


def test_large_weights_are_not_parsed_and_read_back_exactly(tmp_path):
    weights = _weights()
    path = _save(_identity_model(weights), tmp_path / "m.onnx")
    proto, _, _, lazy = model_io._read_proto(path)
    assert set(lazy) == set(weights) - {"small"}
    for tensor in proto.graph.initializer:
        assert tensor.HasField("raw_data") == (tensor.name == "small")
    assert proto.ByteSize() < 2000  # the weights' bytes stayed in the file
    model = load_model(path)
    reference = ir.load(path)  # onnx_ir's reading of the same protos
    for name, array in weights.items():
        tensor = model.graph.initializers[name].const_value
        assert isinstance(tensor, SourceTensor) == (name != "small")
        expected = reference.graph.initializers[name].const_value.numpy()
        got = tensor.numpy()
        assert got.dtype == expected.dtype == array.dtype
        assert got.shape == expected.shape == array.shape
        assert got.tobytes() == expected.tobytes() == array.tobytes()
        assert tensor.tobytes() == array.tobytes()
        assert not got.flags.writeable  # a view of the file, as of a TensorProto's bytes


def test_unchanged_model_is_written_as_onnx_load_and_ir_save_write_it(tmp_path, monkeypatch):
    path = _save(_identity_model(_weights()), tmp_path / "m.onnx")
    ir.save(ir.from_proto(onnx.load(path)), tmp_path / "ir.onnx")
    copied = []
    copy_range = model_writer._copy_range
    monkeypatch.setattr(
        model_writer,
        "_copy_range",
        lambda source, out, part: copied.append(part) or copy_range(source, out, part),
    )
    save_model(load_model(path), tmp_path / "out.onnx")
    assert (tmp_path / "out.onnx").read_bytes() == (tmp_path / "ir.onnx").read_bytes()
    assert len(copied) == 6  # every large weight, file to file
    # renamed and documented: written from the mapped bytes, still ir.save's bytes
    model = load_model(path)
    model.graph.initializers["f16"].const_value.doc_string = "half"
    model.graph.initializers["f32"].name = "renamed"
    assert "renamed" in model.graph.initializers
    ir.save(model, tmp_path / "ir2.onnx")
    save_model(model, tmp_path / "out2.onnx")
    assert (tmp_path / "out2.onnx").read_bytes() == (tmp_path / "ir2.onnx").read_bytes()


def _conv_bn_model(channels: int = 64) -> onnx.ModelProto:
    """Conv (a weight above the lazy size) then BatchNormalization: conv-bn-fold reads
    the weight and writes a new one."""
    weight = RNG.standard_normal((channels, channels, 3, 3)).astype(np.float32)
    assert weight.nbytes >= LAZY_MIN_BYTES
    stats = {
        name: RNG.random(channels).astype(np.float32) + 0.5
        for name in ("scale", "bn_b", "mean", "var")
    }
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
        helper.make_node(
            "BatchNormalization", ["c", "scale", "bn_b", "mean", "var"], ["y"], name="bn"
        ),
    ]
    shape = [1, channels, 8, 8]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)],
        [numpy_helper.from_array(weight, "w")]
        + [numpy_helper.from_array(a, n) for n, a in stats.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_rule_reading_a_lazy_weight_computes_the_same_bytes(tmp_path, whole):
    path = _save(_conv_bn_model(), tmp_path / "m.onnx")
    assert isinstance(load_model(path).graph.initializers["w"].const_value, SourceTensor)
    rules = [rule for rule in select_rules() if rule.name.startswith("conv-bn-fold")]
    optimize_file(path, tmp_path / "lazy.onnx", rules)
    whole()
    assert not isinstance(load_model(path).graph.initializers["w"].const_value, SourceTensor)
    optimize_file(path, tmp_path / "whole.onnx", rules)
    written = (tmp_path / "lazy.onnx").read_bytes()
    assert written == (tmp_path / "whole.onnx").read_bytes()
    ops = [node.op_type for node in onnx.load(tmp_path / "lazy.onnx").graph.node]
    assert ops == ["Conv"]  # folded: the weight was read and scaled


def _corrupt(tmp_path: Path, how: str) -> Path:
    proto = _identity_model({"w": RNG.standard_normal(BIG).astype(np.float32)})
    tensor = proto.graph.initializer[0]
    if how == "short":
        tensor.raw_data = tensor.raw_data[:-4]
    elif how == "long":
        tensor.raw_data = tensor.raw_data + b"\0\0\0\0"
    elif how == "bad-graph":
        proto.graph.node[0].input[0] = "missing"
    path = _save(proto, tmp_path / f"{how}.onnx")
    data = path.read_bytes()
    if how == "truncated":  # in the middle of the weight's bytes
        path.write_bytes(data[: len(data) // 2])
    elif how == "garbage-after":
        path.write_bytes(data + b"\xff\xff\xff")
    elif how == "bad-tag":  # the model's first field's key: wire type 7 does not exist
        path.write_bytes(bytes([data[0] | 7]) + data[1:])
    return path


@pytest.mark.parametrize("how", ["short", "bad-graph", "truncated", "garbage-after", "bad-tag"])
def test_malformed_models_are_rejected_as_when_loaded_whole(tmp_path, whole, how):
    path = _corrupt(tmp_path, how)
    with pytest.raises(ModelError) as lazily:
        load_model(path)
    whole()
    with pytest.raises(ModelError) as eagerly:
        load_model(path)
    assert str(lazily.value) == str(eagerly.value)
    assert "\n" not in str(lazily.value)


def test_raw_data_longer_than_its_shape_needs_is_refused(tmp_path, capsys):
    # onnx's checker accepts it (it complains only of too few bytes); any read would fail
    path = _corrupt(tmp_path, "long")
    need = 4 * BIG
    with pytest.raises(ModelError, match=f"'w' holds {need + 4} bytes .* need {need}$"):
        load_model(path)
    args = ["optimize", str(path), "--no-builtin", "-o", str(tmp_path / "out.onnx")]
    assert main(args) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
    assert not (tmp_path / "out.onnx").exists()


def test_malformed_model_is_one_line_and_exit_2_on_the_command_line(tmp_path, capsys):
    path = _corrupt(tmp_path, "short")
    args = ["optimize", str(path), "--no-builtin", "-o", str(tmp_path / "out.onnx")]
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "raw_data size" in err[0]
    assert not (tmp_path / "out.onnx").exists()


def test_tensors_other_than_plain_raw_data_stay_parsed(tmp_path):
    proto = _identity_model(
        {
            "typed": RNG.standard_normal(BIG).astype(np.float32),
            "located": RNG.standard_normal(BIG).astype(np.float32),
            "plain": RNG.standard_normal(BIG).astype(np.float32),
        }
    )
    typed, located, _ = proto.graph.initializer
    typed.float_data.extend(numpy_helper.to_array(typed).tolist())
    typed.ClearField("raw_data")
    located.data_location = TensorProto.DEFAULT  # set, so serialized: not ir's bytes
    path = _save(proto, tmp_path / "m.onnx")
    model = load_model(path)
    kinds = {n: type(v.const_value).__name__ for n, v in model.graph.initializers.items()}
    assert kinds == {
        "typed": "TensorProtoTensor",
        "located": "TensorProtoTensor",
        "plain": "SourceTensor",
    }
    ir.save(ir.load(path), tmp_path / "ir.onnx")
    save_model(model, tmp_path / "out.onnx")
    assert (tmp_path / "out.onnx").read_bytes() == (tmp_path / "ir.onnx").read_bytes()


def _written_as_ir_saves_it(path: Path, model: ir.Model) -> bool:
    ir.save(ir.load(path), path.with_suffix(".ir.onnx"))
    save_model(model, path.with_suffix(".out.onnx"))
    written = path.with_suffix(".out.onnx").read_bytes()
    return written == path.with_suffix(".ir.onnx").read_bytes()


def test_ir3_subgraph_and_external_data_models(tmp_path):
    # IR 3: initializers are graph inputs too
    weights = {"w": RNG.standard_normal(BIG).astype(np.float32)}
    proto = _identity_model(weights, ir_version=3)
    proto.opset_import[0].version = 8
    proto.graph.input.extend([helper.make_tensor_value_info("w", TensorProto.FLOAT, [BIG])])
    path = _save(proto, tmp_path / "ir3.onnx")
    model = load_model(path)
    assert isinstance(model.graph.initializers["w"].const_value, SourceTensor)
    assert model.graph.initializers["w"] in model.graph.inputs
    assert _written_as_ir_saves_it(path, model)
    # subgraph weights stay parsed
    proto = _identity_model(weights)
    inner = helper.make_graph(
        [helper.make_node("Identity", ["sub_w"], ["t"], name="inner")],
        "then",
        [],
        [helper.make_tensor_value_info("t", TensorProto.FLOAT, [BIG])],
        [numpy_helper.from_array(weights["w"] + 1, "sub_w")],
    )
    proto.graph.node.append(
        helper.make_node("If", ["c"], ["z"], then_branch=inner, else_branch=inner, name="if")
    )
    proto.graph.initializer.append(numpy_helper.from_array(np.array(True), "c"))
    proto.graph.output.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, [BIG]))
    path = _save(proto, tmp_path / "sub.onnx")
    model = load_model(path)
    assert isinstance(model.graph.initializers["w"].const_value, SourceTensor)
    (branch,) = [n for n in model.graph if n.op_type == "If"]
    sub = branch.attributes["then_branch"].value.initializers["sub_w"].const_value
    assert isinstance(sub, ir.serde.TensorProtoTensor)
    assert _written_as_ir_saves_it(path, model)
    # some weights external: the model is read whole, its external tensors from disk
    proto = _identity_model({"a": weights["w"], "b": weights["w"] * 2})
    onnx.external_data_helper.convert_model_to_external_data(
        proto, location="m.data", size_threshold=0
    )
    proto.graph.initializer[1].CopyFrom(numpy_helper.from_array(weights["w"] * 2, "b"))
    path = _save(proto, tmp_path / "mixed.onnx")
    model = load_model(path)
    kinds = {n: type(v.const_value).__name__ for n, v in model.graph.initializers.items()}
    assert kinds == {"a": "ExternalTensor", "b": "TensorProtoTensor"}


def test_weights_stay_readable_when_the_input_is_replaced_not_when_rewritten(tmp_path):
    weights = {"w": RNG.standard_normal(BIG).astype(np.float32)}
    path = _save(_identity_model(weights), tmp_path / "m.onnx")
    model = load_model(path)
    other = _save(_identity_model({"w": weights["w"] + 1}), tmp_path / "other.onnx")
    os.replace(other, path)  # a new file in its place: the loaded one is still open
    tensor = model.graph.initializers["w"].const_value
    assert tensor.numpy().tobytes() == weights["w"].tobytes()
    model = load_model(path)  # rewritten in place after the load: refused, never misread
    data = path.read_bytes()
    with open(path, "r+b") as file:
        file.write(data[:10])
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    with pytest.raises(OSError, match="changed after it was loaded"):
        model.graph.initializers["w"].const_value.numpy()


def test_check_only_and_text_format(tmp_path):
    path = _save(_conv_bn_model(), tmp_path / "m.onnx")
    optimize_file(path, None, [])  # folded and checked in memory, nothing written
    text = tmp_path / "m.textproto"
    onnx.save(_conv_bn_model(), text, format="textproto")
    model = load_model(text)
    assert isinstance(model.graph.initializers["w"].const_value, ir.serde.TensorProtoTensor)


def test_unsorted_model_with_lazy_weights_is_sorted_and_accepted(tmp_path, whole):
    proto = _conv_bn_model()
    proto.graph.node.reverse()  # a writer's slip: the checker complains, the load sorts
    path = _save(proto, tmp_path / "m.onnx")
    model = load_model(path)
    assert isinstance(model.graph.initializers["w"].const_value, SourceTensor)
    assert [node.op_type for node in model.graph] == ["Conv", "BatchNormalization"]
    save_model(model, tmp_path / "lazy.onnx")
    whole()
    save_model(load_model(path), tmp_path / "whole.onnx")
    assert (tmp_path / "lazy.onnx").read_bytes() == (tmp_path / "whole.onnx").read_bytes()


def test_weights_the_graph_does_not_take_are_loaded_whole(tmp_path, monkeypatch):
    path = _save(_identity_model(_weights()), tmp_path / "m.onnx")
    monkeypatch.setattr(model_io, "_attach_source_tensors", lambda *args: False)
    model = load_model(path)
    tensors = [value.const_value for value in model.graph.initializers.values()]
    assert all(
        isinstance(t, ir.serde.TensorProtoTensor) and t.raw.HasField("raw_data") for t in tensors
    )
    assert _written_as_ir_saves_it(path, model)
