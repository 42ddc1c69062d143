"""Rules whose patterns are onnxscript functions, written in Python."""

from __future__ import annotations

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
