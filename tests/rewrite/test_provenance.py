"""Every node a rewrite creates names its rule and the input model's nodes it replaced,
in its metadata_props; ``--no-provenance`` leaves them out and changes nothing else."""

from __future__ import annotations

import json
from pathlib import Path

import onnx

from onnxfuse import api
from onnxfuse.cli.main import main
from onnxfuse.rewrite.apply import PROVENANCE_REPLACED, PROVENANCE_RULE


def _optimized(tmp_path: Path, *extra: str) -> onnx.ModelProto:
    out = tmp_path / f"out{len(extra)}.onnx"
    assert main(["optimize", str(api.sample_model_path()), "-o", str(out), "-q", *extra]) == 0
    return onnx.load(out)


def test_each_created_node_names_its_rule_and_the_nodes_it_replaced(tmp_path):
    source = onnx.load(api.sample_model_path())
    source_names = {node.name for node in source.graph.node}
    result = _optimized(tmp_path)
    onnx.checker.check_model(result, full_check=True)
    created = [node for node in result.graph.node if node.name not in source_names]
    assert created
    for node in created:
        props = {p.key: p.value for p in node.metadata_props}
        assert props[PROVENANCE_RULE] in node.name  # the rule's name is in the node's
        replaced = json.loads(props[PROVENANCE_REPLACED])
        assert replaced and set(replaced) <= source_names
    # A fusion made on a node an earlier rule created (conv-bn-fold, then the Relu's
    # fusion) names the input's nodes, the BatchNormalization's among them.
    stem = next(n for n in created if n.name.startswith("stem.relu"))
    stem_replaced = json.loads({p.key: p.value for p in stem.metadata_props}[PROVENANCE_REPLACED])
    assert stem_replaced == ["stem.conv", "stem.bn", "stem.relu"]
    kept = [node for node in result.graph.node if node.name in source_names]
    assert all(not node.metadata_props for node in kept)


def test_no_provenance_leaves_out_only_the_metadata(tmp_path):
    with_provenance = _optimized(tmp_path)
    without = _optimized(tmp_path, "--no-provenance")
    assert all(not node.metadata_props for node in without.graph.node)
    for node in with_provenance.graph.node:
        del node.metadata_props[:]
    assert with_provenance.SerializeToString() == without.SerializeToString()


def test_a_value_another_tool_recorded_is_not_read_as_ours():
    from onnx_ir import Node

    from onnxfuse.rewrite.apply import replaced_sources

    node = Node("", "Relu", [], name="relu")
    node.metadata_props[PROVENANCE_REPLACED] = "not json"
    assert replaced_sources([node]) == ["relu"]
