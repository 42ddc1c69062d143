"""`onnxfuse targets calibrate` end to end: the profile it writes (its structure, not its
timings, which depend on the machine) and its one-line errors."""

from __future__ import annotations

import subprocess
import sys

import onnx
import pytest
import yaml
from helpers import residual_norm

from onnxfuse.targets.profile import load_profile

QUICK = ("--runs", "2", "--warmup", "1", "-q")


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "onnxfuse", *args], capture_output=True, text=True, timeout=300
    )


@pytest.fixture
def model(tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save(residual_norm(), path)
    return path


def test_calibrate_times_the_matches_of_a_model_and_writes_a_profile(tmp_path, model):
    out = tmp_path / "cpu.yaml"
    done = run_cli("targets", "calibrate", "cpu", str(model), "-o", str(out), *QUICK)
    assert done.returncode == 0, done.stderr
    data = yaml.safe_load(out.read_text())
    assert data["profile"] == 1 and data["target"] == "cpu"
    assert data["provider"] == "CPUExecutionProvider"
    assert set(data["machine"]) == {"cpu", "flags", "platform"}
    assert data["onnxruntime"] and data["date"].endswith("Z")
    assert data["settings"] == {"threads": 1, "level": "disable", "runs": 2, "warmup": 1}
    # The fused op optimize makes here first; then any rule its skipping would expose.
    entry = data["measurements"][0]
    assert entry["rule"] == "ort-skip-layer-norm" and entry["model"] == "m.onnx"
    assert entry["inputs"]["X"] == "float[2,16,128]" and entry["at"] == "[2, 16, 128]"
    assert entry["unfused_us"] > 0 and entry["fused_us"] > 0
    assert entry["ratio"] > 0
    load_profile(out)  # what it writes, it reads
    used = run_cli("optimize", str(model), "--target", f"cpu:profile={out}", "-q")
    assert used.returncode == 0, used.stderr


def test_calibrate_without_a_model_draws_from_the_verify_domain(tmp_path):
    done = run_cli("targets", "calibrate", "cpu", "--rule", "ort-skip-layer-norm", *QUICK)
    assert done.returncode == 0, done.stderr
    (entry,) = yaml.safe_load(done.stdout)["measurements"]
    assert entry["rule"] == "ort-skip-layer-norm" and "model" not in entry


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (("--dim", "heads=4"), "--dim heads: not a dim of the models' inputs"),
        (("--rule", "no-such-rule"), "--rule: no rule named no-such-rule"),
    ],
)
def test_calibrate_errors_are_one_line(model, args, fragment):
    done = run_cli("targets", "calibrate", "cpu", str(model), *args, *QUICK)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0], done.stderr
