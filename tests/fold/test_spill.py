"""Models with external weights: large folded values wait on disk for the save,
the weights a fold read are unmapped, and nothing is left behind."""

from __future__ import annotations

import contextlib
import hashlib
import tempfile
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from helpers import assert_same_outputs, make_model, tensor_input
from onnx import helper, numpy_helper

from onnxfuse import api
from onnxfuse.api import optimize_file, select_rules
from onnxfuse.errors import ModelError
from onnxfuse.files import check_directory, model_io
from onnxfuse.files.model_io import CHECK_PLACEHOLDER, load_model
from onnxfuse.fold import spill
from onnxfuse.passes.normalize import normalize

HIDDEN = 512  # one weight is 1 MiB: the packed Q/K/V (3 MiB) and W_o^T (1 MiB) spill


def _weights(names: tuple[str, ...]) -> list[onnx.TensorProto]:
    rng = np.random.default_rng(0)
    arrays = {n: rng.standard_normal((HIDDEN, HIDDEN)).astype(np.float32) / 20 for n in names}
    arrays["bias"] = rng.standard_normal((2, HIDDEN // 2)).astype(np.float32)
    return [numpy_helper.from_array(a, n) for n, a in arrays.items()]


def _model(kept_weight: bool = True) -> onnx.ModelProto:
    """Folding packs Q, K and V (Concat), transposes W_o (a view of the mapped
    weight) and reshapes a small bias (a small view that stays in memory); a last
    MatMul keeps one external weight as it is (or not: then no weight is left on
    disk and the result is one protobuf)."""
    nodes = [
        helper.make_node("Concat", ["wq", "wk", "wv"], ["qkv_w"], axis=1),
        helper.make_node("MatMul", ["x", "qkv_w"], ["qkv"]),
        helper.make_node("Split", ["qkv"], ["q", "k", "v"], axis=-1, num_outputs=3),
        helper.make_node("Mul", ["q", "k"], ["qk"]),
        helper.make_node("Add", ["qk", "v"], ["h"]),
        helper.make_node("Transpose", ["wo"], ["wo_t"], perm=[1, 0]),
        helper.make_node("MatMul", ["h", "wo_t"], ["o"]),
        helper.make_node("Reshape", ["bias", "bias_shape"], ["b"]),
        helper.make_node("Add", ["o", "b"], ["y" if not kept_weight else "ob"]),
    ]
    names = ("wq", "wk", "wv", "wo")
    if kept_weight:
        nodes.append(helper.make_node("MatMul", ["ob", "w2"], ["y"]))
        names += ("w2",)
    shape = numpy_helper.from_array(np.array([HIDDEN], np.int64), "bias_shape")
    return make_model(
        nodes,
        [tensor_input("x", [2, HIDDEN])],
        [tensor_input("y", [2, HIDDEN])],
        [*_weights(names), shape],
        opset=18,
    )


def _save_external(model: onnx.ModelProto, path: Path) -> Path:
    path.parent.mkdir()
    onnx.save(model, path, save_as_external_data=True, location="model.data", size_threshold=1024)
    return path


@pytest.fixture
def source(tmp_path: Path) -> Path:
    return _save_external(_model(), tmp_path / "src" / "model.onnx")


@pytest.fixture
def temp_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Where the spill directories go: watched for leftovers. The checker's directory,
    one per process until it exits, is made before, elsewhere."""
    check_directory._directory(CHECK_PLACEHOLDER)
    root = tmp_path / "tmp"
    root.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(root))
    return root


@pytest.fixture
def spilled(monkeypatch: pytest.MonkeyPatch) -> list[ir.ExternalTensor]:
    """Every tensor spilled while the test runs."""
    tensors: list[ir.ExternalTensor] = []
    original = spill.SpillArea.spill

    def recording(self, tensor):
        result = original(self, tensor)
        if result is not None:
            tensors.append(result)
        return result

    monkeypatch.setattr(spill.SpillArea, "spill", recording)
    return tensors


def _digest(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.iterdir()}


def _optimize(source: Path, folder: Path) -> Path:
    folder.mkdir()
    out = folder / "model.onnx"
    optimize_file(source, out, select_rules())
    return out


@pytest.mark.parametrize("kept_weight", [True, False])
def test_spilled_output_equals_the_in_memory_one(
    tmp_path, temp_root, spilled, monkeypatch, kept_weight
):
    source = _save_external(_model(kept_weight), tmp_path / "src" / "model.onnx")
    before = _digest(source.parent)
    out = _optimize(source, tmp_path / "spilled")
    assert sorted(t.nbytes for t in spilled) == [HIDDEN * HIDDEN * 4, 3 * HIDDEN * HIDDEN * 4]
    assert list(temp_root.iterdir()) == []  # the spill directory is gone
    assert _digest(source.parent) == before  # the input is never touched
    # Weights still on disk: the result keeps external data, spilled values in it.
    files = ["model.onnx", "model.onnx.data"] if kept_weight else ["model.onnx"]
    assert sorted(p.name for p in out.parent.iterdir()) == files
    optimized = onnx.load(out, load_external_data=False)
    external = [
        i.name for i in optimized.graph.initializer if i.data_location == onnx.TensorProto.EXTERNAL
    ]
    assert len(external) == (4 if kept_weight else 0)  # w2, packed QKV, W_o^T, bias
    assert_same_outputs(onnx.load(source), onnx.load(out))

    # The same optimization with every folded value held in memory: identical files.
    monkeypatch.setattr(api, "spilling", lambda model: contextlib.nullcontext())
    count = len(spilled)
    reference = _optimize(source, tmp_path / "in_memory")
    assert len(spilled) == count
    assert _digest(out.parent) == _digest(reference.parent)


def test_spill_directory_is_removed_when_the_save_fails(
    source, tmp_path, temp_root, spilled, monkeypatch
):
    def full_disk(*args: object) -> None:
        raise ModelError("no space left on the device")

    monkeypatch.setattr(model_io, "_save_with_external_data", full_disk)
    with pytest.raises(ModelError, match="no space left"):
        optimize_file(source, tmp_path / "model.onnx", select_rules())
    assert spilled  # the failure came after folding had spilled
    assert list(temp_root.iterdir()) == []
    assert all(not t._valid for t in spilled)  # unusable rather than dangling


def test_large_folded_values_are_external_tensors_in_the_spill_area(source, temp_root):
    model = load_model(source)
    weights = {name: model.graph.initializers[name].const_value for name in ("wq", "wk", "wv")}
    with spill.spilling(model) as area:
        assert area is not None
        normalize(model)
        packed = [
            v.const_value
            for v in model.graph.initializers.values()
            if v.const_value is not None and v.const_value.nbytes == 3 * HIDDEN * HIDDEN * 4
        ]
        assert len(packed) == 1 and isinstance(packed[0], ir.ExternalTensor)
        assert Path(packed[0].path).parent == area.directory
        expected = np.concatenate([w.numpy() for w in weights.values()], axis=1)
        np.testing.assert_array_equal(packed[0].numpy(), expected)
        directory = area.directory
    assert directory is not None and not directory.exists()


def test_fold_releases_the_mapping_of_its_sources(source, temp_root):
    model = load_model(source)
    weights = [model.graph.initializers[name].const_value for name in ("wq", "wk", "wv")]
    with spill.spilling(model):
        normalize(model)
        # Read by the Concat fold, then unmapped by it.
        assert all(isinstance(w, ir.ExternalTensor) and w.raw is None for w in weights)


def test_models_without_external_weights_spill_only_very_large_values(tmp_path, temp_root, spilled):
    path = tmp_path / "model.onnx"
    onnx.save(_model(), path)
    with spill.spilling(load_model(path)) as area:
        assert area.min_bytes == spill.LARGE_RESULT_BYTES
    out = _optimize(path, tmp_path / "out")
    assert spilled == [] and list(temp_root.iterdir()) == []
    assert [p.name for p in out.parent.iterdir()] == ["model.onnx"]
    assert_same_outputs(onnx.load(path), onnx.load(out))


def test_spilled_values_of_a_model_in_one_protobuf_are_saved_inline(
    tmp_path, temp_root, spilled, monkeypatch
):
    path = tmp_path / "model.onnx"
    onnx.save(_model(), path)
    reference = _optimize(path, tmp_path / "in_memory")
    monkeypatch.setattr(spill, "LARGE_RESULT_BYTES", 1 << 20)
    out = _optimize(path, tmp_path / "spilled")
    assert len(spilled) == 2 and list(temp_root.iterdir()) == []
    assert _digest(out.parent) == _digest(reference.parent)  # one file, same bytes
