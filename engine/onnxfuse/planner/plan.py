"""The plan: one offset in one arena for every intermediate tensor, plus the figures to judge it."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx_ir as ir

from onnxfuse.errors import ModelError, OnnxfuseError, creating
from onnxfuse.files.output_paths import check_output, temporary_prefix
from onnxfuse.planner.baselines import naive_bytes, ort_policy_bytes
from onnxfuse.planner.bindings import Bindings, input_value_arrays
from onnxfuse.planner.inplace import find_inplace, make_blocks
from onnxfuse.planner.lifetimes import Lifetimes, Listed, compute_lifetimes, constant_values
from onnxfuse.planner.schedule import candidate_orders
from onnxfuse.planner.shapes import infer_tensor_infos
from onnxfuse.planner.strategies import get_strategy, lower_bound
from onnxfuse.planner.tensor_info import TensorInfo
from onnxfuse.planner.trace import random_inputs, trace_shapes
from onnxfuse.support.ir_types import value_name

FORMAT = "onnxfuse.memory_plan"
VERSION = 1

# A page of the largest huge pages: no allocator aligns further.
_MAX_ALIGNMENT = 1 << 30


@dataclass
class Step:
    node: int  # index in the graph's node list
    name: str
    op: str


@dataclass
class ListedTensor:
    name: str
    nbytes: int
    dtype: str
    shape: list[int]


@dataclass
class PlannedTensor:
    name: str
    offset: int
    size: int  # bytes reserved: nbytes rounded up to the alignment
    first: int
    last: int
    nbytes: int
    dtype: str
    shape: list[int]
    inplace_of: str | None = None  # the dying input whose buffer this output takes


@dataclass
class Plan:
    strategy: str
    alignment: int
    inplace: bool
    schedule: str  # "graph" (the graph's order) or "memory" (memory-aware reordering)
    fold_constants: bool
    arena_bytes: int
    lower_bound_bytes: int
    naive_bytes: int
    ort_policy_bytes: int
    graph_order_lower_bound_bytes: int  # the lower bound before reordering
    dims: dict[str, int]
    steps: list[Step]
    tensors: list[PlannedTensor]
    inputs: list[ListedTensor] = field(default_factory=list)
    outputs: list[ListedTensor] = field(default_factory=list)
    initializers: list[ListedTensor] = field(default_factory=list)
    constants: list[ListedTensor] = field(default_factory=list)
    omitted: list[str] = field(default_factory=list)  # unread optional outputs, not produced
    input_shapes: dict[str, list[int]] = field(default_factory=dict)  # --input-shape
    traced: list[str] = field(default_factory=list)  # tensors whose shapes a traced run gave
    # --input-value: inputs whose value the plan holds for (nested lists, as numpy's tolist)
    input_values: dict[str, Any] = field(default_factory=dict)

    def entries(self) -> list[PlannedTensor | ListedTensor]:
        """Every tensor the plan sizes: placed, or listed outside the arena."""
        return [
            *self.tensors,
            *self.inputs,
            *self.outputs,
            *self.initializers,
            *self.constants,
        ]

    def bindings(self) -> Bindings:
        """What fixed this plan's shapes, to infer them again (the checker does)."""
        infos = {t.name: tensor_info(t) for t in self.entries()}
        return Bindings(
            self.dims,
            {name: tuple(shape) for name, shape in self.input_shapes.items()},
            {name: infos[name] for name in self.traced if name in infos},
            self.fixed_inputs(),
        )

    def fixed_inputs(self) -> dict[str, np.ndarray]:
        """The ``--input-value`` inputs as arrays of their listed type and shape."""
        listed = {t.name: tensor_info(t) for t in self.inputs}
        return {
            name: np.asarray(values, dtype=listed[name].dtype.numpy()).reshape(listed[name].shape)
            for name, values in self.input_values.items()
            if name in listed
        }

    def to_dict(self) -> dict[str, Any]:
        return {"format": FORMAT, "version": VERSION, **asdict(self)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Plan:
        if data.get("format") != FORMAT or data.get("version") != VERSION:
            raise OnnxfuseError(f"not an {FORMAT} version {VERSION} plan")
        fields = {k: v for k, v in data.items() if k not in ("format", "version")}
        try:
            fields["steps"] = [Step(**s) for s in fields["steps"]]
            fields["tensors"] = [PlannedTensor(**t) for t in fields["tensors"]]
            for key in ("inputs", "outputs", "initializers", "constants"):
                fields[key] = [ListedTensor(**t) for t in fields.get(key, [])]
            return cls(**fields)
        except (KeyError, TypeError) as exc:
            raise OnnxfuseError(f"malformed plan: {exc}") from None

    def to_json(self) -> str:
        """JSON with one line per list entry: readable, and diffs well."""
        lines = []
        for key, value in self.to_dict().items():
            if isinstance(value, list) and value:
                items = ",\n  ".join(json.dumps(v) for v in value)
                lines.append(f"{json.dumps(key)}: [\n  {items}\n ]")
            else:
                lines.append(f"{json.dumps(key)}: {json.dumps(value)}")
        return "{\n " + ",\n ".join(lines) + "\n}\n"

    def write_json(self, path: str | os.PathLike) -> None:
        """Write atomically: a temporary file beside ``path``, then a rename."""
        path = Path(path)
        check_output(path)
        with creating(path):
            fd, tmp = tempfile.mkstemp(
                prefix=temporary_prefix(path), suffix=".tmp", dir=path.parent
            )
        try:
            with os.fdopen(fd, "w") as f:
                f.write(self.to_json())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


def plan_model(
    model: ir.Model,
    dims: Mapping[str, int] | None = None,
    strategy: str = "search",
    alignment: int = 64,
    inplace: bool = True,
    schedule: bool = False,
    fold_constants: bool = True,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    trace_shapes: bool = False,
    input_values: Mapping[str, Sequence[float]] | None = None,
) -> Plan:
    """Plan one arena for the intermediates of ``model`` (which is not modified).

    ``dims`` binds symbolic dims by name (or ``TENSOR:AXIS``) and ``input_shapes``
    gives inputs their whole shapes; ``input_values`` fixes inputs' values (the plan
    then holds for runs with those values); ``trace_shapes`` runs the model once to measure
    what static inference cannot size. ``schedule`` reorders nodes to lower the peak
    of live bytes first; ``fold_constants`` keeps values computed from constants
    only (e.g. ConstantOfShape weights) out of the arena, like initializers.
    """
    place = get_strategy(strategy)
    if not 0 < alignment <= _MAX_ALIGNMENT:
        raise OnnxfuseError(
            f"alignment must be a number of bytes from 1 to {_MAX_ALIGNMENT}, not {alignment}"
        )
    dims = dict(dims or {})
    shapes = {name: list(shape) for name, shape in (input_shapes or {}).items()}
    fixed = input_value_arrays(model, input_values or {}, shapes)
    for name, array in fixed.items():
        shapes.setdefault(name, list(array.shape))
    bindings = Bindings(
        dims, {name: tuple(shape) for name, shape in shapes.items()}, input_values=fixed
    )
    infos = infer_tensor_infos(model, bindings)
    traced: dict[str, TensorInfo] = {}
    if trace_shapes:  # also when all is sized: the run checks what inference gave
        traced = _traced(model, infos, fixed)
        if traced:
            infos = infer_tensor_infos(model, replace(bindings, traced=traced))
    lifetimes = compute_lifetimes(model, infos, fold_constants=fold_constants)
    best_bound = graph_bound = _bound(lifetimes, inplace, alignment)
    chosen = "graph"
    if schedule:
        for order in candidate_orders(lifetimes):
            candidate = compute_lifetimes(model, infos, order, fold_constants)
            bound = _bound(candidate, inplace, alignment)
            if bound < best_bound:
                lifetimes, best_bound, chosen = candidate, bound, "memory"
    pairs = find_inplace(lifetimes) if inplace else {}
    blocks, block_of = make_blocks(lifetimes, pairs, alignment)
    placement = place(blocks, len(lifetimes.steps))
    tensors = [
        PlannedTensor(
            name=t.name,
            offset=placement.offsets[block_of[i]],
            size=blocks[block_of[i]].size,
            first=t.first,
            last=t.last,
            nbytes=t.info.nbytes,
            dtype=t.info.dtype.name,
            shape=list(t.info.shape),
            inplace_of=pairs.get(t.name),
        )
        for i, t in enumerate(lifetimes.tensors)
    ]
    return Plan(
        strategy=strategy,
        alignment=alignment,
        inplace=inplace,
        schedule=chosen,
        fold_constants=fold_constants,
        arena_bytes=placement.arena,
        lower_bound_bytes=lower_bound(blocks, len(lifetimes.steps)),
        naive_bytes=naive_bytes(lifetimes, alignment),
        ort_policy_bytes=ort_policy_bytes(lifetimes, alignment),
        graph_order_lower_bound_bytes=graph_bound,
        dims=dims,
        steps=[
            Step(i, n.name or "", n.op_type) for i, n in zip(lifetimes.step_nodes, lifetimes.steps)
        ],
        tensors=tensors,
        inputs=_listed(lifetimes.inputs),
        outputs=_listed(lifetimes.outputs),
        initializers=_listed(lifetimes.initializers),
        constants=_listed(lifetimes.constants),
        omitted=lifetimes.omitted,
        input_shapes=shapes,
        traced=sorted(traced),
        input_values={name: array.tolist() for name, array in fixed.items()},
    )


def _traced(
    model: ir.Model, infos: Mapping[str, TensorInfo | str], fixed: Mapping[str, np.ndarray]
) -> dict[str, TensorInfo]:
    """The shapes of a traced run for the tensors static inference could not size; where
    it did size one, the run must agree (else the plan would not hold for this run)."""
    consts = constant_values(model)
    inputs = []
    for value in model.graph.inputs:
        name = value_name(value)
        info = infos.get(name)
        if value in consts:
            continue
        if not isinstance(info, TensorInfo):
            raise ModelError(f"input {name!r} {info or 'has no type or shape'}")
        inputs.append((name, info))
    traced = {}
    for name, found in trace_shapes(model, random_inputs(model, inputs, fixed=fixed)).items():
        static = infos.get(name)
        if not isinstance(static, TensorInfo):
            traced[name] = found
        elif static != found:
            raise ModelError(
                f"tensor {name!r}: shape inference gives {static.dtype.name} {list(static.shape)} "
                f"but onnxruntime computed {found.dtype.name} {list(found.shape)}"
            )
    return traced


def tensor_info(t: PlannedTensor | ListedTensor) -> TensorInfo:
    return TensorInfo(ir.DataType[t.dtype], tuple(t.shape))


def _bound(lifetimes: Lifetimes, inplace: bool, alignment: int) -> int:
    pairs = find_inplace(lifetimes) if inplace else {}
    blocks, _ = make_blocks(lifetimes, pairs, alignment)
    return lower_bound(blocks, len(lifetimes.steps))


def _listed(values: list[Listed]) -> list[ListedTensor]:
    return [
        ListedTensor(v.name, v.info.nbytes, v.info.dtype.name, list(v.info.shape)) for v in values
    ]
