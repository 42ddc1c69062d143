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
perturbed model runs with a few seeds. A mismatch within a small factor of
that noise, element by element, is rounding, not a wrong rewrite; a wrong
rewrite moves outputs by the size of its mistake, far above the noise.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx
from onnx import TensorProto, helper

# Relative perturbation, in units of the dtype's machine epsilon.
_ULPS = 2.0
# A mismatch is rounding when it is within this factor of the measured noise.
NOISE_FACTOR = 4.0
_SEEDS = (11.0, 23.0, 37.0)
_PERTURBED = {
    TensorProto.FLOAT: np.float32,
    TensorProto.DOUBLE: np.float64,
    TensorProto.FLOAT16: np.float16,
}


def perturbed(model: onnx.ModelProto, seed: float) -> onnx.ModelProto:
    """A copy of ``model`` whose float node outputs are each scaled by ``1 + r``."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:
        inferred = model
    types = {
        info.name: info.type.tensor_type.elem_type
        for info in (*inferred.graph.value_info, *inferred.graph.output)
    }
    result = onnx.ModelProto()
    result.CopyFrom(model)
    graph = result.graph
    # Values computed from constants only (exponents, shapes, epsilons) are data, not
    # roundoff: perturbing them would change what the model computes (x ** 2.0000002).
    constant = {init.name for init in graph.initializer} - {i.name for i in graph.input}
    nodes: list[onnx.NodeProto] = []
    for index, node in enumerate(graph.node):
        nodes.append(node)
        if all(not name or name in constant for name in node.input):
            constant.update(node.output)
            continue
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
    bound = _ULPS * float(np.finfo(_PERTURBED[elem]).eps)
    wide = exact
    nodes = []
    if elem == TensorProto.FLOAT16:  # RandomUniformLike and Mul in float32, then back
        wide = f"{name}__wide"
        nodes.append(helper.make_node("Cast", [exact], [wide], to=TensorProto.FLOAT))
    noise, factor = f"{name}__noise", f"{name}__factor"
    nodes += [
        helper.make_node(
            "RandomUniformLike", [wide], [noise], low=1 - bound, high=1 + bound, seed=seed
        ),
        helper.make_node("Mul", [wide, noise], [factor if elem == TensorProto.FLOAT16 else name]),
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
            per_output.append(np.maximum.reduce(moves))
        floors.append(per_output)
    return floors


def _distance(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore", over="ignore"):
        move = np.abs(a.astype(np.float64) - b.astype(np.float64))
    return np.where(np.isfinite(move), move, 0.0)
