"""The bundled sample model: reproducible bytes, valid, runnable, and full of work for the rules."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter

import numpy as np
import onnx
import pytest
from helpers import random_feeds, run
from onnx import numpy_helper

from onnxfuse import api, sample_model

SAMPLE = api.sample_model_path()


@pytest.fixture(scope="module")
def model() -> onnx.ModelProto:
    return onnx.load(SAMPLE)


def test_committed_file_is_what_the_builder_writes():
    assert SAMPLE.is_file(), f"{SAMPLE} missing: run `python -m onnxfuse.sample_model`"
    assert sample_model.model_bytes() == SAMPLE.read_bytes()


def test_module_entry_point_writes_identical_bytes(tmp_path):
    out = tmp_path / "sample.onnx"
    result = subprocess.run(
        [sys.executable, "-m", "onnxfuse.sample_model", str(out)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert out.read_bytes() == SAMPLE.read_bytes()


def test_file_is_small():
    assert SAMPLE.stat().st_size < 300_000


def test_passes_full_check(model):
    onnx.checker.check_model(model, full_check=True)
    assert model.ir_version == 8
    assert {(o.domain, o.version) for o in model.opset_import} == {("", 17)}


def test_interface(model):
    (inp,) = model.graph.input
    (out,) = model.graph.output
    assert inp.name == "input"
    assert inp.type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    assert [d.dim_value for d in inp.type.tensor_type.shape.dim] == [1, 3, 32, 32]
    assert [d.dim_value for d in out.type.tensor_type.shape.dim] == [1, 10]
    # IR 8: initializers are not graph inputs.
    assert not {i.name for i in model.graph.initializer} & {i.name for i in model.graph.input}


def test_node_names_set_and_unique(model):
    names = [n.name for n in model.graph.node]
    assert all(names)
    assert len(set(names)) == len(names)


def test_has_work_for_every_core_fusion(model):
    ops = Counter(n.op_type for n in model.graph.node)
    assert ops["Conv"] == ops["BatchNormalization"] == 8
    for op in ("Pad", "Dropout", "Identity", "MatMul", "GlobalAveragePool", "Flatten"):
        assert ops[op] >= 1, op
    assert ops["Add"] == 4  # three residual Adds and the head's bias Add
    convs = [n for n in model.graph.node if n.op_type == "Conv"]
    attrs = [{a.name: onnx.helper.get_attribute_value(a) for a in n.attribute} for n in convs]
    assert any(a["strides"] == [2, 2] and a["kernel_shape"] == [1, 1] for a in attrs)
    # Every BatchNormalization follows a Conv; the Pad feeds a Conv.
    producers = {o: n for n in model.graph.node for o in n.output}
    for node in model.graph.node:
        if node.op_type == "BatchNormalization":
            assert producers[node.input[0]].op_type == "Conv"
    (pad,) = [n for n in model.graph.node if n.op_type == "Pad"]
    assert any(n.op_type == "Conv" and n.input[0] == pad.output[0] for n in model.graph.node)
    # The head is 2-D, so MatMul + Add can become Gemm.
    (matmul,) = [n for n in model.graph.node if n.op_type == "MatMul"]
    assert producers[matmul.input[0]].op_type == "Flatten"


def test_parameters_are_non_trivial(model):
    for tensor in model.graph.initializer:
        array = numpy_helper.to_array(tensor)
        if tensor.name.endswith(".pads"):
            continue
        assert array.dtype == np.float32, tensor.name
        assert np.all(np.isfinite(array)), tensor.name
        assert np.unique(array).size > 1, f"{tensor.name} is constant"
        if tensor.name.endswith(".running_var"):
            assert np.all(array > 0), tensor.name


def test_runs_in_onnxruntime(model):
    outputs = [run(model, random_feeds(model, seed=seed))[0] for seed in (0, 1)]
    for output in outputs:
        assert output.shape == (1, 10)
        assert output.dtype == np.float32
        assert np.all(np.isfinite(output))
        assert np.ptp(output) > 0.1
    assert not np.allclose(outputs[0], outputs[1])
