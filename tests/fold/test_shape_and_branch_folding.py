"""Shape computations fold where their elements are known, though another dimension is
symbolic; an If of a constant condition becomes the branch it takes."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from helpers import make_model, optimize_proto, run, tensor_input
from hypothesis import given
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper


def _ints(name: str, values) -> onnx.TensorProto:
    return numpy_helper.from_array(np.array(values, dtype=np.int64), name)


def _ops(model: onnx.ModelProto) -> list[str]:
    return [n.op_type for n in model.graph.node]


def _outputs_agree(model: onnx.ModelProto, optimized: onnx.ModelProto, x: np.ndarray) -> None:
    for got, want in zip(run(optimized, {"x": x}), run(model, {"x": x})):
        assert got.shape == want.shape and np.array_equal(got, want)


def _reshape_by_gathered_dim(index: int) -> onnx.ModelProto:
    """y = Reshape(x, [-1, dim_index(x)]) with x[batch, 4, 6]."""
    return make_model(
        [
            helper.make_node("Shape", ["x"], ["s"]),
            helper.make_node("Gather", ["s", "i"], ["d"], axis=0),
            helper.make_node("Unsqueeze", ["d", "zero"], ["d1"]),
            helper.make_node("Concat", ["minus_one", "d1"], ["shape"], axis=0),
            helper.make_node("Reshape", ["x", "shape"], ["y"]),
        ],
        [tensor_input("x", ["batch", 4, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["rows", "columns"])],
        [
            numpy_helper.from_array(np.array(index, np.int64), "i"),
            _ints("zero", [0]),
            _ints("minus_one", [-1]),
        ],
    )


@pytest.mark.parametrize("index", [1, 2, -1, -2])
def test_a_static_dim_of_a_symbolic_shape_folds(index):
    model = _reshape_by_gathered_dim(index)
    _, optimized = optimize_proto(model, [])
    assert _ops(optimized) == ["Reshape"]
    _outputs_agree(model, optimized, np.arange(3 * 24, dtype=np.float32).reshape(3, 4, 6))


@pytest.mark.parametrize("index", [0, -3])
def test_the_symbolic_dim_itself_stays_computed(index):
    model = _reshape_by_gathered_dim(index)
    _, optimized = optimize_proto(model, [])
    assert "Shape" in _ops(optimized) and "Gather" in _ops(optimized)
    _outputs_agree(model, optimized, np.ones((2, 4, 6), np.float32))


@given(
    dims=st.lists(st.one_of(st.integers(1, 5), st.none()), min_size=1, max_size=4),
    data=st.data(),
)
def test_any_slice_of_a_partly_symbolic_shape(dims, data):
    """A Slice of Shape(x) folds exactly when every element it keeps is static; the
    result agrees with onnxruntime for other sizes of the symbolic dims."""
    rank = len(dims)
    start = data.draw(st.integers(-rank, rank))
    end = data.draw(st.integers(-rank, rank))
    declared = [d if d is not None else f"n{k}" for k, d in enumerate(dims)]
    model = make_model(
        [
            helper.make_node("Shape", ["x"], ["s"]),
            helper.make_node("Slice", ["s", "start", "end"], ["y"]),
        ],
        [tensor_input("x", declared)],
        [helper.make_tensor_value_info("y", TensorProto.INT64, ["kept"])],
        [_ints("start", [start]), _ints("end", [end])],
    )
    _, optimized = optimize_proto(model, [])
    kept = dims[slice(*slice(start, end).indices(rank))]
    assert ("Slice" not in _ops(optimized)) == all(d is not None for d in kept)
    for sizes in ([2] * rank, [3] * rank):
        shape = [d if d is not None else s for d, s in zip(dims, sizes)]
        x = np.zeros(shape, np.float32)
        assert np.array_equal(run(optimized, {"x": x})[0], run(model, {"x": x})[0])


def _branch(name: str, op: str, output: str, attrs=None) -> onnx.GraphProto:
    node = helper.make_node(op, ["x"], [output], **(attrs or {}))
    return helper.make_graph(
        [node], name, [], [helper.make_tensor_value_info(output, TensorProto.FLOAT, None)]
    )


def _if_on_dim(index: int, equals: int) -> onnx.ModelProto:
    """y = If(dim_index(x) == equals, Relu(x), Neg(x)) with x[batch, 4]."""
    return make_model(
        [
            helper.make_node("Shape", ["x"], ["s"]),
            helper.make_node("Gather", ["s", "i"], ["d"], axis=0),
            helper.make_node("Equal", ["d", "k"], ["c"]),
            helper.make_node(
                "If",
                ["c"],
                ["y"],
                then_branch=_branch("then", "Relu", "t"),
                else_branch=_branch("else", "Neg", "e"),
            ),
        ],
        [tensor_input("x", ["batch", 4])],
        [tensor_input("y", ["batch", 4])],
        [
            numpy_helper.from_array(np.array(index, np.int64), "i"),
            numpy_helper.from_array(np.array(equals, np.int64), "k"),
        ],
    )


@pytest.mark.parametrize(("equals", "taken"), [(4, "Relu"), (5, "Neg")])
def test_an_if_decided_by_a_static_dim_is_its_branch(equals, taken):
    model = _if_on_dim(1, equals)
    _, optimized = optimize_proto(model, [])
    assert _ops(optimized) == [taken]
    assert [o.name for o in optimized.graph.output] == ["y"]
    _outputs_agree(model, optimized, np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4))


def test_an_if_decided_by_a_symbolic_dim_stays():
    model = _if_on_dim(0, 1)
    _, optimized = optimize_proto(model, [])
    assert "If" in _ops(optimized)
    for batch in (1, 2):
        _outputs_agree(model, optimized, np.full((batch, 4), -0.5, np.float32))


def test_an_if_on_data_stays():
    model = make_model(
        [
            helper.make_node(
                "If",
                ["c"],
                ["y"],
                then_branch=_branch("then", "Relu", "t"),
                else_branch=_branch("else", "Neg", "e"),
            )
        ],
        [tensor_input("x", [2]), helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
        [tensor_input("y", [2])],
    )
    _, optimized = optimize_proto(model, [])
    assert _ops(optimized) == ["If"]


def test_nested_ifs_and_branch_constants_and_an_outer_value_as_output():
    """The outer If takes its then branch, which holds a constant of its own and an inner
    If on a constant; the inner If's taken branch returns a value from outside it, so an
    Identity carries it under the graph output's name."""
    inner = helper.make_graph(
        [helper.make_node("Identity", ["outer_sum"], ["inner_out"])],
        "inner_then",
        [],
        [helper.make_tensor_value_info("inner_out", TensorProto.FLOAT, None)],
    )
    inner_else = _branch("inner_else", "Neg", "inner_neg")
    then = helper.make_graph(
        [
            helper.make_node("Add", ["x", "bias"], ["outer_sum"]),
            helper.make_node(
                "If", ["true"], ["then_out"], then_branch=inner, else_branch=inner_else
            ),
        ],
        "then",
        [],
        [helper.make_tensor_value_info("then_out", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.array([1.5, -2.0], np.float32), "bias")],
    )
    model = make_model(
        [
            helper.make_node(
                "If", ["true"], ["y"], then_branch=then, else_branch=_branch("else", "Neg", "e")
            )
        ],
        [tensor_input("x", [2])],
        [tensor_input("y", [2])],
        [numpy_helper.from_array(np.array(True), "true")],
    )
    _, optimized = optimize_proto(model, [])
    assert "If" not in _ops(optimized)
    assert [o.name for o in optimized.graph.output] == ["y"]
    x = np.array([0.25, 3.0], np.float32)
    assert np.array_equal(run(optimized, {"x": x})[0], run(model, {"x": x})[0])


def _matmul_branch(name: str, weight: str, extra: str) -> onnx.GraphProto:
    """y = x @ Transpose(weight), then a unary op: the Transpose folds inside the branch."""
    return helper.make_graph(
        [
            helper.make_node("Transpose", [weight], [f"{name}_wt"]),
            helper.make_node("MatMul", ["x", f"{name}_wt"], [f"{name}_mm"]),
            helper.make_node(extra, [f"{name}_mm"], [f"{name}_y"]),
        ],
        name,
        [],
        [helper.make_tensor_value_info(f"{name}_y", TensorProto.FLOAT, None)],
    )


def _weight(name: str, seed: int) -> onnx.TensorProto:
    array = np.random.default_rng(seed).standard_normal((48, 48)).astype(np.float32)
    return numpy_helper.from_array(array, name)


def test_a_weight_both_branches_fold_alike_is_stored_once():
    """Each branch of an If on data folds Transpose(W) into an initializer of its own:
    one weight in the result, and W, read by nothing any more, goes."""
    model = make_model(
        [
            helper.make_node(
                "If",
                ["c"],
                ["y"],
                then_branch=_matmul_branch("then", "W", "Relu"),
                else_branch=_matmul_branch("else", "W", "Neg"),
            )
        ],
        [tensor_input("x", [2, 48]), helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
        [tensor_input("y", [2, 48])],
        [_weight("W", 0)],
    )
    _, optimized = optimize_proto(model, [])
    weights = [t for t in optimized.graph.initializer if np.prod(t.dims) > 1024]
    assert len(weights) == 1 and weights[0].name != "W"
    x = np.random.default_rng(1).standard_normal((2, 48)).astype(np.float32)
    for cond in (True, False):
        feeds = {"x": x, "c": np.array(cond)}
        assert np.array_equal(run(optimized, feeds)[0], run(model, feeds)[0])


def test_a_weight_only_the_branch_not_taken_read_goes():
    model = make_model(
        [
            helper.make_node(
                "If",
                ["false"],
                ["y"],
                then_branch=_matmul_branch("then", "V", "Relu"),
                else_branch=_matmul_branch("else", "W", "Neg"),
            )
        ],
        [tensor_input("x", [2, 48])],
        [tensor_input("y", [2, 48])],
        [_weight("W", 0), _weight("V", 2), numpy_helper.from_array(np.array(False), "false")],
    )
    _, optimized = optimize_proto(model, [])
    weights = [t for t in optimized.graph.initializer if np.prod(t.dims) > 1024]
    assert len(weights) == 1
    expected = np.random.default_rng(0).standard_normal((48, 48)).astype(np.float32).T
    assert np.array_equal(numpy_helper.to_array(weights[0]), expected)
    x = np.random.default_rng(1).standard_normal((2, 48)).astype(np.float32)
    assert np.array_equal(run(optimized, {"x": x})[0], run(model, {"x": x})[0])


def _loop_model(trips: int, scan: bool, condition: str = "") -> onnx.ModelProto:
    """A Loop accumulating acc += x * (i + 1) for `trips` iterations, maybe scanning acc
    out, and a value read through it (an outer-scope x)."""
    outputs = [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, [])]
    outputs.append(helper.make_tensor_value_info("acc_out", TensorProto.FLOAT, [2]))
    nodes = [
        helper.make_node("Identity", ["cond_in"], ["cond_out"]),
        helper.make_node("Cast", ["i"], ["fi"], to=TensorProto.FLOAT),
        helper.make_node("Add", ["fi", "one"], ["step"]),
        helper.make_node("Mul", ["x", "step"], ["scaled"]),
        helper.make_node("Add", ["acc_in", "scaled"], ["acc_out"]),
    ]
    if scan:
        nodes.append(helper.make_node("Neg", ["acc_out"], ["scanned"]))
        outputs.append(helper.make_tensor_value_info("scanned", TensorProto.FLOAT, [2]))
    body = helper.make_graph(
        nodes,
        "body",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("acc_in", TensorProto.FLOAT, [2]),
        ],
        outputs,
        [numpy_helper.from_array(np.array(1.0, np.float32), "one")],
    )
    loop_outputs = ["acc"] + (["stack"] if scan else [])
    graph_outputs = [tensor_input("acc", [2])]
    if scan:
        graph_outputs.append(tensor_input("stack", [trips, 2]))
    inits = [
        numpy_helper.from_array(np.array(trips, np.int64), "M"),
        numpy_helper.from_array(np.zeros(2, np.float32), "acc0"),
        numpy_helper.from_array(np.array(True), "yes"),
    ]
    return make_model(
        [helper.make_node("Loop", ["M", condition, "acc0"], loop_outputs, body=body)],
        [tensor_input("x", [2])],
        graph_outputs,
        inits,
    )


@pytest.mark.parametrize(
    ("trips", "scan", "condition"),
    [(1, False, ""), (1, True, ""), (1, True, "yes"), (0, False, ""), (0, False, "yes")],
)
def test_a_loop_of_zero_or_one_trips_is_what_it_computes(trips, scan, condition):
    model = _loop_model(trips, scan, condition)
    _, optimized = optimize_proto(model, [])
    assert "Loop" not in _ops(optimized)
    assert [o.name for o in optimized.graph.output] == [o.name for o in model.graph.output]
    x = np.array([0.5, -2.0], np.float32)
    for got, want in zip(run(optimized, {"x": x}), run(model, {"x": x})):
        assert got.shape == want.shape and np.array_equal(got, want)


@pytest.mark.parametrize(("trips", "scan"), [(2, False), (0, True)])
def test_other_loops_stay(trips, scan):
    """Two trips run the body twice; no trip with a scan output leaves an empty tensor
    whose element shape only running tells: both stay Loops."""
    model = _loop_model(trips, scan)
    _, optimized = optimize_proto(model, [])
    assert "Loop" in _ops(optimized)
    x = np.array([0.5, -2.0], np.float32)
    for got, want in zip(run(optimized, {"x": x}), run(model, {"x": x})):
        assert np.array_equal(got, want)


def test_a_one_trip_loop_that_passes_its_value_through():
    """The body returns its loop-carried input unchanged (as the graph fuzzer found):
    the Loop's output is the initial value, under the Loop output's name."""
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"])],
        "body",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("carried", TensorProto.FLOAT, [2]),
        ],
        [
            helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("carried", TensorProto.FLOAT, [2]),
        ],
    )
    model = make_model(
        [
            helper.make_node("Neg", ["x"], ["n"]),
            helper.make_node("Loop", ["M", "", "n"], ["y"], body=body),
        ],
        [tensor_input("x", [2])],
        [tensor_input("y", [2])],
        [numpy_helper.from_array(np.array(1, np.int64), "M")],
    )
    _, optimized = optimize_proto(model, [])
    assert "Loop" not in _ops(optimized) and [o.name for o in optimized.graph.output] == ["y"]
    x = np.array([0.5, -2.0], np.float32)
    assert np.array_equal(run(optimized, {"x": x})[0], -x)


def test_a_fold_never_changes_a_values_shape():
    """Clip of a scalar by [1]-shaped bounds is a scalar (onnxruntime's result); onnx's
    reference evaluator broadcasts it to [1], so that fold is not taken. The scalar
    comes from a static dim of a symbolic shape, as the graph fuzzer found it."""
    model = make_model(
        [
            helper.make_node("Shape", ["x"], ["s"]),
            helper.make_node("Gather", ["s", "two"], ["d"], axis=0),
            helper.make_node("Clip", ["d", "low", "high"], ["y"]),
        ],
        [tensor_input("x", ["batch", 1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.INT64, [])],
        [
            numpy_helper.from_array(np.array(2, np.int64), "two"),
            _ints("low", [-1]),
            _ints("high", [3]),
        ],
    )
    _, optimized = optimize_proto(model, [])
    x = np.zeros((2, 1, 4), np.float32)
    got, want = run(optimized, {"x": x})[0], run(model, {"x": x})[0]
    assert got.shape == want.shape == () and got == want == 3
