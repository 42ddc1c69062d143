"""How far each fused quantized kernel moves a QDQ unit's output, in quantization steps.

```
python bench/qdq_steps.py [--seeds N]
```

For each node unit the `qdq` pack fuses (DQ inputs -> op -> Q), on tensors larger than
the property tests draw (so that onnxruntime's vectorized paths run), with random
scales and zero points and inputs over the whole integer range: the unit as it is and
onnxfuse's result for `cpu`, both run by onnxruntime at ORT_DISABLE_ALL, and the largest
difference of their quantized outputs. The `tolerance: steps:` of each rule in
rules/qdq/ cites these figures.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from helpers import optimize_proto

from onnxfuse import api
from onnxfuse.targets.capabilities import load_target

Weights = dict[int, Callable[[np.random.Generator], np.ndarray]]


def _int8_weight(shape: tuple[int, ...]) -> Callable[[np.random.Generator], np.ndarray]:
    return lambda rng: rng.integers(-127, 128, shape).astype(np.int8)


# name, op, attributes, input shapes, output shape, constant int8 weights by input index
CASES: list[tuple[str, str, dict, list[list[int]], list[int], Weights]] = [
    (
        "Conv 32->64 3x3 16x16",
        "Conv",
        {"pads": [1, 1, 1, 1]},
        [[1, 32, 16, 16], [64, 32, 3, 3]],
        [1, 64, 16, 16],
        {1: _int8_weight((64, 32, 3, 3))},
    ),
    (
        "MatMul 64x256 @ 256x128",
        "MatMul",
        {},
        [[64, 256], [256, 128]],
        [64, 128],
        {1: _int8_weight((256, 128))},
    ),
    ("MatMul of two activations", "MatMul", {}, [[4, 32, 64], [4, 64, 32]], [4, 32, 32], {}),
    (
        "Gemm 16x512 @ (256x512)^T",
        "Gemm",
        {"transB": 1},
        [[16, 512], [256, 512]],
        [16, 256],
        {1: _int8_weight((256, 512))},
    ),
    ("Add 1x64x32x32", "Add", {}, [[1, 64, 32, 32], [1, 64, 32, 32]], [1, 64, 32, 32], {}),
    ("Mul broadcast", "Mul", {}, [[1, 64, 32, 32], [1, 64, 1, 1]], [1, 64, 32, 32], {}),
    ("Sigmoid", "Sigmoid", {}, [[1, 64, 32, 32]], [1, 64, 32, 32], {}),
    ("LeakyRelu", "LeakyRelu", {"alpha": 0.1}, [[1, 64, 32, 32]], [1, 64, 32, 32], {}),
    ("GlobalAveragePool 64x14x14", "GlobalAveragePool", {}, [[1, 64, 14, 14]], [1, 64, 1, 1], {}),
    (
        "AveragePool 3x3",
        "AveragePool",
        {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]},
        [[1, 32, 16, 16]],
        [1, 32, 16, 16],
        {},
    ),
    ("Softmax 8x128", "Softmax", {"axis": -1}, [[8, 128]], [8, 128], {}),
    (
        "Concat of 3",
        "Concat",
        {"axis": 1},
        [[1, 8, 16, 16], [1, 16, 16, 16], [1, 4, 16, 16]],
        [1, 28, 16, 16],
        {},
    ),
]


def _run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> np.ndarray:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    return session.run(None, feeds)[0]


def unit(case, elem_type: int, rng: np.random.Generator):
    """One QDQ unit of ``case`` with random scales and zero points, and a feed for it."""
    _, op, attributes, shapes, out_shape, weights = case
    np_type = np.uint8 if elem_type == TensorProto.UINT8 else np.int8
    info, zero = np.iinfo(np_type), 128 if elem_type == TensorProto.UINT8 else 0
    inits, nodes, inputs, feeds = [], [], [], {}
    for i, shape in enumerate(shapes):
        if i in weights:
            inits.append(numpy_helper.from_array(weights[i](rng), f"x{i}"))
            scale, point = rng.uniform(0.001, 0.02), np.array(0, np.int8)
        else:
            inputs.append(helper.make_tensor_value_info(f"x{i}", elem_type, shape))
            feeds[f"x{i}"] = rng.integers(info.min, info.max + 1, shape).astype(np_type)
            scale, point = rng.uniform(0.005, 0.1), np.array(zero + rng.integers(-20, 21), np_type)
        inits.append(numpy_helper.from_array(np.array(scale, np.float32), f"s{i}"))
        inits.append(numpy_helper.from_array(point, f"z{i}"))
        nodes.append(helper.make_node("DequantizeLinear", [f"x{i}", f"s{i}", f"z{i}"], [f"X{i}"]))
    nodes.append(helper.make_node(op, [f"X{i}" for i in range(len(shapes))], ["C"], **attributes))
    y_scale = (
        rng.choice([1 / 256, 1 / 255, 0.002])
        if op in ("Sigmoid", "Softmax")
        else (rng.uniform(0.01, 0.5))
    )
    inits.append(numpy_helper.from_array(np.array(y_scale, np.float32), "ys"))
    inits.append(numpy_helper.from_array(np.array(zero + rng.integers(-20, 21), np_type), "yz"))
    nodes.append(helper.make_node("QuantizeLinear", ["C", "ys", "yz"], ["y"]))
    output = helper.make_tensor_value_info("y", elem_type, out_shape)
    graph = helper.make_graph(nodes, "unit", inputs, [output], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), feeds


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=10, help="random units per case")
    args = parser.parse_args(argv)
    ort.set_default_logger_severity(3)
    target = load_target("cpu")
    rules = api.select_rules(target=target)
    rng = np.random.default_rng(0)
    print("| unit | type | fused into | max steps |")
    print("|---|---|---|---|")
    for elem_type, label in ((TensorProto.UINT8, "uint8"), (TensorProto.INT8, "int8")):
        for case in CASES:
            worst, fused = 0, set()
            for _ in range(args.seeds):
                model, feeds = unit(case, elem_type, rng)
                _, result = optimize_proto(model, rules, target=target)
                fused |= {n.op_type for n in result.graph.node}
                moved = _run(model, feeds).astype(np.int64) - _run(result, feeds).astype(np.int64)
                worst = max(worst, int(np.abs(moved).max()))
            print(f"| {case[0]} | {label} | {', '.join(sorted(fused))} | {worst} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
