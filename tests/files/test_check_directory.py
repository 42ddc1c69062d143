"""The private directory where models with placeholder weights are checked by path."""

from __future__ import annotations

import shutil
from pathlib import Path

import onnx
from onnx import helper

from onnxfuse.files.check_directory import check_by_path

PLACEHOLDER = "placeholder-for-test"


def _model() -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2])
    y = helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y])
    return helper.make_model(graph)


def _seen(path: Path) -> tuple[Path, bytes, bool]:
    return path, path.read_bytes(), (path.parent / PLACEHOLDER).is_file()


def test_model_written_beside_the_placeholder_then_removed() -> None:
    model = _model()
    seen: list[tuple[Path, bytes, bool]] = []
    assert check_by_path(model, PLACEHOLDER, lambda p: seen.append(_seen(p))) is None
    path, data, placeholder_there = seen[0]
    assert data == model.SerializeToString()
    assert placeholder_there
    assert not path.exists()


def test_checks_share_one_directory_and_remake_it_once_removed() -> None:
    model = _model()
    seen: list[tuple[Path, bytes, bool]] = []
    check_by_path(model, PLACEHOLDER, lambda p: seen.append(_seen(p)))
    check_by_path(model, PLACEHOLDER, lambda p: seen.append(_seen(p)))
    assert seen[0][0].parent == seen[1][0].parent
    shutil.rmtree(seen[0][0].parent)  # as a temp-directory cleaner would
    check_by_path(model, PLACEHOLDER, lambda p: seen.append(_seen(p)))
    assert seen[2][0].parent != seen[0][0].parent
    assert seen[2][2]


def test_the_check_verdict_is_returned() -> None:
    assert check_by_path(_model(), PLACEHOLDER, lambda p: "bad model") == "bad model"
