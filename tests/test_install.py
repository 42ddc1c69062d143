"""A plain (non-editable) `pip install .` finds its built-in rule packs, targets and sample.

The repository is copied to a temporary folder (the build writes `build/` and
`*.egg-info` next to the sources; the shared work tree is left alone) and installed
into a fresh venv. That venv reuses the dependencies of the interpreter running the
tests instead of downloading them: ``--system-site-packages`` exposes only the *base*
interpreter's packages, not those of a venv the tests may run in, so a ``.pth`` file
adds this interpreter's site-packages folders too. A folder added by a ``.pth`` line
has its own ``.pth`` files ignored, so the editable onnxfuse of the development venv
is not activated; the tests check that onnxfuse is imported from the new venv.
"""

from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
from pathlib import Path

import onnx
import pytest
from conftest import REPO_ROOT
from helpers import assert_close, random_feeds, run

from onnxfuse import api

pytestmark = pytest.mark.skipif(
    subprocess.run(
        [sys.executable, "-m", "pip", "--version"], capture_output=True, check=False
    ).returncode
    != 0,
    reason=f"pip is not available for {sys.executable}",
)

_NOT_SOURCES = shutil.ignore_patterns(
    ".git",
    "__pycache__",
    "*.egg-info",
    "build",
    "dist",
    ".pytest_cache",
    ".ruff_cache",
    ".hypothesis",
    ".venv",
    "venv",
)


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    env["PIP_NO_INPUT"] = "1"
    return env


def _run(args: list[str | Path], cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(a) for a in args],
        cwd=cwd,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _our_site_dirs() -> list[str]:
    dirs = [*site.getsitepackages()]
    dirs += [p for p in sys.path if p.endswith(("site-packages", "dist-packages"))]
    return [d for d in dict.fromkeys(dirs) if Path(d).is_dir()]


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> Path:
    """A fresh venv with onnxfuse installed from a copy of the repository."""
    root = tmp_path_factory.mktemp("install")
    source = root / "src"
    shutil.copytree(REPO_ROOT, source, ignore=_NOT_SOURCES)
    env_dir = root / "venv"
    created = _run(
        [sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", env_dir],
        root,
    )
    assert created.returncode == 0, created.stderr
    python = env_dir / "bin" / "python"
    purelib = _run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], root
    )
    assert purelib.returncode == 0, purelib.stderr
    Path(purelib.stdout.strip(), "_onnxfuse_test_deps.pth").write_text(
        "\n".join(_our_site_dirs()) + "\n", encoding="utf-8"
    )
    # An absolute path: a bare folder name would be taken for a package on the index.
    installed = _run([python, "-m", "pip", "install", str(source.resolve())], root)
    assert installed.returncode == 0, installed.stdout[-3000:] + installed.stderr[-3000:]
    return env_dir


def _installed_facts(venv: Path) -> dict:
    script = (
        "import json, onnxfuse\n"
        "from onnxfuse import api\n"
        "from onnxfuse.language.packs import builtin_pack_names, builtin_rules_dir\n"
        "from onnxfuse.targets.capabilities import builtin_target_names, builtin_targets_dir\n"
        "print(json.dumps({'file': onnxfuse.__file__, 'packs': builtin_pack_names(),\n"
        "    'rules_dir': str(builtin_rules_dir()), 'targets': builtin_target_names(),\n"
        "    'targets_dir': str(builtin_targets_dir()),\n"
        "    'sample': str(api.sample_model_path())}))\n"
    )
    result = _run([venv / "bin" / "python", "-c", script], venv.parent)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_onnxfuse_is_imported_from_the_new_venv(venv):
    facts = _installed_facts(venv)
    for key in ("file", "rules_dir", "targets_dir", "sample"):
        path = Path(facts[key]).resolve()
        assert path.is_relative_to(venv.resolve()), f"{key}: {path} is outside {venv}"
    assert Path(facts["sample"]).is_file()


def test_builtin_packs_and_targets_are_installed(venv):
    facts = _installed_facts(venv)
    packs = sorted(p.name for p in (REPO_ROOT / "rules").iterdir() if any(p.glob("*.yaml")))
    targets = sorted(p.stem for p in (REPO_ROOT / "targets").glob("*.yaml"))
    assert sorted(facts["packs"]) == packs
    assert facts["targets"] == targets
    # Every rule file of every pack made it into the installed package.
    for pack in packs:
        expected = sorted(p.name for p in (REPO_ROOT / "rules" / pack).glob("*.yaml"))
        found = sorted(p.name for p in (Path(facts["rules_dir"]) / pack).glob("*.yaml"))
        assert found == expected, pack


def test_rules_list_shows_every_builtin_rule(venv):
    result = _run([venv / "bin" / "onnxfuse", "rules", "list"], venv.parent)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    expected = api.select_rules()
    assert lines[-1] == f"{len(expected)} rules"
    listed = {line.split()[0] for line in lines[1:-1]}
    assert listed == {rule.name for rule in expected}
    packs = {line.split()[1] for line in lines[1:-1]}
    assert packs == {rule.pack for rule in expected}


def test_optimize_sample_for_every_builtin_target(venv, tmp_path):
    targets = sorted(p.stem for p in (REPO_ROOT / "targets").glob("*.yaml"))
    assert targets, "no built-in targets in the repository"
    sample = api.sample_model_path()
    feeds = random_feeds(onnx.load(sample))
    expected = run(sample, feeds)
    for target in targets:
        out = tmp_path / f"out_{target}.onnx"
        args = [venv / "bin" / "onnxfuse", "optimize", "-o", out, "--target", target]
        result = _run(args, tmp_path)
        assert result.returncode == 0, f"--target {target}: {result.stderr}"
        assert "sample" in result.stdout  # no model given: the bundled sample
        onnx.checker.check_model(str(out), full_check=True)
        assert_close(run(out, feeds), expected)


def test_unknown_target_is_a_one_line_error(venv, tmp_path):
    args = [venv / "bin" / "onnxfuse", "optimize", "-o", tmp_path / "x.onnx", "--target", "nope"]
    result = _run(args, tmp_path)
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "x.onnx").exists()


@pytest.mark.skipif(
    shutil.which("dot") is None and os.environ.get("CI") != "true",
    reason="Graphviz's dot is not installed (.ci/run installs it: under CI=true this fails)",
)
def test_the_html_report_has_its_script_and_style_when_installed(venv, tmp_path):
    page = tmp_path / "page.html"
    args = [venv / "bin" / "onnxfuse", "optimize", "-q", "--html", page]
    result = _run(args, tmp_path)
    assert result.returncode == 0, result.stderr
    text = page.read_text(encoding="utf-8")
    assert (REPO_ROOT / "engine/onnxfuse/report/assets/page.js").read_text() in text
    assert (REPO_ROOT / "engine/onnxfuse/report/assets/page.css").read_text() in text
