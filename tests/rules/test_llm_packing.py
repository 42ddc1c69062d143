"""llm-pack-qkv and llm-pack-gate-up (rules/llm/packing.yaml): projections of one input into
one MatMul by the concatenated weights and a Split. The packed weight is one initializer; an
input with other readers, a weight read elsewhere or a runtime weight stays unpacked.
llm-pack-qkv-bias: the parts' bias Adds become one Add before the Split."""

from __future__ import annotations

import numpy as np
import onnx
from core_pack_support import node
from helpers import assert_close, make_model, optimize_proto, random_feeds, run, tensor_input
from onnx import numpy_helper

from onnxfuse.language.packs import load_builtin_rules
from onnxfuse.language.rule import PHASES
from onnxfuse.targets.capabilities import load_target

RULES = {rule.name: rule for rule in load_builtin_rules(["llm"])}
QKV, GATE_UP, QKV_BIAS = "llm-pack-qkv", "llm-pack-gate-up", "llm-pack-qkv-bias"
D = 16
WIDTHS = {"wq": 16, "wk": 8, "wv": 8}


def projections(
    widths=WIDTHS, extra_reader: str | None = None, shared_weight: bool = False
) -> onnx.ModelProto:
    """X [batch, seq, D] times each weight; `extra_reader`: another node reads X."""
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array((rng.standard_normal((D, n)) * 0.2).astype(np.float32), w)
        for w, n in widths.items()
    ]
    nodes = [node("MatMul", ["X", w], f"y_{w}") for w in widths]
    outputs = [tensor_input(f"y_{w}", ["batch", "seq", n]) for w, n in widths.items()]
    if extra_reader == "Add":
        nodes.append(node("Add", ["X", "X"], "residual"))
        outputs.append(tensor_input("residual", ["batch", "seq", D]))
    elif extra_reader == "Shape":
        nodes.append(node("Shape", ["X"], "shape"))
        outputs.append(tensor_input("shape", [3], onnx.TensorProto.INT64))
    inputs = [tensor_input("X", ["batch", "seq", D])]
    if shared_weight:
        first = next(iter(widths))
        inputs.append(tensor_input("Z", [D, widths[first]]))
        nodes.append(node("Add", [first, "Z"], "w_shifted"))
        outputs.append(tensor_input("w_shifted", [D, widths[first]]))
    return make_model(nodes, inputs, outputs, inits, opset=18)


def split_sizes(model) -> str:
    (split,) = [n for n in model.graph.node if n.op_type == "Split"]
    return split.input[1]


def optimize(model, rule):
    report, result = optimize_proto(model, [RULES[rule]], target=load_target("cpu"))
    return report.rules[rule].applied, result


def test_three_projections_become_one_matmul_and_a_split():
    model = projections()
    applied, result = optimize(model, QKV)
    assert applied == 1
    ops = [n.op_type for n in result.graph.node]
    assert ops.count("MatMul") == 1 and ops.count("Split") == 1
    # The weights are one initializer of the concatenated width; the parts are gone.
    assert [list(i.dims) for i in result.graph.initializer if i.name != split_sizes(result)] == [
        [D, 32]
    ]
    for batch, seq in [(2, 5), (1, 1)]:
        feeds = random_feeds(model, dims={"batch": batch, "seq": seq})
        assert_close(run(result, feeds), run(model, feeds))


def test_gate_and_up_become_one_matmul_and_a_split():
    model = projections({"wg": 32, "wu": 32})
    applied, result = optimize(model, GATE_UP)
    assert applied == 1
    weights = [i for i in result.graph.initializer if i.name != split_sizes(result)]
    assert [list(i.dims) for i in weights] == [[D, 64]]
    feeds = random_feeds(model, dims={"batch": 2, "seq": 3})
    assert_close(run(result, feeds), run(model, feeds))


def test_a_shape_of_the_input_does_not_keep_it_from_packing():
    # The legacy exporter reads the normalized input's shape for the head split.
    applied, _ = optimize(projections(extra_reader="Shape"), QKV)
    assert applied == 1


def test_an_input_with_another_reader_stays():
    applied, _ = optimize(projections(extra_reader="Add"), QKV)
    assert applied == 0


def test_a_weight_read_elsewhere_stays():
    # Concatenating it would copy the weight: the other reader keeps the original.
    applied, _ = optimize(projections(shared_weight=True), QKV)
    assert applied == 0


def test_two_projections_are_not_packed_as_three_nor_three_as_two():
    applied, _ = optimize(projections({"wg": 32, "wu": 32}), QKV)
    assert applied == 0
    applied, _ = optimize(projections(), GATE_UP)
    assert applied == 0


def biased_projections(bias_shapes=((16,), (8,), (8,))) -> onnx.ModelProto:
    """Qwen2's projections: each of three MatMuls plus its constant bias."""
    rng = np.random.default_rng(1)
    model = projections()
    graph = model.graph
    for w, shape in zip(WIDTHS, bias_shapes):
        add = node("Add", [f"y_{w}", f"b_{w}"], f"z_{w}")
        graph.node.append(add)
        bias = rng.standard_normal(shape).astype(np.float32)
        graph.initializer.append(numpy_helper.from_array(bias, f"b_{w}"))
        (out,) = [o for o in graph.output if o.name == f"y_{w}"]
        out.name = f"z_{w}"
    return model


def test_the_packed_parts_biases_become_one_add_before_the_split():
    model = biased_projections()
    report, result = optimize_proto(model, [RULES[QKV], RULES[QKV_BIAS]], target=load_target("cpu"))
    assert report.rules[QKV].applied == 1 and report.rules[QKV_BIAS].applied == 1
    assert [n.op_type for n in result.graph.node] == ["MatMul", "Add", "Split"]
    (add,) = [n for n in result.graph.node if n.op_type == "Add"]
    (bias,) = [i for i in result.graph.initializer if i.name in add.input]
    assert list(bias.dims) == [32]
    for batch, seq in [(2, 5), (1, 1)]:
        feeds = random_feeds(model, dims={"batch": batch, "seq": seq})
        assert_close(run(result, feeds), run(model, feeds))


def test_a_bias_that_broadcasts_over_its_part_stays():
    model = biased_projections(((16,), (1,), (8,)))
    report, _ = optimize_proto(model, [RULES[QKV], RULES[QKV_BIAS]], target=load_target("cpu"))
    assert report.rules[QKV].applied == 1 and report.rules[QKV_BIAS].applied == 0


def test_packing_runs_after_the_fusions():
    # Encoder Attention fusions take the projections one by one: they must see them first.
    assert {rule.phase for rule in RULES.values()} == {"packing"}
    assert PHASES.index("packing") == PHASES.index("fusion") + 1
