"""A corpus of minimized failures: the files of one folder (a clone's fuzz/corpus/, which
the test suite replays; ./fuzz-corpus for `onnxfuse fuzz`).

A graph case is ``graph-<slug>.onnx`` with ``graph-<slug>.json`` beside it (the
target, the fuzz seed, how to feed the model, what failed). A rule case is
``rule-<slug>.yaml`` with ``rule-<slug>.json``. A sidecar may carry
``"xfail": "<reason>"``: the bug is known and not fixed yet, and the test
suite expects the case to fail (strictly: once fixed, remove the field).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx


@dataclass
class Entry:
    sidecar: Path
    data: dict[str, Any]

    @property
    def kind(self) -> str:
        return str(self.data.get("kind", ""))

    @property
    def signature(self) -> str:
        return str(self.data.get("failure", {}).get("signature", ""))

    @property
    def xfail(self) -> str | None:
        reason = self.data.get("xfail")
        return str(reason) if reason else None

    @property
    def payload(self) -> Path:
        return self.sidecar.with_name(str(self.data["file"]))


def entries(directory: Path) -> list[Entry]:
    if not directory.is_dir():
        return []
    found = []
    for sidecar in sorted(directory.glob("*.json")):
        try:
            data = json.loads(sidecar.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and data.get("kind") in ("graph", "rule"):
            found.append(Entry(sidecar, data))
    return found


def known_signatures(directory: Path, kind: str = "graph") -> set[str]:
    return {e.signature for e in entries(directory) if e.kind == kind and e.signature}


def xfail_signatures(directory: Path, kind: str = "graph") -> set[str]:
    return {e.signature for e in entries(directory) if e.kind == kind and e.xfail}


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-").lower()[:60] or "case"


@dataclass
class Case:
    """A minimized failure found by a worker, saved by the process that owns the corpus
    (a worker may run on another machine)."""

    kind: str  # graph / rule
    payload: bytes
    suffix: str
    data: dict[str, Any]


def save_case(directory: Path, case: Case) -> Path | None:
    return save(directory, case.kind, case.payload, case.suffix, case.data)


def save(
    directory: Path, kind: str, payload: bytes, suffix: str, data: dict[str, Any]
) -> Path | None:
    """Write a case unless one with the same signature is already there; return the sidecar."""
    directory.mkdir(parents=True, exist_ok=True)
    signature = data["failure"]["signature"]
    if signature in known_signatures(directory, kind):
        return None
    digest = hashlib.sha256(payload).hexdigest()[:8]
    stem = f"{kind}-{_slug(signature)}-{digest}"
    (directory / f"{stem}{suffix}").write_bytes(payload)
    data = {"kind": kind, "file": f"{stem}{suffix}", **data}
    sidecar = directory / f"{stem}.json"
    sidecar.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n", encoding="utf-8")
    return sidecar


def load_model(entry: Entry) -> onnx.ModelProto:
    return onnx.load_model(str(entry.payload))
