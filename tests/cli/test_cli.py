"""The command line: reports, rule files from users, and bad input handled cleanly."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from helpers import assert_same_outputs, make_model, relu_relu_rule, tensor_input
from onnx import helper, numpy_helper

from onnxfuse.cli.main import main
from onnxfuse.errors import InvariantError

X = [2, 3, 4]


def run_cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "onnxfuse", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=300,
    )


def assert_clean_error(result: subprocess.CompletedProcess, *fragments: str) -> None:
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


@pytest.fixture
def relu_model(tmp_path: Path) -> Path:
    nodes = [
        helper.make_node("Relu", ["x"], ["t"], name="a"),
        helper.make_node("Relu", ["t"], ["u"], name="b"),
        helper.make_node("Sigmoid", ["u"], ["y"], name="c"),
    ]
    path = tmp_path / "relu.onnx"
    onnx.save(make_model(nodes, [tensor_input("x", X)], [tensor_input("y", X)]), path)
    return path


USER_RULE = relu_relu_rule("my-relu-relu", "a user's own rule, no code")


def test_a_new_rule_file_fires_without_code(tmp_path, relu_model):
    rules = tmp_path / "mine.yaml"
    rules.write_text(USER_RULE)
    out, report = tmp_path / "out.onnx", tmp_path / "report.json"
    result = run_cli(
        "optimize", str(relu_model), "-o", str(out), "--rules", str(rules), "--no-builtin",
        "--report-json", str(report),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    data = json.loads(report.read_text())
    assert data["rules"]["my-relu-relu"]["applied"] == 1
    assert {"nodes_before", "nodes_after", "iterations", "seconds", "rules"} <= set(data)
    assert data["nodes_before"] == 3 and data["nodes_after"] == 2
    assert "my-relu-relu" in result.stdout
    assert_same_outputs(onnx.load(relu_model), onnx.load(out))


def test_default_run_optimizes_the_bundled_sample(capsys):
    assert main(["optimize"]) == 0
    text = capsys.readouterr().out
    assert "sample_resnet.onnx" in text and "nodes 33 ->" in text


def test_rules_list_names_builtin_rules(capsys):
    assert main(["rules", "list"]) == 0
    text = capsys.readouterr().out
    assert "conv-bn-fold" in text and "fused-conv-relu" in text


def test_disable_a_rule(tmp_path, relu_model, capsys):
    rules = tmp_path / "mine.yaml"
    rules.write_text(USER_RULE)
    code = main(["optimize", str(relu_model), "--rules", str(rules), "--disable", "my-relu-relu"])
    assert code == 0
    assert "my-relu-relu" not in capsys.readouterr().out


FAMILY_RULE = """\
rules:
  - name: twice
    ops: {Op: [Relu, Sigmoid]}
    description: an op-set family
    source: |
      f (X) => (Y) {
        T = Op(X)
        Y = Op(T)
      }
    target: |
      f (X) => (Y) {
        Y = Op(X)
      }
"""


def test_disable_and_explain_take_an_op_set_family(tmp_path, relu_model, capsys):
    rules = tmp_path / "family.yaml"
    rules.write_text(FAMILY_RULE)
    common = ["--no-builtin", "--rules", str(rules)]
    out = tmp_path / "out.onnx"
    assert main(["optimize", str(relu_model), "-o", str(out), *common]) == 0
    assert "twice[Relu]" in capsys.readouterr().out
    assert main(["optimize", str(relu_model), "-o", str(out), *common, "--disable", "twice"]) == 0
    assert "twice[" not in capsys.readouterr().out
    assert main(["explain", str(relu_model), *common, "--rule", "twice"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert "twice[Relu]: Relu 'b': matches" in lines
    assert any(line.startswith("twice[Sigmoid]: Sigmoid 'c': no match") for line in lines)


def test_explain_names_the_failed_constraint(tmp_path, relu_model, capsys):
    rules = tmp_path / "mine.yaml"
    rules.write_text(USER_RULE)
    code = main(
        [
            "explain",
            str(relu_model),
            "--no-builtin",
            "--rules",
            str(rules),
            "--rule",
            "my-relu-relu",
        ]
    )
    assert code == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines == [
        "Relu 'a': no match: input 0 of Relu -> Y: 'x' has no producer (expected T)",
        "Relu 'b': matches",
    ]


def test_input_is_never_modified_and_output_is_atomic(tmp_path, relu_model):
    before = hashlib.sha256(relu_model.read_bytes()).hexdigest()
    out = tmp_path / "out.onnx"
    assert run_cli("optimize", str(relu_model), "-o", str(out)).returncode == 0
    assert hashlib.sha256(relu_model.read_bytes()).hexdigest() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.onnx", "relu.onnx"]


def test_output_gets_the_mode_a_new_file_gets(tmp_path, relu_model):
    # The writer goes through a private temporary file; the result must not stay private.
    out = tmp_path / "out.onnx"
    assert run_cli("optimize", str(relu_model), "-o", str(out)).returncode == 0
    plain = tmp_path / "plain"
    plain.write_bytes(b"")
    assert out.stat().st_mode & 0o777 == plain.stat().st_mode & 0o777


def test_refuses_to_overwrite_the_input(relu_model):
    before = relu_model.read_bytes()
    result = run_cli("optimize", str(relu_model), "-o", str(relu_model))
    assert_clean_error(result, "refusing to overwrite the input")
    assert relu_model.read_bytes() == before


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        (None, "no such file"),
        (b"", "empty file"),
        (b"this is not a model", "not a readable ONNX model"),
    ],
)
def test_bad_model_files(tmp_path, content, fragment):
    path = tmp_path / "bad.onnx"
    if content is not None:
        path.write_bytes(content)
    out = tmp_path / "out.onnx"
    assert_clean_error(run_cli("optimize", str(path), "-o", str(out)), fragment)
    assert not out.exists()


@pytest.mark.parametrize(
    ("name", "content", "fragment"),
    [
        ("bad.json", b"{garbage", "not a readable ONNX model (Failed to load JSON"),
        ("bad.onnxtxt", b"this is not onnx text {{{", "not a readable ONNX model ([ParseError"),
        ("bad.textproto", b"garbage: 1", 'no field named "garbage"'),
    ],
)
def test_bad_text_format_models(tmp_path, name, content, fragment):
    path = tmp_path / name
    path.write_bytes(content)
    assert_clean_error(run_cli("optimize", str(path)), f"{name}: ", fragment)


def test_a_text_format_model_is_checked_as_read(tmp_path):
    # The checker reads a file by path as binary protobuf: a text model is checked
    # from memory, and its warning that the format is experimental is not printed.
    path = tmp_path / "ok.onnxtxt"
    path.write_text(
        '<ir_version: 8, opset_import: ["" : 17]>\n'
        "g (float[1,4] x) => (float[1,4] y) {\n [a] r = Relu (x)\n [b] y = Relu (r)\n}\n"
    )
    result = run_cli("optimize", str(path), "-o", str(tmp_path / "out.onnx"), "-q")
    assert result.returncode == 0 and result.stderr == "", result.stderr
    assert [n.op_type for n in onnx.load(tmp_path / "out.onnx").graph.node] == ["Relu"]


def test_a_cycle_and_an_impossible_opset_are_one_line(tmp_path):
    cycle = [
        helper.make_node("Add", ["x", "b"], ["a"], name="p"),
        helper.make_node("Relu", ["a"], ["b"], name="q"),
        helper.make_node("Relu", ["b"], ["y"], name="r"),
    ]
    graph = helper.make_graph(cycle, "g", [tensor_input("x", X)], [tensor_input("y", X)])
    path = tmp_path / "cycle.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    assert_clean_error(
        run_cli("optimize", str(path)), "cycle.onnx: fails the ONNX checker: its nodes form a cycle"
    )
    model = make_model(
        [helper.make_node("Relu", ["x"], ["y"])], [tensor_input("x", X)], [tensor_input("y", X)]
    )
    model.opset_import[0].version = 2**62
    onnx.save(model, tmp_path / "opset.onnx")
    assert_clean_error(
        run_cli("optimize", str(tmp_path / "opset.onnx")),
        f"opset version {2**62} of '' is out of range",
    )


def test_folding_into_strings_and_back(tmp_path):
    """A constant cast to strings folds to a string tensor that later passes read."""
    nodes = [
        helper.make_node("Cast", ["c"], ["s"], to=onnx.TensorProto.STRING),
        helper.make_node("Cast", ["s"], ["f"], to=onnx.TensorProto.FLOAT),
        helper.make_node("Add", ["x", "f"], ["y"]),
    ]
    constant = numpy_helper.from_array(np.array([1.5, 2.0], np.float32), "c")
    model = make_model(nodes, [tensor_input("x", [2])], [tensor_input("y", [2])], [constant])
    source, out = tmp_path / "strings.onnx", tmp_path / "out.onnx"
    onnx.save(model, source)
    result = run_cli("optimize", str(source), "-o", str(out), "-q")
    assert result.returncode == 0, result.stderr
    assert [n.op_type for n in onnx.load(out).graph.node] == ["Add"]
    assert_same_outputs(model, onnx.load(out))
    result = run_cli("plan", str(source))
    assert result.returncode == 2
    assert result.stderr.startswith(
        "onnxfuse: error: constant 's' made by Cast node 's' is a string tensor: its size"
    )


def test_truncated_model(tmp_path, relu_model):
    path = tmp_path / "truncated.onnx"
    path.write_bytes(relu_model.read_bytes()[:40])
    assert_clean_error(run_cli("optimize", str(path)), "truncated.onnx")


def test_model_failing_the_checker(tmp_path):
    node = helper.make_node("Relu", ["missing"], ["y"], name="r")
    graph = helper.make_graph([node], "g", [tensor_input("x", X)], [tensor_input("y", X)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    path = tmp_path / "invalid.onnx"
    onnx.save(model, path)
    assert_clean_error(run_cli("optimize", str(path)), "fails the ONNX checker")


RULE_ERRORS = [
    ("rules: [\n  - name: x\n    source: |\n  bad: [", "mine.yaml:", "malformed YAML"),
    (USER_RULE.replace("Relu(T)", "Frobnicate(T)"), "mine.yaml:", "unknown op 'Frobnicate'"),
    # The parser notices the missing ")" at the closing brace, line 8.
    (USER_RULE.replace("Y = Relu(T)", "Y = Relu(T,"), "mine.yaml:8", "syntax error"),
    (USER_RULE + "    where: __import__('os')\n", "mine.yaml:13", "unknown function '__import__'"),
    (USER_RULE + "    where: X.__class__\n", "mine.yaml:13", "Attribute is not allowed"),
    (USER_RULE + "    where: '(lambda: 1)()'\n", "mine.yaml:13", "unknown function 'lambda"),
    (USER_RULE + "    where: '{1: 2}'\n", "mine.yaml:13", "Dict is not allowed"),
    (USER_RULE + "    where: rank(Q) == 2\n", "mine.yaml:13", "unknown name 'Q'"),
    (USER_RULE.replace("description:", "descripton:"), "mine.yaml:3", "unknown rule key"),
    (USER_RULE.replace("    target: |", "    targets: |"), "mine.yaml:", "unknown rule key"),
    (USER_RULE + USER_RULE.replace("rules:\n", ""), "mine.yaml:", "defined twice"),
    ("rules: []\n", "mine.yaml:1", "non-empty list"),
]


@pytest.mark.parametrize(("text", "where", "what"), RULE_ERRORS)
def test_bad_rule_files_name_file_and_line(tmp_path, relu_model, text, where, what):
    rules = tmp_path / "mine.yaml"
    rules.write_text(text)
    result = run_cli("optimize", str(relu_model), "--rules", str(rules))
    assert_clean_error(result, where, what)


@pytest.mark.parametrize(
    ("types", "message"),
    [
        ("[float32]", "unknown element type 'float32' (did you mean float?)"),
        ("[float, flaot]", "unknown element type 'flaot' (did you mean float?)"),
    ],
)
def test_a_capability_file_naming_another_element_type_is_refused(tmp_path, types, message):
    """On the bundled sample: the target names no type ONNX spells so, so no rule would fire."""
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        f"name: bad\nops:\n- domain: ''\n  op: Relu\n  since: 6\n  types:\n    T: {types}\n"
    )
    result = run_cli("optimize", "--target", str(bad), "-o", str(tmp_path / "out.onnx"))
    assert_clean_error(result)
    assert result.stderr.strip() == f"onnxfuse: error: {bad}:7: {message}"
    assert not (tmp_path / "out.onnx").exists()


def test_a_rule_file_naming_another_element_type_is_refused(tmp_path, relu_model):
    rules = tmp_path / "mine.yaml"
    rules.write_text(USER_RULE + "    where: dtype(X) == 'float32'\n")
    result = run_cli("optimize", str(relu_model), "--rules", str(rules))
    assert_clean_error(result)
    assert result.stderr.strip() == (
        f"onnxfuse: error: {rules}:13: where: in guard \"dtype(X) == 'float32'\": "
        "unknown element type 'float32' (did you mean float?)"
    )


@pytest.mark.parametrize(
    "args",
    [
        ["optimize", "--max-iterations", "zero"],
        ["optimize", "--bogus"],
        ["explain"],
        ["nonsense"],
        ["optimize", "--target", "no-such-target"],
        ["optimize", "--disable", "no-such-rule"],
        ["explain", "x.onnx", "--rule", "no-such-rule"],
    ],
)
def test_bad_arguments(args):
    result = run_cli(*args)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_external_data_is_preserved(tmp_path):
    weight = numpy_helper.from_array(
        np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32), "w"
    )
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["m"], name="mm"),
        helper.make_node("Identity", ["m"], ["y"], name="id"),
    ]
    model = make_model(nodes, [tensor_input("x", [2, 64])], [tensor_input("y", [2, 64])], [weight])
    source = tmp_path / "src" / "model.onnx"
    source.parent.mkdir()
    onnx.save(model, source, save_as_external_data=True, location="model.data", size_threshold=0)
    out = tmp_path / "out" / "model.onnx"
    out.parent.mkdir()
    result = run_cli("optimize", str(source), "-o", str(out))
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in out.parent.iterdir()) == ["model.onnx", "model.onnx.data"]
    plain = tmp_path / "plain"
    plain.write_bytes(b"")
    for written in out.parent.iterdir():  # neither file stays private
        assert written.stat().st_mode & 0o777 == plain.stat().st_mode & 0o777
    optimized = onnx.load(out, load_external_data=False)
    assert all(
        init.data_location == onnx.TensorProto.EXTERNAL for init in optimized.graph.initializer
    )
    assert_same_outputs(onnx.load(source), onnx.load(out))


def _external_model(path: Path, location: str, seed: int = 1) -> Path:
    """A MatMul whose weight is in the data file ``location`` beside ``path``."""
    weight = numpy_helper.from_array(
        np.random.default_rng(seed).standard_normal((64, 64)).astype(np.float32), "w"
    )
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")]
    model = make_model(nodes, [tensor_input("x", [2, 64])], [tensor_input("y", [2, 64])], [weight])
    onnx.save(model, path, save_as_external_data=True, location=location, size_threshold=0)
    return path


def _contents(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_refuses_to_overwrite_the_inputs_external_data(tmp_path):
    # A copy of out.onnx's model that still reads out.onnx.data: writing the output's
    # data there would change the input.
    source = _external_model(tmp_path / "copy.onnx", "out.onnx.data")
    before = _contents(tmp_path)
    result = run_cli("optimize", str(source), "-o", str(tmp_path / "out.onnx"))
    assert_clean_error(result, "out.onnx.data: refusing to overwrite the input model's external")
    assert _contents(tmp_path) == before  # nothing written, no staging left behind


@pytest.mark.parametrize(
    ("change", "delta", "fragment"),
    [
        (
            "length",
            -4,
            "external data of tensor 'w' is 16380 bytes, but its shape and type need 16384",
        ),
        (
            "length",
            4,
            "external data of tensor 'w' is 16388 bytes, but its shape and type need 16384",
        ),
        (
            "truncate",
            100,
            "external data of tensor 'w' ends at byte 16384, past the end of w.data (16284",
        ),
    ],
)
def test_external_data_that_cannot_be_read_is_one_line(tmp_path, change, delta, fragment):
    source = _external_model(tmp_path / "m.onnx", "w.data")
    if change == "truncate":  # a copy cut short
        data = tmp_path / "w.data"
        data.write_bytes(data.read_bytes()[:-delta])
    else:
        model = onnx.load(source, load_external_data=False)
        (length,) = [e for e in model.graph.initializer[0].external_data if e.key == "length"]
        length.value = str(int(length.value) + delta)
        onnx.save(model, source)
    result = run_cli("optimize", str(source), "-o", str(tmp_path / "out.onnx"))
    assert_clean_error(result, fragment)
    assert not (tmp_path / "out.onnx").exists()


@pytest.mark.parametrize("external", [False, True])
def test_an_output_the_system_refuses_is_one_line(tmp_path, relu_model, external):
    # A directory that is a file: refused whoever runs the test (root writes anywhere).
    source = _external_model(tmp_path / "m.onnx", "m.data") if external else relu_model
    blocked = tmp_path / "a-file"
    blocked.write_bytes(b"")
    for option, name in (("-o", "o.onnx"), ("--report-json", "r.json")):
        result = run_cli("optimize", str(source), option, str(blocked / name), "-q")
        assert_clean_error(result, f"{blocked}: not a directory")
    # A directory the kernel refuses files in, whoever asks.
    result = run_cli("optimize", str(source), "-o", "/proc/onnxfuse-test.onnx", "-q")
    assert_clean_error(result, "/proc/onnxfuse-test.onnx: cannot write it (")


def test_outputs_that_are_not_files_or_name_one_file_twice_are_refused(tmp_path, relu_model):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    same = str(tmp_path / "same")
    for args, message in (
        (["-o", str(fifo)], f"{fifo}: not a regular file (an output replaces a file whole)"),
        (["--report-json", str(fifo)], f"{fifo}: not a regular file"),
        (["-o", same, "--report-json", same], f"{same}: named by both -o and --report-json"),
        (["--report-json", ""], "an output needs a file name, not an empty one"),
        (["-o", str(tmp_path)], f"{tmp_path}: is a directory"),
        (["-o", f"{tmp_path}/new.onnx/"], "new.onnx/: names a directory, not a file"),
    ):
        assert_clean_error(run_cli("optimize", str(relu_model), *args, "-q"), message)
    assert fifo.is_fifo() and sorted(p.name for p in tmp_path.iterdir()) == ["pipe", "relu.onnx"]


def test_rule_and_target_files_that_are_not_regular_files_are_refused(tmp_path):
    # A pipe would block the read; a device such as /dev/zero would never end it.
    fifo = tmp_path / "rules.yaml"
    os.mkfifo(fifo)
    assert_clean_error(
        run_cli("rules", "list", "--rules", str(fifo)), f"{fifo}: not a regular file"
    )
    pack = tmp_path / "pack"
    pack.mkdir()
    (pack / "a.yaml").write_text(USER_RULE)
    os.mkfifo(pack / "b.yaml")
    result = run_cli("rules", "list", "--rules", str(pack))
    assert_clean_error(result, f"{pack / 'b.yaml'}: not a regular file")
    assert_clean_error(run_cli("targets", "show", str(fifo)), "rules.yaml: not a regular file")


def test_outputs_never_replace_the_inputs_data_rules_or_capability_file(tmp_path, relu_model):
    inputs, pack = tmp_path / "in", tmp_path / "pack"
    inputs.mkdir()
    pack.mkdir()
    source = _external_model(inputs / "m.onnx", "m.data")
    rules = pack / "mine.yaml"
    rules.write_text(USER_RULE)
    capability = inputs / "npu.yaml"
    capability.write_text((Path(__file__).parents[2] / "targets" / "cpu.yaml").read_text())
    before = _contents(inputs), _contents(pack)
    cases = (
        ([str(source), "--report-json", str(inputs / "m.data")], "input model's external data"),
        ([str(relu_model), "--rules", str(rules), "-o", str(rules)], "the rule file"),
        ([str(relu_model), "--rules", str(pack), "--report-json", str(rules)], "the rule file"),
        ([str(relu_model), "--target", str(capability), "-o", str(capability)], "capability file"),
    )
    for args, message in cases:
        assert_clean_error(run_cli("optimize", *args, "-q"), "refusing to overwrite", message)
    assert (_contents(inputs), _contents(pack)) == before


def test_report_json_never_replaces_the_input(relu_model, tmp_path):
    before = relu_model.read_bytes()
    result = run_cli(
        "optimize",
        str(relu_model),
        "-o",
        str(tmp_path / "o.onnx"),
        "--report-json",
        str(relu_model),
    )
    assert_clean_error(result, "refusing to overwrite the input model")
    assert relu_model.read_bytes() == before


def test_a_failed_check_leaves_an_earlier_external_output_whole(tmp_path, monkeypatch):
    from onnxfuse.files import model_io

    source = _external_model(tmp_path / "src.onnx", "src.onnx.data")
    out = tmp_path / "out"
    out.mkdir()
    assert run_cli("optimize", str(source), "-o", str(out / "m.onnx")).returncode == 0
    earlier = _contents(out)
    assert sorted(earlier) == ["m.onnx", "m.onnx.data"]
    model = model_io.load_model(_external_model(tmp_path / "new.onnx", "new.onnx.data", seed=2))
    monkeypatch.setattr(model_io, "_check_path", lambda path: "a check that fails")
    with pytest.raises(InvariantError, match="a check that fails"):
        model_io.save_model(model, out / "m.onnx")
    assert _contents(out) == earlier
    monkeypatch.undo()  # and a save that passes replaces both files, leaving nothing else
    model_io.save_model(model, out / "m.onnx")
    assert sorted(_contents(out)) == ["m.onnx", "m.onnx.data"]
    assert _contents(out)["m.onnx.data"] != earlier["m.onnx.data"]
    assert_same_outputs(onnx.load(tmp_path / "new.onnx"), onnx.load(out / "m.onnx"))


def test_progress_and_errors_do_not_leave_temporary_files(tmp_path, relu_model):
    out = tmp_path / "out.onnx"
    assert main(["optimize", str(relu_model), "-o", str(out), "-q"]) == 0
    leftovers = [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]
    assert leftovers == []


def test_the_command_exits_fast_but_still_removes_its_temporary_directories(tmp_path, relu_model):
    """The command skips interpreter teardown: exit handlers must still run."""
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    result = subprocess.run(
        [sys.executable, "-m", "onnxfuse", "optimize", str(relu_model), "-o", "out.onnx"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "TMPDIR": str(scratch)},
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert "nodes 3 -> 2" in result.stdout  # the report was flushed before exiting
    assert (tmp_path / "out.onnx").is_file()
    # (other libraries may leave their own files there)
    assert [p.name for p in scratch.iterdir() if p.name.startswith("onnxfuse-")] == []


def test_a_reader_that_leaves_early_gets_no_traceback():
    command = [sys.executable, "-m", "onnxfuse", "rules", "list"]
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as process:
        assert process.stdout is not None and process.stderr is not None
        process.stdout.readline()
        process.stdout.close()  # as `| head -1` does
        errors = process.stderr.read().decode()
        assert process.wait(timeout=300) == 1
    assert errors == ""


def test_nodes_out_of_order_are_sorted_not_rejected(tmp_path):
    nodes = [
        helper.make_node("Relu", ["t"], ["y"], name="second"),
        helper.make_node("Neg", ["x"], ["t"], name="first"),
    ]
    graph = helper.make_graph(nodes, "g", [tensor_input("x", X)], [tensor_input("y", X)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    path, out = tmp_path / "unsorted.onnx", tmp_path / "out.onnx"
    onnx.save(model, path)
    assert main(["optimize", str(path), "-o", str(out), "-q"]) == 0
    assert [n.name for n in onnx.load(out).graph.node] == ["first", "second"]


def test_a_model_path_not_in_utf8_is_one_line(tmp_path, relu_model):
    path = os.fsdecode(os.fsencode(str(tmp_path)) + b"/u\xff.onnx")
    Path(path).write_bytes(relu_model.read_bytes())
    assert_clean_error(run_cli("optimize", path), "onnx reads only file names in UTF-8")


def test_a_longest_legal_output_name_is_written(tmp_path, relu_model):
    """The temporary file beside it would be too long if named after it."""
    name = "a" * 250
    out, report = tmp_path / f"{name}.onnx", tmp_path / f"{name}.json"
    result = run_cli("optimize", str(relu_model), "-o", str(out), "--report-json", str(report))
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [out.name, report.name, "relu.onnx"]
    )
    result = run_cli("plan", str(relu_model), "-o", str(tmp_path / f"{name}.plan"))
    assert result.returncode == 0, result.stderr


def test_plan_takes_whole_input_shapes(tmp_path, relu_model):
    result = run_cli("plan", str(relu_model), "--input-shape", "x=2,3,5")
    assert_clean_error(result, "--input-shape x=2,3,5: dim 2 of the input is 4, not 5")
    result = run_cli("plan", str(relu_model), "--input-shape", "x=2,3,4", "--input-shape", "y=2")
    assert_clean_error(result, "--input-shape y: no such input (the model's inputs: x)")
    # An input whose dims have no names at all: only its whole shape binds them.
    nodes = [helper.make_node("Relu", ["x"], ["t"]), helper.make_node("Neg", ["t"], ["y"])]
    unnamed = [None, None, 4]
    path = tmp_path / "unnamed.onnx"
    onnx.save(make_model(nodes, [tensor_input("x", unnamed)], [tensor_input("y", unnamed)]), path)
    assert_clean_error(run_cli("plan", str(path)), "input 'x' has an unnamed dynamic dim (axis 0)")
    result = run_cli("plan", str(path), "--input-shape", "x=2,3,4", "--verify")
    assert result.returncode == 0, result.stderr
    assert "verify: outputs match onnxruntime" in result.stdout


def test_plan_help_names_the_shape_options():
    result = run_cli("plan", "--help")
    assert result.returncode == 0
    for option in ("--dim NAME=VALUE", "--input-shape NAME=D1,D2,...", "--trace-shapes"):
        assert option in result.stdout


PYTHON_RULES = """\
from onnxscript import opset17 as op
from onnxscript import script

from onnxfuse.language.python_rules import rule_from_functions


@script()
def double_relu(X):
    return op.Relu(op.Relu(X))


@script()
def single_relu(X):
    return op.Relu(X)


py_relu_relu = rule_from_functions(
    "py-relu-relu",
    double_relu,
    single_relu,
    benefit=2,
    verify={"dtypes": ["float"], "inputs": {"X": [2, 3]}},
)
"""


def test_a_python_rule_module_loads_from_the_command_line(tmp_path, relu_model):
    rules = tmp_path / "rules.py"
    rules.write_text(PYTHON_RULES)
    out = tmp_path / "out.onnx"
    result = run_cli(
        "optimize", str(relu_model), "-o", str(out), "--rules", str(rules), "--no-builtin"
    )
    assert result.returncode == 0, result.stderr
    assert "py-relu-relu" in result.stdout
    assert [n.op_type for n in onnx.load(out).graph.node] == ["Relu", "Sigmoid"]


def test_check_proves_the_rules_of_a_python_rule_module(tmp_path):
    rules = tmp_path / "rules.py"
    rules.write_text(PYTHON_RULES)
    result = run_cli("check", str(rules), "--examples", "5", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "ok    py-relu-relu" in result.stdout


@pytest.mark.parametrize(
    ("text", "fragments"),
    [
        ("x = 1\n", ["rules.py:", "defines its rules at the top level"]),
        ("def f(:\n", ["rules.py:1:", "Python syntax error"]),
        ("import os\n\nraise ValueError('boom')\n", ["rules.py:3:", "raised ValueError: boom"]),
        (
            PYTHON_RULES.replace("benefit=2,", "benefit=2, where=['rank(Q) > 1'],"),
            ["rules.py:17:", "unknown name 'Q'"],
        ),
    ],
)
def test_a_broken_python_rule_module_is_one_line_at_its_line(tmp_path, relu_model, text, fragments):
    rules = tmp_path / "rules.py"
    rules.write_text(text)
    result = run_cli(
        "optimize", str(relu_model), "-o", str(tmp_path / "o.onnx"), "--rules", str(rules)
    )
    assert_clean_error(result, *fragments)
