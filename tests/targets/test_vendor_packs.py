"""A vendor's own capability file and rule pack; pack manifests; `onnxfuse targets`."""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from helpers import make_model, tensor_input
from onnx import helper, numpy_helper

from onnxfuse.api import select_rules
from onnxfuse.cli.main import main
from onnxfuse.errors import OnnxfuseError
from onnxfuse.language import packs
from onnxfuse.language.packs import read_manifest
from onnxfuse.passes.pipeline import Options, op_histogram, optimize
from onnxfuse.targets.capabilities import load_target

VENDOR_TARGET = """\
name: acme-npu
description: The Acme NPU (fictional), for tests
source: Acme's op list
ops:
- {domain: '', op: Conv, since: 11, types: {T: [float]},
   limits: {spatial_dims: [2], input_constant: [1, 2]}}
- {domain: '', op: Relu, since: 6, types: {T: [float]}}
- {domain: '', op: BatchNormalization, since: 15}
- domain: acme
  op: ConvRelu
  since: 1
  types: {T: [float]}
  signature: {inputs: [T, T, T], outputs: [T]}
  limits: {spatial_dims: [2], input_constant: [1, 2]}
  notes: Conv with a fused Relu, 2-D only
"""
VENDOR_RULES = """\
rules:
  - name: acme-conv-relu
    description: Conv then Relu runs as one Acme ConvRelu.
    imports: {acme: 1}
    copy_attributes: {C: Y}
    source: |
      conv_relu (X, W, B) => (Y) {
        C = Conv(X, W, B)
        Y = Relu(C)
      }
    target: |
      conv_relu (X, W, B) => (Y) {
        Y = acme.ConvRelu(X, W, B)
      }
    verify:
      opsets: [17]
      dtypes: [float]
      dims: {N: 1..2, XS: {rank: 2, each: 4..6}}
      node_attributes:
        C: {pads: ["[1, 1, 1, 1]", None], strides: ["[1, 1]", "[2, 2]"]}
      inputs:
        X: [N, 3, XS]
        W: {shape: [4, 3, 3, 3], constant: true}
        B: {shape: [4], constant: true}
"""
# What acme.ConvRelu computes, from standard ops: onnxruntime has no kernel for it.
VENDOR_REFERENCE = """\
description: acme.ConvRelu is a Conv (same inputs and attributes) and a Relu.
functions:
  - |
    <domain: "acme", opset_import: ["" : 17]>
    ConvRelu <group, strides, pads, dilations, auto_pad, kernel_shape> (X, W, B) => (Y) {
      C = Conv<group: int = @group, strides: ints = @strides, pads: ints = @pads,
               dilations: ints = @dilations, auto_pad: string = @auto_pad,
               kernel_shape: ints = @kernel_shape>(X, W, B)
      Y = Relu(C)
    }
"""
VENDOR_MANIFEST = """\
description: Fusions for the Acme NPU.
targets: [acme-npu]
replaces: [ort]
extends: [core]
"""


@pytest.fixture(autouse=True)
def no_packs_loaded_before(monkeypatch):
    # The reference folders of the packs a run loads stay for the run: one per test here.
    monkeypatch.setattr(packs, "_LOADED_REFERENCE_FOLDERS", {})


@pytest.fixture
def vendor(tmp_path: Path) -> tuple[Path, Path]:
    target = tmp_path / "acme-npu.yaml"
    target.write_text(VENDOR_TARGET)
    pack = tmp_path / "acme"
    pack.mkdir()
    (pack / "pack.yaml").write_text(VENDOR_MANIFEST)
    (pack / "fusions.yaml").write_text(VENDOR_RULES)
    return target, pack


def conv_relu_model(dtype=np.float32, spatial: int = 2) -> onnx.ModelProto:
    rng = np.random.default_rng(5)
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    inits = [
        numpy_helper.from_array(rng.standard_normal([4, 3, *[3] * spatial]).astype(dtype), "w"),
        numpy_helper.from_array(rng.standard_normal([4]).astype(dtype), "b"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", pads=[1] * 2 * spatial),
        helper.make_node("Relu", ["c"], ["y"], name="relu"),
    ]
    shape = [1, 3, *[6] * spatial]
    return make_model(
        nodes,
        [tensor_input("x", shape, elem)],
        [tensor_input("y", [1, 4, *[6] * spatial], elem)],
        inits,
    )


def _ops(model: onnx.ModelProto, rules, target) -> dict[str, int]:
    result = ir.from_proto(model)
    optimize(result, rules, Options(target=target))
    return op_histogram(result)


def test_vendor_rules_fire_for_the_vendor_target_only(vendor):
    target_path, pack = vendor
    acme = load_target(str(target_path))
    rules = select_rules([pack], target=acme)
    names = {r.name for r in rules}
    assert "acme-conv-relu" in names
    assert not any(r.pack == "ort" for r in rules)  # replaced
    assert any(r.pack == "core" for r in rules)  # extended
    assert _ops(conv_relu_model(), rules, acme) == {"acme::ConvRelu": 1}
    # the vendor's limits and types still apply to its own rules
    assert _ops(conv_relu_model(spatial=1), rules, acme) == {"Conv": 1, "Relu": 1}
    assert _ops(conv_relu_model(np.float16), rules, acme) == {"Conv": 1, "Relu": 1}

    for other in ("onnx", "coreml"):
        assert select_rules([pack], builtin=False, target=other) == []  # the pack is for acme
    cpu_rules = select_rules([pack], target="cpu")
    assert "acme-conv-relu" not in {r.name for r in cpu_rules}
    assert any(r.pack == "ort" for r in cpu_rules)  # nothing replaced: the pack is inactive
    assert _ops(conv_relu_model(), cpu_rules, load_target("cpu")) == {"com.microsoft::FusedConv": 1}


def test_a_vendor_pack_without_a_target_name_in_its_manifest_applies_everywhere(tmp_path):
    pack = tmp_path / "mine"
    pack.mkdir()
    (pack / "fusions.yaml").write_text(VENDOR_RULES)
    assert read_manifest(pack).targets is None
    cpu_rules = select_rules([pack], builtin=False, target="cpu")
    assert [r.name for r in cpu_rules] == ["acme-conv-relu"]
    # ...and capability gating still keeps the acme op off targets without it
    assert _ops(conv_relu_model(), cpu_rules, load_target("cpu")) == {"Conv": 1, "Relu": 1}


def test_extends_brings_in_a_builtin_pack_left_out(vendor):
    target_path, pack = vendor
    rules = select_rules([pack], builtin=False, target=str(target_path))
    assert {r.pack for r in rules} == {"core", "acme"}


def test_the_command_line_with_a_vendor_target_and_pack(vendor, tmp_path, capsys):
    target_path, pack = vendor
    source, output = tmp_path / "in.onnx", tmp_path / "out.onnx"
    onnx.save(conv_relu_model(), source)
    args = [str(source), "-o", str(output), "--target", str(target_path), "--rules", str(pack)]
    args.append("--no-builtin")  # the pack extends core: that one is loaded all the same
    assert main(["optimize", *args, "-q"]) == 0
    assert [n.op_type for n in onnx.load(output).graph.node] == ["ConvRelu"]
    capsys.readouterr()
    listing = ["rules", "list", "--no-builtin", "--rules", str(pack), "--target"]
    assert main([*listing, str(target_path)]) == 0
    assert "acme-conv-relu" in capsys.readouterr().out
    assert main([*listing, "cpu"]) == 0
    assert "acme-conv-relu" not in capsys.readouterr().out
    assert main(["targets", "show", str(target_path), "--op", "acme::ConvRelu"]) == 0
    shown = capsys.readouterr().out
    assert "T: float" in shown and "2-D only" in shown


def test_targets_list_and_show(capsys):
    assert main(["targets", "list"]) == 0
    listed = capsys.readouterr().out
    for name in ("cpu", "cuda", "coreml", "nnapi", "qnn", "tensorrt", "webnn", "onnx"):
        assert f"\n{name} " in listed
    assert "12 targets" in listed
    assert main(["targets", "show", "coreml", "--op", "Conv"]) == 0
    shown = capsys.readouterr().out
    assert "limit spatial_dims: [1, 2]" in shown and "bias must be constant" in shown
    assert main(["targets", "show", "nnapi"]) == 0
    assert "ops" in capsys.readouterr().out.splitlines()[-1]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["targets", "show", "nope"], "unknown target 'nope'"),
        (["targets", "show", "nnapi", "--op", "Gelu"], "does not list op 'Gelu'"),
        (["targets", "show", "missing.yaml"], "cannot read target file"),
        (["optimize", "--target", "nope"], "unknown target 'nope'"),
    ],
)
def test_targets_errors_are_one_line_and_exit_2(args, message, capsys):
    assert main(args) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def _manifest_error(tmp_path: Path, manifest: str) -> str:
    pack = tmp_path / "bad"
    pack.mkdir()
    (pack / "pack.yaml").write_text(manifest)
    (pack / "fusions.yaml").write_text(VENDOR_RULES)
    with pytest.raises(OnnxfuseError) as raised:
        select_rules([pack], builtin=False, target="cpu")
    return str(raised.value)


@pytest.mark.parametrize(
    ("manifest", "message"),
    [
        ("targets: [cpu]\ncolour: red\n", r"pack.yaml:2: unknown key 'colour'"),
        ("targets: 3\n", r"pack.yaml:1: 'targets' must be a list of names"),
        ("- cpu\n", r"pack.yaml:1: a pack manifest is a mapping"),
        ("targets: [cpu\n", r"pack.yaml:\d+: malformed YAML"),
        ("replaces: [nope]\n", r"pack 'bad' replaces 'nope', which is no pack here"),
        ("extends: [nope]\n", r"pack 'bad' extends 'nope', which is neither selected"),
        ("replaces: [core]\nextends: [core]\n", r"extends 'core', which another pack replaces"),
    ],
)
def test_bad_manifests_name_file_and_line(tmp_path, manifest, message):
    import re

    assert re.search(message, _manifest_error(tmp_path, manifest))


def test_bad_manifest_on_the_command_line(tmp_path, capsys):
    pack = tmp_path / "bad"
    pack.mkdir()
    (pack / "pack.yaml").write_text("targets: [cpu]\ncolour: red\n")
    (pack / "fusions.yaml").write_text(VENDOR_RULES)
    assert main(["rules", "list", "--no-builtin", "--rules", str(pack)]) == 2
    err = capsys.readouterr().err.strip()
    known = "description, targets, replaces, extends, phase, reuses"
    assert err.endswith(f"pack.yaml:2: unknown key 'colour' (known: {known})")
    assert len(err.splitlines()) == 1


def test_bad_target_file_on_the_command_line(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        textwrap.dedent("""\
        name: bad
        ops:
        - op: Relu
          limits: {max_rnk: 4}
        """)
    )
    assert main(["optimize", "--target", str(bad), "-q"]) == 2
    err = capsys.readouterr().err.strip()
    assert "bad.yaml:4: op 'Relu' limits: unknown limit 'max_rnk'" in err
    assert len(err.splitlines()) == 1


def test_explain_names_a_rule_its_target_leaves_out(vendor, tmp_path, capsys):
    target_path, pack = vendor
    source = tmp_path / "in.onnx"
    onnx.save(conv_relu_model(), source)
    explain = ["explain", str(source), "--rules", str(pack), "--rule"]
    assert main([*explain, "acme-conv-relu", "--target", "cpu"]) == 2
    assert capsys.readouterr().err.strip() == (
        "onnxfuse: error: rule 'acme-conv-relu' is in pack 'acme', which is only for "
        "target(s) acme-npu, not 'cpu' (give --target acme-npu)"
    )
    assert main([*explain, "fused-conv-relu", "--target", str(target_path)]) == 2
    assert capsys.readouterr().err.strip() == (
        "onnxfuse: error: rule 'fused-conv-relu' is in pack 'ort', which pack 'acme' "
        "replaces on target 'acme-npu'"
    )


def test_targets_coverage_with_a_vendor_target_and_pack(vendor, tmp_path, capsys):
    target_path, pack = vendor
    source = tmp_path / "in.onnx"
    onnx.save(conv_relu_model(spatial=1), source)  # 1-D: beyond the NPU's stated limits
    args = ["targets", "coverage", str(source), "--target", str(target_path), "--rules", str(pack)]
    assert main(args) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "before optimizing: 2 nodes, 1 not covered (Conv 1), 1 partition (1 nodes)"
    assert "  not covered: Conv 'conv': Conv (1 spatial dims, not one of [2])" in out


def test_check_proves_a_vendor_op_with_the_packs_reference_definition(vendor, capsys):
    target_path, pack = vendor
    args = ["check", str(pack), "--target", str(target_path), "--examples", "5"]
    assert main([*args, "--save-dir", str(pack.parent / "cex")]) == 1
    out = capsys.readouterr().out
    assert "acme:ConvRelu(-1) is not a registered function/op" in out
    assert "give it a reference definition" in out and "reference/*.yaml" in out
    (pack / "reference").mkdir()
    (pack / "reference" / "conv_relu.yaml").write_text(VENDOR_REFERENCE)
    assert main([*args, "--save-dir", str(pack.parent / "cex")]) == 0
    assert "ok    acme-conv-relu" in capsys.readouterr().out


def test_plan_verify_runs_a_vendor_op_as_the_packs_reference_definition(vendor, tmp_path, capsys):
    target_path, pack = vendor
    source, output = tmp_path / "in.onnx", tmp_path / "out.onnx"
    onnx.save(conv_relu_model(), source)
    args = [str(source), "-o", str(output), "--target", str(target_path), "--rules", str(pack)]
    assert main(["optimize", *args, "-q"]) == 0
    (pack / "reference").mkdir()
    (pack / "reference" / "conv_relu.yaml").write_text(VENDOR_REFERENCE)
    capsys.readouterr()
    assert main(["plan", str(output), "--verify", "--rules", str(pack)]) == 0
    assert "verify: outputs match onnxruntime" in capsys.readouterr().out


def test_plan_verify_without_a_definition_says_how_to_give_one(vendor, tmp_path, capsys):
    target_path, pack = vendor
    source, output = tmp_path / "in.onnx", tmp_path / "out.onnx"
    onnx.save(conv_relu_model(), source)
    args = [str(source), "-o", str(output), "--target", str(target_path), "--rules", str(pack)]
    assert main(["optimize", *args, "-q"]) == 0
    capsys.readouterr()
    assert main(["plan", str(output), "--verify"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "no kernel for acme.ConvRelu" in line and "name that pack with --rules" in line


def test_the_fuzz_oracle_runs_a_vendor_op_once_its_pack_is_loaded(vendor):
    from onnxfuse.fuzz import oracle

    _, pack = vendor
    (pack / "reference").mkdir()
    (pack / "reference" / "conv_relu.yaml").write_text(VENDOR_REFERENCE)
    model = conv_relu_model()
    model.graph.node.pop()
    conv = model.graph.node[0]
    conv.op_type, conv.domain, conv.output[0] = "ConvRelu", "acme", "y"
    model.opset_import.add(domain="acme", version=1)
    feeds = [("normal", {"x": np.ones([1, 3, 6, 6], np.float32)})]
    with pytest.raises(Exception, match="ConvRelu"):
        oracle.run_all(model.SerializeToString(), feeds)
    packs.load_packs([pack])
    (outputs,) = oracle.run_all(model.SerializeToString(), feeds)
    assert outputs[0].shape == (1, 4, 6, 6) and np.all(outputs[0] >= 0)


def test_a_builtin_pack_loaded_by_its_own_path_defines_its_ops_once():
    from onnxfuse.proof.reference_ops import reference_functions

    packs.load_packs([Path(__file__).resolve().parents[2] / "rules" / "nhwc"])
    assert ("com.microsoft", "NhwcConv") in reference_functions()
