"""How the page folds a graph into its repeated blocks: by the exporters' scopes, with a
created node where most of what it replaced was, and a Constant with its readers."""

from __future__ import annotations

import json

import onnx_ir as ir
import pytest

from onnxfuse.report import graph_view as gv
from onnxfuse.rewrite.apply import PROVENANCE_REPLACED, PROVENANCE_RULE


@pytest.fixture(autouse=True)
def fold_small_graphs(monkeypatch):
    monkeypatch.setattr(gv, "FOLD_FROM_NODES", 1)


def chain(names: list[str], scopes: list[list[str] | None] | None = None) -> ir.Model:
    """Relu after Relu, named ``names``; ``scopes``: the dynamo exporter's per node."""
    x = ir.Value(name="x")
    value = x
    nodes = []
    for i, name in enumerate(names):
        node = ir.Node("", "Relu", [value], name=name)
        if scopes is not None and scopes[i] is not None:
            node.metadata_props["pkg.torch.onnx.name_scopes"] = repr(scopes[i])
        value = node.outputs[0]
        value.name = f"v{i}"
        nodes.append(node)
    graph = ir.Graph([x], [value], nodes=nodes, opset_imports={"": 17})
    return ir.Model(graph, ir_version=10)


def blocks(view: gv.GraphView) -> dict[str, str]:
    return {n.name: n.block for n in view.nodes if n.kind == "node"}


def test_legacy_names_fold_at_the_first_numbered_series():
    view = gv.graph_view(
        chain(["/model/embed/Gather", "/model/layer.0/attn/MatMul", "/model/layer.0/Add",
               "/model/layer.1/attn/MatMul", "/model/pooler/Tanh"])
    )  # fmt: skip
    gv.assign_blocks(view)
    assert blocks(view) == {
        "/model/embed/Gather": "",
        "/model/layer.0/attn/MatMul": "model/layer.0",
        "/model/layer.0/Add": "model/layer.0",
        "/model/layer.1/attn/MatMul": "model/layer.1",
        "/model/pooler/Tanh": "",
    }


def test_a_numbered_scope_seen_once_is_no_series():
    view = gv.graph_view(chain(["/model/layer.0/MatMul", "/model/layer.0/Add"]))
    gv.assign_blocks(view)
    assert set(blocks(view).values()) == {""}


def test_dynamo_scopes_fold_as_the_names_would():
    scopes = [
        [
            "",
            "model",
            "model.encoder",
            "model.encoder.layer.0",
            "model.encoder.layer.0.output",
            "relu",
        ],
        ["", "model", "model.encoder", "model.encoder.layer.1", "relu_1"],
        None,
    ]
    view = gv.graph_view(chain(["node_relu", "node_relu_1", "node_relu_2"], scopes))
    gv.assign_blocks(view)
    assert blocks(view) == {
        "node_relu": "model/encoder/layer.0",
        "node_relu_1": "model/encoder/layer.1",
        "node_relu_2": "",
    }


def test_a_created_node_goes_where_most_of_what_it_replaced_was():
    before = gv.graph_view(
        chain(["/m/Shape", "/m/layer.0/a", "/m/layer.0/b", "/m/layer.1/a", "/m/layer.1/b"])
    )
    gv.assign_blocks(before)
    model = chain(["/m/layer.0/fused", "/m/layer.1/a", "/m/layer.1/b"])
    fused = model.graph.node(0)
    fused.metadata_props[PROVENANCE_RULE] = "r"
    fused.metadata_props[PROVENANCE_REPLACED] = json.dumps(["/m/Shape", "/m/layer.0/b"])
    model.graph.node(1).name = "renamed-but-kept-by-scope/layer.1/x"
    after = gv.graph_view(model)
    gv.assign_blocks(after, before)
    assert blocks(after) == {
        "/m/layer.0/fused": "m/layer.0",  # the shared /m/Shape is not a block
        "renamed-but-kept-by-scope/layer.1/x": "",  # its own path has no series
        "/m/layer.1/b": "m/layer.1",  # kept: the input's block
    }


def test_a_constant_joins_the_block_of_its_readers():
    model = chain(["/m/layer.0/a", "/m/layer.1/a"])
    constant = ir.Node("", "Constant", [], name="Constant_7")
    constant.outputs[0].name = "c"
    model.graph.insert_before(model.graph.node(1), constant)
    model.graph.node(2).resize_inputs(2)
    model.graph.node(2).replace_input_with(1, constant.outputs[0])
    view = gv.graph_view(model)
    gv.assign_blocks(view)
    assert blocks(view)["Constant_7"] == "m/layer.1"


def test_a_big_top_level_without_scopes_is_cut_into_runs_of_nodes(monkeypatch):
    monkeypatch.setattr(gv, "DRAWN_WHOLE_MAX", 4)
    monkeypatch.setattr(gv, "CHUNK_NODES", 3)
    before = gv.graph_view(chain([f"relu_{i}" for i in range(7)]))
    gv.assign_blocks(before)
    assert list(blocks(before).values()) == ["nodes 1-3"] * 3 + ["nodes 4-6"] * 3 + ["nodes 7-7"]
    # The optimized side follows the input's runs, it is not cut on its own.
    after = gv.graph_view(chain(["relu_0", "relu_4", "relu_5", "relu_6"]))
    gv.assign_blocks(after, before)
    assert list(blocks(after).values()) == ["nodes 1-3", "nodes 4-6", "nodes 4-6", "nodes 7-7"]


def test_a_top_level_small_enough_is_not_cut(monkeypatch):
    monkeypatch.setattr(gv, "DRAWN_WHOLE_MAX", 7)
    view = gv.graph_view(chain([f"relu_{i}" for i in range(7)]))
    gv.assign_blocks(view)
    assert set(blocks(view).values()) == {""}
