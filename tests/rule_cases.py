"""Rules and model builders shared by the rule-language and rewrite tests."""

from __future__ import annotations

import numpy as np
import onnx
from helpers import make_model, tensor_input
from onnx import helper, numpy_helper

X4 = [2, 3, 4, 5]


def unary_chain(*ops: str, shape=X4, opset: int = 17, **attributes) -> onnx.ModelProto:
    nodes, previous = [], "x"
    for index, op in enumerate(ops):
        out = "y" if index == len(ops) - 1 else f"t{index}"
        nodes.append(helper.make_node(op, [previous], [out], name=f"n{index}", **attributes))
        previous = out
    return make_model(nodes, [tensor_input("x", shape)], [tensor_input("y", shape)], opset=opset)


def fired(report, name: str) -> int:
    return report.rules[name].applied


RELU_RELU = """
rules:
  - name: relu-relu
    description: Relu is idempotent.
    benefit: 3
    references: [math]
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


ADD_ZERO = """
rules:
  - name: add-zero
    source: |
      f (X) => (Y) {
        z = Constant<value_float = 0.0>()
        Y = Add(X, z)
      }
    where: broadcastable(X, Y) and shape(X) == shape(Y)
    target: |
      f (X) => (X) {
      }
"""


def _add_model(first: str, second: str, constant: float, dtype=np.float32, ir_version=8):
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    zero = numpy_helper.from_array(np.array(constant, dtype=dtype), "c")
    nodes = [
        helper.make_node("Add", [first, second], ["s"], name="add"),
        helper.make_node("Relu", ["s"], ["y"], name="relu"),
    ]
    return make_model(
        nodes,
        [tensor_input("x", X4, elem)],
        [tensor_input("y", X4, elem)],
        [zero],
        ir_version=ir_version,
    )


def _relu_pair_rule(target: str, extra: str = "") -> str:
    return f"""
rules:
  - name: my-rule
    source: |
      f (X) => (Y) {{
        T = Relu(X)
        Y = Relu(T)
      }}
    target: "{target}"
{extra}"""
