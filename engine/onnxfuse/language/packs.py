"""Rule packs: folders of rule files. Built-in packs ship inside the package.

A pack folder may hold a manifest, ``pack.yaml``::

    description: Fusions for the Acme NPU.
    targets: [acme-npu]      # its rules fire only when optimizing for these targets
    replaces: [ort]          # packs it stands in for: dropped when this pack is active
    extends: [core]          # packs it builds on: loaded first (built-in ones on demand)
    phase: layout            # when its rules run (default: fusion), see PHASES
    reuses: [transpose-*]    # rules of the packs before it (names, * wildcards) that run
                             # again in its phase: the Transposes its rules create cancel

Without a manifest a pack applies to every target and replaces nothing.
"""

from __future__ import annotations

import dataclasses
import fnmatch
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from onnxfuse.errors import RuleError, SourceError
from onnxfuse.language.python_rules import PYTHON_SUFFIX, load_rule_module
from onnxfuse.language.rule import PHASES, Rule
from onnxfuse.language.rulefile import load_rule_file
from onnxfuse.language.yaml_lines import LineMap, load_yaml
from onnxfuse.support.heap import collector_paused
from onnxfuse.support.load_cache import cached, content_key, stat_key

# Built-in packs load in this order; packs not listed follow alphabetically.
_PACK_ORDER = ("core",)
MANIFEST = "pack.yaml"
# A pack's folder of reference definitions of ops with no CPU kernel (proof.reference_ops).
REFERENCE_FOLDER = "reference"
MANIFEST_KEYS = {
    "description": "what the pack is for",
    "targets": "targets its rules are for (names as in the target files)",
    "replaces": "packs this pack stands in for",
    "extends": "packs this pack builds on",
    "phase": f"when its rules run: {' or '.join(PHASES)} (each phase reaches its fixpoint first)",
    "reuses": "rules of the packs before it (names, * wildcards) that run again in its phase",
}


@dataclass
class PackManifest:
    """A pack folder's pack.yaml (an empty one for a folder without it)."""

    path: Path | None = None
    description: str = ""
    targets: list[str] | None = None  # None: every target
    replaces: list[str] = field(default_factory=list)
    extends: list[str] = field(default_factory=list)
    phase: str = PHASES[0]
    reuses: list[str] = field(default_factory=list)

    def applies_to(self, target: str | None) -> bool:
        return self.targets is None or target is None or target in self.targets


@dataclass
class Pack:
    name: str
    rules: list[Rule]
    manifest: PackManifest = field(default_factory=PackManifest)
    builtin: bool = False


def builtin_rules_dir() -> Path:
    return Path(str(resources.files("onnxfuse.builtin_rules")))


def builtin_pack_names() -> list[str]:
    root = builtin_rules_dir()
    names = sorted(p.name for p in root.iterdir() if p.is_dir() and _rule_files(p))
    ordered = [n for n in _PACK_ORDER if n in names]
    return ordered + [n for n in names if n not in ordered]


def _rule_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.glob("*.yaml") if p.name != MANIFEST)


def read_manifest(folder: str | Path) -> PackManifest:
    """The folder's pack.yaml; file:line errors for a malformed one."""
    path = Path(folder) / MANIFEST
    if not path.exists():
        return PackManifest()
    try:
        document = load_yaml(path.read_text(encoding="utf-8"))
    except SourceError as exc:
        raise RuleError(exc.message, path, exc.line) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise RuleError(f"cannot read pack manifest: {exc}", str(path)) from None
    if document is None:
        return PackManifest(path)
    if not isinstance(document, LineMap):
        raise RuleError("a pack manifest is a mapping (description, targets, ...)", str(path), 1)
    for key in document:
        if key not in MANIFEST_KEYS:
            known = ", ".join(MANIFEST_KEYS)
            raise RuleError(
                f"unknown key '{key}' (known: {known})", str(path), document.line_of(str(key))
            )

    def names(key: str) -> list[str] | None:
        value = document.get(key)
        if value is None:
            return None
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
            raise RuleError(
                f"'{key}' must be a list of names ({MANIFEST_KEYS[key]})",
                str(path),
                document.line_of(key),
            )
        return list(value)

    phase = document.get("phase", PHASES[0])
    if phase not in PHASES:
        raise RuleError(
            f"'phase' must be one of {', '.join(PHASES)}, got {phase!r}",
            str(path),
            document.line_of("phase"),
        )
    description = document.get("description", "")
    if not isinstance(description, str):
        raise RuleError("'description' must be text", str(path), document.line_of("description"))
    return PackManifest(
        path=path,
        description=description,
        targets=names("targets"),
        replaces=names("replaces") or [],
        extends=names("extends") or [],
        phase=phase,
        reuses=names("reuses") or [],
    )


def load_pack(folder: str | Path) -> list[Rule]:
    folder = Path(folder)
    files = _rule_files(folder)
    if not files:
        raise RuleError("no rule files (*.yaml) in this folder", str(folder))
    phase = read_manifest(folder).phase
    rules: list[Rule] = []
    for path in files:
        rules.extend(load_rule_file(path, pack=folder.name))
    for rule in rules:
        rule.phase = phase
    return rules


# The reference/ folders of the packs loaded so far (a rule file's folder is its pack).
_LOADED_REFERENCE_FOLDERS: dict[Path, None] = {}


def reference_folders() -> list[Path]:
    """Where reference definitions of ops (a pack's ``reference/*.yaml``) are read: every
    built-in pack's folder, then those of the packs and rule files loaded in this run."""
    found = builtin_rules_dir().glob(f"*/{REFERENCE_FOLDER}")
    # Resolved: `onnxfuse check rules/` loads the built-in packs by another path.
    builtin = sorted(p.resolve() for p in found if p.is_dir())
    return list(dict.fromkeys([*builtin, *_LOADED_REFERENCE_FOLDERS]))


def _remember_reference_folder(path: Path) -> None:
    folder = (path if path.is_dir() else path.parent) / REFERENCE_FOLDER
    if folder.is_dir():
        _LOADED_REFERENCE_FOLDERS[folder.resolve()] = None


def load_packs(paths: list[str | Path]) -> list[Pack]:
    """Rule files and pack folders, in order, each with its manifest."""
    if not paths:
        return []
    given = [Path(path) for path in paths]
    for path in given:
        _remember_reference_folder(path)
    if any(path.suffix == PYTHON_SUFFIX for path in given):
        # A Python module may import other files: its content alone does not name its rules.
        with collector_paused():
            return [_load_one(path) for path in given]

    def key() -> bytes:
        return content_key(file for path in given for file in files_read(path))

    with collector_paused():
        return cached("rules", key, lambda: [_load_one(path) for path in given])


def files_read(path: Path) -> list[Path]:
    """The files loading ``path`` reads (raises OSError for a missing one). Each must be a
    regular file: a pipe would block the read, a device never end it."""
    if path.is_dir():
        manifest = path / MANIFEST
        files = [manifest, *_rule_files(path)] if manifest.exists() else _rule_files(path)
    else:
        files = [path]
    for file in files:
        if file.exists() and not file.is_file():
            raise RuleError("not a regular file", str(file))
    return files


def _load_one(path: Path) -> Pack:
    if path.is_dir():
        manifest = read_manifest(path)  # first: its errors come before the rules'
        return Pack(path.name, load_pack(path), manifest)
    if path.suffix == PYTHON_SUFFIX and path.is_file():
        return Pack(path.stem, load_rule_module(path))
    if path.exists():
        return Pack(path.stem, load_rule_file(path))
    raise RuleError("no such rule file or pack folder", str(path))


def load_rules(paths: list[str | Path]) -> list[Rule]:
    """Load rule files or pack folders, in order."""
    return [rule for pack in load_packs(paths) for rule in pack.rules]


def load_builtin_packs(packs: list[str] | None = None) -> list[Pack]:
    root = builtin_rules_dir()
    names = packs if packs is not None else builtin_pack_names()
    with collector_paused():
        for name in names:
            if not (root / name).is_dir():
                raise RuleError(f"no built-in rule pack '{name}'")

        def key() -> bytes:
            # Installed files: their sizes and times name them, no need to read them.
            return "\0".join(names).encode() + b"\n" + stat_key(sorted(root.rglob("*.yaml")))

        return cached(
            "builtin-rules", key, lambda: [_load_builtin_pack(root / name) for name in names]
        )


def _load_builtin_pack(folder: Path) -> Pack:
    return Pack(folder.name, load_pack(folder), read_manifest(folder), builtin=True)


def load_builtin_rules(packs: list[str] | None = None) -> list[Rule]:
    return [rule for pack in load_builtin_packs(packs) for rule in pack.rules]


def resolve_packs(packs: list[Pack], target: str | None) -> list[Pack]:
    """The packs that apply when optimizing for ``target`` (None: any target).

    A pack whose manifest names other targets is left out; an active pack's
    ``replaces`` drops those packs and its ``extends`` brings in the packs it
    builds on (built-in ones are loaded if they were not selected) before it.
    """
    active = [p for p in packs if p.manifest.applies_to(target)]
    known = {p.name for p in packs} | set(builtin_pack_names())
    replaced: set[str] = set()
    for pack in active:
        for name in pack.manifest.replaces:
            if name not in known:
                raise RuleError(
                    f"pack '{pack.name}' replaces '{name}', which is no pack here",
                    _where(pack),
                )
            replaced.add(name)
    ordered: list[Pack] = []
    for pack in active:
        for name in pack.manifest.extends:
            if name in replaced:
                raise RuleError(
                    f"pack '{pack.name}' extends '{name}', which another pack replaces",
                    _where(pack),
                )
            if any(p.name == name for p in ordered):
                continue
            selected = [p for p in active if p.name == name]
            if not selected and name not in builtin_pack_names():
                raise RuleError(
                    f"pack '{pack.name}' extends '{name}', which is neither selected "
                    "nor a built-in pack",
                    _where(pack),
                )
            ordered.extend(selected or load_builtin_packs([name]))
        if pack.name not in replaced and not any(p is pack for p in ordered):
            ordered.append(pack)
    return _apply_reuses(ordered)


def _apply_reuses(packs: list[Pack]) -> list[Pack]:
    """Rules that a later pack `reuses` also run in that pack's phase.

    A layout pack whose rewrites create Transposes names the transpose rules so
    that they cancel in its phase too; the rules stay in their own phase, and
    packs that are not active reuse nothing. Rules are copied, not changed:
    loaded packs may be shared.
    """
    result = list(packs)
    for index, pack in enumerate(packs):
        patterns, phase = pack.manifest.reuses, pack.manifest.phase
        if not patterns:
            continue
        for earlier in range(index):
            before = result[earlier]
            rules = [
                dataclasses.replace(rule, also_phases=rule.also_phases | {phase})
                if rule.phase != phase and any(fnmatch.fnmatchcase(rule.name, p) for p in patterns)
                else rule
                for rule in before.rules
            ]
            result[earlier] = dataclasses.replace(before, rules=rules)
    return result


def _where(pack: Pack) -> str | None:
    return str(pack.manifest.path) if pack.manifest.path is not None else None


def check_unique(rules: list[Rule]) -> None:
    seen: dict[str, Rule] = {}
    for rule in rules:
        if rule.name in seen:
            raise RuleError(
                f"rule '{rule.name}' is defined twice (also at {seen[rule.name].origin})",
                *rule.place,
            )
        seen[rule.name] = rule
