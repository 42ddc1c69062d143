"""The engine's fast paths give the bytes and verdicts of the slow ones they replace:
the model writer (``ir.save``), the numpy folds (onnx's reference evaluator) and
the checks with stripped weights (onnx's full checker)."""

from __future__ import annotations

import os

import ml_dtypes
import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxfuse.api import sample_model_path
from onnxfuse.errors import ModelError
from onnxfuse.files.model_io import load_model, save_model
from onnxfuse.files.source_weights import SourceTensor
from onnxfuse.files.writer import DIRECT_MIN_BYTES, SOURCE_META, write_model
from onnxfuse.fold.folder import FoldContext, Folder
from onnxfuse.fold.numpy_ops import numpy_result
from onnxfuse.fold.spill import FillTensor
from onnxfuse.graph.names import NameSource
from onnxfuse.passes.normalize import normalize

BIG = DIRECT_MIN_BYTES // 4 + 7  # float32 elements: above the direct-write size


def _both(model: ir.Model, tmp_path) -> tuple[bytes, bytes]:
    ir.save(model, tmp_path / "ir.onnx")
    with open(tmp_path / "fast.onnx", "wb") as out:
        write_model(model, out)
    return (tmp_path / "ir.onnx").read_bytes(), (tmp_path / "fast.onnx").read_bytes()


def _weights_model() -> ir.Model:
    """Initializers of every kind the writer treats apart, a subgraph and metadata."""
    rng = np.random.default_rng(0)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [BIG])
    then = helper.make_graph(
        [helper.make_node("Identity", ["sub_w"], ["t"])],
        "then",
        [],
        [helper.make_tensor_value_info("t", TensorProto.FLOAT, [BIG])],
        [numpy_helper.from_array(rng.random(BIG, dtype=np.float32), "sub_w")],
    )
    nodes = [
        helper.make_node("Add", ["x", "w"], ["a"]),
        helper.make_node("Add", ["a", "v"], ["b"]),
        helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=then),
        helper.make_node("Add", ["b", "y"], ["z"]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [x],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [BIG])],
        [
            numpy_helper.from_array(rng.random(BIG, dtype=np.float32), "w"),
            numpy_helper.from_array(rng.random(BIG, dtype=np.float32), "v"),
            numpy_helper.from_array(np.array(True), "c"),
        ],
        doc_string="a graph",
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    helper.set_model_props(proto, {"key": "value"})
    model = ir.from_proto(proto)
    values = model.graph.initializers
    # numpy-held: a transposed (non-contiguous) view, bfloat16 and bool arrays
    square = rng.random((64, 300), dtype=np.float32)
    values["v"].const_value = ir.Tensor(np.arange(2 * BIG, dtype=np.float32)[::2])
    extra = {
        "t_view": ir.Tensor(square.T),
        "b16": ir.Tensor(rng.random(BIG).astype(ml_dtypes.bfloat16)),
        "flags": ir.Tensor(rng.random(DIRECT_MIN_BYTES + 3) > 0.5),
        "documented": ir.Tensor(rng.random(BIG, dtype=np.float32), doc_string="weights"),
    }
    for name, tensor in extra.items():
        value = ir.Value(name=name, const_value=tensor)
        value.type, value.shape = ir.TensorType(tensor.dtype), tensor.shape
        model.graph.register_initializer(value)
    return model


def test_writer_bytes_equal_ir_save_on_every_kind_of_initializer(tmp_path):
    slow, fast = _both(_weights_model(), tmp_path)
    assert fast == slow


def test_writer_bytes_equal_ir_save_on_loaded_and_optimized_models(tmp_path):
    from onnxfuse.api import optimize_file

    source = sample_model_path()
    slow, fast = _both(ir.load(source), tmp_path)
    assert fast == slow  # loaded protos, written as they are
    optimize_file(source, tmp_path / "opt.onnx", [])  # folds: numpy-held initializers
    slow, fast = _both(ir.load(tmp_path / "opt.onnx"), tmp_path)
    assert fast == slow
    # the optimized file itself was written by the writer: ir.save of it matches
    assert (tmp_path / "opt.onnx").read_bytes() == slow


def test_writer_copies_loaded_weights_from_their_file_only_while_unchanged(tmp_path):
    rng = np.random.default_rng(1)
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "w"], ["a"]), helper.make_node("Add", ["a", "v"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [BIG])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [BIG])],
        [
            numpy_helper.from_array(rng.random(BIG, dtype=np.float32), "w"),
            numpy_helper.from_array(rng.random(BIG, dtype=np.float32), "v"),
        ],
    )
    # v: a field onnx_ir would not write (data_location set): parsed, not left in the file
    graph.initializer[1].data_location = TensorProto.DEFAULT
    source = tmp_path / "source.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), source)
    model = load_model(source)
    assert isinstance(model.graph.initializers["w"].const_value, SourceTensor)
    assert len(model.meta[SOURCE_META].ranges) == 1  # v found in the file
    slow, fast = _both(model, tmp_path)
    assert fast == slow
    model.graph.initializers["v"].const_value.raw.doc_string = "changed"  # unlike the file
    model.graph.initializers["w"].const_value.doc_string = "changed"
    slow, fast = _both(model, tmp_path)
    assert fast == slow
    model = load_model(source)
    model.graph.initializers["w"].const_value = ir.Tensor(  # w in memory: only v is read
        model.graph.initializers["w"].const_value.numpy().copy()
    )
    data = source.read_bytes()
    middle = len(data) - 4 * BIG // 2  # in v's weights, the second initializer
    source.write_bytes(data[:middle] + bytes([data[middle] ^ 1]) + data[middle + 1 :])  # changed
    stat = source.stat()  # a later modification time, whatever the clock's resolution
    os.utime(source, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    slow, fast = _both(model, tmp_path)
    assert fast == slow


def test_writer_writes_folded_fills_as_the_full_arrays(tmp_path):
    shape = helper.make_tensor("shape", TensorProto.INT64, [2], [64, BIG // 64 + 1])
    nodes = [
        helper.make_node(
            "ConstantOfShape",
            ["shape"],
            ["w"],
            value=helper.make_tensor("v", TensorProto.FLOAT, [1], [0.02]),
        ),
        helper.make_node("Add", ["x", "w"], ["y"]),
    ]
    dims = [64, BIG // 64 + 1]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, dims)],
        [shape],
    )
    model = ir.from_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    normalize(model)
    (fill,) = [v for v in model.graph.initializers.values() if v.const_value.size > 2]
    assert isinstance(fill.const_value, FillTensor)  # held as one value
    slow, fast = _both(model, tmp_path)
    assert fast == slow
    (written,) = [
        t for t in onnx.load(tmp_path / "fast.onnx").graph.initializer if t.name == fill.name
    ]
    assert np.array_equal(numpy_helper.to_array(written), np.full(dims, 0.02, np.float32))


def _matmul_model(weight: np.ndarray, ir_version: int = 8) -> onnx.ModelProto:
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, weight.shape[0]])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, weight.shape[1]])],
        [numpy_helper.from_array(weight, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = ir_version
    return model


def test_load_check_with_stripped_weights_keeps_the_size_complaint(tmp_path):
    proto = _matmul_model(np.ones((256, 256), np.float32))
    onnx.save(proto, tmp_path / "good.onnx")
    load_model(tmp_path / "good.onnx")
    proto.graph.initializer[0].raw_data = proto.graph.initializer[0].raw_data[:-4]
    onnx.save(proto, tmp_path / "short.onnx")
    with pytest.raises(ModelError, match="raw_data size"):
        load_model(tmp_path / "short.onnx")


def test_load_check_with_stripped_weights_still_rejects_bad_graphs(tmp_path):
    proto = _matmul_model(np.ones((256, 256), np.float32))
    proto.graph.node[0].input[0] = "missing"
    onnx.save(proto, tmp_path / "bad.onnx")
    with pytest.raises(ModelError, match="fails the ONNX checker"):
        load_model(tmp_path / "bad.onnx")


def test_save_check_with_stripped_weights_passes_and_writes(tmp_path):
    model = ir.from_proto(_matmul_model(np.ones((256, 256), np.float32)))
    save_model(model, tmp_path / "out.onnx")
    onnx.checker.check_model(str(tmp_path / "out.onnx"), full_check=True)


def _random(dtype: str, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    if dtype == "bool":
        return rng.random(shape) > 0.5
    if dtype.startswith(("int", "uint")):
        return rng.integers(-50 if dtype.startswith("int") else 0, 50, shape).astype(dtype)
    values = rng.standard_normal(shape).astype(dtype)
    values.flat[:3] = [0.0, -1.0, np.inf]  # sqrt of a negative, overflow at the edges
    return values


CASES = [
    (op, dtype, {})
    for op in ("Add", "Sub", "Mul", "Div")
    for dtype in ("float32", "float16", "float64", "int32", "int64", "uint8")
] + [
    ("Sqrt", "float32", {}),
    ("Sqrt", "float16", {}),
    ("Cast", "float32", {"to": TensorProto.FLOAT16}),
    ("Cast", "float32", {"to": TensorProto.INT32}),
    ("Cast", "int64", {"to": TensorProto.FLOAT}),
    ("Cast", "bool", {"to": TensorProto.INT64}),
    ("Cast", "float16", {"to": TensorProto.DOUBLE}),
    ("Transpose", "float32", {"perm": [2, 0, 1]}),
    ("Transpose", "int64", {}),
    ("Reshape", "float32", {}),
    ("Reshape", "float32", {"allowzero": 1}),
    ("Concat", "float32", {"axis": 1}),
    ("Concat", "int64", {"axis": -1}),
]


@pytest.mark.parametrize("op, dtype, attrs", CASES)
def test_numpy_folds_give_the_reference_evaluators_bytes(op, dtype, attrs):
    rng = np.random.default_rng(1)
    x = _random(dtype, (3, 4, 5), rng)
    inputs: list[np.ndarray | None] = [x]
    if op in ("Add", "Sub", "Mul", "Div"):
        inputs.append(_random(dtype, (4, 1), rng) + (1 if dtype != "bool" else 0))
    if op == "Concat":
        inputs += [_random(dtype, (3, 4, 5), rng), _random(dtype, (3, 4, 5), rng)]
    if op == "Reshape":
        inputs.append(np.array([0, -1, 5] if not attrs else [3, -1, 5], np.int64))
    values = [ir.Value(name=f"i{k}") for k in range(len(inputs))]
    node = ir.Node(
        "", op, values, [ir.convenience.convert_attribute(k, v) for k, v in attrs.items()]
    )
    folder = Folder(
        FoldContext(10, {"": 21}),
        NameSource(ir.Model(ir.Graph([], [], nodes=[node]), ir_version=10)),
    )
    with np.errstate(all="ignore"):  # x / 0 and NaN casts, as the folder runs them
        fast = numpy_result(node, inputs, 21)
        slow = folder._reference_result(node, inputs)
    if dtype.startswith(("int", "uint")) and op == "Div":
        assert fast is None  # integer Div truncates: left to the evaluator
        return
    assert fast is not None and slow is not None
    assert fast[0].dtype == slow[0].dtype and fast[0].shape == slow[0].shape
    assert fast[0].tobytes() == slow[0].tobytes()


def test_numpy_folds_leave_old_opsets_and_unknown_attributes_to_the_evaluator():
    node = ir.Node("", "Add", [ir.Value(name="a"), ir.Value(name="b")], [])
    one = np.ones(3, np.float32)
    assert numpy_result(node, [one, one], 6) is None  # broadcast attribute era
    assert numpy_result(node, [one, one.astype(np.float64)], 17) is None  # mixed dtypes
    cast = ir.Node("", "Cast", [ir.Value(name="a")], [ir.AttrInt64("to", TensorProto.BFLOAT16)])
    assert numpy_result(cast, [one], 17) is None  # ml_dtypes target
