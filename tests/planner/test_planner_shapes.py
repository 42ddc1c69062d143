"""Sizing every tensor: dim expressions, input shapes, folded shape computations,
SymbolicShapeInference, traced runs, and the errors that name what cannot be sized."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from planner_graphs import (
    expression_model,
    flatten_resnet,
    nonzero_model,
    tensor,
    unnamed_input_model,
    weight,
)

from onnxfuse.errors import ModelError
from onnxfuse.planner import Plan, check_plan, plan_model, verify_plan
from onnxfuse.planner.arena_executor import random_feeds


def _onnxruntime_shapes(model: ir.Model, feeds: dict[str, np.ndarray]) -> dict[str, tuple]:
    """Every main-graph tensor's shape in one onnxruntime run (all made graph outputs)."""
    proto = ir.to_proto(model)
    listed = {o.name for o in proto.graph.output}
    for node in proto.graph.node:
        proto.graph.output.extend(
            onnx.ValueInfoProto(name=o) for o in node.output if o and o not in listed
        )
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return {n: r.shape for n, r in zip(names, session.run(names, feeds), strict=True)}


def assert_sizes_match_a_run(model: ir.Model, plan: Plan) -> None:
    """The plan's sizes are the bytes onnxruntime's tensors take on the plan's own inputs,
    and the model computes its outputs inside the arena."""
    feeds = random_feeds(model, plan)
    shapes = _onnxruntime_shapes(model, feeds)
    for t in (*plan.tensors, *plan.outputs):
        itemsize = np.dtype(ir.DataType[t.dtype].numpy()).itemsize
        assert t.nbytes == itemsize * int(np.prod(shapes[t.name])), t.name
        assert tuple(t.shape) == shapes[t.name], t.name
    assert verify_plan(model, plan).ok
    check_plan(plan, model)


def test_a_reshape_to_a_computed_shape_plans_with_no_bindings():
    # onnx inference leaves the flattened dim unknown (the model even names it unk__0);
    # with the input static, the Shape/Slice/ReduceProd/Concat chain folds.
    model = flatten_resnet()
    plan = plan_model(model)
    placed = {t.name: t for t in plan.tensors}
    assert placed["val_5"].shape == [1, 64] and placed["flat_shape"].shape == [2]
    assert plan.traced == [] and plan.dims == {} and plan.input_shapes == {}
    assert_sizes_match_a_run(model, plan)


def test_an_unnamed_input_dim_is_bound_by_its_input_shape():
    model = unnamed_input_model()
    plan = plan_model(model, input_shapes={"x": [2, 3, 7]})
    assert plan.inputs[0].shape == [2, 3, 7] and plan.input_shapes == {"x": [2, 3, 7]}
    assert {t.name: t.shape for t in plan.tensors} == {"r": [2, 3, 7], "m": [2, 3]}
    assert plan.outputs[0].shape == [2, 5]
    assert_sizes_match_a_run(model, plan)
    # The plan carries its input shapes: read back, it checks against the model.
    check_plan(Plan.from_dict(plan.to_dict()), model)


@pytest.mark.parametrize(
    ("shapes", "message"),
    [
        (
            {},
            r"input 'x' has an unnamed dynamic dim \(axis 0\): give its shape with "
            r"--input-shape x=D0,3,D2$",
        ),
        ({"x": [2, 4, 7]}, r"--input-shape x=2,4,7: dim 1 of the input is 3, not 4$"),
        ({"x": [2, 3]}, r"--input-shape x=2,3: the input has rank 3 \(\[\?, 3, \?\]\)$"),
        ({"y": [2, 5]}, r"--input-shape y: no such input \(the model's inputs: x\)$"),
    ],
)
def test_input_shape_errors(shapes, message):
    with pytest.raises(ModelError, match=message):
        plan_model(unnamed_input_model(), input_shapes=shapes)


def test_an_input_shape_binds_the_names_of_its_dims():
    # width, named by the input's dim, is bound by the input's shape: the expressions of
    # it on the intermediates evaluate too.
    by_name = plan_model(expression_model(), dims={"width": 640})
    by_shape = plan_model(expression_model(), input_shapes={"x": [1, 1, 640]})
    for plan in (by_name, by_shape):
        assert {t.name: t.shape[2] for t in plan.tensors} == {
            "h1": 320,
            "h2": 160,
            "h3": 80,
            "s": 80,
        }
        assert plan.outputs[0].shape == [1, 1, 80]
    with pytest.raises(ModelError, match=r"makes dim 'width' 640, but it is 320"):
        plan_model(expression_model(), dims={"width": 320}, input_shapes={"x": [1, 1, 640]})


def test_a_dim_expression_is_what_sizes_an_op_no_inference_knows():
    # custom.Scale has no schema: only the expression the model carries sizes s and y.
    plan = plan_model(expression_model("2*Max(height, 3) - 1"), dims={"width": 64, "height": 2})
    placed = {t.name: t for t in plan.tensors}
    assert placed["h3"].shape == [1, 1, 8] and placed["s"].shape == [1, 1, 5]
    check_plan(plan, expression_model("2*Max(height, 3) - 1"))


def test_an_unbound_name_in_an_expression_names_the_tensor_the_expression_and_the_name():
    model = expression_model("floor(height/2) + Min(depth, 4)")
    with pytest.raises(ModelError) as caught:
        plan_model(model, dims={"width": 64, "height": 9})
    assert str(caught.value) == (
        "tensor 's' made by custom.Scale node 'scale' has dim 'floor(height/2) + Min(depth, 4)' "
        "with unbound depth: bind it with --dim depth=VALUE, or measure it with --trace-shapes"
    )
    plan = plan_model(model, dims={"width": 64, "height": 9, "depth": 3})
    assert plan.outputs[0].shape == [1, 1, 7]


def test_an_expression_that_is_not_a_dim_is_an_error_naming_the_tensor():
    with pytest.raises(ModelError, match=r"tensor 's': dim 'height/2' is 3/2 with height=3"):
        plan_model(expression_model("height/2"), dims={"width": 64, "height": 3})


def test_a_wrong_dim_expression_is_caught_by_inference():
    # The model claims h3 is width/8 + 1; the convolutions make it floor(...) + 1.
    model = expression_model()
    model.graph.node("down3").outputs[0].shape = ir.Shape([1, 1, ir.SymbolicDim("width/8 + 1")])
    with pytest.raises(
        ModelError, match=r"shape inference failed: .*node name: down3.*\(80\) vs \(81\)"
    ):
        plan_model(model, dims={"width": 640})


def test_nonzero_needs_a_binding_or_a_trace():
    model = nonzero_model()
    with pytest.raises(ModelError) as caught:
        plan_model(model)
    assert str(caught.value) == (
        "tensor 'nz' made by NonZero node 'find' has dim 1 unknown before the model runs: "
        "bind it with --dim nz:1=VALUE, or measure it with --trace-shapes"
    )


def test_a_traced_run_sizes_nonzero_and_the_plan_holds_for_it():
    model = nonzero_model()
    plan = plan_model(model, trace_shapes=True)
    positives = int((random_feeds(model, plan)["x"] > 0).sum())
    assert 0 < positives < 64
    assert plan.traced == ["f", "m", "nz"]  # what static inference could not size
    assert {t.name: t.shape for t in plan.tensors}["nz"] == [1, positives]
    assert_sizes_match_a_run(model, plan)
    # The checker re-infers with the traced shapes the plan records.
    check_plan(Plan.from_dict(plan.to_dict()), model)


def test_a_bound_nonzero_count_sizes_what_follows():
    model = nonzero_model()
    traced = plan_model(model, trace_shapes=True)
    count = {t.name: t.shape for t in traced.tensors}["nz"][1]
    plan = plan_model(model, dims={"nz:1": count})
    assert {t.name: t.shape for t in plan.tensors} == {
        "r": [64],
        "nz": [1, count],
        "f": [1, count],
        "m": [1, count],
    }
    assert plan.traced == [] and plan.arena_bytes == traced.arena_bytes
    assert_sizes_match_a_run(model, plan)


@pytest.mark.parametrize(
    ("dims", "message"),
    [
        ({"nz:2": 3}, r"--dim nz:2: 'nz' has rank 2"),
        ({"nz:0": 3}, r"--dim nz:0=3: the model makes that dim 1"),
        ({"zz:0": 3}, r"unknown dim 'zz:0': the model has no tensor 'zz'"),
        ({"batch": 3}, r"unknown dim 'batch' \(the model has no symbolic dims\)"),
    ],
)
def test_bad_tensor_axis_bindings(dims, message):
    with pytest.raises(ModelError, match=message):
        plan_model(nonzero_model(), dims=dims)


def test_a_traced_run_checks_the_shapes_static_inference_gave():
    # The model claims NonZero finds 3 positives: static inference takes it at its word,
    # the traced run does not.
    model = nonzero_model()
    claimed = model.graph.node("find").outputs[0]
    claimed.dtype, claimed.shape = ir.DataType.INT64, ir.Shape([1, 3])
    assert {t.name: t.shape for t in plan_model(model).tensors}["nz"] == [1, 3]
    with pytest.raises(
        ModelError,
        match=r"tensor 'nz': shape inference gives INT64 \[1, 3\] "
        r"but onnxruntime computed INT64 \[1, \d+\]",
    ):
        plan_model(model, trace_shapes=True)


def test_if_on_a_shape_folds_to_the_branch_it_takes():
    # torch's legacy exporter squeezes axis 0 only if it is 1: If(Shape(x)[0] == 1).
    # With x static, strict inference rejects the Squeeze branch that never runs.
    squeeze = helper.make_graph(
        [helper.make_node("Squeeze", ["r", "axis0"], ["sq"])], "then", [], [tensor("sq", [6])]
    )
    keep = helper.make_graph(
        [helper.make_node("Identity", ["r"], ["kept"])], "else", [], [tensor("kept", [2, 6])]
    )
    nodes = [
        helper.make_node("Relu", ["x"], ["r"], name="relu"),
        helper.make_node("Shape", ["r"], ["shape"], name="shape"),
        helper.make_node("Gather", ["shape", "zero"], ["rows"], name="rows", axis=0),
        helper.make_node("Equal", ["rows", "one"], ["single"], name="single"),
        helper.make_node(
            "If", ["single"], ["o"], name="squeeze", then_branch=squeeze, else_branch=keep
        ),
        helper.make_node("Neg", ["o"], ["y"], name="neg"),
    ]
    inits = [
        numpy_helper.from_array(np.array(0, np.int64), "zero"),
        numpy_helper.from_array(np.array(1, np.int64), "one"),
        numpy_helper.from_array(np.array([0], np.int64), "axis0"),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 6])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    graph = helper.make_graph(nodes, "g", [x], [y], inits)
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    model = ir.from_proto(proto)
    plan = plan_model(model, input_shapes={"x": [2, 6]})
    assert {t.name: t.shape for t in plan.tensors}["o"] == [2, 6]
    assert_sizes_match_a_run(model, plan)


def _contrib_model(op: str, *w_shape: int, **attributes) -> ir.Model:
    """x[batch, 16] -> Relu -> a com.microsoft op of (r, w) -> Relu -> y."""
    nodes = [
        helper.make_node("Relu", ["x"], ["r"], name="relu"),
        helper.make_node(
            op, ["r", "w"], ["c"], name="contrib", domain="com.microsoft", **attributes
        ),
        helper.make_node("Relu", ["c"], ["y"], name="relu2"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [tensor("x", ["batch", 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [weight("w", *w_shape)],
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    return ir.from_proto(helper.make_model(graph, opset_imports=opsets, ir_version=8))


def test_contrib_ops_are_sized_by_symbolic_shape_inference():
    # com.microsoft.BiasGelu has no onnx schema: onnx inference gives it no type at all.
    model = _contrib_model("BiasGelu", 16)
    plan = plan_model(model, dims={"batch": 3})
    assert {t.name: t.shape for t in plan.tensors} == {"r": [3, 16], "c": [3, 16]}
    assert plan.outputs[0].shape == [3, 16] and plan.traced == []
    assert_sizes_match_a_run(model, plan)


def test_an_op_no_inference_knows_is_traced():
    # Neither inference knows FusedMatMul (SymbolicShapeInference only guesses a rank).
    model = _contrib_model("FusedMatMul", 16, 16, alpha=0.5)
    with pytest.raises(ModelError) as caught:
        plan_model(model, dims={"batch": 3})
    assert str(caught.value) == (
        "tensor 'c' made by com.microsoft.FusedMatMul node 'contrib' has no type after "
        "shape inference: measure it with --trace-shapes"
    )
    plan = plan_model(model, dims={"batch": 3}, trace_shapes=True)
    assert plan.traced == ["c", "y"]
    assert_sizes_match_a_run(model, plan)


def test_a_model_onnxruntime_cannot_run_cannot_be_traced():
    with pytest.raises(ModelError, match="onnxruntime cannot run the model to trace its shapes"):
        plan_model(expression_model("depth"), dims={"width": 8}, trace_shapes=True)


def test_an_unknown_element_type_names_the_op():
    with pytest.raises(ModelError, match=r"tensor 's' made by custom.Scale node 'scale' has"):
        model = expression_model()
        model.graph.node("scale").outputs[0].type = None
        model.graph.node("scale").outputs[0].shape = None
        plan_model(model, dims={"width": 64})
