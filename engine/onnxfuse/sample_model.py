"""Build the bundled sample model: a small ResNet-style CNN, with onnx.helper only.

``python -m onnxfuse.sample_model [OUT]`` writes it (default: ``data/sample_resnet.onnx``
beside this module). The bytes are deterministic: weights come from
``numpy.random.default_rng(0)`` and the protobuf is serialized deterministically,
so regenerating the file must reproduce the committed one exactly.

The graph (input ``input`` float32 [1, 3, 32, 32], output ``logits`` float32 [1, 10]):

- stem: Conv 3→16 (with bias) + BatchNormalization + Relu
- block 1 (identity shortcut): Pad → Conv 16→16 (no padding) + BN + Relu → Dropout →
  Conv + BN, Add with the shortcut, Relu
- block 2 (projection shortcut, stride 2): Conv 16→32 stride 2 + BN + Relu → Conv + BN;
  shortcut Conv 1x1 stride 2 + BN; Add, Relu
- block 3 (identity shortcut through an Identity node): Conv + BN + Relu → Conv + BN, Add, Relu
- head: GlobalAveragePool, Flatten, MatMul + Add → [1, 10]

So every built-in fusion has work: Conv+BN folding, Pad into Conv, Dropout and
Identity elimination, MatMul+Add → Gemm. Opset 17, IR version 8 (onnxruntime loads it).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
IR_VERSION = 8
INPUT_SHAPE = (1, 3, 32, 32)
NUM_CLASSES = 10
SEED = 0

DEFAULT_PATH = Path(__file__).resolve().parent / "data" / "sample_resnet.onnx"


class _Builder:
    """Collects nodes and initializers; names every node after its output."""

    def __init__(self, rng: np.random.Generator):
        self.rng = rng
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []

    def constant(self, name: str, array: np.ndarray) -> str:
        self.initializers.append(numpy_helper.from_array(array, name))
        return name

    def node(self, op_type: str, inputs: list[str], output: str, **attrs) -> str:
        self.nodes.append(helper.make_node(op_type, inputs, [output], name=output, **attrs))
        return output

    def conv(
        self,
        name: str,
        x: str,
        c_in: int,
        c_out: int,
        kernel: int,
        stride: int = 1,
        pad: int | None = None,
        bias: bool = False,
    ) -> str:
        pad = kernel // 2 if pad is None else pad
        fan_in = c_in * kernel * kernel
        weight = self.rng.standard_normal((c_out, c_in, kernel, kernel)) * np.sqrt(2.0 / fan_in)
        inputs = [x, self.constant(f"{name}.weight", weight.astype(np.float32))]
        if bias:
            b = 0.1 * self.rng.standard_normal(c_out)
            inputs.append(self.constant(f"{name}.bias", b.astype(np.float32)))
        return self.node(
            "Conv",
            inputs,
            name,
            kernel_shape=[kernel, kernel],
            strides=[stride, stride],
            pads=[pad] * 4,
        )

    def batch_norm(self, name: str, x: str, channels: int) -> str:
        rng = self.rng
        scale = rng.uniform(0.5, 1.5, channels)
        bias = 0.1 * rng.standard_normal(channels)
        mean = 0.1 * rng.standard_normal(channels)
        var = rng.uniform(0.5, 1.5, channels)  # running variance: strictly positive
        inputs = [x] + [
            self.constant(f"{name}.{part}", value.astype(np.float32))
            for part, value in (
                ("scale", scale),
                ("bias", bias),
                ("running_mean", mean),
                ("running_var", var),
            )
        ]
        return self.node("BatchNormalization", inputs, name, epsilon=1e-5)

    def conv_bn(self, name: str, x: str, c_in: int, c_out: int, kernel: int, **conv) -> str:
        y = self.conv(f"{name}.conv", x, c_in, c_out, kernel, **conv)
        return self.batch_norm(f"{name}.bn", y, c_out)

    def relu(self, name: str, x: str) -> str:
        return self.node("Relu", [x], name)


def build_model() -> onnx.ModelProto:
    """The sample ResNet-style CNN as a ModelProto (same bytes every time)."""
    b = _Builder(np.random.default_rng(SEED))

    # Stem.
    x = b.relu("stem.relu", b.conv_bn("stem", "input", 3, 16, 3, bias=True))

    # Block 1: identity shortcut; its first Conv is fed by an explicit Pad.
    pads = b.constant("block1.pad.pads", np.array([0, 0, 1, 1, 0, 0, 1, 1], dtype=np.int64))
    padded = b.node("Pad", [x, pads], "block1.pad", mode="constant")
    y = b.relu("block1.relu1", b.conv_bn("block1.1", padded, 16, 16, 3, pad=0))
    y = b.node("Dropout", [y], "block1.dropout")
    y = b.conv_bn("block1.2", y, 16, 16, 3)
    x = b.relu("block1.relu2", b.node("Add", [y, x], "block1.add"))

    # Block 2: stride 2, 1x1 Conv+BN projection shortcut.
    y = b.relu("block2.relu1", b.conv_bn("block2.1", x, 16, 32, 3, stride=2))
    y = b.conv_bn("block2.2", y, 32, 32, 3)
    shortcut = b.conv_bn("block2.proj", x, 16, 32, 1, stride=2)
    x = b.relu("block2.relu2", b.node("Add", [y, shortcut], "block2.add"))

    # Block 3: identity shortcut passing through an Identity node.
    shortcut = b.node("Identity", [x], "block3.identity")
    y = b.relu("block3.relu1", b.conv_bn("block3.1", x, 32, 32, 3))
    y = b.conv_bn("block3.2", y, 32, 32, 3)
    x = b.relu("block3.relu2", b.node("Add", [y, shortcut], "block3.add"))

    # Head: 2-D MatMul + Add, so MatMul+Add → Gemm applies.
    x = b.node("GlobalAveragePool", [x], "head.pool")
    x = b.node("Flatten", [x], "head.flatten", axis=1)
    weight = b.rng.standard_normal((32, NUM_CLASSES)) * np.sqrt(1.0 / 32)
    bias = 0.1 * b.rng.standard_normal(NUM_CLASSES)
    x = b.node(
        "MatMul", [x, b.constant("head.fc.weight", weight.astype(np.float32))], "head.fc.matmul"
    )
    b.node("Add", [x, b.constant("head.fc.bias", bias.astype(np.float32))], "logits")

    graph = helper.make_graph(
        b.nodes,
        "sample_resnet",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, list(INPUT_SHAPE))],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, NUM_CLASSES])],
        b.initializers,
    )
    graph.doc_string = "Small ResNet-style CNN with seeded random weights (onnxfuse sample)."
    return helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET)],
        ir_version=IR_VERSION,
        producer_name="onnxfuse.sample_model",
        producer_version="1",
    )


def model_bytes() -> bytes:
    return build_model().SerializeToString(deterministic=True)


def write(path: str | Path = DEFAULT_PATH) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(model_bytes())
    return path


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) > 1 or any(a in ("-h", "--help") for a in argv):
        print("usage: python -m onnxfuse.sample_model [OUT]", file=sys.stderr)
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    path = write(argv[0] if argv else DEFAULT_PATH)
    print(f"wrote {path} ({path.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
