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
