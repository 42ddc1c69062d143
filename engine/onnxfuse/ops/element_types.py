"""Element type names: one spelling, ONNX's.

Rule patterns are written in ONNX's text syntax (an input typed ``float[N]``),
onnxruntime's kernel registry and the capability files name types so, and so do
guards (``dtype(X) == 'float'``) and verification domains (``dtypes: [float,
double]``): the lower-case ``TensorProto.DataType`` names, ``float``, ``double``,
``float16``, ``bfloat16``, ``int8`` ... ``uint64``, ``bool``, ``string``. NumPy's
spelling (``float32``, ``float64``) is refused where a file names a type, with a
suggestion (``suggest``).

Conversions to a name and back: ``from_onnx`` (a TensorProto number or an
``ir.DataType``), ``from_numpy`` (a NumPy dtype), ``to_onnx``, ``to_ir``,
``to_numpy``.
"""

from __future__ import annotations

import difflib
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir


def _names_by_code() -> dict[int, str]:
    found = {
        int(code): name.lower()
        for name, code in onnx.TensorProto.DataType.items()
        if code != onnx.TensorProto.UNDEFINED
    }
    # Types the installed onnx_ir knows and onnx does not yet (or the reverse) keep
    # the name their own enumeration gives.
    for dtype in ir.DataType:
        if dtype != ir.DataType.UNDEFINED:
            found.setdefault(int(dtype), dtype.name.lower())
    return dict(sorted(found.items()))


_NAME_OF: dict[int, str] = _names_by_code()
_CODE_OF: dict[str, int] = {name: code for code, name in _NAME_OF.items()}

# Every element type name, in TensorProto's order ('float', 'uint8', 'int8', ...).
NAMES: tuple[str, ...] = tuple(_NAME_OF.values())

# Families of the types NumPy computes in (ml_dtypes' bfloat16 included).
FLOATS: tuple[str, ...] = ("float", "float16", "double", "bfloat16")
INTEGERS: tuple[str, ...] = (
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
)
# 4-bit integers (quantized weights): NumPy holds them in ml_dtypes' int4 and uint4.
PACKED_INTEGERS: tuple[str, ...] = ("int4", "uint4")

# Other spellings a suggestion maps straight to ONNX's: NumPy's (and C's) names.
ALIASES: dict[str, str] = {
    "float32": "float",
    "float64": "double",
    "half": "float16",
    "bool_": "bool",
    "str": "string",
}


def is_name(name: Any) -> bool:
    """Whether ``name`` is an element type name, spelled as ONNX spells it."""
    return isinstance(name, str) and name in _CODE_OF


def from_onnx(code: int | ir.DataType | None) -> str | None:
    """The name of a TensorProto element type number or an ``ir.DataType``
    (None for UNDEFINED, None itself, and numbers no element type has)."""
    if code is None:
        return None
    try:
        return _NAME_OF.get(int(code))
    except (TypeError, ValueError):
        return None


def from_numpy(dtype: Any) -> str | None:
    """The name of a NumPy dtype (or of an array's), None where ONNX has no such type."""
    try:
        dtype = np.dtype(getattr(dtype, "dtype", dtype))
        return from_onnx(onnx.helper.np_dtype_to_tensor_dtype(dtype))
    except (KeyError, TypeError, ValueError):
        return None


def to_onnx(name: str) -> int:
    """The TensorProto element type number of a name; ValueError for another name."""
    try:
        return _CODE_OF[name]
    except (KeyError, TypeError):
        raise ValueError(unknown(name)) from None


def to_ir(name: str) -> ir.DataType:
    return ir.DataType(to_onnx(name))


def to_numpy(name: str) -> np.dtype:
    """The NumPy dtype that holds a type's values (ml_dtypes' for bfloat16 and the
    float8s); ValueError for a name that is not an element type or has no NumPy dtype."""
    try:
        return np.dtype(to_ir(name).numpy())
    except TypeError:
        raise ValueError(f"element type '{name}' has no NumPy dtype") from None


def suggest(name: Any) -> str | None:
    """The element type name ``name`` was probably meant to be, or None."""
    if not isinstance(name, str):
        return None
    text = name.strip()
    lowered = text.lower()
    for candidate in (lowered, lowered.removeprefix("tensor(").removesuffix(")")):
        if candidate in _CODE_OF and candidate != name:
            return candidate
        if candidate in ALIASES:
            return ALIASES[candidate]
    close = difflib.get_close_matches(lowered, NAMES, n=1, cutoff=0.6)
    return close[0] if close else None


def unknown(name: Any) -> str:
    """The message for a name that is not an element type:
    ``unknown element type 'float32' (did you mean float?)``."""
    shown = repr(name) if isinstance(name, str) else f"{name!r} ({type(name).__name__})"
    guess = suggest(name)
    if guess is not None:
        return f"unknown element type {shown} (did you mean {guess}?)"
    return f"unknown element type {shown} (ONNX's names: {', '.join(NAMES)})"


__all__ = [
    "ALIASES",
    "FLOATS",
    "INTEGERS",
    "NAMES",
    "PACKED_INTEGERS",
    "from_numpy",
    "from_onnx",
    "is_name",
    "suggest",
    "to_ir",
    "to_numpy",
    "to_onnx",
    "unknown",
]
