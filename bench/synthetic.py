"""Synthetic transformer decoder stacks, as a legacy exporter writes them.

    python bench/synthetic.py OUT.onnx --layers N [--hidden H] [--heads A] [--ffn F]
                              [--external] [--weights zeros|random]

Each block is pre-norm self-attention and an MLP in decomposed form: layer
norm as ReduceMean/Sub/Pow/ReduceMean/Add/Sqrt/Div/Mul/Add, attention as
MatMul + bias, Reshape/Transpose into heads, scaled QK^T with an additive
causal mask, Softmax, the context back through Transpose/Reshape, and the
exact (erf) Gelu in the MLP: about 60 nodes per block, named by their block
(/model/layers.3/matmul_812) as the legacy exporter names them, every one of them a
candidate for some rule. Weights are zeros by default (cheap to write and
compress nothing away: a rule that never reads a weight must not load it) or
seeded random. ``--external`` stores every initializer in one external data
file beside the model, so the stack can exceed protobuf's 2 GB limit.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17


class _Builder:
    def __init__(self, hidden: int, heads: int, ffn: int, weights: str, seed: int) -> None:
        self.hidden, self.heads, self.ffn = hidden, heads, ffn
        self.weights = weights
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.count = 0
        self.scope = ""  # the module path a node's name starts with (/model/layers.3/)

    def name(self, stem: str) -> str:
        self.count += 1
        return f"{stem}_{self.count}"

    def weight(self, stem: str, *shape: int, scale: float = 0.02) -> str:
        name = self.name(stem)
        if self.weights == "zeros":
            array = np.zeros(shape, np.float32)
        else:
            array = (self.rng.standard_normal(shape) * scale).astype(np.float32)
        self.initializers.append(numpy_helper.from_array(array, name))
        return name

    def const(self, stem: str, value: np.ndarray) -> str:
        name = self.name(stem)
        self.initializers.append(numpy_helper.from_array(value, name))
        return name

    def op(self, op_type: str, inputs: list[str], **attrs) -> str:
        out = self.name(f"{self.scope}{op_type.lower()}")
        self.nodes.append(helper.make_node(op_type, inputs, [out], name=out, **attrs))
        return out

    def layer_norm(self, x: str) -> str:
        mean = self.op("ReduceMean", [x], axes=[-1])
        centered = self.op("Sub", [x, mean])
        square = self.op("Pow", [centered, self.const("two", np.array(2.0, np.float32))])
        variance = self.op("ReduceMean", [square], axes=[-1])
        eps = self.const("eps", np.array(1e-5, np.float32))
        std = self.op("Sqrt", [self.op("Add", [variance, eps])])
        normalized = self.op("Div", [centered, std])
        scaled = self.op("Mul", [normalized, self.weight("ln_gamma", self.hidden)])
        return self.op("Add", [scaled, self.weight("ln_beta", self.hidden)])

    def linear(self, x: str, n_in: int, n_out: int) -> str:
        product = self.op("MatMul", [x, self.weight("w", n_in, n_out)])
        return self.op("Add", [product, self.weight("b", n_out)])

    def heads_of(self, x: str) -> str:
        head = self.hidden // self.heads
        shape = self.const("shape", np.array([0, 0, self.heads, head], np.int64))
        return self.op("Transpose", [self.op("Reshape", [x, shape])], perm=[0, 2, 1, 3])

    def attention(self, x: str, mask: str) -> str:
        q = self.heads_of(self.linear(x, self.hidden, self.hidden))
        k = self.heads_of(self.linear(x, self.hidden, self.hidden))
        v = self.heads_of(self.linear(x, self.hidden, self.hidden))
        kt = self.op("Transpose", [k], perm=[0, 1, 3, 2])
        scores = self.op("MatMul", [q, kt])
        scale = self.const("scale", np.array(math.sqrt(self.hidden // self.heads), np.float32))
        masked = self.op("Add", [self.op("Div", [scores, scale]), mask])
        probs = self.op("Softmax", [masked], axis=-1)
        context = self.op("Transpose", [self.op("MatMul", [probs, v])], perm=[0, 2, 1, 3])
        merged = self.const("merged", np.array([0, 0, self.hidden], np.int64))
        return self.linear(self.op("Reshape", [context, merged]), self.hidden, self.hidden)

    def gelu(self, x: str) -> str:
        root2 = self.const("sqrt2", np.array(math.sqrt(2.0), np.float32))
        erf = self.op("Erf", [self.op("Div", [x, root2])])
        one_plus = self.op("Add", [erf, self.const("one", np.array(1.0, np.float32))])
        half = self.op("Mul", [x, self.const("half", np.array(0.5, np.float32))])
        return self.op("Mul", [half, one_plus])

    def block(self, x: str, mask: str) -> str:
        attended = self.op("Add", [x, self.attention(self.layer_norm(x), mask)])
        hidden = self.gelu(self.linear(self.layer_norm(attended), self.hidden, self.ffn))
        return self.op("Add", [attended, self.linear(hidden, self.ffn, self.hidden)])


def decoder_stack(
    layers: int,
    hidden: int = 64,
    heads: int = 4,
    ffn: int | None = None,
    weights: str = "random",
    seed: int = 0,
) -> onnx.ModelProto:
    """A ``layers``-block decoder: inputs ``hidden_states [batch, seq, hidden]`` and an additive
    ``mask [batch, 1, seq, seq]``; output ``output`` of the input's shape."""
    b = _Builder(hidden, heads, ffn or 4 * hidden, weights, seed)
    x = "hidden_states"
    for layer in range(layers):
        b.scope = f"/model/layers.{layer}/"
        x = b.block(x, "mask")
    b.scope = "/model/norm/"
    b.layer_norm(x)
    b.nodes[-1].output[0] = "output"  # the final Add writes the graph output directly
    graph = helper.make_graph(
        b.nodes,
        "decoder",
        [
            helper.make_tensor_value_info(
                "hidden_states", TensorProto.FLOAT, ["batch", "seq", hidden]
            ),
            helper.make_tensor_value_info("mask", TensorProto.FLOAT, ["batch", 1, "seq", "seq"]),
        ],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["batch", "seq", hidden])],
        b.initializers,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])


def save(model: onnx.ModelProto, path: Path, external: bool) -> None:
    if external:
        onnx.save(
            model,
            path,
            save_as_external_data=True,
            all_tensors_to_one_file=True,
            location=f"{path.name}.data",
            size_threshold=1024,
        )
    else:
        onnx.save(model, path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("output", type=Path)
    parser.add_argument("--layers", type=int, required=True)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--ffn", type=int, default=None)
    parser.add_argument("--weights", choices=("zeros", "random"), default="random")
    parser.add_argument("--external", action="store_true")
    args = parser.parse_args()
    model = decoder_stack(args.layers, args.hidden, args.heads, args.ffn, args.weights)
    save(model, args.output, args.external)
    print(f"{args.output}: {len(model.graph.node)} nodes")


if __name__ == "__main__":
    main()
