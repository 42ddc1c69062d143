"""Ops a provider runs by inlining their ONNX function body (engine/targets_gen_functions.py).

The CPU entries are checked against the installed onnxruntime: every opset and
element type an entry lists loads with the optimizer off, runs, computes what
onnx's reference does and is saved without the op (it was inlined); types it
leaves out fail to load.
"""

from __future__ import annotations

import functools

import numpy as np
import onnx
import onnx.helper as oh
import onnxruntime as ort
import pytest
from onnx.reference import ReferenceEvaluator

from onnxfuse.targets.capabilities import load_target
from onnxfuse.targets.facts import NodeFacts, ValueFacts

FUNCTION_NOTE = "no kernel for these types"


def _model(op: str, opset: int, dtype: str, inputs: int = 1) -> onnx.ModelProto:
    elem = getattr(onnx.TensorProto, dtype.upper())
    names = [f"x{i}" for i in range(inputs)]
    graph = oh.make_graph(
        [oh.make_node(op, names, ["y"])],
        "g",
        [oh.make_tensor_value_info(n, elem, [2, 3, 4]) for n in names],
        [oh.make_tensor_value_info("y", elem, None)],
    )
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", opset)], ir_version=10)


def _session(model: onnx.ModelProto, saved: str | None = None) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    if saved:
        options.optimized_model_filepath = saved
    return ort.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )


@functools.cache
def _max_opset() -> int:
    """The newest ai.onnx opset the installed onnxruntime loads."""
    for opset in range(onnx.defs.onnx_opset_version(), 0, -1):
        try:
            _session(_model("Relu", opset, "float"))
            return opset
        except Exception:
            continue
    raise AssertionError("onnxruntime loads no opset")


def _function_cases() -> list[tuple[str, int, str]]:
    cases = []
    for (domain, op), entries in load_target("cpu").ops.items():
        for entry in entries:
            if domain or not entry.notes.startswith(FUNCTION_NOTE):
                continue
            last = entry.until if entry.until is not None else 99
            for opset in range(entry.since, min(last, _max_opset()) + 1):
                cases.extend((op, opset, t) for t in entry.types["T"])
    return cases


def test_cpu_lists_the_function_ops_onnxruntime_inlines():
    listed = {(op, opset) for op, opset, _ in _function_cases()}
    assert {("HardSwish", 14), ("HardSwish", 22), ("Mish", 18), ("Mish", 22)} <= listed
    # A kernel of its own, not a function: Celu (float), LayerNormalization (its
    # onnxruntime kernel also serves opsets below 17, where onnx has no such op).
    cpu = load_target("cpu")
    for op in ("Celu", "LayerNormalization", "HardSigmoid", "Softplus"):
        assert not any(e.notes.startswith(FUNCTION_NOTE) for e in cpu.ops[("", op)]), op


@pytest.mark.parametrize(("op", "opset", "dtype"), _function_cases())
def test_a_listed_function_op_runs_inlined_on_the_cpu(op, opset, dtype, tmp_path):
    model = _model(op, opset, dtype)
    saved = str(tmp_path / "saved.onnx")
    session = _session(model, saved)
    low = 0.1 if op.startswith("Reduce") else -4.0  # a log of a negative sum is NaN
    x = (
        np.random.default_rng(0)
        .uniform(low, 4, (2, 3, 4))
        .astype(oh.tensor_dtype_to_np_dtype(getattr(onnx.TensorProto, dtype.upper())))
    )
    (got,) = session.run(None, {"x0": x})
    (want,) = ReferenceEvaluator(model).run(None, {"x0": x})
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert op not in {n.op_type for n in onnx.load(saved).graph.node}


@pytest.mark.parametrize(
    ("op", "opset", "dtype"),
    [("HardSwish", 14, "double"), ("HardSwish", 22, "float16"), ("Mish", 22, "double")],
)
def test_an_unlisted_type_is_not_run(op, opset, dtype):
    """HardSigmoid and Softplus have float kernels only: the body cannot run for double
    (float16 is rescued by onnxruntime's inserted Casts, which the target does not
    count, as for every other float-only kernel)."""
    facts = NodeFacts("", op, opset, [ValueFacts(dtype=dtype)], [ValueFacts(dtype=dtype)])
    assert load_target("cpu").check_node(facts) is not None
    if dtype == "double":
        with pytest.raises(Exception, match="implementation"):
            _session(_model(op, opset, dtype))


def test_a_provider_gets_no_entry_for_an_op_the_cpu_has_a_kernel_for():
    """The CPU provider is in every session and claims Softplus before any inlining."""
    webgpu = load_target("webgpu")
    assert not webgpu.supports("", "Softplus", 22)
    assert webgpu.supports("", "HardSwish", 22)  # no CPU kernel: inlined, body on WebGPU
