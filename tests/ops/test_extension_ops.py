"""onnxruntime's ai.onnx extension ops: accepted where the target runs them, checked around.

LayerNormalization before opset 17 and SimplifiedLayerNormalization have no
ONNX schema; onnxruntime runs them in the ai.onnx domain. A model holding them
loads, optimizes and saves for a target that runs them (`cpu`), is refused with
the checker's one-line error for one that does not (`onnx`), and everything
else in it is still checked: on a view where exactly those nodes sit in a
private domain, with their outputs typed so checking reaches past them.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from helpers import assert_close, run
from onnx import TensorProto, helper, numpy_helper

from onnxfuse.api import optimize_file
from onnxfuse.errors import InvariantError, ModelError
from onnxfuse.files.model_io import check_model, load_model, save_model
from onnxfuse.ops import schemas
from onnxfuse.ops.extension import (
    PRIVATE_DOMAIN,
    accepted,
    checker_view,
    extension_schema,
    is_extension,
)
from onnxfuse.passes.normalize import normalize
from onnxfuse.passes.pipeline import Options
from onnxfuse.rewrite.report import REPAIRS_META
from onnxfuse.targets.capabilities import load_target

CPU = load_target("cpu")
ONNX = load_target("onnx")
SHAPE = [2, 3, 4]


def _weights() -> list[onnx.TensorProto]:
    rng = np.random.default_rng(0)
    return [
        numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "scale"),
        numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "bias"),
    ]


def _model(nodes, opset: int = 12, initializers=None, value_info=(), output="Z", ir_version=8):
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, SHAPE)],
        [helper.make_tensor_value_info(output, TensorProto.FLOAT, SHAPE)],
        _weights() if initializers is None else initializers,
        value_info=list(value_info),
    )
    return helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=ir_version
    )


def layer_norm_12(**kwargs) -> onnx.ModelProto:
    """LayerNormalization at opset 12 (onnxruntime's contrib schema), then Relu."""
    return _model(
        [
            helper.make_node(
                "LayerNormalization", ["X", "scale", "bias"], ["Y"], axis=-1, epsilon=1e-5
            ),
            helper.make_node("Relu", ["Y"], ["Z"]),
        ],
        **kwargs,
    )


def simplified_13() -> onnx.ModelProto:
    return _model(
        [
            helper.make_node("SimplifiedLayerNormalization", ["X", "scale"], ["Y"], epsilon=1e-6),
            helper.make_node("Relu", ["Y"], ["Z"]),
        ],
        opset=13,
    )


def _save(model: onnx.ModelProto, path) -> str:
    onnx.save_model(model, str(path))
    return str(path)


# -- which ops -------------------------------------------------------------------------


def test_extension_ops_are_known_where_the_standard_has_no_schema():
    assert is_extension("", "LayerNormalization", 12)
    assert not is_extension("", "LayerNormalization", 17)  # the standard's own op
    assert is_extension("", "SimplifiedLayerNormalization", 21)
    assert not is_extension("", "Relu", 12)
    assert not is_extension("com.microsoft", "LayerNormalization", 12)
    schema = extension_schema("LayerNormalization", 12)
    assert schema is not None and schema.since_version == 1
    assert {"axis", "epsilon", "stash_type"} <= set(schema.attributes)


def test_acceptance_follows_the_target():
    assert accepted(CPU, "", "LayerNormalization", 12)
    assert accepted(CPU, "", "SimplifiedLayerNormalization", 13)
    assert not accepted(ONNX, "", "LayerNormalization", 12)
    assert not accepted(ONNX, "", "SimplifiedLayerNormalization", 13)
    assert not accepted(CPU, "", "LayerNormalization", 17)  # standard: not an exception
    assert not accepted(CPU, "", "NoSuchOp", 13)
    assert accepted(None, "", "LayerNormalization", 12)  # no gating: onnxruntime's ops
    assert not accepted(None, "", "NoSuchOp", 13)


def test_wildcard_targets_mean_standard_ops_only():
    assert not ONNX.supports("", "LayerNormalization", 12)
    assert ONNX.supports("", "LayerNormalization", 17)
    assert CPU.supports("", "LayerNormalization", 12)
    assert CPU.supports("", "SimplifiedLayerNormalization", 21)


def test_rule_language_knows_extension_schemas():
    assert schemas.known_op("", "SimplifiedLayerNormalization")
    assert [s.since_version for s in schemas.schemas_in_range("", "LayerNormalization", 9, 16)] == [
        1
    ]
    assert schemas.get_schema("", "LayerNormalization", 12) is None  # the standard's alone
    eps = schemas.attribute_default("", "LayerNormalization", 12, "epsilon")
    assert eps == pytest.approx(1e-5)
    assert schemas.input_is_optional("", "LayerNormalization", 12, 2)
    assert not schemas.input_is_optional("", "SimplifiedLayerNormalization", 13, 1)


# -- the checker's view ----------------------------------------------------------------


def test_view_moves_exactly_the_accepted_nodes():
    model = layer_norm_12()
    view = checker_view(model, CPU)
    assert view is not None
    assert [n.domain for n in view.graph.node] == [PRIVATE_DOMAIN, ""]
    assert any(o.domain == PRIVATE_DOMAIN for o in view.opset_import)
    assert [n.domain for n in model.graph.node] == ["", ""]  # the model itself is untouched
    assert checker_view(model, ONNX) is None
    onnx.checker.check_model(view, full_check=True)


def test_view_reaches_into_subgraphs(tmp_path):
    then_graph = helper.make_graph(
        [helper.make_node("LayerNormalization", ["X", "scale"], ["T"], epsilon=1e-5)],
        "then",
        [],
        [helper.make_tensor_value_info("T", TensorProto.FLOAT, SHAPE)],
    )
    else_graph = helper.make_graph(
        [helper.make_node("Relu", ["X"], ["E"])],
        "else",
        [],
        [helper.make_tensor_value_info("E", TensorProto.FLOAT, SHAPE)],
    )
    cond = numpy_helper.from_array(np.array(True), "cond")
    model = _model(
        [helper.make_node("If", ["cond"], ["Z"], then_branch=then_graph, else_branch=else_graph)],
        initializers=[*_weights(), cond],
    )
    view = checker_view(model, CPU)
    assert view is not None
    branches = {a.name: a.g for a in view.graph.node[0].attribute}
    assert branches["then_branch"].node[0].domain == PRIVATE_DOMAIN
    assert branches["else_branch"].node[0].domain == ""
    assert load_model(_save(model, tmp_path / "m.onnx"), target=CPU) is not None


# -- loading ---------------------------------------------------------------------------


@pytest.mark.parametrize("build", [layer_norm_12, simplified_13], ids=["ln12", "simplified13"])
def test_load_accepts_extension_ops_the_target_runs(build, tmp_path):
    path = _save(build(), tmp_path / "m.onnx")
    assert load_model(path, target=CPU) is not None
    assert load_model(path) is not None  # no target: no gating


@pytest.mark.parametrize("build", [layer_norm_12, simplified_13], ids=["ln12", "simplified13"])
def test_load_refuses_them_for_a_target_that_does_not(build, tmp_path):
    path = _save(build(), tmp_path / "m.onnx")
    with pytest.raises(ModelError, match="fails the ONNX checker: No Op registered for"):
        load_model(path, target=ONNX)


def test_unknown_ai_onnx_ops_are_still_refused(tmp_path):
    model = _model([helper.make_node("NoSuchOp", ["X"], ["Z"])])
    with pytest.raises(ModelError, match="No Op registered for NoSuchOp"):
        load_model(_save(model, tmp_path / "m.onnx"), target=CPU)


def test_the_rest_of_the_model_is_still_checked(tmp_path):
    # An Add of float and int64 before the extension op: a type error.
    shift = numpy_helper.from_array(np.ones(SHAPE, np.int64), "shift")
    model = _model(
        [
            helper.make_node("Add", ["X", "shift"], ["S"]),
            helper.make_node("LayerNormalization", ["S", "scale", "bias"], ["Z"]),
        ],
        initializers=[*_weights(), shift],
    )
    with pytest.raises(ModelError, match="fails the ONNX checker"):
        load_model(_save(model, tmp_path / "m.onnx"), target=CPU)


def test_checking_reaches_past_the_extension_op(tmp_path):
    # The LayerNormalization output is float; adding an int64 to it is a type error
    # that only inference through the extension op can see.
    shift = numpy_helper.from_array(np.ones(SHAPE, np.int64), "shift")
    model = _model(
        [
            helper.make_node("LayerNormalization", ["X", "scale", "bias"], ["Y"]),
            helper.make_node("Add", ["Y", "shift"], ["Z"]),
        ],
        initializers=[*_weights(), shift],
    )
    with pytest.raises(ModelError, match="fails the ONNX checker"):
        load_model(_save(model, tmp_path / "m.onnx"), target=CPU)


def test_a_wrong_declared_shape_of_the_extension_op_is_found_and_repaired(tmp_path):
    model = layer_norm_12(
        value_info=[helper.make_tensor_value_info("Y", TensorProto.FLOAT, [2, 3, 5])]
    )
    repairs = load_model(_save(model, tmp_path / "m.onnx"), target=CPU).meta[REPAIRS_META]
    assert [str(r) for r in repairs if r.kind == "declared-vs-inferred"] == [
        "repaired: value_info contradicting inference replaced (the inferred type wins), "
        "'Y' float[2,3,5] -> float[2,3,4]"
    ]


def test_a_wrong_declared_output_type_after_the_extension_op_is_found(tmp_path):
    model = layer_norm_12()
    model.graph.output[0].type.tensor_type.elem_type = TensorProto.INT64
    with pytest.raises(ModelError, match="graph output 'Z' is declared int64"):
        load_model(_save(model, tmp_path / "m.onnx"), target=CPU)


def test_errors_after_the_extension_op_are_still_reported(tmp_path):
    # onnx stops reporting inference errors after an op it has no schema for: the
    # view registers onnxruntime's schema for the private domain, so this Relu's
    # declared shape conflict (independent of the LayerNormalization) is found, and
    # repaired.
    model = _model(
        [
            helper.make_node("LayerNormalization", ["X", "scale", "bias"], ["Y"]),
            helper.make_node("Relu", ["X"], ["A"]),
            helper.make_node("Add", ["A", "Y"], ["Z"]),
        ],
        value_info=[helper.make_tensor_value_info("A", TensorProto.FLOAT, [2, 3, 5])],
    )
    repairs = load_model(_save(model, tmp_path / "m.onnx"), target=CPU).meta[REPAIRS_META]
    assert [r.places for r in repairs if r.kind == "declared-vs-inferred"] == [
        ("'A' float[2,3,5] -> float[2,3,4]",)
    ]


def test_the_extension_node_itself_is_checked_against_its_schema(tmp_path):
    model = _model(
        [
            helper.make_node("SimplifiedLayerNormalization", ["X"], ["Y"]),
            helper.make_node("Relu", ["Y"], ["Z"]),
        ],
        opset=13,
    )
    with pytest.raises(ModelError, match="fails the ONNX checker"):
        load_model(_save(model, tmp_path / "m.onnx"), target=CPU)


def test_attributes_onnxruntime_ignores_are_not_held_against_the_model(tmp_path):
    # Old exporters wrote `epsion` (tests/data/ort-fusion/attention_*.onnx); onnxruntime
    # ignores attributes its extension schemas do not define, and runs the model.
    model = layer_norm_12()
    model.graph.node[0].attribute.append(helper.make_attribute("epsion", 1e-6))
    path = _save(model, tmp_path / "m.onnx")
    assert load_model(path, target=CPU) is not None
    out = tmp_path / "out.onnx"
    optimize_file(path, out, [], Options(target=CPU))
    feeds = {"X": np.random.default_rng(2).standard_normal(SHAPE).astype(np.float32)}
    assert_close(run(onnx.load(out), feeds), run(model, feeds))


def test_external_data_is_checked_beside_the_model(tmp_path):
    model = layer_norm_12()
    path = tmp_path / "m.onnx"
    onnx.save_model(
        model, str(path), save_as_external_data=True, location="m.data", size_threshold=0
    )
    loaded = load_model(path, target=CPU)
    assert loaded is not None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.data", "m.onnx"]  # no leftovers
    (tmp_path / "m.data").unlink()
    with pytest.raises(ModelError, match="fails the ONNX checker"):
        load_model(path, target=CPU)


# -- inference, optimizing, saving -----------------------------------------------------


def test_shapes_are_inferred_through_extension_ops():
    model = ir.from_proto(layer_norm_12())
    normalize(model)
    relu = next(n for n in model.graph if n.op_type == "Relu")
    norm = next(n for n in model.graph if n.op_type == "LayerNormalization")
    assert norm.outputs[0].shape == ir.Shape(SHAPE)
    assert relu.inputs[0].dtype == ir.DataType.FLOAT


def test_shapes_reach_down_a_chain_of_extension_ops(tmp_path):
    # onnx types nothing after the first extension op; one walk in graph order types
    # the whole chain (LayerNormalization, MatMul, SimplifiedLayerNormalization, Relu).
    weight = numpy_helper.from_array(np.ones((4, 4), np.float32), "w")
    model = _model(
        [
            helper.make_node("LayerNormalization", ["X", "scale", "bias"], ["L"]),
            helper.make_node("MatMul", ["L", "w"], ["M"]),
            helper.make_node("SimplifiedLayerNormalization", ["M", "scale"], ["S"]),
            helper.make_node("Relu", ["S"], ["Z"]),
        ],
        initializers=[*_weights(), weight],
    )
    loaded = load_model(_save(model, tmp_path / "m.onnx"), target=CPU)
    normalize(loaded)
    values = {n.op_type: n.outputs[0] for n in loaded.graph}
    for op in ("LayerNormalization", "MatMul", "SimplifiedLayerNormalization"):
        assert values[op].shape == ir.Shape(SHAPE), op
        assert values[op].dtype == ir.DataType.FLOAT, op


def test_unsorted_models_with_extension_ops_are_sorted_and_accepted(tmp_path):
    model = layer_norm_12()
    nodes = list(model.graph.node)
    del model.graph.node[:]
    model.graph.node.extend(reversed(nodes))
    loaded = load_model(_save(model, tmp_path / "m.onnx"), target=CPU)
    assert [n.op_type for n in loaded.graph] == ["LayerNormalization", "Relu"]


def test_optimize_keeps_extension_ops_in_the_ai_onnx_domain(tmp_path):
    model = layer_norm_12()
    source, out = _save(model, tmp_path / "in.onnx"), tmp_path / "out.onnx"
    optimize_file(source, out, [], Options(target=CPU))
    result = onnx.load(out)
    assert [(n.domain, n.op_type) for n in result.graph.node] == [
        ("", "LayerNormalization"),
        ("", "Relu"),
    ]
    assert not any(o.domain == PRIVATE_DOMAIN for o in result.opset_import)
    feeds = {"X": np.random.default_rng(1).standard_normal(SHAPE).astype(np.float32)}
    assert_close(run(result, feeds), run(model, feeds))


def test_optimize_refuses_them_for_the_onnx_target(tmp_path):
    source = _save(layer_norm_12(), tmp_path / "in.onnx")
    with pytest.raises(ModelError, match="No Op registered for LayerNormalization"):
        optimize_file(source, tmp_path / "out.onnx", [], Options(target=ONNX))
    assert not (tmp_path / "out.onnx").exists()


def test_save_and_check_follow_the_target(tmp_path):
    model = ir.from_proto(layer_norm_12())
    check_model(model, CPU)
    save_model(model, tmp_path / "ok.onnx", CPU)
    with pytest.raises(InvariantError, match="No Op registered for LayerNormalization"):
        check_model(model, ONNX)
    with pytest.raises(InvariantError, match="No Op registered for LayerNormalization"):
        save_model(model, tmp_path / "bad.onnx", ONNX)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ok.onnx"]


def test_command_line(tmp_path):
    source = _save(layer_norm_12(), tmp_path / "in.onnx")

    def onnxfuse(*args: str) -> subprocess.CompletedProcess:
        command = [sys.executable, "-m", "onnxfuse", "optimize", source, "-q", *args]
        return subprocess.run(command, capture_output=True, text=True, timeout=120)

    done = onnxfuse("-o", str(tmp_path / "cpu.onnx"))
    assert done.returncode == 0, done.stderr
    refused = onnxfuse("--target", "onnx", "-o", str(tmp_path / "onnx.onnx"))
    assert refused.returncode == 2
    assert len(refused.stderr.strip().splitlines()) == 1
    assert "No Op registered for LayerNormalization" in refused.stderr
