"""The command line imports sympy only if something reads it (onnxfuse.support.deferred_imports).

Each case runs in a fresh interpreter: deferring only works before onnx_ir is imported.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from onnxfuse.cli.main import main
from onnxfuse.sample_model import DEFAULT_PATH as SAMPLE_MODEL


def _run_python(code: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_optimizing_leaves_sympy_unimported_and_it_works_once_read(tmp_path: Path) -> None:
    found = _run_python(
        f"""
        import json, sys
        from onnxfuse.support.deferred_imports import defer_unused_imports
        deferred = defer_unused_imports()
        from onnxfuse.cli.main import main
        code = main(["optimize", {str(SAMPLE_MODEL)!r}, "-o", {str(tmp_path / "out.onnx")!r}, "-q"])
        loaded_while_optimizing = "sympy.core" in sys.modules
        import onnx_ir as ir
        import sympy
        from sympy import Max
        dim = ir.SymbolicDim("N") * 2 + 1
        print(json.dumps({{
            "deferred": deferred,
            "code": code,
            "loaded_while_optimizing": loaded_while_optimizing,
            "dim": str(dim),
            "max": str(Max(sympy.Symbol("a"), 3).subs("a", 5)),
            "real_module": type(sys.modules["sympy"]).__name__,
            "same_symbol": sympy.Symbol is sys.modules["sympy"].Symbol,
        }}))
        """
    )
    assert found["deferred"] == ["sympy", "onnx_ir._symbolic_shapes"]
    assert found["code"] == 0
    assert not found["loaded_while_optimizing"]
    assert found["dim"] == "2*N + 1"
    assert found["max"] == "5"
    assert found["real_module"] == "module"
    assert found["same_symbol"]


def test_nothing_is_deferred_once_sympy_or_onnx_ir_is_imported() -> None:
    for first in ("sympy", "onnx_ir"):
        found = _run_python(
            f"""
            import json, sys
            import {first}
            from onnxfuse.support.deferred_imports import defer_unused_imports
            print(json.dumps({{
                "deferred": defer_unused_imports(),
                "real": type(sys.modules["sympy"]).__name__,
            }}))
            """
        )
        assert found == {"deferred": [], "real": "module"}, first


def test_finding_a_submodule_does_not_import_its_package() -> None:
    found = _run_python(
        """
        import json, sys
        from onnxfuse.support.deferred_imports import _find_without_importing
        spec = _find_without_importing("onnx_ir._symbolic_shapes")
        missing = _find_without_importing("onnx_ir._no_such_module")
        print(json.dumps({
            "found": spec is not None and spec.origin.endswith("_symbolic_shapes.py"),
            "missing": missing is None,
            "no_such_package": _find_without_importing("no_such_package.module") is None,
            "imported": "onnx_ir" in sys.modules,
        }))
        """
    )
    assert found == {"found": True, "missing": True, "no_such_package": True, "imported": False}


def test_the_command_writes_what_an_in_process_run_writes(tmp_path: Path) -> None:
    """`python -m onnxfuse` defers sympy; this process has it imported already."""
    by_command, in_process = tmp_path / "command.onnx", tmp_path / "in_process.onnx"
    done = subprocess.run(
        [sys.executable, "-m", "onnxfuse", "optimize", str(SAMPLE_MODEL), "-o", str(by_command)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert main(["optimize", str(SAMPLE_MODEL), "-o", str(in_process), "-q"]) == 0
    assert by_command.read_bytes() == in_process.read_bytes()
