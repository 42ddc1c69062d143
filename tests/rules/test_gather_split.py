"""rules/ort/gather_split.yaml and gather_slice.yaml against onnxruntime's own optimizer.

onnxruntime's GatherSliceToSplitFusion and GatherToSliceFusion are tested in its C++ suite
on graphs built in code (onnxruntime/test/optimizer/graph_transform_test.cc), so no peer
model holds them; the graphs below are built the same way: a packed QKV tensor read by
three Gathers, rotary-style halves read by two Slices, arange(seq_len) gathered rows. On
each, onnxfuse (all packs, --target cpu) must fuse where it saves nodes, end with at most
as many nodes as onnxruntime 1.32 at ORT_ENABLE_EXTENDED, and keep the outputs.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from core_pack_support import node
from helpers import assert_same_outputs, make_model, optimize_proto, run, tensor_input
from onnx import numpy_helper

from onnxfuse.language.packs import load_builtin_rules
from onnxfuse.targets.capabilities import load_target

I64 = np.int64
INT64_MAX = np.iinfo(I64).max
RULES = load_builtin_rules(["core", "onnx", "ort"])
CPU = load_target("cpu")


def ours(model: onnx.ModelProto) -> onnx.ModelProto:
    _, out = optimize_proto(model, RULES, target=CPU)
    return out


def onnxruntime_extended(model: onnx.ModelProto, tmp_path) -> onnx.ModelProto:
    """The graph onnxruntime's CPU session optimizer leaves at ORT_ENABLE_EXTENDED."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    options.optimized_model_filepath = str(tmp_path / "ort.onnx")
    options.log_severity_level = 3
    ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return onnx.load(options.optimized_model_filepath)


def ops(model: onnx.ModelProto) -> Counter:
    return Counter(n.op_type for n in model.graph.node)


def consts(**arrays) -> list[onnx.TensorProto]:
    return [numpy_helper.from_array(np.asarray(a, I64), name) for name, a in arrays.items()]


def qkv_graph(scalar: bool, negative: bool = False) -> onnx.ModelProto:
    """[batch, seq, 3, heads, head] read as Q, K, V by three Gathers on axis 2, each
    transposed to [batch, heads, seq, head] as attention does."""
    shape = [] if scalar else [1]
    indices = [-3, -2, -1] if negative else [0, 1, 2]
    nodes, inits = [], []
    for name, i in zip("qkv", indices):
        inits.append(numpy_helper.from_array(np.full(shape, i, I64), f"i_{name}"))
        nodes.append(node("Gather", ["X", f"i_{name}"], f"g_{name}", axis=2))
        perm = [0, 2, 1, 3] if scalar else [0, 3, 1, 2, 4]
        nodes.append(node("Transpose", [f"g_{name}"], name, perm=perm))
    out_shape = ["batch", 2, "seq", 4] if scalar else ["batch", 2, "seq", 1, 4]
    return make_model(
        nodes,
        [tensor_input("X", ["batch", "seq", 3, 2, 4])],
        [tensor_input(n, out_shape) for n in "qkv"],
        inits,
    )


def halves_graph(second_end: int, consumer: str = "Sigmoid") -> onnx.ModelProto:
    """x[..., :4] and x[..., 4:end] of a last axis of 8, each fed to ``consumer``."""
    inits = consts(b0=[0], m=[4], e1=[second_end], ax=[-1], one=[1])
    nodes = [
        node("Slice", ["X", "b0", "m", "ax", "one"], "x1"),
        node("Slice", ["X", "m", "e1", "ax"], "x2"),
        node(consumer, ["x1"], "y1"),
        node(consumer, ["x2"], "y2"),
    ]
    end = min(second_end, 8) - 4
    return make_model(
        nodes,
        [tensor_input("X", ["batch", 3, 8])],
        [tensor_input("y1", ["batch", 3, 4]), tensor_input("y2", ["batch", 3, end])],
        inits,
    )


def arange_rows_graph(start: int) -> onnx.ModelProto:
    """Rows start..seq-1 of a table: Gather(table, Range(start, Shape(ids)[1], 1))."""
    inits = consts(one_i=1, start=start, step=1)
    inits.append(numpy_helper.from_array(np.arange(40, dtype=np.float32).reshape(10, 4), "W"))
    nodes = [
        node("Shape", ["ids"], "sh"),
        node("Gather", ["sh", "one_i"], "seq", axis=0),
        node("Range", ["start", "seq", "step"], "pos"),
        node("Gather", ["W", "pos"], "rows", axis=0),
    ]
    return make_model(
        nodes,
        [tensor_input("ids", ["batch", "seq"], onnx.TensorProto.INT64)],
        [tensor_input("rows", ["n", 4])],
        inits,
    )


def check_against_onnxruntime(model, tmp_path, fused: Counter) -> onnx.ModelProto:
    out = ours(model)
    reference = onnxruntime_extended(model, tmp_path)
    assert len(out.graph.node) <= len(reference.graph.node), (ops(out), ops(reference))
    for op, count in fused.items():
        assert ops(out)[op] == count, ops(out)
    return out


@pytest.mark.parametrize("negative", [False, True])
def test_qkv_gathers_of_one_element_indices_become_one_split(negative, tmp_path):
    model = qkv_graph(scalar=False, negative=negative)
    out = check_against_onnxruntime(model, tmp_path, Counter(Split=1, Gather=0))
    assert len(out.graph.node) == 4  # Split + three Transposes
    assert_same_outputs(model, out)


def test_qkv_gathers_of_scalar_indices_stay(tmp_path):
    """onnxruntime makes Split + three Squeezes of them (one node more, no faster on its
    CPU provider); onnxfuse leaves the Gathers."""
    model = qkv_graph(scalar=True)
    reference = onnxruntime_extended(model, tmp_path)
    assert ops(reference)["Split"] == 1 and ops(reference)["Squeeze"] == 3
    out = check_against_onnxruntime(model, tmp_path, Counter(Gather=3, Split=0))
    assert len(out.graph.node) == len(reference.graph.node) - 1
    assert_same_outputs(model, out)


@pytest.mark.parametrize("second_end", [8, INT64_MAX])
def test_slice_halves_become_one_split(second_end, tmp_path):
    model = halves_graph(second_end)
    out = check_against_onnxruntime(model, tmp_path, Counter(Split=1, Slice=0))
    assert_same_outputs(model, out)


def first_and_rest_graph(last: bool) -> onnx.ModelProto:
    """Row 0 (or the last row) of axis 1 by a Gather of a [1] index, the others by a Slice."""
    inits = consts(i=[-1 if last else 0], b=[0 if last else 1], e=[-1 if last else INT64_MAX])
    inits += consts(ax=[1])
    nodes = [
        node("Gather", ["X", "i"], "row", axis=1),
        node("Slice", ["X", "b", "e", "ax"], "rest"),
        node("Relu", ["row"], "y1"),
        node("Relu", ["rest"], "y2"),
    ]
    return make_model(
        nodes,
        [tensor_input("X", ["batch", 5, 8])],
        [tensor_input("y1", ["batch", 1, 8]), tensor_input("y2", ["batch", 4, 8])],
        inits,
    )


@pytest.mark.parametrize("last", [False, True])
def test_a_gather_and_a_slice_become_one_split(last, tmp_path):
    model = first_and_rest_graph(last)
    out = check_against_onnxruntime(model, tmp_path, Counter(Split=1, Gather=0, Slice=0))
    assert_same_outputs(model, out)


def test_slices_short_of_the_axis_end_stay(tmp_path):
    model = halves_graph(7)
    out = check_against_onnxruntime(model, tmp_path, Counter(Slice=2, Split=0))
    assert_same_outputs(model, out)


def test_rotate_half_slices_are_left_to_the_rotary_fusion():
    """Halves feeding a Neg are rotate_half's: no Split, so ort-rotary-embedding (tested in
    test_rotary_rules.py on whole graphs) still sees its two Slices."""
    out = ours(halves_graph(INT64_MAX, consumer="Neg"))
    assert ops(out)["Slice"] == 2 and ops(out)["Split"] == 0


def test_gathers_of_a_shape_stay():
    """Shape computations keep their Gathers, which elements() reads for other rules."""
    inits = consts(i0=[0], i1=[1])
    nodes = [
        node("Shape", ["X"], "sh"),
        node("Gather", ["sh", "i0"], "d0", axis=0),
        node("Gather", ["sh", "i1"], "d1", axis=0),
        node("Mul", ["d0", "d1"], "p"),
    ]
    model = make_model(
        nodes, [tensor_input("X", ["a", "b"])],
        [tensor_input("p", [1], onnx.TensorProto.INT64)], inits,
    )  # fmt: skip
    out = ours(model)
    assert ops(out)["Gather"] == 2 and ops(out)["Split"] == 0


@pytest.mark.parametrize("start", [0, 2])
def test_gather_of_arange_becomes_slice(start, tmp_path):
    model = arange_rows_graph(start)
    out = check_against_onnxruntime(model, tmp_path, Counter(Slice=1, Range=0))
    # Shape, Gather of the one-element index, Slice: one node fewer than the source.
    assert len(out.graph.node) == 3
    feeds = {"ids": np.zeros((2, 6), I64)}
    np.testing.assert_array_equal(run(out, feeds)[0], run(model, feeds)[0])


def test_gather_of_arange_from_a_negative_start_stays():
    """Range(-1, seq) reads the last row first in Gather; a Slice cannot."""
    out = ours(arange_rows_graph(-1))
    assert ops(out)["Range"] == 1 and ops(out)["Slice"] == 0
