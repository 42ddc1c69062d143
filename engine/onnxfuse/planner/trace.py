"""One traced run: the shapes onnxruntime gives every tensor, for what static inference
cannot size (a NonZero's count, a Loop's scan outputs, an If whose branches differ).

The model is run once, on the same seeded inputs ``--verify`` uses, with every
main-graph value made a graph output of a copy of the model, so onnxruntime reports
each one's shape. A data-dependent shape is only right for inputs like these: the plan
holds for runs that produce the same shapes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort

from onnxfuse.errors import ModelError
from onnxfuse.planner.tensor_info import TensorInfo


def random_inputs(
    model: ir.Model,
    inputs: Iterable[tuple[str, TensorInfo]],
    seed: int = 0,
    fixed: Mapping[str, np.ndarray] | None = None,
) -> dict[str, np.ndarray]:
    """Seeded inputs: normal floats, 0/1 integers (valid as indices), random bools.

    An input of ``fixed`` (``--input-value``) gets that value; one that is also an
    initializer (an overridable default), its default.
    """
    rng = np.random.default_rng(seed)
    initializers = model.graph.initializers
    feeds = {}
    for name, info in inputs:
        if fixed and name in fixed:
            feeds[name] = fixed[name]
            continue
        default = initializers[name].const_value if name in initializers else None
        if default is not None:
            feeds[name] = default.numpy()
            continue
        dtype = info.dtype.numpy()
        if np.issubdtype(dtype, np.floating):
            feeds[name] = rng.standard_normal(info.shape).astype(dtype)
        elif dtype == np.bool_:
            feeds[name] = rng.random(info.shape) < 0.5
        else:
            feeds[name] = rng.integers(0, 2, info.shape).astype(dtype)
    return feeds


def trace_shapes(model: ir.Model, feeds: Mapping[str, np.ndarray]) -> dict[str, TensorInfo]:
    """The dtype and shape of every tensor of the main graph in one run on ``feeds``."""
    return {
        name: TensorInfo(ir.DataType.from_numpy(result.dtype), result.shape)
        for name, result in trace_values(model, feeds).items()
    }


def trace_values(model: ir.Model, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every tensor of the main graph in one run on ``feeds``, by name."""
    proto = ir.to_proto(model)
    graph = proto.graph
    listed = {o.name for o in graph.output} | {i.name for i in graph.input}
    for node in model.graph:
        for value in node.outputs:
            if value.name and value.name not in listed:
                # No type: onnxruntime takes the one it infers, which a run then confirms.
                graph.output.append(onnx.ValueInfoProto(name=value.name))
    options = ort.SessionOptions()
    # As written: a fused or folded node would not report the tensors it replaces.
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 4  # fatal only: a failed run is reported as one line
    try:
        session = ort.InferenceSession(
            proto.SerializeToString(), options, providers=["CPUExecutionProvider"]
        )
        names = [o.name for o in session.get_outputs()]
        results = session.run(names, dict(feeds))
    except MemoryError:
        raise ModelError("cannot trace: the model's tensors do not fit in memory") from None
    except Exception as exc:  # onnxruntime raises several unrelated types
        first = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
        raise ModelError(f"onnxruntime cannot run the model to trace its shapes: {first}") from None
    # Sequences, maps and strings have no size before they are computed: not planned.
    return {
        name: result
        for name, result in zip(names, results, strict=True)
        if isinstance(result, np.ndarray) and result.dtype != np.object_
    }
