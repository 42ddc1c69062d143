"""`onnxfuse check`: the wrong example rule fails with a saved counterexample; the built-in
packs pass; bad input is a one-line error."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import onnx
import pytest
from conftest import REPO_ROOT

from onnxfuse.cli.main import main

WRONG_RULE = REPO_ROOT / "docs" / "examples" / "wrong-rule.yaml"


def run(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_wrong_rule_fails_and_saves_a_counterexample(tmp_path, capsys):
    save = tmp_path / "cex"
    code, out, _ = run(
        capsys, "check", str(WRONG_RULE), "--examples", "20", "--save-dir", str(save)
    )
    assert code == 1, out
    # Numerics is the usual first failure; which check trips first can vary.
    assert "FAIL  gelu-as-sigmoid" in out
    saved = save / "gelu-as-sigmoid.onnx"
    onnx.checker.check_model(onnx.load(str(saved)), full_check=True)
    assert saved.stat().st_size < 10_000
    repro = [line for line in out.splitlines() if line.strip().startswith("reproduce: ")]
    assert len(repro) == 1
    command = repro[0].strip().removeprefix("reproduce: ")
    assert (save / "gelu-as-sigmoid.repro").read_text().strip() == command
    argv = shlex.split(command)
    assert argv[:2] == ["onnxfuse", "check"] and "--replay" in argv
    code, out, _ = run(capsys, *argv[1:])
    assert code == 1 and "still fails" in out


@pytest.mark.parametrize("pack", ["core", "ort", "onnx"])
def test_builtin_packs_hold(pack, tmp_path, capsys):
    folder = REPO_ROOT / "rules" / pack
    # The command over a whole pack folder. One positive instance per rule: with the same
    # seed (0), test_rule_properties proves these instances and 24 more, and the negatives.
    args = ["check", str(folder), "--examples", "1", "--no-negatives", "--save-dir", str(tmp_path)]
    code, out, _ = run(capsys, *args)
    assert code == 0, out
    assert "rule(s) hold" in out
    assert not list(Path(tmp_path).iterdir())


def test_a_rule_without_a_domain_fails(tmp_path, capsys):
    path = tmp_path / "rules.yaml"
    path.write_text(
        "rules:\n"
        "  - name: no-domain\n"
        "    source: |\n"
        "      f (X) => (Y) {\n"
        "        Y = Identity(X)\n"
        "      }\n"
        "    target: |\n"
        "      f (X) => (X) {}\n"
    )
    code, out, _ = run(capsys, "check", str(path), "--save-dir", str(tmp_path / "cex"))
    assert code == 1
    assert "no verification domain" in out


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["check", "no/such/rules.yaml"], "no such rule file"),
        (["check", str(WRONG_RULE), "--rule", "nope"], "no rule named nope"),
        (["check", str(WRONG_RULE), "--examples", "0"], "positive integer"),
        (["check", str(WRONG_RULE), "--target", "nope"], "unknown target"),
        (["check", str(WRONG_RULE), "--replay", "no/such.onnx"], "no such file"),
    ],
)
def test_bad_input_is_one_line(args, fragment, capsys):
    try:
        code = main(args)
    except SystemExit as exc:  # argparse rejects the arguments themselves
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0], err


@pytest.mark.parametrize(
    ("verify", "message"),
    [
        ("inputs: {X: [-1, 3]}", "cannot be evaluated: negative dimensions are not allowed"),
        ("inputs: {X: {value: \"'abc'\"}}", "cannot be evaluated: could not convert string"),
    ],
)
def test_a_domain_no_instance_can_have_fails_the_rule_in_one_line(
    tmp_path, capsys, verify, message
):
    path = tmp_path / "rules.yaml"
    path.write_text(
        "rules:\n"
        "  - name: relu-relu\n"
        '    source: "f (X) => (Y) { T = Relu(X)\\n Y = Relu(T) }"\n'
        '    target: "f (X) => (Y) { Y = Relu(X) }"\n'
        "    verify:\n"
        "      dtypes: [float]\n"
        f"      {verify}\n"
    )
    code, out, err = run(
        capsys, "check", str(path), "--examples", "3", "--save-dir", str(tmp_path / "s")
    )
    assert code == 1 and err == "", err
    (failed,) = [line for line in out.splitlines() if "FAIL" in line]
    assert message in failed


@pytest.mark.parametrize(
    ("verify", "line", "message"),
    [
        ("opsets: [999]\n      inputs: {X: [2]}", 2, "verify: opset 999 is not one onnx knows"),
        (
            "inputs:\n        X: {shape: [2], range: [-1.0, 1.0]}",
            8,
            "verify: inputs.X.range: narrowing the values (which leaves NaN, infinities and "
            "values outside [-1.0, 1.0] out) needs a reason",
        ),
    ],
)
def test_a_malformed_domain_is_bad_input_at_its_line(tmp_path, capsys, verify, line, message):
    path = tmp_path / "rules.yaml"
    path.write_text(
        "rules:\n"
        "  - name: relu-relu\n"
        '    source: "f (X) => (Y) { T = Relu(X)\\n Y = Relu(T) }"\n'
        '    target: "f (X) => (Y) { Y = Relu(X) }"\n'
        "    verify:\n"
        "      dtypes: [float]\n"
        f"      {verify}\n"
    )
    code, _, err = run(capsys, "check", str(path), "--save-dir", str(tmp_path / "s"))
    assert code == 2
    (only,) = err.strip().splitlines()
    assert f"rules.yaml:{line}: rule 'relu-relu': {message}" in only, only


def test_check_leaves_no_hypothesis_files_in_the_working_directory(tmp_path):
    work = tmp_path / "project"
    work.mkdir()
    saved = tmp_path / "saved"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "onnxfuse",
            "check",
            str(WRONG_RULE),
            "--examples",
            "3",
            "--save-dir",
            str(saved),
        ],
        capture_output=True,
        text=True,
        cwd=work,
        env={**os.environ, "ONNXFUSE_CACHE_DIR": str(tmp_path / "cache")},
        timeout=600,
    )
    assert result.returncode == 1, result.stderr
    assert list(work.iterdir()) == []  # no .hypothesis
    assert list(saved.iterdir())  # the failure was saved where asked
