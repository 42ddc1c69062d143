"""Digests of onnxfuse's outputs, to show that a change leaves every result byte-identical.

```
python bench/identity.py record BEFORE.json     # with the old revision installed
python bench/identity.py record AFTER.json      # with the new one
python bench/identity.py compare BEFORE.json AFTER.json
```

``record`` optimizes each model through the command line (`python -m onnxfuse optimize`),
so that any revision can be recorded whatever its package layout, and writes the
SHA-256 of every output file (the model and its external data) with its node count.
Models: the bundled sample, the onnx package's `light` models, the exports cached by
`tests/exports/` (`$ONNXFUSE_EXPORT_CACHE`, else `~/.cache/onnxfuse-exports`) and the
peer models of `tests/data/ort-fusion/`, each on the default target; the sample and the
light models also on the layout targets. ``compare`` prints every model whose digests
differ, or that only one record has, and exits 1 if there is any.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import onnx

REPO = Path(__file__).resolve().parent.parent
LIGHT_DIR = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
PEER_DIR = REPO / "tests" / "data" / "ort-fusion"
LAYOUT_TARGETS = ("cpu:block=8", "cuda:layout=nhwc", "cpu:layout=nhwc")


def export_cache() -> Path:
    root = os.environ.get("ONNXFUSE_EXPORT_CACHE")
    return Path(root) if root else Path.home() / ".cache" / "onnxfuse-exports"


def cases() -> list[tuple[str, str | None, str]]:
    """(case name, model path or None for the bundled sample, target)."""
    found: list[tuple[str, str | None, str]] = []
    light = sorted(LIGHT_DIR.glob("*.onnx"))
    for target in ("cpu", *LAYOUT_TARGETS):
        found.append((f"sample@{target}", None, target))
        found.extend((f"light/{p.name}@{target}", str(p), target) for p in light)
    found.extend(
        (f"exports/{p.name}@cpu", str(p), "cpu") for p in sorted(export_cache().glob("*.onnx"))
    )
    found.extend((f"peer/{p.name}@cpu", str(p), "cpu") for p in sorted(PEER_DIR.glob("*.onnx")))
    return found


def digest(path: Path) -> str:
    sha = hashlib.sha256()
    with path.open("rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            sha.update(block)
    return sha.hexdigest()


def optimize_one(case: tuple[str, str | None, str], workdir: Path) -> dict[str, object]:
    name, model, target = case
    out = workdir / (hashlib.sha1(name.encode()).hexdigest() + ".onnx")
    report = out.with_suffix(".json")
    command = [sys.executable, "-m", "onnxfuse", "optimize"]
    command += [model] if model else []
    command += ["-o", str(out), "--target", target, "--report-json", str(report), "-q"]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    result: dict[str, object] = {"exit": done.returncode}
    if done.returncode != 0:
        result["stderr"] = done.stderr.strip().splitlines()[-1:] or [""]
        return result
    result["nodes_after"] = json.loads(report.read_text())["nodes_after"]
    written = sorted(workdir.glob(out.stem + "*"))
    # The model and its external data; the report holds timings.
    result["files"] = {p.name.replace(out.stem, "OUT"): digest(p) for p in written if p != report}
    for p in written:
        p.unlink()
    return result


def record(path: Path, jobs: int) -> None:
    env_cache = tempfile.mkdtemp(prefix="onnxfuse-identity-cache-")
    os.environ["ONNXFUSE_CACHE_DIR"] = env_cache  # each revision parses its own rules
    found = cases()
    with (
        tempfile.TemporaryDirectory(prefix="onnxfuse-identity-") as work,
        ThreadPoolExecutor(jobs) as pool,
    ):
        results = pool.map(lambda c: optimize_one(c, Path(work)), found)
        table = {case[0]: result for case, result in zip(found, results)}
    path.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
    failed = sum(1 for r in table.values() if r["exit"] != 0)
    print(f"{len(table)} cases recorded in {path} ({failed} exited non-zero)")


def compare(before_path: Path, after_path: Path) -> int:
    before = json.loads(before_path.read_text())
    after = json.loads(after_path.read_text())
    differ = [
        name
        for name in sorted(set(before) | set(after))
        if {k: v for k, v in before.get(name, {}).items() if k != "stderr"}
        != {k: v for k, v in after.get(name, {}).items() if k != "stderr"}
    ]
    for name in differ:
        print(f"{name}: {before.get(name)} -> {after.get(name)}")
    print(f"{len(set(before) | set(after))} cases, {len(differ)} differ")
    return 1 if differ else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    verbs = parser.add_subparsers(dest="verb", required=True)
    rec = verbs.add_parser("record")
    rec.add_argument("out", type=Path)
    rec.add_argument("--jobs", type=int, default=2)
    cmp = verbs.add_parser("compare")
    cmp.add_argument("before", type=Path)
    cmp.add_argument("after", type=Path)
    args = parser.parse_args()
    if args.verb == "record":
        record(args.out, args.jobs)
        return 0
    return compare(args.before, args.after)


if __name__ == "__main__":
    sys.exit(main())
