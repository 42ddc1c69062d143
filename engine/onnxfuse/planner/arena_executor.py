"""Run a model step by step with every intermediate inside one buffer at its planned offset.

Each step is a one-node onnxruntime session. Its inputs are bound to the
arena's memory and its outputs are bound to the arena at their planned offsets,
so onnxruntime reads and writes the arena itself (in-place steps really alias).
If two live tensors overlapped, one would clobber the other and the outputs
would differ from onnxruntime's run of the whole model.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort

from onnxfuse.errors import OnnxfuseError
from onnxfuse.planner.lifetimes import used_values
from onnxfuse.planner.plan import ListedTensor, Plan, PlannedTensor, tensor_info
from onnxfuse.planner.trace import random_inputs
from onnxfuse.support.ir_types import value_name

# Tolerances against the whole-model run (which may fuse ops and round differently).
_TOLERANCE = {
    np.dtype(np.float16): (1e-2, 1e-3),
    np.dtype(np.float32): (1e-4, 1e-5),
    np.dtype(np.float64): (1e-7, 1e-9),
}


# What makes a model runnable on the CPU before a session loads it (inlining the reference
# definitions of ops onnxruntime has no kernel for); the identity by default.
Runnable = Callable[[onnx.ModelProto], onnx.ModelProto]


def _as_is(model: onnx.ModelProto) -> onnx.ModelProto:
    return model


@dataclass
class VerifyResult:
    ok: bool
    max_abs_diff: dict[str, float]  # per graph output
    mismatched: list[str]


class ArenaExecutor:
    """Executes ``model`` inside one arena laid out by ``plan``; sessions are cached."""

    def __init__(self, model: ir.Model, plan: Plan, runnable: Runnable = _as_is):
        self._model = model
        self._plan = plan
        self._runnable = runnable
        self._nodes = list(model.graph)
        self._placed = {t.name: t for t in plan.tensors}
        self._types: dict[str, PlannedTensor | ListedTensor] = {t.name: t for t in plan.tensors}
        for listed in (plan.inputs, plan.outputs, plan.initializers, plan.constants):
            self._types.update((t.name, t) for t in listed)
        stepped = {s.node for s in plan.steps}
        self._constant_nodes = [i for i in range(len(self._nodes)) if i not in stepped]
        self._sessions: dict[int, ort.InferenceSession] = {}
        self.arena = _aligned_buffer(plan.arena_bytes, max(plan.alignment, 64))

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        # Garbage first (NaN for floats): reading a byte no step wrote shows in the outputs.
        self.arena.fill(0xFF)
        outside: dict[str, np.ndarray] = {
            name: v.const_value.numpy()
            for name, v in self._model.graph.initializers.items()
            if v.const_value is not None
        }
        outside.update(feeds)
        for index in self._constant_nodes:  # folded constants live outside the arena
            session = self._session(index)
            names = [o.name for o in session.get_outputs()]
            feed = {i.name: outside[i.name] for i in session.get_inputs()}
            outside.update(zip(names, session.run(names, feed), strict=True))
        for step in self._plan.steps:
            self._run_step(step.node, outside)
        return {t.name: outside[t.name] for t in self._plan.outputs}

    def _run_step(self, index: int, outside: dict[str, np.ndarray]) -> None:
        session = self._session(index)
        binding = session.io_binding()
        for meta in session.get_inputs():
            placed = self._placed.get(meta.name)
            if placed is not None and placed.nbytes:
                binding.bind_input(meta.name, "cpu", 0, *self._pointer(placed))
            elif placed is not None:
                binding.bind_cpu_input(meta.name, self.view(placed))
            else:
                # Not np.ascontiguousarray: it makes a scalar 1-D (a Gather index then adds a dim).
                binding.bind_cpu_input(meta.name, np.require(outside[meta.name], requirements="C"))
        unplaced = []
        for meta in session.get_outputs():
            placed = self._placed.get(meta.name)
            if placed is not None and placed.nbytes:
                dtype, shape, pointer = self._pointer(placed)
                binding.bind_output(meta.name, "cpu", 0, dtype, shape, pointer)
            else:
                binding.bind_output(meta.name, "cpu")
                unplaced.append(meta.name)
        session.run_with_iobinding(binding)
        results = dict(
            zip([o.name for o in session.get_outputs()], binding.get_outputs(), strict=True)
        )
        for name in unplaced:
            value = results[name].numpy()
            if name in self._placed:
                self.view(self._placed[name])[...] = value
            else:
                outside[name] = value

    def view(self, t: PlannedTensor) -> np.ndarray:
        """The tensor's bytes in the arena, as an array of its dtype and shape."""
        info = tensor_info(t)
        raw = self.arena[t.offset : t.offset + t.nbytes]
        return raw.view(info.dtype.numpy()).reshape(info.shape)

    def _pointer(self, t: PlannedTensor) -> tuple[np.dtype, list[int], int]:
        return tensor_info(t).dtype.numpy(), list(t.shape), self.arena.ctypes.data + t.offset

    def _session(self, index: int) -> ort.InferenceSession:
        if index not in self._sessions:
            options = ort.SessionOptions()
            options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
            options.log_severity_level = 4  # fatal only: a failed run is reported as one line
            # A session with its own thread pool takes ~70 ms to tear down; one per node adds up.
            options.intra_op_num_threads = 1
            try:
                model = self._runnable(self._one_node_model(self._nodes[index]))
                self._sessions[index] = ort.InferenceSession(
                    model.SerializeToString(), options, providers=["CPUExecutionProvider"]
                )
            except Exception as exc:  # onnxruntime raises several unrelated types
                first = str(exc).strip().splitlines()[0][:300]
                raise OnnxfuseError(f"onnxruntime cannot run node {index}: {first}") from None
        return self._sessions[index]

    def _one_node_model(self, node: ir.Node) -> onnx.ModelProto:
        """The node alone; values its bodies read from the outer scope become inputs too."""
        proto = ir.to_proto(node)
        for k, name in enumerate(proto.output):
            if name in self._plan.omitted:
                proto.output[k] = ""
        inputs = list(dict.fromkeys(value_name(v) for v in used_values(node)))
        graph = onnx.helper.make_graph(
            [proto],
            "step",
            [self._value_info(name) for name in inputs],
            [self._value_info(name) for name in proto.output if name],
        )
        return onnx.helper.make_model(
            graph,
            ir_version=self._model.ir_version,
            opset_imports=[
                onnx.helper.make_opsetid(domain, version)
                for domain, version in self._model.opset_imports.items()
            ],
            functions=[ir.to_proto(f) for f in self._model.functions.values()],
        )

    def _value_info(self, name: str) -> onnx.ValueInfoProto:
        t = self._types[name]
        return onnx.helper.make_tensor_value_info(name, ir.DataType[t.dtype].value, t.shape)


def random_feeds(model: ir.Model, plan: Plan, seed: int = 0) -> dict[str, np.ndarray]:
    """The seeded inputs a traced run uses too (``planner.trace.random_inputs``)."""
    inputs = [(t.name, tensor_info(t)) for t in plan.inputs]
    return random_inputs(model, inputs, seed, fixed=plan.fixed_inputs())


def verify_plan(
    model: ir.Model,
    plan: Plan,
    feeds: Mapping[str, np.ndarray] | None = None,
    seed: int = 0,
    runnable: Runnable = _as_is,
) -> VerifyResult:
    """Run ``model`` inside the arena and compare with onnxruntime's run of the whole model.
    ``runnable`` prepares each model a session loads (the node's, the whole one's)."""
    ort.set_default_logger_severity(4)  # fatal only: a failed run is reported as one line
    try:
        feeds = dict(feeds) if feeds is not None else random_feeds(model, plan, seed)
        got = ArenaExecutor(model, plan, runnable).run(feeds)
        options = ort.SessionOptions()
        options.log_severity_level = 4
        reference = ort.InferenceSession(
            runnable(ir.to_proto(model)).SerializeToString(),
            options,
            providers=["CPUExecutionProvider"],
        )
        names = [o.name for o in reference.get_outputs()]
        expected = dict(zip(names, reference.run(names, feeds), strict=True))
    except MemoryError:
        raise OnnxfuseError("cannot verify: the model's tensors do not fit in memory") from None
    except Exception as exc:
        if not _from_onnxruntime(exc):
            raise
        first = str(exc).strip().splitlines()[0][:300]
        raise OnnxfuseError(f"onnxruntime cannot run the model: {first}") from None
    diffs, mismatched = {}, []
    for name, want in expected.items():
        have = got[name]
        rtol, atol = _TOLERANCE.get(want.dtype, (0.0, 0.0))
        same = have.shape == want.shape and np.allclose(have, want, rtol, atol, equal_nan=True)
        diffs[name] = _max_abs_diff(have, want)
        if not same:
            mismatched.append(name)
    return VerifyResult(not mismatched, diffs, mismatched)


def _from_onnxruntime(exc: Exception) -> bool:
    """An error onnxruntime raised (its own types, or RuntimeError from its bindings:
    a run that fails on the model's data, an element type it has no kernel for)."""
    return type(exc).__module__.startswith("onnxruntime") or isinstance(exc, RuntimeError)


def _max_abs_diff(have: np.ndarray, want: np.ndarray) -> float:
    if have.shape != want.shape or not have.size:
        return 0.0 if have.shape == want.shape else float("inf")
    if want.dtype == np.bool_:
        return float(np.count_nonzero(have != want))
    return float(np.max(np.abs(have.astype(np.float64) - want.astype(np.float64))))


def _aligned_buffer(nbytes: int, alignment: int) -> np.ndarray:
    """A uint8 buffer whose first byte is ``alignment``-aligned, so planned offsets are too."""
    raw = np.empty(nbytes + alignment, dtype=np.uint8)
    start = -raw.ctypes.data % alignment
    return raw[start : start + nbytes]
