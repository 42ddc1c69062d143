"""Running real models inside their planned arena matches onnxruntime's whole-model run."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
from onnx import helper, numpy_helper
from planner_graphs import LIGHT, if_model, loop_model, make_model, tensor

from onnxfuse.files.model_io import load_model
from onnxfuse.planner import ArenaExecutor, check_plan, plan_model, verify_plan
from onnxfuse.planner.arena_executor import random_feeds

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", ["light_squeezenet", "light_inception_v1"])
def test_light_models_run_inside_the_arena(name):
    model = load_model(LIGHT / f"{name}.onnx")
    plan = plan_model(model, schedule=True)
    check_plan(plan, model)
    assert plan.arena_bytes == plan.lower_bound_bytes < plan.ort_policy_bytes
    result = verify_plan(model, plan)
    assert result.ok, result


def test_outputs_are_really_written_into_the_arena():
    model = load_model(LIGHT / "light_squeezenet.onnx")
    plan = plan_model(model)
    executor = ArenaExecutor(model, plan)
    executor.run(random_feeds(model, plan))
    last = max(plan.tensors, key=lambda t: t.last)  # alive at the end: not yet overwritten
    values = executor.view(last)
    assert np.isfinite(values).all() and values.any()


def test_bert_style_encoder_with_symbolic_dims():
    spec = importlib.util.spec_from_file_location("bench_plan", REPO_ROOT / "bench" / "plan.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    model = bench.build_encoder(layers=2, hidden=64, ffn=128)
    plan = plan_model(model, dims={"batch": 2, "seq": 128})
    check_plan(plan, model)
    assert plan.arena_bytes <= 1.05 * plan.lower_bound_bytes
    assert verify_plan(model, plan).ok


@pytest.mark.parametrize("build", [if_model, loop_model])
def test_bodies_read_outer_scope_values_from_the_arena(build):
    model = build()
    plan = plan_model(model)
    early = next(t for t in plan.tensors if t.name == "early")
    assert early.last == next(i for i, s in enumerate(plan.steps) if s.op in ("If", "Loop"))
    check_plan(plan, model)
    assert verify_plan(model, plan).ok


def test_a_scalar_outside_the_arena_stays_a_scalar():
    # Gather by a scalar index drops the axis; by a 1-element index it keeps it.
    nodes = [
        helper.make_node("Relu", ["x"], ["r"]),
        helper.make_node("Gather", ["r", "i"], ["g"], axis=0),
        helper.make_node("Neg", ["g"], ["y"]),
    ]
    index = numpy_helper.from_array(np.array(1, np.int64), "i")
    model = make_model(nodes, [tensor("x", [2, 3])], [tensor("y", [3])], [index])
    assert verify_plan(model, plan_model(model)).ok
