"""`onnxfuse check --ray` on the session's local Ray reports what a local check does,
rule by rule, in the rules' order; so does `--jobs 2`."""

from __future__ import annotations

from onnxfuse.cli.main import main

# Rules whose checks draw from hypothesis's constants (counts that moved with the process
# before every job loaded the same modules), and one whose domain rejects some draws.
RULES = ["--rule", "clip-relu", "--rule", "not-where", "--rule", "transpose-unary[Elu]"]
CHECK = ["check", "rules/core", *RULES, "--examples", "10", "--seed", "0"]


def _report(capsys) -> list[str]:
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("onnxfuse check rules/core: 3 rule(s)")
    return lines[1:]


def test_check_on_ray_and_in_processes_reports_what_a_local_check_does(local_ray, capsys):
    assert main(CHECK) == 0
    here = _report(capsys)
    assert [line.split()[:2] for line in here[:3]] == [
        ["ok", "clip-relu"],
        ["ok", "not-where"],
        ["ok", "transpose-unary[Elu]"],
    ]
    assert main([*CHECK, "--ray"]) == 0
    assert _report(capsys) == here
    assert main([*CHECK, "--jobs", "2"]) == 0
    assert _report(capsys) == here
