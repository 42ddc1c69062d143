"""ort-rotary-embedding (rules/ort/rotary.yaml): rotate_half RoPE with run-time angles into
com.microsoft.RotaryEmbedding, on a hand-built graph of the dynamo Llama form and end to end
on the cached Llama exports. Angles per batch element are ort-rotary-embedding-batched's;
halves of another angle, or a slice that is not the half stay."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from core_pack_support import node
from helpers import make_model, optimize_proto, run, tensor_input
from onnx import numpy_helper

from onnxfuse.language.packs import load_builtin_rules
from onnxfuse.targets.capabilities import load_target

RULE, ONNX_RULE = "ort-rotary-embedding", "onnx-rotary-embedding"
BATCHED = "ort-rotary-embedding-batched"
RULES = {rule.name: rule for rule in load_builtin_rules(["ort", "onnx", "core"])}
F32, I64 = np.float32, np.int64
HEADS, HEAD = 2, 8
HALF = HEAD // 2


def rope_graph(
    angle_batch: int | str = 1, second_half=None, half=HALF, opset=18
) -> onnx.ModelProto:
    """q and k rotated by one table, as Llama's dynamo export computes it."""
    inv_freq = (10000.0 ** (-np.arange(HALF) / HALF)).astype(F32)
    inits = {
        "inv_freq": inv_freq,
        "u": np.array([1], I64), "st": np.array([0], I64), "h": np.array([half], I64),
        "ax": np.array([3], I64), "one": np.array([1], I64),
        "end": np.array([np.iinfo(I64).max], I64), "u2": np.array([2], I64),
    }  # fmt: skip
    nodes = [
        node("Unsqueeze", ["P", "u2"], "p3"),  # [b, seq] positions -> [b, seq, 1]
        node("Cast", ["p3"], "pf", to=onnx.TensorProto.FLOAT),
        node("Mul", ["pf", "inv_freq"], "m"),
        node("Concat", ["m", second_half or "m"], "cat", axis=-1),
        node("Cos", ["cat"], "c"),
        node("Sin", ["cat"], "s"),
        node("Unsqueeze", ["c", "u"], "cu"),
        node("Unsqueeze", ["s", "u"], "su"),
    ]
    for x in ("q", "k"):
        nodes += [
            node("Mul", [x, "cu"], f"{x}c"),
            node("Slice", [x, "st", "h", "ax", "one"], f"{x}1"),
            node("Slice", [x, "h", "end", "ax", "one"], f"{x}2"),
            node("Neg", [f"{x}2"], f"{x}n"),
            node("Concat", [f"{x}n", f"{x}1"], f"{x}r", axis=-1),
            node("Mul", [f"{x}r", "su"], f"{x}s"),
            node("Add", [f"{x}c", f"{x}s"], f"{x}_out"),
        ]
    inputs = [
        tensor_input("q", ["batch", HEADS, "seq", HEAD]),
        tensor_input("k", ["batch", 1, "seq", HEAD]),
        tensor_input("P", [angle_batch, "seq"], onnx.TensorProto.INT64),
    ]
    if second_half:
        inputs.append(tensor_input(second_half, [angle_batch, "seq", HALF]))
    model = make_model(
        nodes,
        inputs,
        [tensor_input("q_out", ["batch", HEADS, "seq", HEAD]),
         tensor_input("k_out", ["batch", 1, "seq", HEAD])],
        [numpy_helper.from_array(a, n) for n, a in inits.items()],
        opset=opset,
    )  # fmt: skip
    return onnx.shape_inference.infer_shapes(model)


def feeds(batch=2, seq=5, angle_batch=1, start=0):
    rng = np.random.default_rng(4)
    positions = np.arange(start, start + seq, dtype=I64)
    return {
        "q": rng.standard_normal((batch, HEADS, seq, HEAD)).astype(F32),
        "k": rng.standard_normal((batch, 1, seq, HEAD)).astype(F32),
        "P": np.broadcast_to(positions, (angle_batch, seq)).copy(),
    }


def optimize(model, rule=RULE):
    report, result = optimize_proto(model, [RULES[rule]], target=load_target("cpu"))
    return report.rules[rule].applied, result


def ops(model) -> list[str]:
    return [n.op_type for n in model.graph.node]


def test_rotate_half_fuses_into_rotary_embedding():
    model = rope_graph()
    applied, result = optimize(model)
    assert applied == 2
    assert ops(result).count("RotaryEmbedding") == 2
    assert not {"Neg", "Slice", "Concat"} & set(ops(result))
    # One Cos and one Sin table for both.
    assert ops(result).count("Cos") == 1 and ops(result).count("Sin") == 1
    # Any position offset: the caches are computed from the angles fed, row s for token s.
    for shape in [dict(batch=2, seq=5), dict(batch=1, seq=1), dict(batch=3, seq=7, start=100)]:
        f = feeds(**shape)
        for got, want in zip(run(result, f), run(model, f), strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_opset_23_fuses_into_the_standard_op_for_the_onnx_target():
    model = rope_graph(opset=23)
    report, result = optimize_proto(model, [RULES[ONNX_RULE]], target=load_target("onnx"))
    assert report.rules[ONNX_RULE].applied == 2
    assert [n.domain for n in result.graph.node if n.op_type == "RotaryEmbedding"] == ["", ""]
    assert "Neg" not in ops(result)
    # onnxruntime runs RotaryEmbedding-23 only with caches of x's batch: the target expands.
    for shape in [dict(batch=3, seq=5), dict(batch=1, seq=2, start=40)]:
        f = feeds(**shape)
        for got, want in zip(run(result, f), run(model, f), strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    applied = (
        optimize_proto(
            rope_graph(opset=23, angle_batch="batch"),
            [RULES[ONNX_RULE]],
            target=load_target("onnx"),
        )[0]
        .rules[ONNX_RULE]
        .applied
    )
    assert applied == 0


def test_angles_per_batch_element_do_not_fuse():
    applied, _ = optimize(rope_graph(angle_batch="batch"))
    assert applied == 0


def test_angles_per_batch_element_fuse_with_a_row_per_token():
    model = rope_graph(angle_batch="batch")
    applied, result = optimize(model, BATCHED)
    assert applied == 2
    assert ops(result).count("RotaryEmbedding") == 2 and "Neg" not in ops(result)
    assert ops(result).count("Cos") == 1 and ops(result).count("Sin") == 1
    rng = np.random.default_rng(7)
    # Every sequence at its own positions (left padding, a decode step far into the cache).
    for batch, seq in [(3, 5), (1, 1), (2, 1), (4, 3)]:
        f = feeds(batch=batch, seq=seq, angle_batch=batch)
        f["P"] = rng.integers(0, 4000, (batch, seq)).astype(I64)
        for got, want in zip(run(result, f), run(model, f), strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_one_row_of_angles_for_a_batch_is_not_the_batched_rules():
    # m [1, seq, half] broadcast over x's batch: no row per sequence to index.
    applied, _ = optimize(rope_graph(angle_batch=1), BATCHED)
    assert applied == 0


def test_halves_of_different_angles_do_not_fuse():
    # Concat(m, m2): the two halves of a row rotate by different angles, not the op's rotation.
    applied, _ = optimize(rope_graph(second_half="m2"))
    assert applied == 0


def test_a_slice_off_the_half_does_not_fuse():
    applied, _ = optimize(rope_graph(half=HALF - 1))
    assert applied == 0


# End to end on the Llama exports (the export cache of tests/models/test_exports.py, exported
# here if missing): a longer and a one-token sequence than the export's, with left padding.
@pytest.mark.parametrize("name", ["llama-gqa-dynamo18", "llama-gqa-legacy17"])
def test_llama_export_rotary_fused(name):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from exports.export import export_by_name

    from onnxfuse.api import select_rules

    export = export_by_name(name)
    spec, model = export.spec, onnx.load(export.path)
    report, result = optimize_proto(model, select_rules(), target=load_target("cpu"))
    layers = spec.config["layers"]
    # queries and keys of every layer, in the dynamo or the legacy exporter's form
    fused = report.rules[RULE].applied + report.rules[f"{RULE}-legacy"].applied
    assert fused == 2 * layers
    assert "Neg" not in ops(result) and ops(result).count("RotaryEmbedding") == 2 * layers
    rng = np.random.default_rng(1)
    for batch, seq in [(2, 7), (1, 1)]:
        f = {
            "input_ids": rng.integers(0, 100, (batch, seq)).astype(I64),
            "attention_mask": np.ones((batch, seq), I64),
        }
        f["attention_mask"][0, : seq // 2] = 0  # left padding
        for got, want in zip(run(result, f), run(model, f), strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
