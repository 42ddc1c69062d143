"""Type inference: the schema-only answer agrees with onnx's inference; model inference names
the dimensions it can infer."""

from __future__ import annotations

import onnx
import onnx_ir as ir
import pytest

from onnxfuse.ops.inference import infer_node, infer_shapes, schema_dtypes

F, I64, B, F16 = ir.DataType.FLOAT, ir.DataType.INT64, ir.DataType.BOOL, ir.DataType.FLOAT16

CASES = [
    ("Add", [F, F], {}),
    ("Div", [F16, F16], {}),
    ("Sqrt", [F], {}),
    ("Equal", [I64, I64], {}),
    ("Shape", [F], {}),
    ("Reshape", [F, I64], {}),
    ("Concat", [F, F, F], {"axis": ir.AttrInt64("axis", 0)}),
    ("Cast", [F], {"to": ir.AttrInt64("to", int(I64))}),
    ("Cast", [I64], {"to": ir.AttrInt64("to", int(F16))}),
    ("Where", [B, F, F], {}),
    ("Sum", [F, F, F], {}),
    ("Not", [B], {}),
    ("Size", [F16], {}),
    ("Range", [I64, I64, I64], {}),
    ("ConstantOfShape", [I64], {}),
]


@pytest.mark.parametrize(("op", "dtypes", "attributes"), CASES, ids=[c[0] for c in CASES])
def test_schema_dtypes_match_onnx_inference(op, dtypes, attributes):
    inputs = [
        ir.Value(name=f"i{k}", type=ir.TensorType(dtype), shape=ir.Shape([2]))
        for k, dtype in enumerate(dtypes)
    ]
    node = ir.Node("", op, inputs, list(attributes.values()), num_outputs=1)
    node.outputs[0].name = "y"
    guessed = schema_dtypes(node, 18)
    infer_node(node, 18)
    # ConstantOfShape's type comes from an attribute's value, not from a constraint.
    assert guessed == [None if op == "ConstantOfShape" else node.outputs[0].dtype]


def test_schema_dtypes_leave_what_the_inputs_do_not_fix_unknown():
    untyped = ir.Value(name="x")
    assert schema_dtypes(ir.Node("", "Relu", [untyped], num_outputs=1), 18) == [None]
    unknown_op = ir.Node("com.example", "Mystery", [untyped], num_outputs=1)
    assert schema_dtypes(unknown_op, 18) == [None]


def test_model_inference_replaces_the_dims_onnx_invented_before():
    # An export's value_info as onnx leaves it where it could not infer a dimension then
    # (unk__N); the model's own names, now inferable, replace them, so that guards comparing
    # shapes by name see one dimension. A declared name (an output's) stays.
    graph = onnx.parser.parse_graph(
        """g (float[batch, 8] x) => (float[out, 8] z) {
            y = Relu(x)
            z = Neg(y)
        }"""
    )
    graph.value_info.append(onnx.helper.make_tensor_value_info("y", 1, ["unk__0", 8]))
    model = ir.from_proto(
        onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 18)])
    )
    infer_shapes(model, outputs=False)
    y = model.graph.node(0).outputs[0]
    assert [str(d) for d in y.shape] == ["batch", "8"]
    assert [str(d) for d in model.graph.outputs[0].shape] == ["out", "8"]


def test_model_inference_replaces_invented_dims_inside_branches_too():
    # The branches of an If read the outer x: their values are named by it alike.
    def branch(name: str, op: str) -> onnx.GraphProto:
        graph = onnx.helper.make_graph(
            [
                onnx.helper.make_node(op, ["x"], [f"y_{name}"]),
                onnx.helper.make_node("Neg", [f"y_{name}"], [f"o_{name}"]),
            ],
            name,
            [],
            [onnx.helper.make_tensor_value_info(f"o_{name}", 1, None)],
        )
        graph.value_info.append(onnx.helper.make_tensor_value_info(f"y_{name}", 1, ["unk__0", 8]))
        return graph

    graph = onnx.helper.make_graph(
        [
            onnx.helper.make_node(
                "If", ["c"], ["z"], then_branch=branch("t", "Relu"), else_branch=branch("e", "Abs")
            )
        ],
        "g",
        [
            onnx.helper.make_tensor_value_info("x", 1, ["batch", 8]),
            onnx.helper.make_tensor_value_info("c", 9, []),
        ],
        [onnx.helper.make_tensor_value_info("z", 1, None)],
    )
    model = ir.from_proto(
        onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 18)])
    )
    infer_shapes(model, outputs=False)
    if_node = model.graph.node(0)
    for name in ("then_branch", "else_branch"):
        first = if_node.attributes[name].as_graph().node(0)
        assert [str(d) for d in first.outputs[0].shape] == ["batch", "8"]
