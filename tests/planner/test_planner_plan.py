"""Planning hand-built graphs whose optimal arena is known, and the plan's figures."""

from __future__ import annotations

import json

import pytest
from onnx import helper
from planner_graphs import (
    LIGHT,
    if_model,
    make_model,
    matmul_chain,
    tensor,
    two_branches,
    weight,
)

from onnxfuse.errors import ModelError
from onnxfuse.files.model_io import load_model
from onnxfuse.planner import Plan, check_plan, plan_model


@pytest.mark.parametrize("strategy", ["greedy-size", "search"])
def test_matmul_chain_gets_the_optimal_arena(strategy):
    plan = plan_model(matmul_chain(), strategy=strategy)
    placed = {t.name: t for t in plan.tensors}
    assert sorted(placed) == ["a", "b", "c"]
    assert [(placed[n].first, placed[n].last) for n in "abc"] == [(0, 1), (1, 2), (2, 3)]
    assert [placed[n].size for n in "abc"] == [128, 64, 128]
    assert plan.arena_bytes == plan.lower_bound_bytes == 192
    assert plan.naive_bytes == 320
    # a (128 bytes) is freed before c (96 bytes) is made, but sizes differ: no reuse.
    assert plan.ort_policy_bytes == 320
    assert placed["c"].offset == placed["a"].offset
    check_plan(plan)


def test_inputs_outputs_and_initializers_are_listed_not_placed():
    plan = plan_model(matmul_chain())
    assert [t.name for t in plan.inputs] == ["x"]
    assert [t.name for t in plan.outputs] == ["y"]
    assert sorted(t.name for t in plan.initializers) == ["w_a", "w_b", "w_c", "w_y"]
    assert {"x", "y", "w_a"}.isdisjoint(t.name for t in plan.tensors)


def test_alignment_rounds_each_size_up():
    plan = plan_model(matmul_chain(), alignment=1)
    assert [t.size for t in plan.tensors] == [128, 64, 96]
    assert plan.arena_bytes == plan.lower_bound_bytes == 192
    assert plan_model(matmul_chain(), alignment=256).arena_bytes == 512


def test_inplace_elementwise_chain_uses_one_buffer():
    # Softmax -> Relu -> Sigmoid -> Exp: each elementwise op writes over its dying input.
    nodes = [
        helper.make_node("Softmax", ["x"], ["s"]),
        helper.make_node("Relu", ["s"], ["r"]),
        helper.make_node("Sigmoid", ["r"], ["g"]),
        helper.make_node("Softmax", ["g"], ["y"]),
    ]
    model = make_model(nodes, [tensor("x", [4, 64])], [tensor("y", [4, 64])])
    plan = plan_model(model)
    placed = {t.name: t for t in plan.tensors}
    assert placed["r"].inplace_of == "s" and placed["g"].inplace_of == "r"
    assert {t.offset for t in plan.tensors} == {0}
    assert plan.arena_bytes == plan.lower_bound_bytes == 1024
    without = plan_model(model, inplace=False)
    assert without.arena_bytes == without.lower_bound_bytes == 2048
    check_plan(plan, model)


def test_no_inplace_over_an_input_still_read_later():
    nodes = [
        helper.make_node("Softmax", ["x"], ["s"]),
        helper.make_node("Relu", ["s"], ["r"]),
        helper.make_node("Add", ["r", "s"], ["y"]),
    ]
    model = make_model(nodes, [tensor("x", [4, 64])], [tensor("y", [4, 64])])
    placed = {t.name: t for t in plan_model(model).tensors}
    assert placed["r"].inplace_of is None
    assert placed["r"].offset != placed["s"].offset


def test_value_read_inside_a_body_lives_across_the_whole_node():
    placed = {t.name: t for t in plan_model(if_model()).tensors}
    assert (placed["early"].first, placed["early"].last) == (0, 4)


def test_zero_size_tensors_take_no_bytes():
    nodes = [
        helper.make_node("Relu", ["x"], ["r"]),
        helper.make_node("Neg", ["r"], ["y"]),
    ]
    model = make_model(nodes, [tensor("x", [0, 4])], [tensor("y", [0, 4])])
    plan = plan_model(model)
    assert [(t.name, t.size, t.offset) for t in plan.tensors] == [("r", 0, 0)]
    assert plan.arena_bytes == plan.lower_bound_bytes == 0


def test_symbolic_dims_are_bound_and_an_unbound_one_names_the_tensor():
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Neg", ["r"], ["y"])]
    model = make_model(nodes, [tensor("x", ["batch", 16])], [tensor("y", ["batch", 16])])
    plan = plan_model(model, dims={"batch": 3})
    assert plan.tensors[0].shape == [3, 16] and plan.dims == {"batch": 3}
    with pytest.raises(ModelError, match=r"input 'x' has unknown dim 'batch'.*--dim batch="):
        plan_model(model)
    with pytest.raises(ModelError, match=r"unknown dim 'seq'.*symbolic dims: batch"):
        plan_model(model, dims={"batch": 1, "seq": 2})


def test_ir3_light_model_weights_are_folded_constants():
    model = load_model(LIGHT / "light_squeezenet.onnx")
    plan = plan_model(model)
    # IR 3 lists every initializer as an input too: only the image is a real input.
    assert [t.name for t in plan.inputs] == ["data_0"]
    assert len(plan.constants) == 39  # the ConstantOfShape weights
    assert all(s.op != "ConstantOfShape" for s in plan.steps)
    kept = plan_model(model, fold_constants=False)
    assert len(kept.tensors) == len(plan.tensors) + 39
    assert kept.lower_bound_bytes > plan.lower_bound_bytes
    check_plan(kept, model)


def test_ir4_initializer_that_is_an_input_is_an_input():
    nodes = [helper.make_node("Add", ["x", "bias"], ["s"]), helper.make_node("Neg", ["s"], ["y"])]
    bias = weight("bias", 4)
    model = make_model(nodes, [tensor("x", [4]), tensor("bias", [4])], [tensor("y", [4])], [bias])
    plan = plan_model(model)
    assert [t.name for t in plan.inputs] == ["x", "bias"]
    assert [t.name for t in plan.initializers] == ["bias"]


def test_memory_aware_schedule_lowers_the_peak():
    model = two_branches()
    plain = plan_model(model)
    assert plain.schedule == "graph" and plain.lower_bound_bytes == 1024 + 1024 + 64
    scheduled = plan_model(model, schedule=True)
    assert scheduled.schedule == "memory"
    assert scheduled.graph_order_lower_bound_bytes == plain.lower_bound_bytes
    assert scheduled.lower_bound_bytes == scheduled.arena_bytes == 1024 + 64 + 64
    assert [s.name for s in scheduled.steps] == ["A1", "A2", "B1", "B2", "cat"]
    check_plan(scheduled, model)


def test_plan_json_round_trips(tmp_path):
    plan = plan_model(matmul_chain())
    path = tmp_path / "plan.json"
    plan.write_json(path)
    data = json.loads(path.read_text())
    for key in ("arena_bytes", "lower_bound_bytes", "naive_bytes", "ort_policy_bytes"):
        assert data[key] == getattr(plan, key)
    assert data["strategy"] == "search" and data["alignment"] == 64
    assert set(data["tensors"][0]) >= {"name", "offset", "size", "first", "last"}
    assert Plan.from_dict(data) == plan


def test_the_caller_model_is_not_modified():
    model = two_branches()
    before = [n.name for n in model.graph]
    plan_model(model, schedule=True)
    assert [n.name for n in model.graph] == before
