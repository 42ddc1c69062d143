"""Models onnxruntime runs are repaired, not refused; what onnxruntime refuses stays refused.

Each defect has a small model built here. A repaired one: onnxruntime runs it (or, where
said, refuses it and runs the repair), ``onnxfuse optimize`` exits 0 with the repair's
warning printed once, and the output passes onnx's full checker and computes the same
outputs in onnxruntime. A refused one: exit 2 and one line.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from helpers import assert_close, random_feeds, run, tensor_input
from onnx import TensorProto, helper, numpy_helper

from onnxfuse.api import optimize, optimize_file
from onnxfuse.errors import ModelError
from onnxfuse.files.model_io import load_model
from onnxfuse.files.repair import repair_computed_outputs
from onnxfuse.files.source_weights import SourceTensor
from onnxfuse.rewrite.report import REPAIRS_META

SHAPE = [2, 3]


def _model(
    nodes: list[onnx.NodeProto],
    outputs: list[onnx.ValueInfoProto] | None = None,
    value_info: list[onnx.ValueInfoProto] = (),  # type: ignore[assignment]
    initializers: list[onnx.TensorProto] = (),  # type: ignore[assignment]
    inputs: list[onnx.ValueInfoProto] | None = None,
    opsets: list[tuple[str, int]] = [("", 17)],  # noqa: B006 (never changed)
) -> onnx.ModelProto:
    """A model as a writer made it: not checked (these fail onnx's checker)."""
    graph = helper.make_graph(
        nodes,
        "g",
        inputs if inputs is not None else [tensor_input("x", SHAPE)],
        outputs if outputs is not None else [tensor_input("z", SHAPE)],
        list(initializers),
        value_info=list(value_info),
    )
    imports = [helper.make_opsetid(d, v) for d, v in opsets]
    return helper.make_model(graph, opset_imports=imports, ir_version=8)


def _relu_relu(first: str = "a", second: str = "b") -> list[onnx.NodeProto]:
    return [
        helper.make_node("Relu", ["x"], ["y"], name=first),
        helper.make_node("Relu", ["y"], ["z"], name=second),
    ]


def _no_shape(name: str, elem_type: int = TensorProto.FLOAT) -> onnx.ValueInfoProto:
    info = onnx.ValueInfoProto(name=name)
    info.type.tensor_type.elem_type = elem_type
    return info


def _no_elem_type(name: str) -> onnx.ValueInfoProto:
    info = onnx.ValueInfoProto(name=name)
    info.type.tensor_type.SetInParent()
    return info


def _add_constant(declared: onnx.ValueInfoProto, as_node: bool) -> onnx.ModelProto:
    """x + c with c a [1]-shaped constant (an initializer or a Constant node) and a
    value_info for c as ``declared`` says."""
    tensor = numpy_helper.from_array(np.array([2.0], np.float32), "c")
    nodes = [helper.make_node("Add", ["x", "c"], ["z"], name="add")]
    if as_node:
        nodes.insert(0, helper.make_node("Constant", [], ["c"], value=tensor, name="const"))
    return _model(nodes, value_info=[declared], initializers=[] if as_node else [tensor])


def _reshape_by_input_shape() -> onnx.ModelProto:
    """Reshape of a [1,6,2] input to [-1, q's last dim]: [6,2]; the output is declared
    [10,20,unk], which only data propagation (or folding) shows wrong."""
    axis = numpy_helper.from_array(np.array(1, np.int64), "one")
    minus = numpy_helper.from_array(np.array([-1], np.int64), "minus")
    nodes = [
        helper.make_node("Shape", ["q"], ["s"], name="shape"),
        helper.make_node("Gather", ["s", "one"], ["d"], axis=0, name="gather"),
        helper.make_node("Unsqueeze", ["d", "axes"], ["u"], name="unsqueeze"),
        helper.make_node("Concat", ["minus", "u"], ["target"], axis=0, name="concat"),
        helper.make_node("Reshape", ["m", "target"], ["z"], name="reshape"),
    ]
    axes = numpy_helper.from_array(np.array([0], np.int64), "axes")
    return _model(
        nodes,
        outputs=[tensor_input("z", [10, 20, "unk"])],
        inputs=[tensor_input("q", [1, 2]), tensor_input("m", [1, 6, 2])],
        initializers=[axis, minus, axes],
        opsets=[("", 13)],
    )


@dataclass(frozen=True)
class Defect:
    name: str
    build: object  # () -> onnx.ModelProto
    warning: str  # the warning line, after "onnxfuse: warning: repaired: "
    kind: str
    onnxruntime_runs: bool = True  # onnxruntime runs the model as written


DEFECTS = [
    Defect(
        "output-without-shape",
        lambda: _model(_relu_relu(), outputs=[_no_shape("z")]),
        "graph output without a type or shape given the inferred one, 'z' float -> float[2,3]",
        "output-undeclared",
    ),
    Defect(
        "output-without-type",
        lambda: _model(_relu_relu(), outputs=[onnx.ValueInfoProto(name="z")]),
        "graph output without a type or shape given the inferred one, 'z' ? -> float[2,3]",
        "output-undeclared",
    ),
    Defect(
        "value-info-shape-contradicted",
        lambda: _model(_relu_relu(), value_info=[tensor_input("y", [3])]),
        "value_info contradicting inference replaced (the inferred type wins), "
        "'y' float[3] -> float[2,3]",
        "declared-vs-inferred",
    ),
    Defect(
        "value-info-type-contradicted",
        lambda: _model(_relu_relu(), value_info=[tensor_input("y", SHAPE, TensorProto.INT64)]),
        "value_info contradicting inference replaced (the inferred type wins), "
        "'y' int64[2,3] -> float[2,3]",
        "declared-vs-inferred",
        onnxruntime_runs=False,  # a Type Error: onnxruntime holds the declaration to it
    ),
    Defect(
        "value-info-contradicts-initializer-shape",
        lambda: _add_constant(tensor_input("c", []), as_node=False),
        "value_info contradicting its constant's tensor dropped (the tensor wins), "
        "'c' float[] -> float[1]",
        "declared-vs-tensor",
    ),
    Defect(
        "value-info-contradicts-initializer-type",
        lambda: _add_constant(tensor_input("c", [1], TensorProto.INT64), as_node=False),
        "value_info contradicting its constant's tensor dropped (the tensor wins), "
        "'c' int64[1] -> float[1]",
        "declared-vs-tensor",
    ),
    Defect(
        # What onnxruntime-genai's model builder writes (tests/data/genai-builder).
        "rank-0-value-info-on-a-1-element-constant",
        lambda: _add_constant(tensor_input("c", []), as_node=True),
        "value_info contradicting its constant's tensor dropped (the tensor wins), "
        "'c' float[] -> float[1]",
        "declared-vs-tensor",
    ),
    Defect(
        "output-shape-contradicted",
        lambda: _model(_relu_relu(), outputs=[tensor_input("z", [2, 4])]),
        "graph output's shape contradicting inference replaced (the inferred one wins), "
        "'z' float[2,4] -> float[2,3]",
        "output-shape",
    ),
    Defect(
        "output-shape-contradicted-once-folded",
        _reshape_by_input_shape,
        "graph output's shape contradicting inference replaced (the inferred one wins), "
        "'z' float[10,20,unk] -> float[6,2]",
        "output-shape",
    ),
    Defect(
        "value-info-without-type",
        lambda: _model(_relu_relu(), value_info=[onnx.ValueInfoProto(name="y")]),
        "value_info without a type dropped, 'y'",
        "untyped-value-info",
    ),
    Defect(
        "value-info-without-element-type",
        lambda: _model(_relu_relu(), value_info=[_no_elem_type("y")]),
        "value_info without a type dropped, 'y'",
        "untyped-value-info",
        onnxruntime_runs=False,  # "Invalid tensor data type 0"
    ),
    Defect(
        "unnamed-nodes",
        lambda: _model(_relu_relu("", "")),
        "unnamed node named, 'y', 'z'",
        "unnamed-node",
    ),
    Defect(
        "duplicate-node-names",
        lambda: _model(_relu_relu("a", "a")),
        "duplicate node name renamed, 'a' -> 'a_0'",
        "duplicate-node-name",
        onnxruntime_runs=False,  # "two nodes with same node name"
    ),
    Defect(
        "unused-opset-import",
        lambda: _model(_relu_relu(), opsets=[("", 17), ("com.microsoft", 1), ("ai.onnx.ml", 3)]),
        "unused opset import dropped, 'ai.onnx.ml', 'com.microsoft'",
        "unused-opset",
    ),
    Defect(
        "duplicate-opset-import",
        lambda: _model(_relu_relu(), opsets=[("", 17), ("", 17)]),
        "opset imported twice, kept once, '' version 17",
        "duplicate-opset",
    ),
    Defect(
        # Squeeze-1 with unsorted axes: onnx's inference of that version keeps a squeezed
        # dim ([1, 3]), contradicting the declared [3] that onnxruntime computes.
        "unsorted-squeeze-axes",
        lambda: _model(
            [helper.make_node("Squeeze", ["x"], ["z"], axes=[1, 0], name="s")],
            inputs=[tensor_input("x", [1, 1, 3])],
            outputs=[tensor_input("z", [3])],
            opsets=[("", 8)],
        ),
        "Squeeze axes sorted (onnx's Squeeze-1 inference misreads unsorted ones), 's'",
        "unsorted-squeeze-axes",
    ),
    Defect(
        # ReduceSum's axes attribute exists before opset 13 only: onnxruntime (and onnx's
        # checker) read the last import, 11.
        "opset-imported-at-two-versions",
        lambda: _model(
            [helper.make_node("ReduceSum", ["x"], ["z"], axes=[0], keepdims=0, name="r")],
            outputs=[tensor_input("z", [3])],
            opsets=[("", 13), ("", 11)],
        ),
        "opset imported at two versions, the last kept (as onnxruntime runs it), "
        "'' versions 13, 11: 11",
        "conflicting-opset",
    ),
]


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "onnxfuse", *args], capture_output=True, text=True, timeout=300
    )


def _session(model: onnx.ModelProto) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.log_severity_level = 4  # the declared-shape warnings of a run are expected
    return ort.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )


@pytest.mark.parametrize("defect", DEFECTS, ids=[d.name for d in DEFECTS])
def test_a_model_onnxruntime_runs_is_repaired_with_one_warning(defect: Defect, tmp_path: Path):
    model = defect.build()  # type: ignore[operator]
    feeds = random_feeds(model)
    if defect.onnxruntime_runs:
        _session(model).run(None, feeds)
    else:
        with pytest.raises(Exception, match=r"Type Error|data type 0|same node name"):
            _session(model)
    source, out = tmp_path / "in.onnx", tmp_path / "out.onnx"
    onnx.save(model, source)
    result = run_cli("optimize", str(source), "-o", str(out), "-q", "--target", "cpu")
    assert result.returncode == 0, result.stderr
    warning = f"onnxfuse: warning: repaired: {defect.warning}"
    assert result.stderr.splitlines().count(warning) == 1, result.stderr
    onnx.checker.check_model(str(out), full_check=True)
    optimized = onnx.load(out)
    if defect.onnxruntime_runs:
        assert_close(_session(optimized).run(None, feeds), _session(model).run(None, feeds))
    else:  # the repaired model, unoptimized, is what the writer meant
        assert_close(_session(optimized).run(None, feeds), run(load_as_repaired(source), feeds))


def load_as_repaired(path: Path) -> onnx.ModelProto:
    return ir.serde.serialize_model(load_model(path))


@pytest.mark.parametrize("defect", DEFECTS, ids=[d.name for d in DEFECTS])
def test_the_report_holds_the_repair(defect: Defect, tmp_path: Path):
    source = tmp_path / "in.onnx"
    onnx.save(defect.build(), source)  # type: ignore[operator]
    report = optimize_file(source, tmp_path / "out.onnx", [])
    assert [(r.kind, str(r)) for r in report.repairs] == [
        (defect.kind, f"repaired: {defect.warning}")
    ]


def test_a_valid_model_is_not_repaired(tmp_path: Path):
    model = _model(_relu_relu())
    onnx.checker.check_model(model, full_check=True)
    source = tmp_path / "in.onnx"
    onnx.save(model, source)
    assert REPAIRS_META not in load_model(source).meta
    result = run_cli("optimize", str(source), "-o", str(tmp_path / "out.onnx"), "-q")
    assert result.returncode == 0 and result.stderr == "", result.stderr


def test_repairs_are_in_the_json_and_terminal_reports(tmp_path: Path):
    source, report = tmp_path / "in.onnx", tmp_path / "report.json"
    onnx.save(_model(_relu_relu("a", "a"), outputs=[_no_shape("z")]), source)
    result = run_cli("optimize", str(source), "--report-json", str(report))
    assert result.returncode == 0, result.stderr
    repairs = json.loads(report.read_text())["repairs"]
    assert [r["kind"] for r in repairs] == ["duplicate-node-name", "output-undeclared"]
    assert repairs[0]["places"] == ["'a' -> 'a_0'"]
    assert repairs[0]["message"] == "repaired: duplicate node name renamed, 'a' -> 'a_0'"
    assert "  repaired: duplicate node name renamed, 'a' -> 'a_0'" in result.stdout.splitlines()
    assert len(result.stderr.splitlines()) == 2, result.stderr


def test_a_long_list_of_places_is_cut_in_the_line_and_whole_in_the_json(tmp_path: Path):
    nodes = [helper.make_node("Relu", ["x"], ["y0"])]
    nodes += [helper.make_node("Relu", [f"y{i}"], [f"y{i + 1}"]) for i in range(4)]
    nodes.append(helper.make_node("Identity", ["y4"], ["z"]))
    source = tmp_path / "in.onnx"
    onnx.save(_model(nodes), source)
    report = optimize_file(source, None, [])
    (repair,) = report.repairs
    assert len(repair.places) == 6
    assert str(repair) == "repaired: unnamed node named, 'y0', 'y1', 'y2' and 3 more"


def test_the_api_returns_repairs_for_a_model_proto():
    _, report = optimize(_model(_relu_relu("a", "a")), return_report=True)
    assert [r.kind for r in report.repairs] == ["duplicate-node-name"]


def test_an_in_memory_model_gets_the_computed_output_shape():
    model = ir.from_proto(_reshape_by_input_shape())
    result, report = optimize(model, return_report=True)
    assert [r.kind for r in report.repairs] == ["output-shape"]
    assert result.graph.outputs[0].shape == ir.Shape([6, 2])


def test_a_computed_output_shape_the_declaration_agrees_with_is_left_alone():
    model = ir.from_proto(_model(_relu_relu(), outputs=[tensor_input("z", ["N", 3])]))
    assert repair_computed_outputs(model) == []
    assert model.graph.outputs[0].shape == ir.Shape(["N", 3])


def test_nested_graphs_get_node_names_of_their_own(tmp_path: Path):
    branch = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"], name="a")], "then", [], [tensor_input("r", SHAPE)]
    )
    other = helper.make_graph(
        [helper.make_node("Neg", ["x"], ["n"], name="a")], "else", [], [tensor_input("n", SHAPE)]
    )
    condition = numpy_helper.from_array(np.array(True), "c")
    nodes = [helper.make_node("If", ["c"], ["z"], then_branch=branch, else_branch=other, name="a")]
    source = tmp_path / "in.onnx"
    model = _model(nodes, initializers=[condition])
    onnx.save(model, source)
    # Each graph holds one node named a: unique per graph, as onnxruntime requires.
    assert load_model(source).meta.get(REPAIRS_META) is None
    feeds = random_feeds(model)
    out = tmp_path / "out.onnx"
    optimize_file(source, out, [])
    assert_close(run(out, feeds), run(model, feeds))


# -- refused -------------------------------------------------------------------------------


REFUSED = [
    (
        # onnxruntime: "Type Error: Type (tensor(int64)) of output arg (z)"
        "output-type-contradicted",
        lambda: _model(_relu_relu(), outputs=[tensor_input("z", SHAPE, TensorProto.INT64)]),
        "graph output 'z' is declared int64[2,3] but computes float[2,3]",
        False,
    ),
    (
        # onnxruntime: "Model input (x) does not have type information"
        "input-without-type",
        lambda: _model(_relu_relu(), inputs=[onnx.ValueInfoProto(name="x")]),
        "fails the ONNX checker: Field 'type' of 'value_info' is required",
        False,
    ),
    (
        # onnxruntime: "Node input 'nowhere' is not a graph input, initializer, or output"
        "undefined-input",
        lambda: _model([helper.make_node("Relu", ["nowhere"], ["z"], name="r")]),
        "fails the ONNX checker",
        False,
    ),
    (
        # onnxruntime: "Type Error: Shape of initializer c does not match"
        "input-contradicts-its-initializer",
        lambda: _model(
            [helper.make_node("Add", ["x", "c"], ["z"], name="add")],
            inputs=[tensor_input("x", SHAPE), tensor_input("c", [])],
            initializers=[numpy_helper.from_array(np.array([2.0], np.float32), "c")],
        ),
        "fails the ONNX checker",
        False,
    ),
    (
        # onnxruntime runs these: onnx's checker requires a shape of every graph input and
        # output, and no shape it accepts says "any rank".
        "input-without-shape",
        lambda: _model(_relu_relu(), inputs=[_no_shape("x")]),
        "graph input 'x' declares no shape",
        True,
    ),
    (
        "output-without-shape-inference-cannot-find",
        lambda: _model(
            [helper.make_node("Reshape", ["x", "s"], ["z"], name="r")],
            inputs=[tensor_input("x", SHAPE), tensor_input("s", ["n"], TensorProto.INT64)],
            outputs=[_no_shape("z")],
        ),
        "graph output 'z' declares no shape and inference finds none",
        True,
    ),
]


@pytest.mark.parametrize(
    ("build", "message", "onnxruntime_runs"),
    [r[1:] for r in REFUSED],
    ids=[r[0] for r in REFUSED],
)
def test_a_model_onnxruntime_refuses_stays_refused(build, message, onnxruntime_runs, tmp_path):
    model = build()
    if onnxruntime_runs:
        feeds = random_feeds(model)
        if "s" in feeds:
            feeds["s"] = np.array([3, 2], np.int64)
        _session(model).run(None, feeds)
    else:
        with pytest.raises(Exception):  # noqa: B017 (onnxruntime raises its own types)
            _session(model)
    source = tmp_path / "in.onnx"
    onnx.save(model, source)
    result = run_cli("optimize", str(source), "-o", str(tmp_path / "out.onnx"))
    assert result.returncode == 2, result.stderr
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"onnxfuse: error: {source}: ") and message in line, line
    assert not (tmp_path / "out.onnx").exists()
    with pytest.raises(ModelError, match="^" + str(source)):
        load_model(source)


def test_a_model_whose_weights_stay_in_the_file_is_repaired_and_checked(tmp_path: Path):
    # 64 KiB and more of raw data stays in the file: the repaired protobuf lacks it, and
    # the check runs on placeholders of it.
    weight = np.random.default_rng(0).standard_normal((128, 128)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["z"], name="mm")]
    model = _model(
        nodes,
        inputs=[tensor_input("x", [2, 128])],
        outputs=[tensor_input("z", [2, 64])],
        initializers=[numpy_helper.from_array(weight, "w")],
    )
    source, out = tmp_path / "in.onnx", tmp_path / "out.onnx"
    onnx.save(model, source)
    loaded = load_model(source)
    assert isinstance(loaded.graph.initializers["w"].const_value, SourceTensor)
    assert [r.kind for r in loaded.meta[REPAIRS_META]] == ["output-shape"]
    optimize_file(source, out, [])
    feeds = random_feeds(model)
    assert_close(run(out, feeds), _session(model).run(None, feeds))
    model.graph.node.append(helper.make_node("Relu", ["nowhere"], ["q"], name="r"))
    model.graph.output.append(tensor_input("q", [2]))
    onnx.save(model, source)  # repaired, then refused on the placeholders' check
    with pytest.raises(ModelError, match=r"fails the ONNX checker: .*'nowhere'"):
        load_model(source)


def test_explain_and_plan_warn_of_the_repairs_too(tmp_path: Path):
    source = tmp_path / "in.onnx"
    onnx.save(_model(_relu_relu("a", "a")), source)
    warning = "onnxfuse: warning: repaired: duplicate node name renamed, 'a' -> 'a_0'"
    explained = run_cli("explain", str(source), "--rule", "relu-relu")
    assert explained.returncode == 0, explained.stderr
    assert explained.stderr.splitlines() == [warning]
    assert "Relu 'a_0'" in explained.stdout
    planned = run_cli("plan", str(source))
    assert planned.returncode == 0, planned.stderr
    assert planned.stderr.splitlines() == [warning]
    refused = run_cli("plan", str(source), "--dim", "nope=3")
    assert refused.returncode == 2 and len(refused.stderr.splitlines()) == 1, refused.stderr


def test_an_unnamed_node_whose_output_names_another_node_is_named_apart(tmp_path: Path):
    # The first Relu's output is the second node's name: the first gets 'b_0'.
    nodes = [helper.make_node("Relu", ["x"], ["b"]), helper.make_node("Relu", ["b"], ["z"], "b")]
    source = tmp_path / "in.onnx"
    onnx.save(_model(nodes), source)
    (repair,) = optimize_file(source, None, []).repairs
    assert repair.places == ("'b_0'",)
