"""The NCHWc block size this machine's onnxruntime (MLAS) would use.

MLAS picks its NCHWc block size from the CPU's SIMD width: 16 floats with
AVX-512F, 8 with AVX2/FMA or AVX, and no NCHWc kernels otherwise (SSE-only x86,
Arm). Only Linux exposes the flags in a file we can read without extra
packages; elsewhere the block size must be given (``--target cpu:block=8``).
"""

from __future__ import annotations

import sys
from pathlib import Path

CPUINFO = Path("/proc/cpuinfo")


def _first_processor(field: str, cpuinfo: Path) -> str | None:
    try:
        text = cpuinfo.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == field:
            return value.strip()
    return None


def cpu_flags(cpuinfo: Path = CPUINFO) -> frozenset[str] | None:
    """The first processor's feature flags, or None where they cannot be read."""
    flags = _first_processor("flags", cpuinfo)
    return None if flags is None else frozenset(flags.split())


def cpu_model(cpuinfo: Path = CPUINFO) -> str | None:
    """The first processor's model name (``Intel(R) Xeon(R) ...``), or None."""
    return _first_processor("model name", cpuinfo)


def block_size_for_flags(flags: frozenset[str]) -> int | None:
    """MLAS's choice: AVX-512F -> 16, AVX2/FMA or AVX -> 8, otherwise no NCHWc."""
    if "avx512f" in flags:
        return 16
    if flags & {"avx2", "fma", "avx"}:
        return 8
    return None


def detect_block_size(cpuinfo: Path = CPUINFO) -> int | None:
    """This machine's NCHWc block size; None when unknown or when NCHWc is off."""
    if not sys.platform.startswith("linux"):
        return None
    flags = cpu_flags(cpuinfo)
    return None if flags is None else block_size_for_flags(flags)
