"""What the HTML report costs, model by model: dot's layout time folded (each repeated
block its own view) and flat (the whole graph in one view), the page's size, and the time
headless Chromium takes to show it (navigation start to the first frame, median of 3).

    python bench/report_page.py [--only NAME ...] [--flat-timeout S] [--screenshot FILE]
                                [--json FILE]

Models: the bundled sample CNN, that CNN quantized (QDQ, by onnxruntime's tools), a 12-layer
BERT export (the legacy exporter at opset 17: about 1,100 nodes) and a 98-layer
synthetic decoder (bench/synthetic.py: about 5,000 nodes). docs/report.md quotes the
figures.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tests" / "report"))

import numpy as np  # noqa: E402
import onnx  # noqa: E402
from chromium import Chromium  # noqa: E402
from synthetic import decoder_stack  # noqa: E402

from onnxfuse.api import sample_model_path  # noqa: E402
from onnxfuse.files.model_io import load_model  # noqa: E402
from onnxfuse.report.graph_view import assign_blocks, graph_view  # noqa: E402
from onnxfuse.report.page import _link  # noqa: E402
from onnxfuse.report.views import rule_colours, side_views  # noqa: E402
from onnxfuse.targets.capabilities import load_target  # noqa: E402


class _Calibration:
    """Random images for onnxruntime's static quantization of the sample CNN."""

    def __init__(self, count: int = 4) -> None:
        rng = np.random.default_rng(0)
        self.feeds = iter(
            {"input": rng.standard_normal((1, 3, 32, 32)).astype(np.float32)} for _ in range(count)
        )

    def get_next(self) -> dict | None:
        return next(self.feeds, None)


def qdq_cnn(folder: Path) -> Path:
    from onnx import version_converter
    from onnxruntime import quantization

    source, out = folder / "float21.onnx", folder / "qdq-cnn.onnx"
    onnx.save(version_converter.convert_version(onnx.load(sample_model_path()), 21), source)
    quantization.quantize_static(
        str(source), str(out), _Calibration(), quant_format=quantization.QuantFormat.QDQ,
        per_channel=True, weight_type=quantization.QuantType.QInt8,
    )  # fmt: skip
    return out


def models(folder: Path) -> dict[str, Path]:
    from exports.export import get_export
    from exports.models import MODELS

    bert = next(spec for spec in MODELS if spec.name == "bert-mask")
    bert12 = dataclasses.replace(bert, name="bert-12", config={**bert.config, "layers": 12})
    synthetic = folder / "decoder-98.onnx"
    onnx.save(decoder_stack(98, hidden=64, heads=4), synthetic)
    return {
        "sample": sample_model_path(),
        "qdq-cnn": qdq_cnn(folder),
        "bert-12-legacy17": get_export(bert12, "legacy", 17).path,
        "decoder-98": synthetic,
    }


def dot_seconds(before: Path, after: Path, fold: bool, timeout: float) -> tuple[float | None, int]:
    """dot's time on every view of both sides (None: over ``timeout``), and the views."""
    target = load_target("cpu")
    left, right = (
        graph_view(load_model(before, target=target)),
        graph_view(load_model(after, target=target)),
    )
    if fold:
        assign_blocks(left)
        assign_blocks(right, left)
    sides = _link(left, right)
    colours = rule_colours(sorted({n.rule for n in right.nodes if n.rule is not None}))
    sources = [
        source
        for s in sides
        for source in side_views(s.key, s.view, s.colour_by, s.status, colours).sources
    ]
    started = time.perf_counter()
    try:
        subprocess.run(
            ["dot", "-Tsvg"], input="\n".join(sources).encode(), capture_output=True,
            timeout=timeout, check=True,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return None, len(sources)
    return time.perf_counter() - started, len(sources)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", action="append", default=[], metavar="NAME")
    parser.add_argument("--flat-timeout", type=float, default=300.0)
    parser.add_argument("--screenshot", type=Path, help="a screenshot of the BERT page")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    rows = []
    browser = Chromium()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for name, path in models(folder).items():
            if args.only and name not in args.only:
                continue
            out, page = folder / f"{name}.out.onnx", folder / f"{name}.html"
            nodes = len(onnx.load(path, load_external_data=False).graph.node)
            started = time.perf_counter()
            subprocess.run(
                [sys.executable, "-m", "onnxfuse", "optimize", str(path), "-o", str(out),
                 "--html", str(page), "-q"],
                check=True,
            )  # fmt: skip
            total = time.perf_counter() - started
            folded, views = dot_seconds(path, out, True, args.flat_timeout)
            flat, _ = dot_seconds(path, out, False, args.flat_timeout)
            ready = []
            for _ in range(3):
                opened = browser.open(page.resolve().as_uri())
                ready.append(int(opened.wait_for("document.body.dataset.readyMs")))
                elements = opened.evaluate("document.getElementsByTagName('*').length")
                if args.screenshot and name.startswith("bert"):
                    opened.screenshot(args.screenshot)
            row = {
                "model": name,
                "nodes": nodes,
                "optimize_with_html_s": round(total, 2),
                "views": views,
                "dot_folded_s": None if folded is None else round(folded, 2),
                "dot_flat_s": None if flat is None else round(flat, 2),
                "page_bytes": page.stat().st_size,
                "dom_elements": elements,
                "chromium_ready_ms": statistics.median(ready),
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
    browser.close()
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
