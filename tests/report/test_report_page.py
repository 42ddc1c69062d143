"""The HTML report: what the page holds (read from its HTML), the command line's errors,
and the page opened in headless Chromium: every fused node present and coloured by its
rule, no request leaving the page, blocks that open, a search that finds."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import onnx
import pytest
from chromium import Chromium, chromium_path
from helpers import make_model, relu_relu_rule, tensor_input
from onnx import helper

from onnxfuse.api import sample_model_path

REPO_ROOT = Path(__file__).resolve().parents[2]
# .ci/run installs Graphviz and Chromium: under CI=true their tests fail without them.
IN_CI = os.environ.get("CI") == "true"
HAS_DOT = shutil.which("dot") is not None
needs_dot = pytest.mark.skipif(
    not HAS_DOT and not IN_CI, reason="Graphviz's dot is not installed (apt-get install graphviz)"
)
X = [2, 3, 4]


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "onnxfuse", *args],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )


def page_data(path: Path) -> dict:
    found = re.search(
        r'<script type="application/json" id="onnxfuse-data">(.*?)</script>',
        path.read_text(encoding="utf-8"),
        re.DOTALL,
    )
    assert found is not None
    return json.loads(found.group(1))


def optimize_with_page(model: Path, folder: Path, *extra: str) -> tuple[Path, Path, Path]:
    out, report, page = folder / "out.onnx", folder / "report.json", folder / "page.html"
    result = run_cli(
        "optimize", str(model), "-o", str(out), "--report-json", str(report),
        "--html", str(page), "-q", *extra,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return out, report, page


def created_nodes(path: Path) -> dict[str, tuple[str, list[str]]]:
    """The main graph's nodes that name their rule, read with onnx alone."""
    found = {}
    for node in onnx.load(path, load_external_data=False).graph.node:
        props = {p.key: p.value for p in node.metadata_props}
        if "onnxfuse.rule" in props:
            found[node.name] = (props["onnxfuse.rule"], json.loads(props["onnxfuse.replaced"]))
    return found


@pytest.fixture(scope="module")
def sample_page(tmp_path_factory) -> tuple[Path, Path, Path]:
    if not HAS_DOT and not IN_CI:
        pytest.skip("Graphviz's dot is not installed (apt-get install graphviz)")
    return optimize_with_page(sample_model_path(), tmp_path_factory.mktemp("sample"))


@needs_dot
def test_each_created_node_is_linked_to_the_input_nodes_it_replaced(sample_page):
    out, report, page = sample_page
    data = page_data(page)
    left, right = data["sides"]["L"], data["sides"]["R"]
    created = created_nodes(out)
    assert created
    applied = {n for n, s in json.loads(report.read_text())["rules"].items() if s["applied"]}
    for name, (rule, replaced) in created.items():
        j = right["names"].index(name)
        assert data["rules"][right["rule"][j]] == rule and rule in applied
        assert sorted(left["names"][i] for i in right["links"][j]) == sorted(replaced)
        for i in right["links"][j]:
            assert j in left["links"][i] and left["rule"][i] >= 0


@needs_dot
def test_the_page_holds_the_rule_table_and_the_op_diff(sample_page):
    _, report, page = sample_page
    text = page.read_text(encoding="utf-8")
    data = json.loads(report.read_text())
    for name, stats in data["rules"].items():
        if stats["applied"]:
            assert re.search(rf"{re.escape(name)}</td><td>{stats['matched']}</td>", text)
    for op, count in data["ops_before"].items():
        after = data["ops_after"].get(op, 0)
        assert f"<td>{op}</td><td>{count}</td><td>{after}</td>" in text
    # optimize's JSON report holds the target's coverage before and after
    coverage = data["coverage"]
    assert 'id="coverage"' in text and "Not run by <b>cpu</b>" in text
    assert f"of {coverage['before']['nodes']} nodes before" in text


@needs_dot
def test_the_json_report_records_the_models_and_the_run(sample_page):
    out, report, _ = sample_page
    run = json.loads(report.read_text())["run"]
    assert run["input"] == str(sample_model_path().resolve())
    assert run["output"] == str(out) and run["target"] == "cpu" and run["builtin"] is True


@needs_dot
def test_report_json_html_writes_the_page_again(sample_page, tmp_path):
    _, report, page = sample_page
    again = tmp_path / "again.html"
    result = run_cli("report", str(report), "--html", str(again))
    assert result.returncode == 0, result.stderr
    assert page_data(again) == page_data(page)


@needs_dot
def test_a_model_the_report_names_that_moved_is_one_line(sample_page, tmp_path):
    _, report, _ = sample_page
    data = json.loads(report.read_text())
    data["run"]["output"] = str(tmp_path / "moved.onnx")
    moved = tmp_path / "report.json"
    moved.write_text(json.dumps(data))
    result = run_cli("report", str(moved), "--html", str(tmp_path / "page.html"))
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1
    assert "moved.onnx: no such file (the optimized model of the JSON report)" in result.stderr
    assert not (tmp_path / "page.html").exists()


@needs_dot
@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d.pop("run"), "the JSON report has no 'run' record of its models"),
        (lambda d: d["run"].update(input=3), "the JSON report's run.input is not a path"),
        (lambda d: d["run"].update(rules="x.yaml"), "the JSON report's run.rules is not paths"),
        (lambda d: d.update(rules=[1]), "the JSON report's rules are not a table of rule counts"),
        (lambda d: d["run"].update(output=None), "records no optimized model: optimize ran"),
    ],
)
def test_a_json_report_edited_wrong_is_one_line(sample_page, tmp_path, edit, message):
    _, report, _ = sample_page
    data = json.loads(report.read_text())
    edit(data)
    edited = tmp_path / "report.json"
    edited.write_text(json.dumps(data))
    result = run_cli("report", str(edited), "--html", str(tmp_path / "page.html"))
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1
    assert message in result.stderr and "Traceback" not in result.stderr


def test_html_without_dot_is_one_line_before_the_work(tmp_path):
    bare = tmp_path / "bin"
    bare.mkdir()
    env = {**os.environ, "PATH": str(bare)}
    out = tmp_path / "out.onnx"
    result = run_cli("optimize", "-o", str(out), "--html", str(tmp_path / "p.html"), env=env)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip() == (
        "onnxfuse: error: no 'dot' on PATH: Graphviz's dot lays out the graphs of --html "
        "(Debian: apt-get install graphviz)"
    )
    assert not out.exists()


@needs_dot
def test_a_rule_that_never_applied_is_explained_at_its_nearest_node(tmp_path):
    nodes = [
        helper.make_node("Relu", ["x"], ["t"], name="a"),
        helper.make_node("Relu", ["t"], ["u"], name="b"),
        helper.make_node("Sigmoid", ["u"], ["y"], name="c"),
    ]
    model = tmp_path / "relu.onnx"
    onnx.save(make_model(nodes, [tensor_input("x", X)], [tensor_input("y", X)]), model)
    rules = tmp_path / "rules.yaml"
    rules.write_text(relu_relu_rule("relu-of-rank-7") + "    where:\n      - rank(X) == 7\n")
    _, _, page = optimize_with_page(model, tmp_path, "--rules", str(rules), "--no-builtin")
    text = page.read_text(encoding="utf-8")
    section = text[text.index('id="explain"') :]
    assert '<td>relu-of-rank-7</td><td><a class="goto" data-name="b">Relu &#x27;b&#x27;' in section
    assert "no match: guard &#x27;rank(X) == 7&#x27; is false" in section


@needs_dot
def test_a_coverage_entry_gets_its_section(sample_page, tmp_path):
    _, report, _ = sample_page
    data = json.loads(report.read_text())

    def side(nodes: int, uncovered: list[tuple[str, str]], runs: int) -> dict:
        ops: dict[str, int] = {}
        for _, op in uncovered:
            ops[op] = ops.get(op, 0) + 1
        return {
            "target": "npu",
            "nodes": nodes,
            "uncovered": [
                {"node": n, "op": op, "reason": f"{op} for T=double", "graph": ""}
                for n, op in uncovered
            ],
            "uncovered_ops": ops,
            "partitions": [{"nodes": 1, "first": "a", "last": "a"}] * runs,
            "inlined": {},
        }

    data["coverage"] = {
        "before": side(33, [("block1.pad", "Pad"), ("stem.bn", "BatchNormalization")], 3),
        "after": side(11, [("block1.pad", "Pad")], 1),
    }
    covered = tmp_path / "report.json"
    covered.write_text(json.dumps(data))
    page = tmp_path / "page.html"
    assert run_cli("report", str(covered), "--html", str(page)).returncode == 0
    text = page.read_text(encoding="utf-8")
    section = text[text.index('id="coverage"') :]
    assert "<td>BatchNormalization</td><td>1</td><td>0</td>" in section
    assert "<td>Pad</td><td>1</td><td>1</td>" in section
    assert (
        "Not run by <b>npu</b>: 2 of 33 nodes before (3 runs of nodes it runs), "
        "1 of 11 nodes after (1 run of nodes it runs)." in section
    )
    assert (
        '<a class="goto" data-side="L" data-name="stem.bn">BatchNormalization &#x27;stem.bn'
        "&#x27;</a>: BatchNormalization for T=double" in section
    )


def decoder(path: Path, layers: int) -> Path:
    sys.path.insert(0, str(REPO_ROOT / "bench"))
    try:
        from synthetic import decoder_stack
    finally:
        sys.path.remove(str(REPO_ROOT / "bench"))
    onnx.save(decoder_stack(layers, hidden=16, heads=2), path)
    return path


@needs_dot
def test_a_layered_graph_is_folded_into_its_layers_on_both_sides(tmp_path):
    _, _, page = optimize_with_page(decoder(tmp_path / "decoder.onnx", 6), tmp_path)
    data = page_data(page)
    layers = [f"model/layers.{i}" for i in range(6)]
    for key in ("L", "R"):
        side = data["sides"][key]
        assert side["blocks"] == layers
        # Every node of a layer is in its block: the top level keeps the final norm.
        outside = [
            n
            for n, b, k in zip(side["names"], side["block"], side["kinds"])
            if b < 0 and k == "node"
        ]
        assert all(n.startswith("/model/norm/") for n in outside), outside


# --- In a real browser --------------------------------------------------------------------


@pytest.fixture(scope="module")
def browser():
    if chromium_path() is None:
        if IN_CI:  # .ci/run installs it: a CI run without it has failed, not skipped
            pytest.fail("chromium is not installed")
        pytest.skip("chromium is not installed (Debian: apt-get install chromium)")
    chromium = Chromium()
    yield chromium
    chromium.close()


def check_in_browser(
    browser: Chromium, page_path: Path, out: Path, shot: Path, fused: bool = True
) -> dict:
    """Open the page: no script error, no request but the page itself, nothing external
    in the DOM, every created node drawn in its rule's colour (``fused``: there are
    some); a screenshot taken."""
    url = page_path.resolve().as_uri()
    page = browser.open(url)
    ready = int(page.wait_for("document.body.dataset.readyMs"))
    assert page.errors == []
    assert page.requests == [url]
    assert page.evaluate(
        "document.querySelector('meta[http-equiv=\"Content-Security-Policy\"]')"
        ".content.startsWith(\"default-src 'none'\")"
    )
    external = page.evaluate(
        "[...document.querySelectorAll('[src],[href]')].map(e => e.getAttribute('src') || "
        "e.getAttribute('href')).filter(v => !v.startsWith('#') && !v.startsWith('data:'))"
    )
    assert external == []
    drawn = page.evaluate(
        """(() => {
          const data = JSON.parse(document.getElementById('onnxfuse-data').textContent);
          const shape = (id) => {
            const g = document.getElementById(id);
            const s = g && g.querySelector('path, polygon, ellipse');
            return s && s.getAttribute('fill');
          };
          const found = {};
          for (const key of ['L', 'R']) {
            const side = data.sides[key];
            side.names.forEach((name, i) => {
              if (side.rule[i] >= 0) found[key + ':' + name] = [data.rules[side.rule[i]],
                shape(key + i), data.colours[side.rule[i]]];
            });
          }
          return found;
        })()"""
    )
    created = created_nodes(out)
    assert created or not fused
    for name, (rule, replaced) in created.items():
        assert drawn[f"R:{name}"][0] == rule
        for input_name in replaced:
            entry = drawn.get(f"L:{input_name}")
            assert entry is not None, input_name
    for key, (rule, fill, colour) in drawn.items():
        assert fill == colour, (key, rule)
    page.screenshot(shot)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    return {"page": page, "ready_ms": ready}


def test_the_sample_page_works_offline_in_chromium(browser, sample_page, tmp_path):
    out, _, page = sample_page
    check_in_browser(browser, page, out, tmp_path / "sample.png")


def qdq_cnn(folder: Path) -> Path:
    """The sample CNN quantized by onnxruntime's tools (QDQ, per channel)."""
    import numpy as np
    from onnx import version_converter
    from onnxruntime import quantization

    class Calibration(quantization.CalibrationDataReader):
        def __init__(self) -> None:
            rng = np.random.default_rng(0)
            self.feeds = iter(
                {"input": rng.standard_normal((1, 3, 32, 32)).astype(np.float32)} for _ in range(4)
            )

        def get_next(self):
            return next(self.feeds, None)

    source, out = folder / "float21.onnx", folder / "qdq.onnx"
    onnx.save(version_converter.convert_version(onnx.load(sample_model_path()), 21), source)
    quantization.quantize_static(
        str(source), str(out), Calibration(), quant_format=quantization.QuantFormat.QDQ,
        per_channel=True, weight_type=quantization.QuantType.QInt8,
    )  # fmt: skip
    return out


def test_a_qdq_cnn_page_works_offline_in_chromium(browser, tmp_path):
    out, _, page = optimize_with_page(qdq_cnn(tmp_path), tmp_path)
    check_in_browser(browser, page, out, tmp_path / "qdq.png", fused=False)


def test_a_folded_decoder_page_works_offline_in_chromium(browser, tmp_path):
    out, _, page = optimize_with_page(decoder(tmp_path / "decoder.onnx", 6), tmp_path)
    opened = check_in_browser(browser, page, out, tmp_path / "decoder.png")["page"]
    # A click on a node a rule created lights up the input's nodes it replaced.
    click(opened, "#Rb2")
    data = page_data(page)
    right = data["sides"]["R"]
    j = next(j for j, r in enumerate(right["rule"]) if r >= 0 and right["block"][j] == 2)
    click(opened, f"#R{j}")
    lit = opened.evaluate("[...document.querySelectorAll('#pane-L g.hl')].map(g => g.id)")
    nodes = sorted(i for i in lit if re.fullmatch(r"L\d+", i))
    assert nodes == sorted(f"L{i}" for i in right["links"][j])
    # and the boxes of the blocks they are in, for when those are closed
    left_blocks = {data["sides"]["L"]["block"][i] for i in right["links"][j]}
    assert sorted(set(lit) - set(nodes)) == sorted(f"Lb{b}" for b in left_blocks if b >= 0)


def click(page, selector: str) -> None:
    """A real mouse click at the middle of the element (DevTools' input events)."""
    x, y = page.evaluate(
        f"(() => {{ const r = document.querySelector({json.dumps(selector)})"
        ".getBoundingClientRect(); return [r.left + r.width / 2, r.top + r.height / 2]; })()"
    )
    for kind in ("mousePressed", "mouseReleased"):
        page.browser.send(
            "Input.dispatchMouseEvent",
            {"type": kind, "x": x, "y": y, "button": "left", "clickCount": 1},
            page.session,
        )


@pytest.mark.slow
def test_a_bert_page_opens_its_layers_and_finds_nodes_in_chromium(browser, tmp_path):
    from exports.export import export_by_name

    export = export_by_name("bert-mask-legacy17")
    out, _, page_path = optimize_with_page(export.path, tmp_path)
    data = page_data(page_path)
    assert data["sides"]["R"]["blocks"] == ["model/encoder/layer.0", "model/encoder/layer.1"]
    opened = check_in_browser(browser, page_path, out, tmp_path / "bert.png")["page"]
    # A click on a layer's box opens it on both sides.
    click(opened, "#Rb1")
    shown = "[...document.querySelectorAll('#pane-{} .view')].find(v => !v.hidden).dataset.view"
    assert opened.evaluate(shown.format("R")) == "1"
    assert opened.evaluate(shown.format("L")) == "1"
    # A search lists the nodes of both sides whose name or op holds the text.
    listed = opened.evaluate(
        "(() => { const s = document.getElementById('search'); s.value = 'biasgelu';"
        " s.dispatchEvent(new Event('input'));"
        " return [...document.querySelectorAll('#results li')].map(e => e.textContent); })()"
    )
    expected = [
        f"{title} · {op} · {name}"
        for key, title in (("L", "original"), ("R", "optimized"))
        for name, op, kind in zip(*(data["sides"][key][f] for f in ("names", "ops", "kinds")))
        if kind == "node" and ("biasgelu" in name.lower() or "biasgelu" in op.lower())
    ]
    # the two layers' fused BiasGelu, on the optimized side
    assert listed == expected and len(expected) == 2 and expected[0].startswith("optimized")


@needs_dot
def test_without_provenance_the_page_colours_nothing_and_says_so(tmp_path):
    _, _, page = optimize_with_page(sample_model_path(), tmp_path, "--no-provenance")
    data = page_data(page)
    assert data["rules"] == []
    assert all(r < 0 for side in data["sides"].values() for r in side["rule"])
    assert "written with --no-provenance): nothing is coloured" in page.read_text(encoding="utf-8")
