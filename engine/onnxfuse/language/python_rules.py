"""Rules whose patterns are onnxscript functions, written in Python.

A rule module (``--rules my_rules.py``, ``onnxfuse check my_rules.py``) is a Python
file whose module-level ``Rule`` objects, made with ``rule_from_functions``, are its
rules, in the order they are assigned.
"""

from __future__ import annotations

import ast
import importlib.util
import sys
import traceback
from pathlib import Path
from typing import Any

import onnx

from onnxfuse.errors import NO_RULE_FILE, RuleError
from onnxfuse.language.pattern import compile_function
from onnxfuse.language.rule import Rule, commutative_set
from onnxfuse.language.rulefile import check_keys, rule_from_entry
from onnxfuse.language.yaml_lines import LineMap


def _function_proto(function: Any) -> onnx.FunctionProto:
    if isinstance(function, onnx.FunctionProto):
        return function
    to_proto = getattr(function, "to_function_proto", None)
    if to_proto is None:
        # A place of its own: the rule's (python:NAME), added below, does not replace it.
        raise RuleError(
            f"{function!r} is neither an onnxscript function nor a FunctionProto", NO_RULE_FILE
        )
    return to_proto()


def rule_from_functions(
    name: str,
    source: Any | list[Any],
    replacement: Any,
    *,
    pack: str = "python",
    **keys: Any,
) -> Rule:
    """A rule from onnxscript ``@script`` functions (or FunctionProtos).

    ``source`` may be a list of alternatives. Other keyword arguments are the
    keys of a YAML rule (``where``, ``let``, ``optional``, ``copy_attributes``,
    ``benefit``, ...), with the same meaning and checks.
    """
    entry = LineMap(name=name, **keys)
    sources = source if isinstance(source, list) else [source]
    try:
        check_keys(entry)
        commutative = commutative_set(list(keys.get("commutative", [])), None)
        compiled = [
            compile_function(_function_proto(s), role="source", commutative=commutative)
            for s in sources
        ]
        compiled_replacement = compile_function(
            _function_proto(replacement), role="replacement", commutative=commutative
        )
        return rule_from_entry(
            entry, compiled, compiled_replacement, pack=pack, origin=f"python:{name}"
        )
    except RuleError as exc:
        raise exc.located(f"python:{name}") from None


PYTHON_SUFFIX = ".py"


def load_rule_module(path: str | Path, pack: str = "") -> list[Rule]:
    """The rules a Python rule module defines at its top level, placed at their lines.

    The module runs as a script would (it is the user's own code, named on the command
    line); an error while it runs is reported at its line in the module.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise RuleError("no such rule file", str(path)) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise RuleError(f"cannot read rule module: {exc}", str(path)) from None
    try:
        lines = _assignment_lines(ast.parse(text, str(path)))
    except SyntaxError as exc:
        raise RuleError(f"Python syntax error: {exc.msg}", str(path), exc.lineno) from None
    namespace = _run_module(path)
    rules = []
    for name, value in namespace.items():
        if isinstance(value, Rule):
            line = lines.get(name)
            value.origin = f"{path}:{line}" if line else str(path)
            value.pack = pack or path.parent.name
            rules.append(value)
    if not rules:
        raise RuleError(
            "a Python rule module defines its rules at the top level "
            "(NAME = rule_from_functions(...)); this one defines none",
            str(path),
        )
    return rules


def _assignment_lines(module: ast.Module) -> dict[str, int]:
    lines: dict[str, int] = {}
    for statement in module.body:
        targets = (
            statement.targets
            if isinstance(statement, ast.Assign)
            else [statement.target]
            if isinstance(statement, (ast.AnnAssign, ast.AugAssign))
            else []
        )
        for target in targets:
            if isinstance(target, ast.Name):
                lines.setdefault(target.id, statement.lineno)
    return lines


def _run_module(path: Path) -> dict[str, Any]:
    # A name of its own: two modules called rules.py do not replace each other.
    name = f"onnxfuse_rule_module_{abs(hash(str(path.resolve())))}"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except RuleError as exc:
        if exc.path is not None and not exc.path.startswith("python:"):
            raise  # an error in another file the module read names that file
        raise RuleError(exc.message, str(path), _line_in(exc, path)) from None
    except Exception as exc:  # the user's code: any error, reported at its line
        raise RuleError(
            f"the rule module raised {type(exc).__name__}: {exc}", str(path), _line_in(exc, path)
        ) from None
    finally:
        sys.modules.pop(name, None)
    return dict(vars(module))


def _line_in(exc: BaseException, path: Path) -> int | None:
    """The line of ``path`` the error passed through last (the call that raised it)."""
    found = None
    for frame in traceback.extract_tb(exc.__traceback__):
        if Path(frame.filename).resolve() == path.resolve():
            found = frame.lineno
    return found
