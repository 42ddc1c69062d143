"""Target profiles: the format round-trips, a match is decided by the measurement at its
facts, a profile measuring a rule slower skips it and the report names it, a bad file is
one line with its line number."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from helpers import make_model, residual_norm, tensor_input
from onnx import helper, numpy_helper

from onnxfuse.api import select_rules
from onnxfuse.errors import OnnxfuseError, SourceError
from onnxfuse.passes.pipeline import Options, op_histogram, optimize
from onnxfuse.targets.capabilities import load_target
from onnxfuse.targets.profile import Measurement, Profile, dump_profile, load_profile

SKIP_LN = "com.microsoft::SkipLayerNormalization"
# The facts ort-skip-layer-norm's match has in residual_norm(): what calibrate records.
FACTS = {
    "X": "float[2,16,128]",
    "skip": "float[2,16,128]",
    "gamma": "float[128]",
    "beta": "float[128]",
}


def measured(ratio: float, facts=FACTS, rule="ort-skip-layer-norm") -> Measurement:
    return Measurement(rule, 0, dict(facts), "[2, 16, 128]", 10.0, 10.0 * ratio)


def write_profile(path: Path, *measurements: Measurement, target: str = "cpu") -> Path:
    path.write_text(dump_profile(Profile(target, list(measurements))), encoding="utf-8")
    return path


def fused(model: onnx.ModelProto, target: str):
    result = ir.from_proto(model)
    report = optimize(result, select_rules(target=target), Options(target=load_target(target)))
    return op_histogram(result), report


def test_a_profile_round_trips(tmp_path):
    profile = Profile(
        "cpu",
        [
            Measurement(
                "ort-skip-layer-norm",
                1,
                dict(FACTS),
                "[2, 16, 128]",
                17.9,
                34.7,
                dims={"batch": 2},
                model="bert.onnx",
                paired_ratio=1.9,
            )
        ],
        provider="CPUExecutionProvider",
        machine={"cpu": "AMD EPYC", "flags": ["avx2", "avx512f"]},
        onnxruntime="1.32.0",
        date="2026-12-02T02:00:00Z",
        settings={"threads": 1, "level": "disable", "runs": 30, "warmup": 3},
    )
    path = tmp_path / "cpu.yaml"
    path.write_text(dump_profile(profile), encoding="utf-8")
    loaded = load_profile(path)
    assert loaded.measurements == profile.measurements
    assert loaded.machine == profile.machine and loaded.settings == profile.settings
    assert (loaded.target, loaded.provider, loaded.onnxruntime, loaded.date) == (
        "cpu",
        "CPUExecutionProvider",
        "1.32.0",
        "2026-12-02T02:00:00Z",
    )
    assert loaded.measurements[0].ratio == 1.9  # the rounds' median, as measured
    assert measured(3.7).ratio == pytest.approx(3.7)  # without one: fused over unfused


def test_a_match_is_decided_by_its_own_facts_then_by_compatible_ones():
    faster = measured(0.5, {**FACTS, "X": "float[1,128,128]", "skip": "float[1,128,128]"})
    profile = Profile("cpu", [measured(3.7), faster])
    assert profile.lookup("ort-skip-layer-norm", 0, FACTS).slower
    assert not profile.lookup("ort-skip-layer-norm", 0, faster.inputs).slower
    # A symbolic dim equals any measured size; a static one must be equal.
    symbolic = {**FACTS, "X": "float[batch,seq,128]", "skip": "float[batch,seq,128]"}
    assert profile.lookup("ort-skip-layer-norm", 0, symbolic) is None  # they disagree
    only_slower = Profile("cpu", [measured(3.7)])
    assert only_slower.lookup("ort-skip-layer-norm", 0, symbolic).slower
    assert only_slower.lookup("ort-bias-gelu", 0, FACTS) is None  # not measured


def test_plain_cpu_leaves_skip_layer_norm_to_a_profile_and_cuda_fuses(tmp_path):
    ops, report = fused(residual_norm(), "cpu")
    assert SKIP_LN not in ops and ops["LayerNormalization"] == 1
    stats = report.rules["ort-skip-layer-norm"]
    assert stats.applied == 0 and stats.blocked >= 1
    assert "target profile" in stats.blocked_reason
    cuda, _ = fused(residual_norm(), "cuda")
    assert cuda[SKIP_LN] == 1


def test_a_profile_measuring_a_fusion_slower_skips_it_and_the_report_says_so(tmp_path):
    path = write_profile(tmp_path / "slow.yaml", measured(3.7))
    ops, report = fused(residual_norm(), f"cpu:profile={path}")
    assert SKIP_LN not in ops
    stats = report.rules["ort-skip-layer-norm"]
    assert stats.applied == 0 and stats.blocked >= 1
    assert stats.blocked_reason.startswith("measured 3.70x slower at [2, 16, 128]")
    assert str(path) in stats.blocked_reason


def test_a_profile_measuring_it_faster_lets_it_fire(tmp_path):
    path = write_profile(tmp_path / "fast.yaml", measured(0.5))
    ops, report = fused(residual_norm(), f"cpu:profile={path}")
    assert ops[SKIP_LN] == 1
    assert report.rules["ort-skip-layer-norm"].blocked == 0


def test_a_rule_the_profile_does_not_measure_fires_as_its_benefit_says(tmp_path):
    # The Gelu rules need no measurement: a profile of another rule leaves them alone.
    path = write_profile(tmp_path / "other.yaml", measured(3.7))
    hidden = 8
    bias = numpy_helper.from_array(np.ones(hidden, np.float32), "bias")
    half = numpy_helper.from_array(np.array(0.5, np.float32), "half")
    one = numpy_helper.from_array(np.array(1.0, np.float32), "one")
    root = numpy_helper.from_array(np.array(1.4142135, np.float32), "root")
    nodes = [
        helper.make_node("Add", ["x", "bias"], ["b"]),
        helper.make_node("Div", ["b", "root"], ["d"]),
        helper.make_node("Erf", ["d"], ["e"]),
        helper.make_node("Add", ["e", "one"], ["f"]),
        helper.make_node("Mul", ["b", "f"], ["g"]),
        helper.make_node("Mul", ["g", "half"], ["y"]),
    ]
    model = make_model(
        nodes,
        [tensor_input("x", [2, hidden])],
        [tensor_input("y", [2, hidden])],
        [bias, half, one, root],
        opset=17,
    )
    with_profile, _ = fused(model, f"cpu:profile={path}")
    plain, _ = fused(model, "cpu")
    assert with_profile.get("com.microsoft::BiasGelu") == plain.get("com.microsoft::BiasGelu") == 1


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "onnxfuse", *args], capture_output=True, text=True, timeout=300
    )


def test_the_terminal_and_json_reports_name_the_skipped_fusion(tmp_path):
    model = tmp_path / "m.onnx"
    onnx.save(residual_norm(), model)
    path = write_profile(tmp_path / "slow.yaml", measured(3.7))
    report = tmp_path / "r.json"
    done = run_cli(
        "optimize", str(model), "--target", f"cpu:profile={path}", "--report-json", str(report)
    )
    assert done.returncode == 0, done.stderr
    assert "blocked: ort-skip-layer-norm (" in done.stdout
    assert "measured 3.70x slower at [2, 16, 128]" in done.stdout
    rules = json.loads(report.read_text())["rules"]
    assert rules["ort-skip-layer-norm"]["blocked_reason"].startswith("measured 3.70x slower")


@pytest.mark.parametrize(
    ("text", "line", "fragment"),
    [
        (
            "profile: 1\ntarget: cpu\nmeasurements:\n- rule: r\n  inputs: {}\n  at: x\n"
            "  unfused_us: 1\n  fused_us: -2\n",
            8,
            "fused_us",
        ),
        ("profile: 1\ntarget: cpu\nmeasurements: []\ncolour: red\n", 4, "unknown key 'colour'"),
        ("profile: 2\ntarget: cpu\nmeasurements: []\n", 1, "profile: 1"),
        ("profile: 1\ntarget: cpu\nmeasurements:\n- rule: r\n  at: x\n", 4, "lacks 'inputs'"),
        ("profile: 1\ntarget: [cpu\n", 3, "malformed YAML"),
    ],
)
def test_a_bad_profile_is_one_line_with_file_and_line_and_exit_2(tmp_path, text, line, fragment):
    path = tmp_path / "bad.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(SourceError) as caught:
        load_profile(path)
    assert caught.value.line == line, str(caught.value)
    model = tmp_path / "m.onnx"
    onnx.save(residual_norm(), model)
    done = run_cli("optimize", str(model), "--target", f"cpu:profile={path}")
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert f"{path}:{line}" in lines[0] and fragment in lines[0], lines[0]


def test_a_profile_for_another_target_is_refused(tmp_path):
    path = write_profile(tmp_path / "cuda.yaml", measured(3.7), target="cuda")
    with pytest.raises(OnnxfuseError, match="for target 'cuda', not 'cpu'"):
        load_target(f"cpu:profile={path}")
