"""Rounding noise of a model: how far its outputs move when intermediates round differently.

A rewrite that folds a BatchNormalization into the weights before it rounds
the weights once more: a few units in the last place. When a later op is ill
conditioned (a normalization over nearly equal values divides by a tiny
standard deviation), that difference is amplified far beyond the per-dtype
tolerance even though the rewrite is exact in real arithmetic: the original
model itself is that sensitive to where it rounds.

This module measures that sensitivity, in the spirit of Monte Carlo
arithmetic: every floating-point intermediate of the original's main graph is
multiplied by ``1 + r`` with ``r`` uniform in a few units of roundoff, and the
perturbed model runs with a few seeds. The operands of ops that sum products
(Conv, MatMul, Gemm, reductions) are perturbed as well, weights included: their
rounding error scales with the sum of the magnitudes of the terms, not with the
result, which can be far smaller when the terms cancel; and a rewrite that
folds a scale into a weight rounds exactly those operands again. A mismatch within a small factor of
that noise, element by element, is rounding, not a wrong rewrite; a wrong
rewrite moves outputs by the size of its mistake, far above the noise.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

# Relative perturbation, in units of the dtype's machine epsilon.
_ULPS = 2.0
# A mismatch is rounding when it is within this factor of the measured noise.
NOISE_FACTOR = 4.0
_SEEDS = (11.0, 23.0, 37.0)
# Ops whose result sums products of their operands: their operands are perturbed too.
_SUMMING = {
    "Conv",
    "ConvTranspose",
    "MatMul",
    "Gemm",
    "Einsum",
    "ReduceSum",
    "ReduceMean",
    "ReduceSumSquare",
}
_PERTURBED: dict[int, type[np.floating]] = {
    TensorProto.FLOAT: np.float32,
    TensorProto.DOUBLE: np.float64,
    TensorProto.FLOAT16: np.float16,
}


def perturbed(model: onnx.ModelProto, seed: float) -> onnx.ModelProto:
    """A copy of ``model`` whose float node outputs, and the operands of ops that sum
    products, are each scaled by ``1 + r``."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:
        inferred = model
    types = {
        info.name: info.type.tensor_type.elem_type
        for info in (
            *inferred.graph.value_info,
            *inferred.graph.output,
            *inferred.graph.input,
        )
    }
    types.update({init.name: init.data_type for init in model.graph.initializer})
    result = onnx.ModelProto()
    result.CopyFrom(model)
    graph = result.graph
    # Values computed from constants only (exponents, shapes, epsilons) are data, not
    # roundoff: perturbing them would change what the model computes (x ** 2.0000002).
    constant = {init.name for init in graph.initializer} - {i.name for i in graph.input}
    nodes: list[onnx.NodeProto] = []
    for index, node in enumerate(graph.node):
        if all(not name or name in constant for name in node.input):
            nodes.append(node)
            constant.update(node.output)
            continue
        if node.op_type in _SUMMING and node.domain in ("", "ai.onnx"):
            for position, name in enumerate(node.input):
                elem = types.get(name)
                if not name or elem not in _PERTURBED:
                    continue
                operand = f"{name}__operand{index}_{position}"
                node.input[position] = operand
                nodes.extend(_scale_nodes(name, operand, elem, seed + index * 13 + position))
        nodes.append(node)
        for position, name in enumerate(node.output):
            elem = types.get(name)
            if not name or elem not in _PERTURBED:
                continue
            exact = f"{name}__exact"
            node.output[position] = exact
            nodes.extend(_scale_nodes(exact, name, elem, seed + index * 7 + position))
    del graph.node[:]
    graph.node.extend(nodes)
    return result


def _scale_nodes(exact: str, name: str, elem: int, seed: float) -> list[onnx.NodeProto]:
    """Nodes computing ``name = exact * (1 + r)``, ``|r| <= bound``, r pseudo-random.

    r is ``bound * sin(exact * k + seed)``: a hash of the value itself, made of ops
    onnxruntime runs at every opset (its RandomUniformLike stops at opset 21).
    """
    bound = _ULPS * float(np.finfo(_PERTURBED[elem]).eps)
    wide_type = TensorProto.DOUBLE if elem == TensorProto.DOUBLE else TensorProto.FLOAT
    dtype = _PERTURBED[wide_type]
    wide = exact
    nodes = []
    if elem == TensorProto.FLOAT16:  # the noise in float32, then back
        wide = f"{name}__wide"
        nodes.append(helper.make_node("Cast", [exact], [wide], to=TensorProto.FLOAT))

    def constant(suffix: str, value: float) -> str:
        out = f"{name}__{suffix}"
        tensor = numpy_helper.from_array(np.asarray(value, dtype=dtype), out)
        nodes.append(helper.make_node("Constant", [], [out], value=tensor))
        return out

    frequency = constant("frequency", 12.9898 + seed)
    phase = constant("phase", seed)
    amplitude = constant("amplitude", bound)
    one = constant("one", 1.0)
    factor = f"{name}__factor"
    nodes += [
        helper.make_node("Mul", [wide, frequency], [f"{name}__angle0"]),
        helper.make_node("Add", [f"{name}__angle0", phase], [f"{name}__angle"]),
        helper.make_node("Sin", [f"{name}__angle"], [f"{name}__wave"]),
        helper.make_node("Mul", [f"{name}__wave", amplitude], [f"{name}__r"]),
        helper.make_node("Add", [f"{name}__r", one], [f"{name}__noise"]),
        helper.make_node(
            "Mul",
            [wide, f"{name}__noise"],
            [factor if elem == TensorProto.FLOAT16 else name],
        ),
    ]
    if elem == TensorProto.FLOAT16:
        nodes.append(helper.make_node("Cast", [factor], [name], to=TensorProto.FLOAT16))
    return nodes


def noise_floor(
    model: onnx.ModelProto, run: Callable[[bytes], list[list[np.ndarray]]]
) -> list[list[np.ndarray]] | None:
    """Per feed set and output, the largest move of each element over the perturbed runs.

    ``run`` maps serialized model bytes to outputs per feed set. None when the
    perturbed model cannot be built or run (then nothing is excused).
    """
    try:
        base = run(model.SerializeToString())
        runs = [run(perturbed(model, seed).SerializeToString()) for seed in _SEEDS]
    except Exception:
        return None
    floors = []
    for set_index, outputs in enumerate(base):
        per_output = []
        for out_index, exact in enumerate(outputs):
            if exact.dtype.kind != "f":
                per_output.append(np.zeros(exact.shape))
                continue
            moves = [_distance(r[set_index][out_index], exact) for r in runs]
            # The outputs are rounded to their own type, so a move below one unit in the
            # last place shows as 0 or 1 ulp (float16 mostly): the floor is at least 1 ulp.
            per_output.append(np.maximum.reduce([*moves, _ulp(exact)]))
        floors.append(per_output)
    return floors


def _ulp(values: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore", over="ignore"):
        spacing = np.spacing(np.abs(values)).astype(np.float64)
    return np.where(np.isfinite(spacing), spacing, 0.0)


def _distance(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore", over="ignore"):
        move = np.abs(a.astype(np.float64) - b.astype(np.float64))
    return np.where(np.isfinite(move), move, 0.0)


# -- quantization noise ----------------------------------------------------------------

# Ops that move quantized values without computing: the Q after one rounds nothing new
# (the cleanups that drop its DQ -> op -> Q are exact).
_MOVING = {
    "Reshape",
    "Transpose",
    "Squeeze",
    "Unsqueeze",
    "Flatten",
    "Slice",
    "Split",
    "Gather",
    "MaxPool",
    "Resize",
    "Identity",
}


# The moves that reach an output through later units are taken this many times over:
# the sign and spread of a fused kernel's differences are not those of a few draws.
QUANT_FACTOR = 2.0


def requantized(
    model: onnx.ModelProto, steps: int, sign: int, last: bool, seed: int = 0
) -> onnx.ModelProto:
    """A copy of ``model`` whose QuantizeLinear nodes of computed values move their
    result by ``steps`` whole steps, element by element: what a fused kernel that
    rounds once, where the unit rounds twice, may do at every unit. ``sign`` +1 or -1
    moves every element that way, 0 each one a pseudo-random way; ``last``: only the Qs
    no other such Q follows (an output's own unit), else only the others. The Q of a
    graph input, and of a data-movement op, is left alone (they round nothing new)."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:
        inferred = model
    shapes = {
        info.name: info.type.tensor_type.shape
        for info in (*inferred.graph.value_info, *inferred.graph.input)
    }
    result = onnx.ModelProto()
    result.CopyFrom(model)
    graph = result.graph
    initializers = {init.name: numpy_helper.to_array(init) for init in graph.initializer}
    producers = {out: node for node in graph.node for out in node.output}
    moved = [i for i, node in enumerate(graph.node) if _moves(node, producers)]
    followed = _followed(graph, {graph.node[i].output[0] for i in moved})
    rng = np.random.default_rng(seed)
    nodes: list[onnx.NodeProto] = []
    for index, node in enumerate(graph.node):
        chosen = index in moved and (node.output[0] not in followed) == last
        delta = _delta(node, shapes, initializers, rng, steps, sign) if chosen else None
        if delta is not None:
            name = f"{node.input[0]}__requantized{index}"
            graph.initializer.append(numpy_helper.from_array(delta, f"{name}_delta"))
            nodes.append(helper.make_node("Add", [node.input[0], f"{name}_delta"], [name]))
            node.input[0] = name
        nodes.append(node)
    del graph.node[:]
    graph.node.extend(nodes)
    return result


def _moves(node: onnx.NodeProto, producers: dict[str, onnx.NodeProto]) -> bool:
    """``node`` is a Q of a value a computing op produced."""
    if node.op_type != "QuantizeLinear" or node.domain not in ("", "ai.onnx"):
        return False
    producer = producers.get(node.input[0])
    return producer is not None and producer.op_type not in _MOVING


def _followed(graph: onnx.GraphProto, quantized: set[str]) -> set[str]:
    """Those of ``quantized`` from which another of them is computed."""
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    result = set()
    for start in quantized:
        seen, todo = set(), [start]
        while todo:
            for node in consumers.get(todo.pop(), ()):
                for out in node.output:
                    if out in quantized:
                        result.add(start)
                    if out not in seen:
                        seen.add(out)
                        todo.append(out)
            if start in result:
                break
    return result


def _delta(node, shapes, initializers, rng, steps: int, sign: int) -> np.ndarray | None:
    """``k * scale`` to add to the input of the Q ``node``, ``|k| = steps``."""
    scale = initializers.get(node.input[1])
    shape = shapes.get(node.input[0])
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    if scale is None or shape is None or attrs.get("block_size", 0):
        return None
    dims = [d.dim_value if d.HasField("dim_value") else 0 for d in shape.dim]
    if not all(dims):
        return None
    if scale.size > 1:  # per axis: the scale of each slice along the axis
        axis = int(attrs.get("axis", 1)) % len(dims)
        scale = scale.reshape((-1,) + (1,) * (len(dims) - 1 - axis))
    k = np.full(dims, sign) if sign else rng.choice([-1, 1], dims)
    return (steps * k * scale).astype(scale.dtype)


def quantization_floor(
    model: onnx.ModelProto, steps: int, run: Callable[[bytes], list[list[np.ndarray]]]
) -> list[list[np.ndarray]] | None:
    """Per feed set and output, how far each element may move when every unit of a QDQ
    model rounds up to ``steps`` steps differently (``requantized``): its own unit's
    move either way, plus ``QUANT_FACTOR`` times the largest move the units before it
    cause (every element moved up, down, and a random way with a few seeds). None if
    the model has no such unit or a requantized model does not run. A wrong fusion (a
    wrong zero point or scale, a lost saturation) moves outputs by its mistake."""
    if not steps or not any(n.op_type == "QuantizeLinear" for n in model.graph.node):
        return None
    try:
        base = run(model.SerializeToString())
        own = [run(requantized(model, steps, sign, True).SerializeToString()) for sign in (1, -1)]
        before = [
            run(requantized(model, steps, sign, False, int(seed)).SerializeToString())
            for sign, seed in ((1, 0), (-1, 0), *((0, s) for s in _SEEDS))
        ]
    except Exception:
        return None

    def largest(runs, s: int, o: int, exact: np.ndarray) -> np.ndarray:
        return np.maximum.reduce([_distance(r[s][o], exact) for r in runs])

    return [
        [
            largest(own, s, o, exact) + QUANT_FACTOR * largest(before, s, o, exact)
            if exact.dtype.kind == "f"
            else np.zeros(exact.shape)
            for o, exact in enumerate(outputs)
        ]
        for s, outputs in enumerate(base)
    ]
