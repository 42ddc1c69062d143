"""Where a benchmark's figures come from: command, date, commit, machine, versions."""

from __future__ import annotations

import datetime
import importlib
import os
import platform
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _git(*command: str) -> str:
    done = subprocess.run(["git", *command], cwd=ROOT, capture_output=True, text=True)
    return done.stdout.strip()


def _cpu_model() -> str:
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return ""
    names = (line.split(":", 1)[1].strip() for line in lines if line.startswith("model name"))
    return next(names, "")


def commit() -> str:
    return _git("rev-parse", "--short", "HEAD")


def environment(script: str, packages: list[str], **settings) -> dict:
    """The record a benchmark's JSON starts with; ``settings`` are its own options."""
    versions = {name: importlib.import_module(name).__version__ for name in packages}
    return {
        "command": f"python bench/{script} " + " ".join(sys.argv[1:]),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": commit(),
        # uncommitted engine, rule or target changes were in the measured tree
        "dirty": bool(_git("status", "--porcelain", "--", "engine", "rules", "targets")),
        "machine": f"{platform.machine()}, {_cpu_model()}",
        "cores": os.cpu_count(),
        "versions": {**versions, "python": platform.python_version()},
        **settings,
    }
