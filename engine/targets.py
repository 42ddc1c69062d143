"""Capability files: which ops an execution provider runs, and rule gating.

A target file (``targets/NAME.yaml``) lists ops as domain, op type and opset
range, with the element types per type variable where the source states
them. A rule may fire for a target only if every op its target pattern
creates is supported there at the model's opset.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import yaml

from onnxfuse.errors import OnnxfuseError
from onnxfuse.language.rule import Rule

OPEN_ENDED = None


@dataclass(frozen=True)
class OpSupport:
    domain: str
    op_type: str
    since: int
    until: int | None
    types: dict[str, list[str]] = field(default_factory=dict, hash=False, compare=False)

    def covers(self, opset: int) -> bool:
        return self.since <= opset and (self.until is None or opset <= self.until)


@dataclass
class Target:
    name: str
    description: str
    ops: dict[tuple[str, str], list[OpSupport]]
    all_ops_of: frozenset[str] = frozenset()

    def supports(self, domain: str, op_type: str, opset: int) -> bool:
        if domain in self.all_ops_of:
            return True
        return any(s.covers(opset) for s in self.ops.get((domain, op_type), ()))

    def unsupported_ops(self, rule: Rule, constants: set[str], opsets: dict[str, int]) -> list[str]:
        """Ops a firing would leave in the graph that this target cannot run.

        ``constants`` names the bound variables that are constants: target
        nodes computed from constants only are folded away and need no kernel.
        """
        constant = set(constants)
        missing: list[str] = []
        for node in rule.target.nodes:
            outputs = {o.name for o in node.outputs if o is not None}
            value_inputs = node.inputs[:1] if node.op_type == "CastLike" else node.inputs
            if node.domain == "" and all(v is None or v.name in constant for v in value_inputs):
                constant |= outputs
                continue
            opset = opsets.get(node.domain, rule.imports.get(node.domain, 1))
            if not self.supports(node.domain, node.op_type, opset):
                name = f"{node.domain}::{node.op_type}" if node.domain else node.op_type
                if name not in missing:
                    missing.append(name)
        return missing


def builtin_targets_dir() -> Path:
    return Path(str(resources.files("onnxfuse.builtin_targets")))


def builtin_target_names() -> list[str]:
    return sorted(p.stem for p in builtin_targets_dir().glob("*.yaml"))


@functools.cache
def load_target(name_or_path: str) -> Target:
    path = Path(name_or_path)
    if path.suffix not in (".yaml", ".yml"):
        path = builtin_targets_dir() / f"{name_or_path}.yaml"
        if not path.exists():
            known = ", ".join(builtin_target_names())
            raise OnnxfuseError(f"unknown target '{name_or_path}' (known: {known})")
    try:
        loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=loader)
    except (OSError, yaml.YAMLError) as exc:
        raise OnnxfuseError(f"{path}: cannot read target file: {exc}") from None
    if not isinstance(data, dict) or "name" not in data:
        raise OnnxfuseError(f"{path}: a target file is a mapping with 'name' and 'ops'")
    ops: dict[tuple[str, str], list[OpSupport]] = {}
    for entry in data.get("ops") or []:
        try:
            support = OpSupport(
                domain=str(entry.get("domain", "")),
                op_type=str(entry["op"]),
                since=int(entry.get("since", 1)),
                until=None if entry.get("until") is None else int(entry["until"]),
                types=dict(entry.get("types") or {}),
            )
        except (KeyError, TypeError, ValueError, AttributeError):
            raise OnnxfuseError(f"{path}: malformed op entry {entry!r}") from None
        ops.setdefault((support.domain, support.op_type), []).append(support)
    return Target(
        name=str(data["name"]),
        description=str(data.get("description", "")),
        ops=ops,
        all_ops_of=frozenset(str(d) for d in data.get("all_ops_of") or []),
    )
