"""The same input and rules give the same output, byte for byte."""

from __future__ import annotations

from onnxfuse.api import optimize_file, sample_model_path, select_rules


def test_optimizing_twice_gives_identical_bytes(tmp_path):
    rules = select_rules()
    first, second = tmp_path / "a.onnx", tmp_path / "b.onnx"
    optimize_file(sample_model_path(), first, rules)
    optimize_file(sample_model_path(), second, select_rules())
    assert first.read_bytes() == second.read_bytes()
