"""`onnxfuse plan`: outputs, embedding, verification and one-line errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper
from planner_graphs import (
    LIGHT,
    expression_model,
    flatten_resnet,
    make_model,
    nonzero_model,
    rate_model,
    tensor,
    unnamed_input_model,
)

from onnxfuse.cli.main import main
from onnxfuse.files.model_io import load_model, save_model
from onnxfuse.planner import METADATA_KEY, check_plan, read_embedded_plan

SQUEEZENET = str(LIGHT / "light_squeezenet.onnx")


def _symbolic_model(tmp_path):
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Neg", ["r"], ["y"])]
    model = make_model(nodes, [tensor("x", ["batch", 16])], [tensor("y", ["batch", 16])])
    path = tmp_path / "sym.onnx"
    save_model(model, path)
    return str(path)


def test_plan_writes_json_embeds_and_verifies(tmp_path, capsys):
    out, embedded = tmp_path / "plan.json", tmp_path / "planned.onnx"
    before = Path(SQUEEZENET).read_bytes()
    code = main(
        ["plan", SQUEEZENET, "--verify", "--schedule", "-o", str(out), "--embed", str(embedded)]
    )
    assert code == 0
    printed = capsys.readouterr().out
    assert "arena/bound 1.0000" in printed and "verify: outputs match onnxruntime" in printed
    plan = json.loads(out.read_text())
    assert plan["arena_bytes"] == plan["lower_bound_bytes"] < plan["ort_policy_bytes"]
    assert Path(SQUEEZENET).read_bytes() == before  # the input is never modified
    model = load_model(embedded)
    stored = read_embedded_plan(model)
    assert stored.arena_bytes == plan["arena_bytes"]
    # The embedded model runs its steps in its own node order, after the constants.
    assert [s.node for s in stored.steps] == list(range(39, 39 + len(stored.steps)))
    check_plan(stored, model)
    assert METADATA_KEY in {p.key for p in onnx.load(embedded).metadata_props}


def test_dims_strategy_and_alignment(tmp_path, capsys):
    out = tmp_path / "plan.json"
    path = _symbolic_model(tmp_path)
    args = ["plan", path, "--dim", "batch=4", "--strategy", "greedy-size", "--align", "16"]
    assert main([*args, "-o", str(out)]) == 0
    plan = json.loads(out.read_text())
    assert (plan["strategy"], plan["alignment"], plan["dims"]) == ("greedy-size", 16, {"batch": 4})
    assert plan["tensors"][0]["shape"] == [4, 16] and plan["arena_bytes"] == 256


def _run(*args):
    return subprocess.run(
        [sys.executable, "-m", "onnxfuse", "plan", *args], capture_output=True, text=True
    )


def test_unknown_dim_is_one_line_and_exit_2(tmp_path):
    result = _run(_symbolic_model(tmp_path), "--dim", "seq=3")
    assert result.returncode == 2
    assert result.stderr == (
        "onnxfuse: error: unknown dim 'seq' (the model's symbolic dims: batch)\n"
    )


def test_unbound_dim_names_the_tensor(tmp_path):
    result = _run(_symbolic_model(tmp_path))
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert "input 'x' has unknown dim 'batch': bind it with --dim batch=VALUE" in result.stderr


def test_missing_file_is_one_line_and_exit_2(tmp_path):
    result = _run(str(tmp_path / "missing.onnx"))
    assert result.returncode == 2
    assert result.stderr == f"onnxfuse: error: {tmp_path / 'missing.onnx'}: no such file\n"


def test_bad_arguments_are_one_line_and_exit_2(tmp_path, capsys):
    for args in (["--dim", "batch"], ["--strategy", "magic"], ["--align", "0"]):
        assert main(["plan", SQUEEZENET, *args]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("onnxfuse: error: ")


def test_outputs_never_replace_the_input(tmp_path):
    model = _symbolic_model(tmp_path)
    before = Path(model).read_bytes()
    for flag in ("--embed", "-o"):
        result = _run(model, "--dim", "batch=2", flag, model)
        assert result.returncode == 2
        assert result.stderr == f"onnxfuse: error: {model}: refusing to overwrite the input model\n"
    assert Path(model).read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sym.onnx"]


def test_an_output_the_system_refuses_is_one_line(tmp_path):
    blocked = tmp_path / "a-file"
    blocked.write_bytes(b"")
    for flag, name in (("-o", "p.json"), ("--embed", "p.onnx")):
        result = _run(SQUEEZENET, flag, str(blocked / name))
        assert result.returncode == 2
        assert result.stderr == f"onnxfuse: error: {blocked}: not a directory\n"
        # A directory the kernel refuses files in, whoever asks.
        result = _run(SQUEEZENET, flag, f"/proc/onnxfuse-test-{name}")
        assert result.returncode == 2
        assert result.stderr.startswith(
            f"onnxfuse: error: /proc/onnxfuse-test-{name}: cannot write it ("
        )


def test_outputs_that_are_not_files_or_name_one_file_twice_are_refused(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    for args, message in (
        (["--embed", str(fifo)], f"{fifo}: not a regular file (an output replaces a file whole)"),
        (
            ["-o", str(tmp_path / "x"), "--embed", str(tmp_path / "x")],
            f"{tmp_path / 'x'}: named by both -o and --embed",
        ),
        (["-o", ""], "an output needs a file name, not an empty one"),
    ):
        result = _run(SQUEEZENET, *args)
        assert result.returncode == 2
        assert result.stderr == f"onnxfuse: error: {message}\n"
    assert fifo.is_fifo() and sorted(p.name for p in tmp_path.iterdir()) == ["pipe"]


def test_numbers_out_of_range_are_one_line(tmp_path, capsys):
    for args, message in (
        (["--align", str(2**70)], f"alignment must be a number of bytes from 1 to {2**30}"),
        (["--dim", f"batch={2**64}"], "--dim expects NAME=VALUE with a positive integer"),
    ):
        assert main(["plan", SQUEEZENET, *args]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and message in err


def test_a_model_onnxruntime_cannot_run_fails_verify_in_one_line(tmp_path):
    # An integer division by zero: onnxruntime refuses to run it.
    int32 = onnx.TensorProto.INT32
    zero = onnx.numpy_helper.from_array(np.zeros([4], np.int32), "zero")
    nodes = [helper.make_node("Div", ["x", "zero"], ["y"])]
    model = make_model(nodes, [tensor("x", [4], int32)], [tensor("y", [4], int32)], [zero])
    path = tmp_path / "div0.onnx"
    save_model(model, path)
    result = _run(str(path), "--keep-constants", "--verify")
    assert result.returncode == 2
    assert result.stderr.startswith("onnxfuse: error: onnxruntime cannot run the model: ")
    assert result.stderr.count("\n") == 1


def _saved(tmp_path, model, name):
    path = tmp_path / f"{name}.onnx"
    save_model(model, path)
    return str(path)


def test_a_computed_reshape_plans_with_no_flags(tmp_path):
    path = _saved(tmp_path, flatten_resnet(), "flatten")
    out = tmp_path / "plan.json"
    result = _run(path, "-o", str(out), "--verify")
    assert result.returncode == 0, result.stderr
    assert "verify: outputs match onnxruntime" in result.stdout
    assert "traced" not in result.stdout
    plan = json.loads(out.read_text())
    assert {t["name"]: t["shape"] for t in plan["tensors"]}["val_5"] == [1, 64]
    assert plan["traced"] == [] and plan["input_shapes"] == {}


def test_input_shape_binds_an_unnamed_dim(tmp_path, capsys):
    path = _saved(tmp_path, unnamed_input_model(), "unnamed")
    out = tmp_path / "plan.json"
    assert main(["plan", path, "--input-shape", "x=2,3,7", "-o", str(out), "--verify"]) == 0
    assert "verify: outputs match onnxruntime" in capsys.readouterr().out
    plan = json.loads(out.read_text())
    assert plan["input_shapes"] == {"x": [2, 3, 7]} and plan["inputs"][0]["shape"] == [2, 3, 7]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            [],
            "input 'x' has an unnamed dynamic dim (axis 0): give its shape with "
            "--input-shape x=D0,3,D2",
        ),
        (["--input-shape", "x=2,4,7"], "--input-shape x=2,4,7: dim 1 of the input is 3, not 4"),
        (
            ["--input-shape", "x=2,3,7", "--input-shape", "x=2,3,7"],
            "--input-shape x is given twice",
        ),
        (
            ["--input-shape", "x=2,a,7"],
            "--input-shape expects NAME=D1,D2,... with positive integers, not 'x=2,a,7'",
        ),
        (
            ["--input-shape", "x=2,0,7"],
            "--input-shape expects NAME=D1,D2,... with positive integers, not 'x=2,0,7'",
        ),
        (
            ["--input-shape", "=2"],
            "--input-shape expects NAME=D1,D2,... with positive integers, not '=2'",
        ),
    ],
)
def test_input_shape_errors_are_one_line_and_exit_2(tmp_path, args, message):
    result = _run(_saved(tmp_path, unnamed_input_model(), "unnamed"), *args)
    assert result.returncode == 2
    assert result.stderr == f"onnxfuse: error: {message}\n"


def test_dim_expressions_evaluate_under_dim(tmp_path, capsys):
    path = _saved(tmp_path, expression_model(), "expressions")
    out = tmp_path / "plan.json"
    assert main(["plan", path, "--dim", "width=640", "-o", str(out)]) == 0
    plan = json.loads(out.read_text())
    assert plan["outputs"][0]["shape"] == [1, 1, 80]


def test_an_unbound_name_in_an_expression_is_one_line(tmp_path):
    model = expression_model("floor(height/2) + 1")
    result = _run(_saved(tmp_path, model, "expressions"), "--dim", "width=640")
    assert result.returncode == 2
    assert result.stderr == (
        "onnxfuse: error: tensor 's' made by custom.Scale node 'scale' has dim "
        "'floor(height/2) + 1' with unbound height: bind it with --dim height=VALUE, "
        "or measure it with --trace-shapes\n"
    )


def test_nonzero_is_traced_or_bound(tmp_path):
    path = _saved(tmp_path, nonzero_model(), "nonzero")
    result = _run(path)
    assert result.returncode == 2
    assert result.stderr == (
        "onnxfuse: error: tensor 'nz' made by NonZero node 'find' has dim 1 unknown before "
        "the model runs: bind it with --dim nz:1=VALUE, or measure it with --trace-shapes\n"
    )
    out = tmp_path / "plan.json"
    result = _run(path, "--trace-shapes", "--verify", "-o", str(out))
    assert result.returncode == 0, result.stderr
    plan = json.loads(out.read_text())
    count = {t["name"]: t["shape"] for t in plan["tensors"]}["nz"][1]
    assert plan["traced"] == ["f", "m", "nz"]
    assert (
        f"from the traced run: 3 shapes (f [1, {count}], m [1, {count}], nz [1, {count}])"
        in result.stdout
    )
    assert "verify: outputs match onnxruntime" in result.stdout
    bound = tmp_path / "bound.json"
    result = _run(path, "--dim", f"nz:1={count}", "--verify", "-o", str(bound))
    assert result.returncode == 0, result.stderr
    assert json.loads(bound.read_text())["arena_bytes"] == plan["arena_bytes"]


def test_an_output_declared_for_other_input_shapes_takes_the_computed_shape(tmp_path, capsys):
    # As a legacy export declares it: [1, seqlen] for an output that, at the bound
    # input shape, is [3, 4]. onnxruntime returns the computed shape (with a warning).
    nodes = [helper.make_node("Relu", ["x"], ["y"], name="relu")]
    model = make_model(nodes, [tensor("x", ["batch", 4])], [tensor("y", [1, "seqlen"])])
    path = tmp_path / "declared.onnx"
    save_model(model, path)
    assert main(["plan", str(path), "--dim", "batch=3", "--verify"]) == 0
    captured = capsys.readouterr()
    assert "verify: outputs match onnxruntime" in captured.out
    warning = (
        "onnxfuse: warning: repaired: graph output's declared shape, which the bound input "
        "shapes contradict, left out, 'y'"
    )
    assert captured.err.splitlines().count(warning) == 1, captured.err


def test_input_value_decides_an_if_on_an_input(tmp_path, capsys):
    path = _saved(tmp_path, rate_model(), "rate")
    assert main(["plan", path]) == 2
    assert "made by If node" in capsys.readouterr().err
    for rate, width in (("16000", 8), ("8000", 4)):
        out = tmp_path / f"plan{rate}.json"
        assert main(["plan", path, "--input-value", f"sr={rate}", "-o", str(out), "--verify"]) == 0
        assert "verify: outputs match onnxruntime" in capsys.readouterr().out
        plan = json.loads(out.read_text())
        assert plan["input_values"] == {"sr": int(rate)}
        assert {t["name"]: t["shape"] for t in plan["outputs"]}["y"] == [1, width]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--input-value", "sr=abc"], "--input-value expects NAME=V1,V2,... with numbers"),
        (["--input-value", "sr=1", "--input-value", "sr=2"], "--input-value sr is given twice"),
        (["--input-value", "rate=1"], "--input-value rate: no such input"),
        (["--input-value", "sr=1,2"], "--input-value sr: 2 value(s) for shape [] (1 element(s))"),
        (["--input-value", "sr=0.5"], "--input-value sr: the input holds INT64 values"),
    ],
)
def test_input_value_errors_are_one_line_and_exit_2(tmp_path, capsys, args, message):
    path = _saved(tmp_path, rate_model(), "rate")
    assert main(["plan", path, *args]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err


def _dynamic_quantize_lstm(direction: str) -> onnx.ModelProto:
    """X [seq 5, batch, input 4] through com.microsoft DynamicQuantizeLSTM (hidden 3),
    whose outputs neither onnx nor SymbolicShapeInference sizes, then Y reshaped to
    [seq, batch, directions * hidden] by a shape computed from Y's, into an output that
    declares [1, seqlen] (as ddddocr's captcha model does): only once Y is sized does
    the Reshape show that the declaration is wrong."""
    rng = np.random.default_rng(0)
    directions, hidden = (2 if direction == "bidirectional" else 1), 3

    def int8(name, *shape):
        return onnx.numpy_helper.from_array(rng.integers(-20, 20, shape).astype(np.int8), name)

    def f32(name, *shape):
        return onnx.numpy_helper.from_array(rng.uniform(0.01, 0.02, shape).astype(np.float32), name)

    def i64(name, values):
        return onnx.numpy_helper.from_array(np.array(values, np.int64), name)

    constants = [int8("W", directions, 4, 4 * hidden), int8("R", directions, hidden, 4 * hidden)]
    constants += [f32("B", directions, 8 * hidden), f32("ws", directions), f32("rs", directions)]
    constants += [onnx.numpy_helper.from_array(np.zeros(directions, np.int8), "z")]
    constants += [i64("i0", [0]), i64("i2", [2]), i64("m1", [-1])]
    lstm = helper.make_node(
        "DynamicQuantizeLSTM",
        ["x", "W", "R", "B", "", "", "", "", "ws", "z", "rs", "z"],
        ["y", "y_h", "y_c"],
        name="lstm",
        domain="com.microsoft",
        direction=direction,
        hidden_size=hidden,
    )
    nodes = [
        lstm,
        helper.make_node("Shape", ["y"], ["sy"]),
        helper.make_node("Gather", ["sy", "i0"], ["seq"]),
        helper.make_node("Gather", ["sy", "i2"], ["batch"]),
        helper.make_node("Concat", ["seq", "batch", "m1"], ["s"], axis=0),
        helper.make_node("Reshape", ["y", "s"], ["out"], name="merge"),
    ]
    graph = helper.make_graph(
        nodes, "g", [tensor("x", [5, "batch", 4])], [tensor("out", [1, "seqlen"])], constants
    )
    imports = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=imports)


@pytest.mark.parametrize("direction", ["forward", "bidirectional"])
def test_a_dynamically_quantized_lstm_is_sized_like_an_lstm(tmp_path, capsys, direction):
    path = tmp_path / "lstm.onnx"
    onnx.save(_dynamic_quantize_lstm(direction), path)
    out = tmp_path / "plan.json"
    # No --verify: with these random int8 weights the one-node session of the op and the
    # whole model round 4e-5 apart (tests/zoo/test_zoo_plan.py verifies a real one).
    assert main(["plan", str(path), "--dim", "batch=2", "-o", str(out)]) == 0
    captured = capsys.readouterr()
    assert "declared shape, which the bound input shapes contradict, left out, 'out'" in (
        captured.err
    )
    plan = json.loads(out.read_text())
    shapes = {t["name"]: t["shape"] for t in (*plan["tensors"], *plan["outputs"])}
    directions = 2 if direction == "bidirectional" else 1
    assert shapes["y"] == [5, directions, 2, 3] and shapes["out"] == [5, 2, directions * 3]
