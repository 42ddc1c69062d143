"""Target profiles: what a fused op measured against the pattern it replaces, on a machine.

A rule's ``benefit`` is a guess; a profile written by ``onnxfuse targets calibrate``
holds the measured ratio (fused time / unfused time) of each rule at the facts it was
measured at: the element type and shape, as the model states them, of every value the
rule's source pattern binds. ``--target cpu:profile=FILE`` reads one; a rewrite whose
match has facts measured slower (ratio above ``SLOWER_ABOVE``) is then skipped, and the
report names it with the ratio. The format is documented in docs/targets.md.
"""

from __future__ import annotations

import datetime
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import onnx_ir as ir

from onnxfuse.errors import SourceError
from onnxfuse.language.yaml_lines import LineList, LineMap, load_yaml
from onnxfuse.targets.facts import dtype_name

FORMAT_VERSION = 1
# Above this ratio a fusion counts as slower: below it, timing noise on a busy machine
# could flip the verdict from one calibration to the next; ties go to the rule's benefit.
SLOWER_ABOVE = 1.05

FILE_KEYS = ("profile", "target", "provider", "machine", "onnxruntime", "date", "settings")
FILE_KEYS_MEASURED = ("measurements",)
MEASUREMENT_KEYS = (
    "rule",
    "alternative",
    "inputs",
    "at",
    "dims",
    "model",
    "unfused_us",
    "fused_us",
    "ratio",
)


def value_spelling(value: ir.Value | None) -> str:
    """A bound value as a profile keys it: ``float[batch,seq,768]`` (dims as the model
    states them; ``?`` for a dim without a name), ``float[...]`` without a known rank,
    ``absent`` for an optional input the match left out."""
    if value is None:
        return "absent"
    dtype = dtype_name(value.dtype) if isinstance(value.type, ir.TensorType) else None
    if value.shape is None:
        return f"{dtype or '?'}[...]"
    dims = [str(d) if isinstance(d, int) else (d.value or "?") for d in value.shape]
    return f"{dtype or '?'}[{','.join(dims)}]"


def match_facts(values: Mapping[str, ir.Value | None], names: list[str]) -> dict[str, str]:
    """The facts of a match a profile keys on: each source input's spelling."""
    return {name: value_spelling(values.get(name)) for name in names}


def _compatible(measured: str, seen: str) -> bool:
    """Whether a value spelled ``seen`` in a model may be the one ``measured``: the same
    element type and rank, equal static dims (a named or unknown dim matches any)."""
    m_type, _, m_dims = measured.partition("[")
    s_type, _, s_dims = seen.partition("[")
    if m_type != s_type or "..." in (m_dims, s_dims):
        return measured == seen
    m_list = [d for d in m_dims.rstrip("]").split(",") if d]
    s_list = [d for d in s_dims.rstrip("]").split(",") if d]
    return len(m_list) == len(s_list) and all(
        a == b or not b.isdigit() for a, b in zip(m_list, s_list)
    )


@dataclass(frozen=True)
class Measurement:
    rule: str
    alternative: int  # which of the rule's source patterns matched
    inputs: dict[str, str]  # source input -> value_spelling
    at: str  # the shapes the run had, for people: "[1, 128, 768]"
    unfused_us: float
    fused_us: float
    dims: dict[str, int] = field(default_factory=dict)  # the symbolic dims as bound
    model: str = ""  # the model it was measured in ("" : drawn from the verify domain)
    # The median of the rounds' own ratios (each round times both, one after the other:
    # steadier than the ratio of the medians when the machine's load drifts).
    paired_ratio: float | None = None

    @property
    def ratio(self) -> float:
        if self.paired_ratio is not None:
            return self.paired_ratio
        return self.fused_us / self.unfused_us

    @property
    def slower(self) -> bool:
        return self.ratio > SLOWER_ABOVE

    def verdict(self) -> str:
        if self.slower:
            return f"measured {self.ratio:.2f}x slower at {self.at}"
        if self.ratio > 1:
            return f"measured as fast (ratio {self.ratio:.2f}) at {self.at}"
        return f"measured {1 / self.ratio:.2f}x faster at {self.at}"

    def to_yaml(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "rule": self.rule,
            "alternative": self.alternative,
            "inputs": dict(self.inputs),
            "at": self.at,
        }
        if self.dims:
            out["dims"] = dict(self.dims)
        if self.model:
            out["model"] = self.model
        out["unfused_us"] = round(self.unfused_us, 3)
        out["fused_us"] = round(self.fused_us, 3)
        out["ratio"] = round(self.ratio, 3)
        return out


@dataclass
class Profile:
    target: str
    measurements: list[Measurement]
    provider: str = ""
    machine: dict[str, Any] = field(default_factory=dict)
    onnxruntime: str = ""
    date: str = ""
    settings: dict[str, Any] = field(default_factory=dict)  # threads, level, runs
    path: Path | None = None

    def __str__(self) -> str:
        # How `Target.spec` spells the parameter: the file it came from.
        return str(self.path) if self.path is not None else "<profile>"

    def of_rule(self, rule: str) -> list[Measurement]:
        return [m for m in self.measurements if m.rule == rule]

    def lookup(self, rule: str, alternative: int, facts: dict[str, str]) -> Measurement | None:
        """The measurement that decides a match: the one at its very facts; else those
        it may be at (a symbolic dim of the match equals any measured size, its static
        dims must be equal), else all of the rule's, when they agree (all slower or all
        not: the slowest of them stands for them); None when the rule is not measured
        or its measurements disagree."""
        measured = self.of_rule(rule)
        for m in measured:
            if m.alternative == alternative and m.inputs == facts:
                return m
        compatible = [
            m
            for m in measured
            if m.alternative == alternative
            and m.inputs.keys() == facts.keys()
            and all(_compatible(m.inputs[k], facts[k]) for k in facts)
        ]
        for candidates in (compatible, measured):
            if candidates and len({m.slower for m in candidates}) == 1:
                return max(candidates, key=lambda m: m.ratio)
        return None

    def to_yaml(self) -> dict[str, Any]:
        return {
            "profile": FORMAT_VERSION,
            "target": self.target,
            "provider": self.provider,
            "machine": dict(self.machine),
            "onnxruntime": self.onnxruntime,
            "date": self.date,
            "settings": dict(self.settings),
            "measurements": [m.to_yaml() for m in self.measurements],
        }


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def dump_profile(profile: Profile) -> str:
    import yaml

    header = "# A target profile written by `onnxfuse targets calibrate` (docs/targets.md).\n"
    return header + yaml.safe_dump(profile.to_yaml(), sort_keys=False, width=100)


def load_profile(path: str | Path) -> Profile:
    """Read a profile; a problem is one SourceError naming the file and the line."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SourceError(f"cannot read profile: {exc}", path) from None
    try:
        data = load_yaml(text)
    except SourceError as exc:
        raise SourceError(exc.message, path, exc.line) from None
    return _parse(data, path)


def _parse(data: Any, path: Path) -> Profile:
    if not isinstance(data, LineMap) or data.get("profile") != FORMAT_VERSION:
        raise SourceError(
            f"a profile is a mapping with 'profile: {FORMAT_VERSION}', 'target' and 'measurements'",
            path,
            data.line_of("profile") if isinstance(data, LineMap) else 1,
        )
    for key in data:
        if key not in FILE_KEYS + FILE_KEYS_MEASURED:
            known = ", ".join(FILE_KEYS + FILE_KEYS_MEASURED)
            raise SourceError(f"unknown key '{key}' (known: {known})", path, data.line_of(key))
    target = data.get("target")
    if not isinstance(target, str) or not target:
        raise SourceError("'target' must be a target name", path, data.line_of("target"))
    entries = data.get("measurements")
    if not isinstance(entries, LineList):
        raise SourceError("'measurements' must be a list", path, data.line_of("measurements") or 1)
    measurements = [_measurement(e, line, path) for e, line in zip(entries, entries.item_lines)]
    for key in ("machine", "settings"):
        if not isinstance(data.get(key, {}), dict):
            raise SourceError(f"'{key}' must be a mapping", path, data.line_of(key))
    return Profile(
        target=target,
        measurements=measurements,
        provider=str(data.get("provider", "")),
        machine=dict(data.get("machine", {})),
        onnxruntime=str(data.get("onnxruntime", "")),
        date=str(data.get("date", "")),
        settings=dict(data.get("settings", {})),
        path=path,
    )


def _measurement(entry: Any, line: int, path: Path) -> Measurement:
    if not isinstance(entry, LineMap):
        raise SourceError("a measurement is a mapping (rule, inputs, at, ...)", path, line)

    def bad(key: str, expected: str) -> SourceError:
        return SourceError(f"measurement '{key}': expected {expected}", path, entry.line_of(key))

    for key in entry:
        if key not in MEASUREMENT_KEYS:
            known = ", ".join(MEASUREMENT_KEYS)
            raise SourceError(f"unknown key '{key}' (known: {known})", path, entry.line_of(key))
    for key in ("rule", "inputs", "at", "unfused_us", "fused_us"):
        if key not in entry:
            raise SourceError(f"measurement lacks '{key}'", path, line)
    rule, inputs, at = entry["rule"], entry["inputs"], entry["at"]
    if not isinstance(rule, str) or not rule:
        raise bad("rule", "a rule name")
    if not isinstance(inputs, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in inputs.items()
    ):
        raise bad("inputs", "a mapping of pattern inputs to 'dtype[dims]'")
    alternative = entry.get("alternative", 0)
    if not _integer(alternative) or alternative < 0:
        raise bad("alternative", "a source pattern index (0, 1, ...)")
    dims = entry.get("dims", {})
    if not isinstance(dims, dict) or not all(_integer(v) for v in dims.values()):
        raise bad("dims", "a mapping of dim names to integers")
    times = {}
    for key in ("unfused_us", "fused_us", "ratio"):
        if key not in entry:
            continue
        value = entry[key]
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
            raise bad(key, "a positive number")
        if not math.isfinite(value):
            raise bad(key, "a finite number")
        times[key] = float(value)
    return Measurement(
        rule=rule,
        alternative=alternative,
        inputs=dict(inputs),
        at=str(at),
        unfused_us=times["unfused_us"],
        fused_us=times["fused_us"],
        dims={str(k): int(v) for k, v in dims.items()},
        model=str(entry.get("model", "")),
        paired_ratio=times.get("ratio"),
    )


def _integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
