"""Rule packs: folders of rule files. Built-in packs ship inside the package."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from onnxfuse.errors import RuleError
from onnxfuse.language.rule import Rule
from onnxfuse.language.rulefile import load_rule_file

# Built-in packs load in this order; packs not listed follow alphabetically.
_PACK_ORDER = ("core",)


def builtin_rules_dir() -> Path:
    return Path(str(resources.files("onnxfuse.builtin_rules")))


def builtin_pack_names() -> list[str]:
    root = builtin_rules_dir()
    names = sorted(p.name for p in root.iterdir() if p.is_dir() and any(p.glob("*.yaml")))
    ordered = [n for n in _PACK_ORDER if n in names]
    return ordered + [n for n in names if n not in ordered]


def load_pack(folder: str | Path) -> list[Rule]:
    folder = Path(folder)
    files = sorted(folder.glob("*.yaml"))
    if not files:
        raise RuleError("no rule files (*.yaml) in this folder", str(folder))
    rules: list[Rule] = []
    for path in files:
        rules.extend(load_rule_file(path, pack=folder.name))
    return rules


def load_rules(paths: list[str | Path]) -> list[Rule]:
    """Load rule files or pack folders, in order."""
    rules: list[Rule] = []
    for path in paths:
        path = Path(path)
        if path.is_dir():
            rules.extend(load_pack(path))
        elif path.exists():
            rules.extend(load_rule_file(path))
        else:
            raise RuleError("no such rule file or pack folder", str(path))
    return rules


def load_builtin_rules(packs: list[str] | None = None) -> list[Rule]:
    root = builtin_rules_dir()
    rules: list[Rule] = []
    for name in packs if packs is not None else builtin_pack_names():
        folder = root / name
        if not folder.is_dir():
            raise RuleError(f"no built-in rule pack '{name}'")
        rules.extend(load_pack(folder))
    return rules


def check_unique(rules: list[Rule]) -> None:
    seen: dict[str, Rule] = {}
    for rule in rules:
        if rule.name in seen:
            raise RuleError(
                f"rule '{rule.name}' is defined twice (also at {seen[rule.name].origin})",
                rule.origin,
            )
        seen[rule.name] = rule
