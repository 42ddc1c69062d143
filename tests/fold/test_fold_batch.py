"""Folding a rewrite's new nodes together (Folder.fold_nodes): results read only by
other folded nodes never become initializers, and the model is the one folding node by
node gives once unused initializers are gone."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import onnx_ir.passes.common as common_passes
from hypothesis import given
from hypothesis import strategies as st

from onnxfuse.fold.folder import FoldContext, Folder
from onnxfuse.graph.names import NameSource

OPS = {"Add": 2, "Mul": 2, "Sub": 2, "Neg": 1, "Abs": 1}


def _build(steps: list[tuple[str, int, int, bool, bool]]) -> tuple[ir.Model, list[ir.Node]]:
    """A graph input X, two weights, then one node per step (op, operands as indices
    into the values so far, whether the first operand is X instead, which keeps the node
    from folding, and whether its value is a graph output)."""
    x = ir.Value(name="X", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape([3]))
    weights = []
    for k, data in enumerate(([1.0, 2.0, 3.0], [0.5, -1.0, 4.0])):
        tensor = ir.tensor(np.array(data, np.float32), name=f"w{k}")
        weights.append(ir.Value(name=f"w{k}", type=ir.TensorType(tensor.dtype), shape=tensor.shape))
        weights[-1].const_value = tensor
    graph = ir.Graph([x], [], nodes=[], initializers=weights, opset_imports={"": 17})
    values = list(weights)
    nodes = []
    outputs = []
    for index, (op, first, second, reads_x, is_output) in enumerate(steps):
        operands = [x if reads_x else values[first % len(values)]]
        if OPS[op] == 2:
            operands.append(values[second % len(values)])
        node = ir.Node("", op, operands, name=f"n{index}")
        node.outputs[0].name = f"v{index}"
        node.outputs[0].type = ir.TensorType(ir.DataType.FLOAT)
        node.outputs[0].shape = ir.Shape([3])
        graph.append(node)
        nodes.append(node)
        values.append(node.outputs[0])
        if is_output:
            outputs.append(node.outputs[0])
    graph.outputs.extend(outputs or [values[-1]])
    return ir.Model(graph, ir_version=10), nodes


def _folder(model: ir.Model, limit: int = 1 << 20) -> Folder:
    return Folder(FoldContext(10, {"": 17}, limit), NameSource(model))


def _serialized(model: ir.Model) -> bytes:
    common_passes.RemoveUnusedNodesPass()(model)
    return ir.serde.serialize_model(model).SerializeToString()


STEPS = st.lists(
    st.tuples(
        st.sampled_from(sorted(OPS)),
        st.integers(0, 12),
        st.integers(0, 12),
        st.booleans(),
        st.booleans(),
    ),
    min_size=1,
    max_size=10,
)


@given(STEPS)
def test_folding_together_gives_the_model_folding_node_by_node_gives(steps) -> None:
    together, nodes = _build(steps)
    one_by_one, singles = _build(steps)
    folder = _folder(together)
    remaining = folder.fold_nodes(nodes)
    alone = _folder(one_by_one)
    kept = [node for node in singles if not alone.fold_node(node)]
    assert [n.name for n in remaining] == [n.name for n in kept]
    assert folder.folded == alone.folded
    assert _serialized(together) == _serialized(one_by_one)


def test_results_read_only_by_folded_nodes_are_not_initializers() -> None:
    # v0 = w0 + w1; v1 = v0 * v0; v2 = X + v1 (kept); v3 = -v0 (a graph output)
    model, nodes = _build(
        [
            ("Add", 0, 1, False, False),
            ("Mul", 2, 2, False, False),
            ("Add", 0, 3, True, False),
            ("Neg", 2, 0, False, True),
        ]
    )
    model.graph.outputs.append(nodes[2].outputs[0])
    folder = _folder(model)
    remaining = folder.fold_nodes(nodes)
    assert [n.name for n in remaining] == ["n2"]
    graph = model.graph
    # A folded value takes a fresh name; a graph output keeps its own.
    assert list(graph.initializers) == ["w0", "w1", "v1_1", "v3"]
    np.testing.assert_array_equal(graph.initializers["v1_1"].const_value.numpy(), [2.25, 1.0, 49.0])
    np.testing.assert_array_equal(graph.initializers["v3"].const_value.numpy(), [-1.5, -1.0, -7.0])
    assert graph.outputs[0] is graph.initializers["v3"]
    assert nodes[2].inputs[1] is graph.initializers["v1_1"]
    assert [n.name for n in graph] == ["n2"]


def test_a_result_read_by_a_node_left_unfolded_is_placed() -> None:
    # Random ops never fold: v0, which one reads, must become an initializer.
    model, nodes = _build([("Add", 0, 1, False, False)])
    random = ir.Node("", "RandomUniformLike", [nodes[0].outputs[0]], name="random")
    model.graph.append(random)
    model.graph.outputs[:] = [random.outputs[0]]
    folder = _folder(model)
    remaining = folder.fold_nodes([*nodes, random])
    assert remaining == [random]
    assert random.inputs[0] is model.graph.initializers["v0_1"]
    np.testing.assert_array_equal(
        model.graph.initializers["v0_1"].const_value.numpy(), [1.5, 1.0, 7.0]
    )
    assert [n.name for n in model.graph] == ["random"]
