"""Capability files: the committed ones match their sources; gating uses them."""

from __future__ import annotations

import pytest
import yaml

from onnxfuse.errors import OnnxfuseError
from onnxfuse.targets import builtin_target_names, builtin_targets_dir, load_target
from onnxfuse.targets_gen import cpu_ops, onnx_target


def test_cpu_target_agrees_with_the_installed_onnxruntime():
    committed = yaml.safe_load((builtin_targets_dir() / "cpu.yaml").read_text())
    assert committed["ops"] == cpu_ops(), "regenerate with: python -m onnxfuse.targets_gen"


def test_onnx_target_is_generated():
    committed = yaml.safe_load((builtin_targets_dir() / "onnx.yaml").read_text())
    assert committed == onnx_target()


def test_builtin_targets_are_listed():
    assert {"cpu", "onnx"} <= set(builtin_target_names())


@pytest.mark.parametrize(
    ("target", "domain", "op", "opset", "expected"),
    [
        ("cpu", "", "Conv", 17, True),
        ("cpu", "com.microsoft", "FusedConv", 1, True),
        ("cpu", "", "Conv", 0, False),
        ("cpu", "vendor", "Magic", 1, False),
        ("onnx", "", "Anything", 17, True),
        ("onnx", "com.microsoft", "FusedConv", 1, False),
    ],
)
def test_supports(target, domain, op, opset, expected):
    assert load_target(target).supports(domain, op, opset) is expected


def test_unknown_target_is_a_clear_error():
    with pytest.raises(OnnxfuseError, match="unknown target 'nope'"):
        load_target("nope")


def test_a_vendor_target_file(tmp_path):
    path = tmp_path / "npu.yaml"
    path.write_text(
        "name: npu\nops:\n- {domain: '', op: Relu, since: 6, until: null}\n"
        "- {domain: acme, op: FusedThing, since: 1}\n"
    )
    target = load_target(str(path))
    assert target.supports("", "Relu", 17)
    assert target.supports("acme", "FusedThing", 1)
    assert not target.supports("", "Conv", 17)


def test_malformed_target_file(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("name: bad\nops:\n- {since: 1}\n")
    with pytest.raises(OnnxfuseError, match="malformed op entry"):
        load_target(str(path))
