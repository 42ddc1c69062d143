"""bench/quantized.py: its section of docs/parity.md is replaced in place or appended, and
the quantized ops it lists are onnxruntime's integer kernels only."""

from __future__ import annotations

import collections
import sys
from pathlib import Path

import pytest

pytest.importorskip("onnxruntime.quantization")
pytest.importorskip("torch")

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import quantized  # noqa: E402  (bench/quantized.py)


def test_the_section_is_replaced_where_it_is_and_appended_otherwise(tmp_path: Path):
    doc = tmp_path / "parity.md"
    doc.write_text("# Parity\n\n## Exports\n\nold table\n")
    quantized.write_section(doc, [quantized.SECTION, "", "first"])
    appended = "# Parity\n\n## Exports\n\nold table\n\n## Quantized models\n\nfirst\n"
    assert doc.read_text() == appended
    doc.write_text(doc.read_text() + "\n## Later\n\nkept\n")
    quantized.write_section(doc, [quantized.SECTION, "", "second"])
    text = doc.read_text()
    assert "first" not in text and "second" in text
    assert text.index("## Quantized models") < text.index("## Later") and "kept" in text


def test_quantized_ops_are_the_integer_kernels():
    ops = collections.Counter(
        {
            "QLinearConv": 2,
            "com.microsoft::QGemm": 1,
            "com.microsoft::MatMulNBits": 3,
            "DequantizeLinear": 5,
            "Conv": 1,
        }
    )
    assert quantized.quantized_ops(ops) == "MatMulNBits 3, QGemm 1, QLinearConv 2"
    assert quantized.quantized_ops(collections.Counter({"Conv": 1})) == "-"


def test_parity_keeps_the_quantized_section_when_it_rewrites_the_file():
    import parity  # bench/parity.py

    text = "# Parity\n\n## Exports\n\nold\n\n## Quantized models\n\nrows\n\n## Later\n"
    assert parity.kept_sections(text) == ["", "## Quantized models", "", "rows", ""]
    assert parity.kept_sections("# Parity\n\n## Exports\n") == []
