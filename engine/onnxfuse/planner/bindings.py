"""What fixes the dims of a plan: named dims, whole input shapes, shapes measured by a run.

A dim is bound by its name (``batch``, or a name inside a dim expression such as
``width`` in ``floor(width/2) + 1``), or by tensor and axis (``nz:1``) when the model
gives it no name; ``--input-shape`` gives a graph input's whole shape, named dims or
not; ``--input-value`` fixes an input's value (a sample rate an If branches on); a traced
run gives the shapes static inference could not work out.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import onnx_ir as ir

from onnxfuse.errors import ModelError
from onnxfuse.planner.dim_expressions import DimExpression, parse_dim
from onnxfuse.planner.tensor_info import TensorInfo
from onnxfuse.support.ir_types import value_name

# At most this many of the model's dim names are listed in an error.
_LISTED_NAMES = 12


@dataclass(frozen=True)
class Bindings:
    dims: Mapping[str, int] = field(default_factory=dict)  # name, or TENSOR:AXIS, to value
    input_shapes: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    traced: Mapping[str, TensorInfo] = field(default_factory=dict)  # measured by a run
    # Inputs whose value is fixed (``--input-value``): constants to static analysis.
    input_values: Mapping[str, np.ndarray] = field(default_factory=dict)


@dataclass(frozen=True)
class Resolved:
    """The bindings checked against the model: the value of every bound name, the axes
    bound per tensor (``--dim T:AXIS``), and the model's own dim texts, parsed."""

    dims: dict[str, int]
    axes: dict[str, dict[int, int]]
    declared: dict[str, DimExpression]


def main_values(graph: ir.Graph) -> list[ir.Value]:
    """The values of the main graph: inputs, initializers and every node's outputs."""
    values = [*graph.inputs, *graph.initializers.values()]
    values += [out for node in graph for out in node.outputs]
    return values


def graph_inputs(model: ir.Model) -> list[ir.Value]:
    """Inputs a caller feeds: before IR 4 every initializer is listed as an input too."""
    graph = model.graph
    if model.ir_version < 4:
        return [v for v in graph.inputs if v.name not in graph.initializers]
    return list(graph.inputs)


def dim_name(dim: int | ir.SymbolicDim) -> str | None:
    """The ``dim_param`` of a dim, if it names one: a text without a letter or digit
    (``?``, which some exporters write) marks a dynamic dim with no name."""
    if isinstance(dim, ir.SymbolicDim) and dim.value and any(c.isalnum() for c in dim.value):
        return dim.value
    return None


def declared_dims(model: ir.Model) -> dict[str, DimExpression]:
    """Every ``dim_param`` text on the main graph's values, parsed."""
    texts = {
        name
        for v in main_values(model.graph)
        if v.shape is not None
        for d in v.shape
        if (name := dim_name(d))
    }
    return {text: parse_dim(text) for text in sorted(texts)}


def resolve(model: ir.Model, bindings: Bindings) -> Resolved:
    """Check ``bindings`` against ``model``; derive the names an input shape binds."""
    declared = declared_dims(model)
    names = set(declared).union(*(e.names for e in declared.values()))
    values = {value_name(v): v for v in main_values(model.graph)}
    dims: dict[str, int] = {}
    axes: dict[str, dict[int, int]] = {}
    for name, value in bindings.dims.items():
        tensor, _, axis = name.rpartition(":")
        if name in names:
            dims[name] = value
        elif tensor in values and axis.isdigit():
            axes.setdefault(tensor, {})[int(axis)] = value
        elif tensor and axis.isdigit():
            raise ModelError(f"unknown dim {name!r}: the model has no tensor {tensor!r}")
        else:
            raise ModelError(f"unknown dim {name!r} ({_known_names(model, declared)})")
    inputs = {value_name(v): v for v in graph_inputs(model)}
    for name, shape in bindings.input_shapes.items():
        if name not in inputs:
            listed = ", ".join(inputs) or "none"
            raise ModelError(f"--input-shape {name}: no such input (the model's inputs: {listed})")
        for text, value in _named_dims(name, inputs[name], shape):
            given = dims.setdefault(text, value)
            if given != value:
                raise ModelError(
                    f"--input-shape {name}={_shape_text(shape)} makes dim {text!r} {value}, "
                    f"but it is {given} (from --dim or another --input-shape)"
                )
    return Resolved(dims, axes, declared)


def input_value_arrays(
    model: ir.Model,
    values: Mapping[str, Sequence[float]],
    input_shapes: Mapping[str, Sequence[int]],
) -> dict[str, np.ndarray]:
    """``--input-value`` as arrays of each input's element type, in the shape
    ``--input-shape`` gives it, or its declared static shape, or else (a dim without a
    value) a scalar for one value of a rank-0 input and a vector for a rank-1 one. One
    value fills the whole shape."""
    inputs = {value_name(v): v for v in graph_inputs(model)}
    arrays = {}
    for name, numbers in values.items():
        value = inputs.get(name)
        if value is None:
            listed = ", ".join(inputs) or "none"
            raise ModelError(f"--input-value {name}: no such input (the model's inputs: {listed})")
        if value.dtype is None or value.dtype == ir.DataType.STRING:
            raise ModelError(f"--input-value {name}: the input is no numeric tensor")
        declared = value.shape
        if name in input_shapes:
            shape = tuple(input_shapes[name])
        elif declared is not None and all(isinstance(d, int) and d >= 0 for d in declared):
            shape = tuple(d for d in declared if isinstance(d, int))
        elif declared is not None and len(declared) <= 1:
            shape = (len(numbers),) if len(declared) == 1 else ()
        else:
            raise ModelError(
                f"--input-value {name}: give its shape with --input-shape {name}=D0,D1,..."
            )
        count = int(np.prod(shape))
        if len(numbers) == 1:  # one value fills the input (an all-ones mask)
            numbers = list(numbers) * count
        if count != len(numbers):
            raise ModelError(
                f"--input-value {name}: {len(numbers)} value(s) for shape {list(shape)} "
                f"({count} element(s))"
            )
        dtype = value.dtype.numpy()
        array = np.array(numbers, dtype=np.float64)
        if not np.issubdtype(dtype, np.floating) and not np.all(array == np.round(array)):
            raise ModelError(f"--input-value {name}: the input holds {value.dtype.name} values")
        arrays[name] = array.astype(dtype).reshape(shape)
    return arrays


def fix_input_values(clone: ir.Model, values: Mapping[str, np.ndarray]) -> None:
    """Make the inputs of ``values`` initializers of ``clone`` (a private copy): static
    analysis folds what they decide, an If on a sample rate."""
    graph = clone.graph
    for value in [v for v in graph.inputs if value_name(v) in values]:
        value.const_value = ir.tensor(values[value_name(value)])
        graph.inputs.remove(value)
        graph.register_initializer(value)


def bind_model(clone: ir.Model, bindings: Bindings, resolved: Resolved) -> None:
    """Write the bindings into ``clone`` (a private copy): input shapes, named dims and
    dim expressions evaluated wherever they appear, axes and traced shapes.

    A negative ``dim_value`` (paddle writes -1 for a dynamic dim) becomes unknown.
    """
    graph = clone.graph
    for value in main_values(graph):
        name = value_name(value)
        if name in bindings.input_shapes:
            value.shape = ir.Shape(bindings.input_shapes[name])
        elif name in bindings.traced:
            info = bindings.traced[name]
            value.dtype, value.shape = info.dtype, ir.Shape(info.shape)
        elif value.shape is not None:
            value.shape = ir.Shape([_bound(name, d, resolved) for d in value.shape])
        overrides = resolved.axes.get(name)
        if overrides and value.shape is not None:
            value.shape = with_axes(name, value.shape, overrides)


def with_axes(name: str, shape: ir.Shape, axes: Mapping[int, int]) -> ir.Shape:
    """``shape`` with the ``--dim NAME:AXIS`` bindings; a bound axis must exist and an
    axis the model already fixes must agree."""
    dims = list(shape)
    for axis, value in axes.items():
        if axis >= len(dims):
            raise ModelError(f"--dim {name}:{axis}: {name!r} has rank {len(dims)}")
        known = dims[axis]
        if isinstance(known, int) and known >= 0 and known != value:
            raise ModelError(f"--dim {name}:{axis}={value}: the model makes that dim {known}")
        dims[axis] = value
    return ir.Shape(dims)


def _bound(name: str, dim: int | ir.SymbolicDim, resolved: Resolved) -> int | ir.SymbolicDim:
    if isinstance(dim, int):
        return dim if dim >= 0 else ir.SymbolicDim(None)
    text = dim_name(dim)
    if text is None:
        return ir.SymbolicDim(None)
    try:
        value = resolved.declared[text].value(resolved.dims)
    except ModelError as exc:
        raise ModelError(f"tensor {name!r}: {exc}") from None
    return dim if value is None else value


def _named_dims(name: str, value: ir.Value, shape: tuple[int, ...]) -> Iterator[tuple[str, int]]:
    """The names ``--input-shape`` binds; checks its rank and the input's fixed dims."""
    given = f"--input-shape {name}={_shape_text(shape)}"
    if value.shape is None:
        return
    if len(value.shape) != len(shape):
        declared = ", ".join(
            str(d) if isinstance(d, int) else dim_name(d) or "?" for d in value.shape
        )
        raise ModelError(f"{given}: the input has rank {len(value.shape)} ([{declared}])")
    for axis, (dim, size) in enumerate(zip(value.shape, shape, strict=True)):
        if isinstance(dim, int) and dim >= 0 and dim != size:
            raise ModelError(f"{given}: dim {axis} of the input is {dim}, not {size}")
        text = dim_name(dim)
        if text and parse_dim(text).is_name:
            yield text, size


def _known_names(model: ir.Model, declared: Mapping[str, DimExpression]) -> str:
    """The model's dim names, those of its inputs first, for an error."""
    first = [
        name
        for v in graph_inputs(model)
        if v.shape is not None
        for d in v.shape
        if (name := dim_name(d))
    ]
    rest = sorted(set().union(*(e.names for e in declared.values())))
    names = list(dict.fromkeys(first + rest))
    if not names:
        return "the model has no symbolic dims"
    more = f", ... ({len(names) - _LISTED_NAMES} more)" if len(names) > _LISTED_NAMES else ""
    return f"the model's symbolic dims: {', '.join(names[:_LISTED_NAMES])}{more}"


def _shape_text(shape: tuple[int, ...]) -> str:
    return ",".join(map(str, shape))
