"""Op-type variables: one rule written for a set of op types.

A rule's ``ops:`` key binds a name to a list of op types::

    ops: {Op: [Relu, Sigmoid, com.microsoft::Gelu]}

and the patterns use that name as an op type (``Y = Op(T)``). The rule is
expanded when loaded into one concrete rule per member, named
``family[Member]`` (``family[M1,M2]`` for several variables), so everything
downstream (schema checks at the rule's opsets, the op-type index, capability
gating, derived property tests, reports) sees ordinary rules. ``per_op:``
gives the keys that differ for one member: ``opset`` (replaces the rule's),
``where`` (added to the rule's guards) and ``verify`` (its keys replace the
rule's). A member of the ai.onnx domain applies only from the first opset
that defines it.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, field
from typing import Any

import onnx

from onnxfuse.errors import RuleError
from onnxfuse.language.yaml_lines import LineMap
from onnxfuse.ops import schemas

OPS_KEY = "ops"
PER_OP_KEY = "per_op"
PER_OP_KEYS = ("opset", "where", "verify")
_VARIABLE = re.compile(r"^[A-Z][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class Member:
    """One expansion of a rule: each op-type variable bound to one op."""

    ops: dict[str, tuple[str, str]]  # variable -> (domain, op_type)
    labels: tuple[str, ...]  # the members as written, in variable order
    overrides: dict[str, Any] = field(default_factory=dict)  # merged per_op keys

    @property
    def suffix(self) -> str:
        return "[" + ",".join(self.labels) + "]"


def op_key(text: str) -> tuple[str, str]:
    """'Relu' -> ('', 'Relu'); 'com.microsoft::Gelu' -> ('com.microsoft', 'Gelu')."""
    domain, _, op = text.rpartition("::")
    return ("" if domain in ("", "ai.onnx") else domain, op)


def parse_members(entry: LineMap) -> list[Member] | None:
    """The expansions of a rule with ``ops:``; None for a rule without it."""
    if OPS_KEY not in entry:
        if PER_OP_KEY in entry:
            raise RuleError("'per_op' needs an 'ops' set", line=entry.line_of(PER_OP_KEY))
        return None
    line = entry.line_of(OPS_KEY)
    raw = entry[OPS_KEY]
    if not isinstance(raw, dict) or not raw:
        raise RuleError("'ops' must map op-type variables to lists of op types", line=line)
    variables: dict[str, list[str]] = {}
    for name, members in raw.items():
        variables[str(name)] = _check_set(name, members, line)
    per_op = _parse_per_op(entry, {m for ms in variables.values() for m in ms})
    expansions = []
    for combo in itertools.product(*variables.values()):
        overrides: dict[str, Any] = {}
        for label in combo:
            for key, value in per_op.get(label, {}).items():
                if key == "where":
                    overrides["where"] = overrides.get("where", []) + value
                elif key == "verify":
                    overrides["verify"] = {**overrides.get("verify", {}), **value}
                else:
                    overrides[key] = value
        ops = {var: op_key(label) for var, label in zip(variables, combo)}
        expansions.append(Member(ops=ops, labels=tuple(combo), overrides=overrides))
    return expansions


def _check_set(name: Any, members: Any, line: int | None) -> list[str]:
    if not isinstance(name, str) or not _VARIABLE.match(name):
        raise RuleError(
            f"ops: variable {name!r} must be a name starting with a capital letter", line=line
        )
    if schemas.known_op("", name):
        raise RuleError(
            f"ops: variable '{name}' is the name of an ONNX op; pick another", line=line
        )
    if isinstance(members, str) or not isinstance(members, list) or not members:
        raise RuleError(f"ops: '{name}' must be a non-empty list of op types", line=line)
    seen: set[str] = set()
    for item in members:
        if not isinstance(item, str) or not item or item.endswith("::"):
            raise RuleError(f"ops: '{name}' holds {item!r}, which is not an op type", line=line)
        domain, op = op_key(item)
        if schemas.known_op(domain, op) is False:
            where = f"{domain}::{op}" if domain else op
            raise RuleError(f"ops: unknown op '{where}' in the set '{name}'", line=line)
        if item in seen:
            raise RuleError(f"ops: '{item}' is listed twice in the set '{name}'", line=line)
        seen.add(item)
    return list(members)


def _parse_per_op(entry: LineMap, members: set[str]) -> dict[str, dict[str, Any]]:
    raw = entry.get(PER_OP_KEY, {})
    line = entry.line_of(PER_OP_KEY)
    if not isinstance(raw, dict):
        raise RuleError("'per_op' must map members of the op set to rule keys", line=line)
    result: dict[str, dict[str, Any]] = {}
    for label, keys in raw.items():
        if label not in members:
            raise RuleError(f"per_op: '{label}' is not a member of the op set", line=line)
        if not isinstance(keys, dict):
            raise RuleError(f"per_op.{label} must be a mapping of rule keys", line=line)
        for key in keys:
            if key not in PER_OP_KEYS:
                raise RuleError(
                    f"per_op.{label}: '{key}' cannot differ per member "
                    f"(allowed: {', '.join(PER_OP_KEYS)})",
                    line=line,
                )
        where = keys.get("where", [])
        if isinstance(where, str):
            where = [where]
        if not isinstance(where, list):
            raise RuleError(f"per_op.{label}.where must be an expression or a list", line=line)
        if "verify" in keys and not isinstance(keys["verify"], dict):
            raise RuleError(f"per_op.{label}.verify must be a mapping", line=line)
        result[str(label)] = {**keys, **({"where": list(where)} if "where" in keys else {})}
    return result


def substitute(function: onnx.FunctionProto, ops: dict[str, tuple[str, str]]) -> set[str]:
    """Give the nodes whose op type is a variable the bound op; return the variables used."""
    used = set()
    for node in function.node:
        if node.domain in ("", "ai.onnx") and node.op_type in ops:
            used.add(node.op_type)
            node.domain, node.op_type = ops[node.op_type]
    return used


def first_opset(domain: str, op_type: str) -> int | None:
    """The first ai.onnx opset defining the op (None outside ai.onnx or if unknown)."""
    if domain != "":
        return None
    versions = schemas.schemas_in_range(domain, op_type, None, None)
    return versions[0].since_version if versions else None


def narrow_opset(
    opset: dict[str, tuple[int | None, int | None]], member: Member
) -> dict[str, tuple[int | None, int | None]]:
    """The rule's opset range, starting no earlier than where each ai.onnx member exists."""
    firsts = [f for d, o in member.ops.values() if (f := first_opset(d, o)) is not None]
    if not firsts or max(firsts) <= 1:  # defined from the start: nothing to exclude
        return opset
    low, high = opset.get("", (None, None))
    start = max(firsts)
    if low is None or low < start:
        return {**opset, "": (start, high)}
    return opset
