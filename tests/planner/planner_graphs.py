"""Small hand-built models for the planner tests (opset 17, IR 8: onnxruntime runs them)."""

from __future__ import annotations

import itertools

import numpy as np
import onnx
import onnx_ir as ir
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
LIGHT = __import__("pathlib").Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"


def make_model(
    nodes: list[onnx.NodeProto],
    inputs: list[onnx.ValueInfoProto],
    outputs: list[onnx.ValueInfoProto],
    initializers: list[TensorProto] = (),
    ir_version: int = 8,
) -> ir.Model:
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(initializers))
    proto = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=ir_version
    )
    onnx.checker.check_model(proto, full_check=True)
    return ir.from_proto(proto)


def tensor(name: str, shape: list[int | str], dtype: int = TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, dtype, shape)


def weight(name: str, *shape: int, seed: int = 0) -> TensorProto:
    rng = np.random.default_rng(seed + len(name))
    return numpy_helper.from_array(rng.normal(0, 0.3, shape).astype(np.float32), name)


def matmul_chain() -> ir.Model:
    """x[1,16] -> a[1,32] -> b[1,16] -> c[1,24] -> y[1,8]: 128, 64 and 96 bytes.

    With 64-byte alignment the optimal arena is 192 (c takes a's slot); onnxruntime's
    exact-size reuse cannot give a's 128-byte buffer to the 96-byte c.
    """
    dims = [("x", 16), ("a", 32), ("b", 16), ("c", 24), ("y", 8)]
    nodes, inits = [], []
    for (src, n_in), (dst, n_out) in itertools.pairwise(dims):
        inits.append(weight(f"w_{dst}", n_in, n_out))
        nodes.append(helper.make_node("MatMul", [src, f"w_{dst}"], [dst], name=f"mm_{dst}"))
    return make_model(nodes, [tensor("x", [1, 16])], [tensor("y", [1, 8])], inits)


def two_branches() -> ir.Model:
    """Two branches x->big->small, concatenated. Graph order runs both bigs first."""
    nodes = [
        helper.make_node("MatMul", ["x", "wa1"], ["a1"], name="A1"),
        helper.make_node("MatMul", ["x", "wb1"], ["b1"], name="B1"),
        helper.make_node("MatMul", ["a1", "wa2"], ["a2"], name="A2"),
        helper.make_node("MatMul", ["b1", "wb2"], ["b2"], name="B2"),
        helper.make_node("Concat", ["a2", "b2"], ["y"], name="cat", axis=1),
    ]
    inits = [weight("wa1", 16, 256), weight("wb1", 16, 256)]
    inits += [weight("wa2", 256, 16), weight("wb2", 256, 16)]
    return make_model(nodes, [tensor("x", [1, 16])], [tensor("y", [1, 32])], inits)


def if_model() -> ir.Model:
    """An If whose branches read ``early``, made at step 0, from the outer scope."""
    then = helper.make_graph(
        [helper.make_node("Relu", ["early"], ["t"])], "then", [], [tensor("t", [8])]
    )
    other = helper.make_graph(
        [helper.make_node("Neg", ["early"], ["e"])], "else", [], [tensor("e", [8])]
    )
    nodes = [
        helper.make_node("Sigmoid", ["x"], ["early"]),
        helper.make_node("Exp", ["x"], ["unrelated"]),
        helper.make_node("ReduceSum", ["unrelated"], ["total"], keepdims=0),
        helper.make_node("Greater", ["total", "zero"], ["cond"]),
        helper.make_node("If", ["cond"], ["y"], then_branch=then, else_branch=other),
    ]
    zero = helper.make_tensor("zero", TensorProto.FLOAT, [], [0.0])
    return make_model(nodes, [tensor("x", [8])], [tensor("y", [8])], [zero])


def loop_model() -> ir.Model:
    """A Loop adding ``early`` (read from the outer scope) three times to a carried value."""
    body = helper.make_graph(
        [
            helper.make_node("Add", ["acc_in", "early"], ["acc_out"]),
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
        ],
        "body",
        [
            tensor("i", [], TensorProto.INT64),
            tensor("cond_in", [], TensorProto.BOOL),
            tensor("acc_in", [8]),
        ],
        [tensor("cond_out", [], TensorProto.BOOL), tensor("acc_out", [8])],
    )
    nodes = [
        helper.make_node("Sigmoid", ["x"], ["early"]),
        helper.make_node("Relu", ["x"], ["start"]),
        helper.make_node("Loop", ["n", "", "start"], ["acc"], body=body),
        helper.make_node("Neg", ["acc"], ["y"]),
    ]
    n = helper.make_tensor("n", TensorProto.INT64, [], [3])
    return make_model(nodes, [tensor("x", [8])], [tensor("y", [8])], [n])


def nonzero_model() -> ir.Model:
    """The positions of x's positive elements, doubled and summed: NonZero's count of
    them is the dim of nz, f and m that only a run can tell."""
    nodes = [
        helper.make_node("Relu", ["x"], ["r"], name="relu"),
        helper.make_node("NonZero", ["r"], ["nz"], name="find"),
        helper.make_node("Cast", ["nz"], ["f"], name="cast", to=TensorProto.FLOAT),
        helper.make_node("Mul", ["f", "two"], ["m"], name="double"),
        helper.make_node("ReduceSum", ["m"], ["y"], name="total", keepdims=0),
    ]
    two = numpy_helper.from_array(np.array(2, np.float32), "two")
    return make_model(nodes, [tensor("x", [64])], [tensor("y", [])], [two])


def flatten_resnet() -> ir.Model:
    """A residual block, then a flatten to a computed shape: Reshape(p, [N, C*H*W]) with
    N and C*H*W taken from Shape(p) (a ReduceProd of its tail, which onnx's data
    propagation does not follow). The input is static; the exporter's value_info left
    the flattened dim as ``unk__0``, as torch's legacy exporter does."""
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["c2", "x"], ["s"], name="residual"),
        helper.make_node("Relu", ["s"], ["r2"], name="relu2"),
        helper.make_node(
            "MaxPool", ["r2"], ["p"], name="pool", kernel_shape=[2, 2], strides=[2, 2]
        ),
        helper.make_node("Shape", ["p"], ["shape"], name="shape"),
        helper.make_node("Slice", ["shape", "zero", "one"], ["head"], name="head"),
        helper.make_node("Slice", ["shape", "one", "four"], ["tail"], name="tail"),
        helper.make_node("ReduceProd", ["tail"], ["features"], name="features", keepdims=1),
        helper.make_node("Concat", ["head", "features"], ["flat_shape"], name="flat", axis=0),
        helper.make_node("Reshape", ["p", "flat_shape"], ["val_5"], name="flatten"),
        helper.make_node("MatMul", ["val_5", "w3"], ["y"], name="fc"),
    ]
    ints = [
        numpy_helper.from_array(np.array([v], np.int64), name)
        for name, v in (("zero", 0), ("one", 1), ("four", 4))
    ]
    inits = [weight("w1", 4, 4, 3, 3), weight("w2", 4, 4, 3, 3), weight("w3", 64, 10), *ints]
    model = make_model(nodes, [tensor("x", [1, 4, 8, 8])], [tensor("y", [1, 10])], inits)
    model.graph.node("flatten").outputs[0].shape = ir.Shape([1, ir.SymbolicDim("unk__0")])
    model.graph.node("flatten").outputs[0].dtype = ir.DataType.FLOAT
    return model


def unnamed_input_model() -> ir.Model:
    """x[?, 3, ?]: axis 0 has no dim_param, axis 2 the placeholder ``?`` some exporters
    write; neither can be bound by name."""
    nodes = [
        helper.make_node("Relu", ["x"], ["r"], name="relu"),
        helper.make_node("ReduceMean", ["r"], ["m"], name="mean", axes=[2], keepdims=0),
        helper.make_node("MatMul", ["m", "w"], ["y"], name="fc"),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 3, "?"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 5])
    return make_model(nodes, [x], [y], [weight("w", 3, 5)])


# What SymbolicShapeInference writes for three stride-2 convolutions (kernel 3, pad 1).
HALVED = ("floor(width/2 - 1/2) + 1", "floor(floor(width/2 - 1/2)/2) + 1")
EIGHTH = "floor(floor(floor(width/2 - 1/2)/2)/2) + 1"


def expression_model(custom_dim: str = EIGHTH) -> ir.Model:
    """x[1, 1, width], three stride-2 convolutions, then an op of a custom domain that no
    shape inference knows: its output's size is only in the dim expression the model
    carries for it (``custom_dim``), as a tool that annotated the model wrote it."""
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["h1"], name="down1", strides=[2], pads=[1, 1]),
        helper.make_node("Conv", ["h1", "w2"], ["h2"], name="down2", strides=[2], pads=[1, 1]),
        helper.make_node("Conv", ["h2", "w3"], ["h3"], name="down3", strides=[2], pads=[1, 1]),
        helper.make_node("Scale", ["h3"], ["s"], name="scale", domain="custom"),
        helper.make_node("Relu", ["s"], ["y"], name="relu"),
    ]
    inits = [weight(f"w{i}", 1, 1, 3) for i in (1, 2, 3)]
    graph = helper.make_graph(
        nodes,
        "g",
        [tensor("x", [1, 1, "width"])],
        [tensor("y", [1, 1, custom_dim])],
        inits,
        value_info=[
            tensor("h1", [1, 1, HALVED[0]]),
            tensor("h2", [1, 1, HALVED[1]]),
            tensor("h3", [1, 1, EIGHTH]),
            tensor("s", [1, 1, custom_dim]),
        ],
    )
    opsets = [helper.make_opsetid("", OPSET), helper.make_opsetid("custom", 1)]
    proto = helper.make_model(graph, opset_imports=opsets, ir_version=8)
    onnx.checker.check_model(proto, full_check=True)
    return ir.from_proto(proto)


def rate_model() -> ir.Model:
    """As a voice-activity model branches on its ``sr`` input: at 16000 the chunk is
    used whole ([1, 8]), else every other sample ([1, 4]); the branches' shapes differ."""
    whole = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["w"])], "whole", [], [tensor("w", [1, 8])]
    )
    half = helper.make_graph(
        [
            helper.make_node("Slice", ["x", "starts", "ends", "axes", "steps"], ["h"]),
        ],
        "half",
        [],
        [tensor("h", [1, 4])],
    )
    nodes = [
        helper.make_node("Equal", ["sr", "rate16k"], ["is16k"]),
        helper.make_node("If", ["is16k"], ["picked"], then_branch=whole, else_branch=half),
        helper.make_node("Relu", ["picked"], ["y"]),
    ]
    consts = [
        helper.make_tensor("rate16k", TensorProto.INT64, [], [16000]),
        helper.make_tensor("starts", TensorProto.INT64, [1], [0]),
        helper.make_tensor("ends", TensorProto.INT64, [1], [8]),
        helper.make_tensor("axes", TensorProto.INT64, [1], [1]),
        helper.make_tensor("steps", TensorProto.INT64, [1], [2]),
    ]
    inputs = [tensor("x", [1, 8]), tensor("sr", [], TensorProto.INT64)]
    return make_model(nodes, inputs, [tensor("y", [1, "n"])], consts)
