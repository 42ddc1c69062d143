"""onnxfuse.ops.element_types: one spelling of element types, ONNX's, and conversions."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import onnx_ir as ir
import pytest

from onnxfuse.ops import element_types


def test_names_are_onnx_s():
    assert element_types.NAMES[:3] == ("float", "uint8", "int8")
    for name, code in onnx.TensorProto.DataType.items():
        if code:
            assert element_types.from_onnx(code) == name.lower()
            assert element_types.to_onnx(name.lower()) == code
    assert element_types.is_name("double") and not element_types.is_name("float64")
    assert not element_types.is_name("undefined") and not element_types.is_name(1)


@pytest.mark.parametrize(
    ("name", "code", "dtype"),
    [
        ("float", 1, np.float32),
        ("double", 11, np.float64),
        ("float16", 10, np.float16),
        ("bfloat16", 16, ml_dtypes.bfloat16),
        ("int64", 7, np.int64),
        ("uint8", 2, np.uint8),
        ("bool", 9, np.bool_),
    ],
)
def test_conversions(name, code, dtype):
    assert element_types.from_onnx(code) == name
    assert element_types.from_onnx(ir.DataType(code)) == name
    assert element_types.to_onnx(name) == code
    assert element_types.to_ir(name) == ir.DataType(code)
    assert element_types.to_numpy(name) == np.dtype(dtype)
    assert element_types.from_numpy(np.dtype(dtype)) == name
    assert element_types.from_numpy(np.zeros(2, dtype)) == name


def test_what_has_no_name():
    assert element_types.from_onnx(None) is None
    assert element_types.from_onnx(0) is None
    assert element_types.from_onnx(999) is None
    assert element_types.from_numpy(np.dtype("datetime64[s]")) is None
    with pytest.raises(
        ValueError, match=r"unknown element type 'float32' \(did you mean float\?\)"
    ):
        element_types.to_onnx("float32")


@pytest.mark.parametrize(
    ("given", "meant"),
    [
        ("float32", "float"),
        ("float64", "double"),
        ("flaot", "float"),
        ("FLOAT", "float"),
        ("doubel", "double"),
        ("tensor(float)", "float"),
        ("Float16", "float16"),
        ("unit8", "uint8"),
        ("qwerty", None),
        (3, None),
    ],
)
def test_suggest(given, meant):
    assert element_types.suggest(given) == meant


def test_unknown():
    assert (
        element_types.unknown("float32") == "unknown element type 'float32' (did you mean float?)"
    )
    assert element_types.unknown("qwerty").startswith(
        "unknown element type 'qwerty' (ONNX's names: float, uint8, int8, uint16,"
    )
