"""Support for the core rule pack tests: build small models, fire one rule, compare numerics."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import onnx
from helpers import (
    IR_VERSION,
    OPSET,
    assert_close,
    make_model,
    optimize_proto,
    random_feeds,
    run,
)
from onnx import helper, numpy_helper

from onnxfuse.language.packs import load_builtin_rules

CORE_RULES = load_builtin_rules(["core"])
RULES = {rule.name: rule for rule in CORE_RULES}

F16, F32, F64 = np.float16, np.float32, np.float64


def build(
    nodes: Sequence[onnx.NodeProto],
    inputs: Mapping[str, tuple[Sequence[int | str] | None, type]],
    outputs: Sequence[str] = ("y",),
    inits: Mapping[str, np.ndarray] | None = None,
    opset: int = OPSET,
    ir_version: int = IR_VERSION,
    inits_as_inputs: bool = False,
    output_shapes: Mapping[str, Sequence[int | str]] | None = None,
) -> onnx.ModelProto:
    """A checked model; graph input types are given, output types are inferred.

    ``inits_as_inputs`` also lists every initializer as a graph input (what IR < 4
    requires, and what makes an initializer an overridable default from IR 4 on).
    ``output_shapes`` declares output shapes that inference cannot find.
    """
    graph_inputs = [
        helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(np.dtype(dt)), shape)
        for name, (shape, dt) in inputs.items()
    ]
    initializers = [numpy_helper.from_array(np.asarray(a), n) for n, a in (inits or {}).items()]
    if inits_as_inputs:
        graph_inputs += [
            helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)) for t in initializers
        ]
    untyped = [helper.make_value_info(name, onnx.TypeProto()) for name in outputs]
    probe = helper.make_model(
        helper.make_graph(list(nodes), "probe", graph_inputs, untyped, initializers),
        opset_imports=[helper.make_opsetid("", opset)],
        ir_version=ir_version,
    )
    inferred = onnx.shape_inference.infer_shapes(probe, strict_mode=True)
    typed = {v.name: v for v in inferred.graph.output}
    for name, shape in (output_shapes or {}).items():
        elem_type = typed[name].type.tensor_type.elem_type
        typed[name] = helper.make_tensor_value_info(name, elem_type, shape)
    return make_model(
        nodes,
        graph_inputs,
        [typed[name] for name in outputs],
        initializers,
        opset=opset,
        ir_version=ir_version,
    )


def node(op: str, inputs: Sequence[str], outputs: Sequence[str] | str = "y", **attrs):
    outs = [outputs] if isinstance(outputs, str) else list(outputs)
    return helper.make_node(op, list(inputs), outs, name=f"{op.lower()}_{outs[0]}", **attrs)


def special_feeds(model: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    """Random feeds whose floating inputs also hold NaN, +inf, -inf and -0.0."""
    feeds = as_arrays(random_feeds(model, seed))
    for name, array in feeds.items():
        if np.issubdtype(array.dtype, np.floating) and array.size >= 4:
            flat = array.reshape(-1)
            flat[:4] = [np.nan, np.inf, -np.inf, -0.0]
            feeds[name] = flat.reshape(array.shape)
    return feeds


def as_arrays(feeds: Mapping[str, object]) -> dict[str, np.ndarray]:
    """Feeds as arrays (random_feeds gives a NumPy scalar for a rank-0 bool input)."""
    return {name: np.asarray(value) for name, value in feeds.items()}


def fire(
    model: onnx.ModelProto,
    name: str,
    feeds: Mapping[str, np.ndarray] | None = None,
    special: bool = False,
    rules: Sequence[str] | None = None,
) -> onnx.ModelProto:
    """Optimize with the rule (or ``rules``); it must fire and keep the outputs.

    optimize_proto also runs the ONNX full checker on the result.
    """
    chosen = [RULES[n] for n in (rules or [name])]
    report, result = optimize_proto(model, chosen)
    assert report.rules[name].applied >= 1, f"{name} did not fire"
    if feeds is None:
        feeds = special_feeds(model) if special else random_feeds(model)
    feeds = as_arrays(feeds)
    assert_close(run(result, feeds), run(model, feeds))
    assert [o.name for o in result.graph.output] == [o.name for o in model.graph.output]
    return result


def no_fire(model: onnx.ModelProto, name: str) -> onnx.ModelProto:
    """The rule must not fire: no rewrite, and the nodes that folding alone leaves."""
    report, result = optimize_proto(model, [RULES[name]])
    assert report.rules[name].applied == 0, f"{name} fired where it must not"
    _, folded = optimize_proto(model, [])
    assert len(result.graph.node) == len(folded.graph.node)
    return result


def ops(model: onnx.ModelProto) -> list[str]:
    return [n.op_type for n in model.graph.node]
