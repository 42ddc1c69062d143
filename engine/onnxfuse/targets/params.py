"""Target parameters: ``name:key=value,key=value`` on the command line.

A parameter states something about the machine a model is optimized for that
the capability file cannot know. The CPU target's NCHWc block size
(``cpu:block=8``): onnxruntime's blocked-layout kernels are laid out for the SIMD
width of the machine, so a model rewritten into them only runs correctly where that
block size holds. The CPU target's ``int8=on``: int8-activation QDQ units become
QLinearConv and QLinearMatMul, fast on Arm, slower than the unfused units on x86.
Plain ``cpu`` stays portable.
Every target takes ``layout=nhwc|nchw`` (``cuda:layout=nhwc``): the tensor
layout its convolutions should run in; a capability file's ``preferred_layout``
is its default, and ``profile=FILE``: a target profile written by ``onnxfuse targets
calibrate`` on the machine the model will run on (``targets/profile.py``); with one, a
rewrite measured slower than what it replaces is skipped.

Parameters reach rules through the guard name ``target_params`` (a mapping;
a rule that reads a parameter the target lacks does not fire).
"""

from __future__ import annotations

import platform
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from onnxfuse.errors import OnnxfuseError
from onnxfuse.targets.cpu_features import detect_block_size

if TYPE_CHECKING:
    from onnxfuse.targets.profile import Profile

# Metadata key recording the block size a rewritten model assumes.
BLOCK_SIZE_METADATA = "onnxfuse.nchwc_block_size"
NCHWC_DOMAIN = "com.microsoft.nchwc"

_SPEC = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=[^,:=]*(,[A-Za-z_][A-Za-z0-9_]*=[^,:=]*)*$")


def _block(text: str) -> int | None:
    if text == "auto":
        return detect_block_size()
    if text in ("8", "16"):
        return int(text)
    raise ValueError("8, 16 or auto")


def _int8(text: str) -> bool | None:
    if text == "auto":
        return True if platform.machine().lower() in ("aarch64", "arm64") else None
    if text in ("on", "off"):
        return True if text == "on" else None
    raise ValueError("on, off or auto")


def _profile(text: str) -> Profile:
    from onnxfuse.targets.profile import load_profile  # read only when one is given

    if not text:
        raise ValueError("the path of a profile written by `onnxfuse targets calibrate`")
    return load_profile(text)


def _layout(text: str) -> str:
    if text.lower() in ("nhwc", "nchw"):
        return text.lower()
    raise ValueError("nhwc or nchw")


# Parameters every target takes: key -> (parser, help).
COMMON_PARAMETERS: dict[str, tuple[Callable[[str], Any], str]] = {
    "layout": (
        _layout,
        "nhwc or nchw: the layout convolutions run in (default: the capability file's "
        "preferred_layout, else nchw); nhwc enables the nhwc pack",
    ),
    "profile": (
        _profile,
        "a target profile written by `onnxfuse targets calibrate` on the machine the model "
        "will run on: rewrites it measured slower than what they replace are skipped",
    ),
}


# Parameters per target name: key -> (parser to a value or None for "off", help).
PARAMETERS: dict[str, dict[str, tuple[Callable[[str], Any], str]]] = {
    "cpu": {
        "block": (
            _block,
            "NCHWc block size: 8 (AVX/AVX2), 16 (AVX-512F) or auto (this machine's "
            "CPU; off where it has no AVX or is not Linux); enables the nchwc pack",
        ),
        "int8": (
            _int8,
            "on, off (default) or auto (on for Arm): fuse QDQ Conv and MatMul units with "
            "int8 activations, as onnxruntime does on Arm only (its x86 int8 kernels run "
            "slower than the unfused units)",
        ),
    },
}


def split_spec(text: str) -> tuple[str, str | None]:
    """``'cpu:block=8'`` -> ``('cpu', 'block=8')``; a plain name or path -> (text, None).

    The split is at the last ':' followed by key=value pairs, so a Windows path
    (``C:\\targets\\npu.yaml``) stays whole.
    """
    base, sep, rest = text.rpartition(":")
    if sep and base and _SPEC.match(rest):
        return base, rest
    return text, None


def parse_params(target_name: str, spec: str) -> dict[str, Any]:
    """The parameters of ``spec`` for the target; a one-line error for unknown or bad ones."""
    known = {**PARAMETERS.get(target_name, {}), **COMMON_PARAMETERS}
    params: dict[str, Any] = {}
    for item in spec.split(","):
        key, _, raw = item.partition("=")
        if key not in known:
            names = ", ".join(sorted(known)) or "none"
            raise OnnxfuseError(
                f"target '{target_name}' has no parameter '{key}' (its parameters: {names})"
            )
        if key in params:
            raise OnnxfuseError(f"target parameter '{key}' is given twice")
        parser, _help = known[key]
        try:
            value = parser(raw.strip())
        except ValueError as exc:
            raise OnnxfuseError(f"target parameter {key}={raw!r}: expected {exc}") from None
        if key == "profile" and value.target != target_name:
            raise OnnxfuseError(
                f"{value.path}: the profile is for target '{value.target}', not '{target_name}'"
            )
        params[key] = value
    # A parameter resolved to "off" (block=auto on a machine without NCHWc) is left out.
    return {k: v for k, v in params.items() if v is not None}


def describe_parameters(target_name: str) -> list[str]:
    """One line per parameter the target accepts, for `onnxfuse targets show`."""
    return [
        f"{target_name}:{key}=...  {help_text}"
        for key, (_parser, help_text) in {
            **PARAMETERS.get(target_name, {}),
            **COMMON_PARAMETERS,
        }.items()
    ]
