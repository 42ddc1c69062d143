"""rules/core/space_to_depth.yaml on the Focus stem as torch exports YOLOv5's: eight
strided Slices, each with its own constants, and a Concat, then a Conv. Duplicate Slices
merge, Focus becomes SpaceToDepth with a channel Gather, and the Conv takes the Gather
into its weights."""

from __future__ import annotations

import numpy as np
import onnx
from helpers import assert_close, make_model, optimize_proto, random_feeds, run
from onnx import TensorProto, helper, numpy_helper

from onnxfuse.api import select_rules
from onnxfuse.targets.capabilities import load_target

END = np.iinfo(np.int64).max


def focus_stem(opset: int = 11) -> onnx.ModelProto:
    n = helper.make_node
    inits: list[onnx.TensorProto] = []
    nodes: list[onnx.NodeProto] = []

    def strided(source: str, start: int, axis: int, name: str) -> str:
        params = {"s": start, "e": END, "a": axis, "t": 2}
        for key, value in params.items():
            inits.append(numpy_helper.from_array(np.array([value], np.int64), f"{name}_{key}"))
        nodes.append(n("Slice", [source] + [f"{name}_{k}" for k in params], [name]))
        return name

    # x[..., ::2, ::2], x[..., 1::2, ::2], x[..., ::2, 1::2], x[..., 1::2, 1::2]
    parts = [
        strided(strided("X", row, 2, f"r{i}"), col, 3, f"p{i}")
        for i, (row, col) in enumerate([(0, 0), (1, 0), (0, 1), (1, 1)])
    ]
    nodes.append(n("Concat", parts, ["focus"], axis=1))
    rng = np.random.default_rng(0)
    inits.append(
        numpy_helper.from_array(rng.uniform(-0.5, 0.5, (8, 12, 3, 3)).astype(np.float32), "W")
    )
    inits.append(numpy_helper.from_array(rng.uniform(-0.5, 0.5, 8).astype(np.float32), "B"))
    nodes.append(n("Conv", ["focus", "W", "B"], ["Y"], pads=[1, 1, 1, 1]))
    x = helper.make_tensor_value_info("X", TensorProto.FLOAT, ["batch", 3, "height", "width"])
    y = helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["batch", 8, "h2", "w2"])
    return make_model(nodes, [x], [y], inits, opset=opset)


def test_the_focus_stem_becomes_space_to_depth_and_its_conv():
    model = focus_stem()
    report, optimized = optimize_proto(model, select_rules(), target=load_target("cpu"))
    assert report.rules["focus-space-to-depth"].applied == 1
    assert report.rules["gather-channels-conv-fold"].applied == 1
    assert [node.op_type for node in optimized.graph.node] == ["SpaceToDepth", "Conv"]
    for batch, height, width in ((1, 8, 6), (2, 4, 10)):
        dims = {"batch": batch, "height": height, "width": width}
        feeds = random_feeds(model, seed=height, dims=dims)
        assert_close(run(optimized, feeds), run(model, feeds))


def test_a_gather_that_is_no_permutation_stays():
    model = focus_stem()
    concat = next(node for node in model.graph.node if node.op_type == "Concat")
    concat.input[1] = concat.input[0]  # x[..., ::2, ::2] twice: not Focus
    report, optimized = optimize_proto(model, select_rules(), target=load_target("cpu"))
    assert report.rules["focus-space-to-depth"].applied == 0
    assert "SpaceToDepth" not in [node.op_type for node in optimized.graph.node]
