"""ort-mha-* and ort-attention-from-mha (rules/ort/mha.yaml): T5-style attention over separate
Q, K, V values with an unscaled Q·Kᵀ, a relative-position bias P and a mask M added to the
scores, into com.microsoft MultiHeadAttention(Q, K, V, attention_bias = P + M, scale = 1), and
self-attention (Q, K, V projected from one input) on into one packed-weight Attention.

T5 masks with float32's lowest value, not -inf, so a fully masked query row is a uniform
average of V in the source; the kernels must give the same row, whatever order they add the
bias terms in. Every case below feeds masks with such rows and a fully masked batch element,
on hand-built layers and end to end on the cached T5 encoder-decoder export."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from core_pack_support import node
from helpers import assert_close, make_model, optimize_proto, run, tensor_input
from onnx import TensorProto, numpy_helper

from onnxfuse.language.packs import load_builtin_rules
from onnxfuse.targets.capabilities import load_target

MHA, PACK = "ort-mha-bias2", "ort-attention-from-mha"
RULES = {rule.name: rule for rule in load_builtin_rules(["ort"])}
F32, I64 = np.float32, np.int64
F32_LOWEST = float(np.finfo(F32).min)
HEADS, HEAD, D_IN = 2, 4, 8
D = HEADS * HEAD
MS = "com.microsoft"


def t5_layer(masked_value: float = F32_LOWEST, cross: bool = False, mask_shape=None):
    """One T5 attention as it stands once the other packs ran: no projection bias, no scale.

    Self-attention reads K and V from X; cross-attention from the encoder output E.
    P (the position bias) is a graph input [1, heads, seq, kv]; the mask is Where(C, 0, F).
    """
    rng = np.random.default_rng(7)
    kv_input, kv_len = ("E", "enc") if cross else ("X", "seq")
    inits = {f"W{x}": (rng.standard_normal((D_IN, D)) * 0.3).astype(F32) for x in "qkv"}
    inits |= {
        "sh": np.array([0, 0, HEADS, HEAD], I64),
        "out": np.array([0, 0, -1], I64),
        "zero": np.array(0.0, F32),
        "F": np.array(masked_value, F32),
    }
    nodes = [
        node("MatMul", ["X", "Wq"], "q"),
        node("MatMul", [kv_input, "Wk"], "k"),
        node("MatMul", [kv_input, "Wv"], "v"),
        node("Reshape", ["q", "sh"], "qr"),
        node("Transpose", ["qr"], "qt", perm=[0, 2, 1, 3]),
        node("Reshape", ["k", "sh"], "kr"),
        node("Transpose", ["kr"], "kt", perm=[0, 2, 3, 1]),
        node("Reshape", ["v", "sh"], "vr"),
        node("Transpose", ["vr"], "vt", perm=[0, 2, 1, 3]),
        node("MatMul", ["qt", "kt"], "s"),
        node("Add", ["s", "P"], "a1"),
        node("Where", ["C", "zero", "F"], "M"),
        node("Add", ["a1", "M"], "a"),
        node("Softmax", ["a"], "p", axis=-1),
        node("MatMul", ["p", "vt"], "o"),
        node("Transpose", ["o"], "ot", perm=[0, 2, 1, 3]),
        node("Reshape", ["ot", "out"], "Y"),
    ]
    inputs = [
        tensor_input("X", ["batch", "seq", D_IN]),
        tensor_input("P", [1, HEADS, "seq", kv_len]),
        tensor_input("C", mask_shape or ["batch", 1, "seq", kv_len], TensorProto.BOOL),
    ]
    if cross:
        inputs.insert(1, tensor_input("E", ["batch", "enc", D_IN]))
    model = make_model(
        nodes,
        inputs,
        [tensor_input("Y", ["batch", "seq", D])],
        [numpy_helper.from_array(a, n) for n, a in inits.items()],
        opset=17,
        extra_opsets={MS: 1},
    )
    return onnx.shape_inference.infer_shapes(model)


def feeds(cross: bool = False, batch: int = 3, seq: int = 4, enc: int = 5):
    """Random inputs; the mask leaves one query row and the whole first batch element empty."""
    rng = np.random.default_rng(11)
    kv = enc if cross else seq
    c = rng.random((batch, 1, seq, kv)) < 0.6
    c[:, :, :, 0] = True
    if batch > 1 and seq > 2:
        c[1, :, 2, :] = False
    c[0] = False
    out = {
        "X": rng.standard_normal((batch, seq, D_IN)).astype(F32),
        "P": rng.standard_normal((1, HEADS, seq, kv)).astype(F32),
        "C": c,
    }
    if cross:
        out["E"] = rng.standard_normal((batch, enc, D_IN)).astype(F32)
    return out


def optimize(model):
    report, result = optimize_proto(model, [RULES[MHA], RULES[PACK]], target=load_target("cpu"))
    return {name: report.rules[name].applied for name in (MHA, PACK)}, result


def ops(model) -> list[str]:
    return [n.op_type for n in model.graph.node]


def attrs(model, op: str) -> dict:
    (found,) = [n for n in model.graph.node if n.op_type == op]
    return {a.name: onnx.helper.get_attribute_value(a) for a in found.attribute}


def test_self_attention_becomes_one_packed_attention_with_scale_one():
    model = t5_layer()
    applied, result = optimize(model)
    assert applied == {MHA: 1, PACK: 1}
    # The packed weights fold into one initializer; only the bias terms' Add stays beside.
    assert sorted(ops(result)) == ["Add", "Attention", "Where"], ops(result)
    assert attrs(result, "Attention") == {"num_heads": HEADS, "scale": 1.0}
    x = feeds()
    want = run(model, x)
    # A fully masked row is the uniform average of V in the source, not zeros or NaN:
    # float32's lowest absorbs the scores and the position bias, so every query of the
    # fully masked batch element gets the same row.
    y = want[0]
    assert np.all(np.isfinite(y)) and np.any(y[0] != 0)
    np.testing.assert_array_equal(y[0, 0], y[0, -1])
    assert_close(run(result, x), want)
    for batch, seq in [(1, 1), (2, 6)]:
        x = feeds(batch=batch, seq=seq)
        assert_close(run(result, x), run(model, x))


def test_cross_attention_stays_multi_head_attention():
    model = t5_layer(cross=True)
    applied, result = optimize(model)
    assert applied == {MHA: 1, PACK: 0}
    assert "MultiHeadAttention" in ops(result) and "Softmax" not in ops(result)
    assert attrs(result, "MultiHeadAttention") == {"num_heads": HEADS, "scale": 1.0}
    for batch, seq, enc in [(3, 4, 5), (1, 1, 1), (2, 3, 7)]:
        x = feeds(cross=True, batch=batch, seq=seq, enc=enc)
        assert_close(run(result, x), run(model, x))


def test_an_inf_mask_gives_nan_rows_in_both():
    """-inf (not T5's value) leaves a fully masked row NaN in the source and in the kernels."""
    model = t5_layer(masked_value=-np.inf, cross=True)
    applied, result = optimize(model)
    assert applied[MHA] == 1
    x = feeds(cross=True)
    want, got = run(model, x)[0], run(result, x)[0]
    assert np.isnan(want[0]).all() and np.isnan(want[1, 2]).all()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got, want, rtol=1.3e-6, atol=1e-5, equal_nan=True)


def test_a_finite_masked_value_stays_because_the_kernel_adds_in_another_order():
    """MultiHeadAttention adds s + (P + M), the source (s + P) + M. With F = -10000 the two
    round apart by up to ulp(10000) ~ 1e-3 on a fully masked row, which the softmax turns
    into visibly different weights; float32's lowest absorbs both sums exactly."""
    model = t5_layer(masked_value=-10000.0)
    applied, result = optimize(model)
    assert applied == {MHA: 0, PACK: 0} and "Softmax" in ops(result)

    def softmax(a):
        e = np.exp(a - a.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)

    rng = np.random.default_rng(3)
    s, p = (rng.standard_normal((64, 16)).astype(F32) * 4 for _ in range(2))
    for f, differs in [(F32(-10000.0), True), (F32(F32_LOWEST), False)]:
        source, fused = softmax((s + p) + f), softmax(s + (p + f))
        assert (np.abs(source - fused).max() > 1e-4) == differs


def test_a_mask_of_unproven_shape_stays():
    """Shapes that only agree at run time (other dim names) are not proof for attention_bias."""
    model = t5_layer(mask_shape=["b2", 1, "q2", "k2"])
    applied, result = optimize(model)
    assert applied == {MHA: 0, PACK: 0}
    assert "Softmax" in ops(result)


def test_mha_with_a_key_padding_mask_is_not_packed():
    rng = np.random.default_rng(2)
    inits = [
        numpy_helper.from_array((rng.standard_normal((D_IN, D)) * 0.3).astype(F32), f"W{x}")
        for x in "qkv"
    ]
    nodes = [node("MatMul", ["X", f"W{x}"], x) for x in "qkv"] + [
        onnx.helper.make_node(
            "MultiHeadAttention",
            ["q", "k", "v", "", "KP", "AB"],
            ["Y"],
            domain=MS,
            num_heads=HEADS,
            scale=1.0,
        )
    ]
    model = make_model(
        nodes,
        [
            tensor_input("X", ["batch", "seq", D_IN]),
            tensor_input("KP", ["batch", "seq"], TensorProto.INT32),
            tensor_input("AB", [1, HEADS, "seq", "seq"]),
        ],
        [tensor_input("Y", ["batch", "seq", D])],
        inits,
        opset=17,
        extra_opsets={MS: 1},
    )
    applied, result = optimize(model)
    assert applied[PACK] == 0 and "MultiHeadAttention" in ops(result)


@pytest.mark.slow
def test_t5_encoder_decoder_export_fuses_every_attention(tmp_path):
    """Encoder and decoder self-attention into Attention, cross-attention into
    MultiHeadAttention."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from exports.anchors import session, worst_error
    from exports.export import export_by_name

    from onnxfuse.api import optimize_file, select_rules
    from onnxfuse.passes.pipeline import Options

    export = export_by_name("t5-seq2seq-dynamo18")
    out = tmp_path / "fused.onnx"
    optimize_file(export.path, out, select_rules(), Options(target=load_target("cpu")))
    counts: dict[str, int] = {}
    for n in onnx.load(str(out)).graph.node:
        counts[n.op_type] = counts.get(n.op_type, 0) + 1
    layers = export.spec.config["layers"]
    assert counts.get("Attention") == 2 * layers, counts
    assert counts.get("MultiHeadAttention") == layers, counts
    assert "Softmax" not in counts, counts
    masked = dict(export.feeds)
    mask = masked["attention_mask"].copy()
    mask[0, 1:] = 0
    mask[-1, :] = 0  # a batch element with no key: uniform rows in the source
    masked["attention_mask"] = mask
    for x in (export.feeds, masked):
        want = session(export.path).run(None, x)
        got = session(out).run(None, x)
        assert worst_error(got, want) <= 1.0, worst_error(got, want)
