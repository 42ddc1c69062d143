"""ort-attention-sdpa and ort-attention-sdpa-inf-mask (rules/ort/attention_sdpa.yaml): the
SDPA decomposition torch's dynamo exporter writes (Kᵀ through Reshape/Transpose/Reshape, the
mask Where(C, 0, F), Where(IsNaN(p), 0, p) after the Softmax) into com.microsoft.Attention.

The point of the two rules is a fully masked query row: the source gives zeros when F is -inf
and a uniform row when F is finite; Attention gives NaN and a uniform row. So a finite F fuses
as is, -inf fuses with Attention's NaN rows replaced by the source's value (zeros, or NaN
where the batch element's X is not finite), and anything else (+inf, NaN, a runtime F)
stays.
Every case feeds masks with fully masked rows and a fully masked batch element, on a
hand-built graph and end to end on the cached BERT SDPA exports."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from core_pack_support import node
from helpers import make_model, optimize_proto, run, tensor_input
from onnx import TensorProto, numpy_helper

from onnxfuse.language.packs import load_builtin_rules
from onnxfuse.targets.capabilities import load_target

FINITE, INF = "ort-attention-sdpa", "ort-attention-sdpa-inf-mask"
RULES = {rule.name: rule for rule in load_builtin_rules(["ort", "core"])}
F32, I64 = np.float32, np.int64
HEADS, HEAD, D_IN = 2, 4, 8
D = HEADS * HEAD
MS = "com.microsoft"
I64_MAX, I64_MIN = np.iinfo(I64).max, np.iinfo(I64).min


def sdpa_graph(masked_value, mask_heads: int | str = 1, runtime_f: bool = False):
    """One SDPA layer as it stands once the other packs ran (FusedMatMul holds the scale)."""
    rng = np.random.default_rng(5)

    def w(*shape):
        return (rng.standard_normal(shape) * 0.3).astype(F32)

    inits = {
        "Wq": w(D_IN, D), "Bq": w(D), "Wk": w(D_IN, D), "Bk": w(D),
        "Wv": w(D_IN, D), "Bv": w(D),
        "sh": np.array([0, 0, HEADS, HEAD], I64), "out": np.array([0, 0, -1], I64),
        "m1": np.array([-1], I64), "m2": np.array([-2], I64),
        "big": np.array([I64_MAX], I64), "small": np.array([I64_MIN], I64),
        "zero": np.array(0.0, F32),
    }  # fmt: skip
    if not runtime_f:
        inits["F"] = np.array(masked_value, F32)
    nodes = []
    for x in "qkv":
        nodes += [
            node("MatMul", ["X", f"W{x}"], f"{x}0"),
            node("Add", [f"{x}0", f"B{x}"], f"{x}b"),
            node("Reshape", [f"{x}b", "sh"], f"{x}r"),
            node("Transpose", [f"{x}r"], f"{x}t" if x != "k" else "k4", perm=[0, 2, 1, 3]),
        ]
    nodes += [
        # Kᵀ as dynamo writes it: [b, n, s, h] -> [-1, s, h] -> [-1, h, s] -> [b, n, h, s]
        node("Shape", ["k4"], "ks"),
        node("Slice", ["ks", "m1", "big"], "kh"),
        node("Slice", ["ks", "m2", "m1"], "kseq"),
        node("Slice", ["ks", "small", "m2"], "kbn"),
        node("Concat", ["m1", "kseq", "kh"], "s1", axis=0),
        node("Reshape", ["k4", "s1"], "k3"),
        node("Transpose", ["k3"], "k3t", perm=[0, 2, 1]),
        node("Concat", ["kbn", "kh", "kseq"], "s2", axis=0),
        node("Reshape", ["k3t", "s2"], "kt"),
        node("FusedMatMul", ["qt", "kt"], "s", domain=MS, alpha=float(HEAD**-0.5)),
        node("Where", ["C", "zero", "F"], "M"),
        node("Add", ["s", "M"], "a"),
        node("Softmax", ["a"], "p", axis=-1),
        node("IsNaN", ["p"], "n"),
        node("Where", ["n", "zero", "p"], "pz"),
        node("MatMul", ["pz", "vt"], "o"),
        node("Transpose", ["o"], "ot", perm=[0, 2, 1, 3]),
        node("Reshape", ["ot", "out"], "Y"),
    ]
    inputs = [
        tensor_input("X", ["batch", "seq", D_IN]),
        tensor_input("C", ["batch", mask_heads, "seq", "seq"], TensorProto.BOOL),
    ]
    if runtime_f:
        inputs.append(tensor_input("F", []))
    model = make_model(
        nodes,
        inputs,
        [tensor_input("Y", ["batch", "seq", D])],
        [numpy_helper.from_array(a, n) for n, a in inits.items()],
        opset=18,
        extra_opsets={MS: 1},
    )
    return onnx.shape_inference.infer_shapes(model)


def masks(batch=3, seq=4, heads=1):
    """Random masks, plus a query row with no key and a batch element with no key at all."""
    rng = np.random.default_rng(11)
    c = rng.random((batch, heads, seq, seq)) < 0.6
    c[:, :, :, 0] = True  # every row of the other elements keeps a key...
    c[1, :, 2, :] = False  # ...but this query row
    c[0] = False  # and the whole first element (an attention_mask row of zeros)
    x = rng.standard_normal((batch, seq, D_IN)).astype(F32)
    return {"X": x, "C": c}


def optimize(model):
    rules = [RULES[FINITE], RULES[INF]]
    report, result = optimize_proto(model, rules, target=load_target("cpu"))
    return {name: report.rules[name].applied for name in (FINITE, INF)}, result


def ops(model) -> list[str]:
    return [n.op_type for n in model.graph.node]


def assert_equal_with_nan(got: np.ndarray, want: np.ndarray) -> None:
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, equal_nan=True)


@pytest.mark.parametrize("masked_value", [np.finfo(F32).min, -10000.0])
def test_a_finite_mask_fuses_into_attention_alone(masked_value):
    model = sdpa_graph(masked_value)
    applied, result = optimize(model)
    assert applied == {FINITE: 1, INF: 0}
    assert ops(result).count("Attention") == 1
    assert not {"Softmax", "IsNaN", "IsInf", "ReduceMax"} & set(ops(result))
    feeds = masks()
    (want,), (got,) = run(model, feeds), run(result, feeds)
    # A fully masked row is a uniform average of V in both, not zeros.
    assert np.all(np.isfinite(want)) and np.any(want[0] != 0)
    assert_equal_with_nan(got, want)


def test_an_inf_mask_fuses_with_the_fully_masked_rows_zeroed():
    model = sdpa_graph(-np.inf)
    applied, result = optimize(model)
    assert applied == {FINITE: 0, INF: 1}
    assert ops(result).count("Attention") == 1 and "Softmax" not in ops(result)
    feeds = masks()
    (want,), (got,) = run(model, feeds), run(result, feeds)
    assert np.all(want[0] == 0) and np.all(want[1, 2] == 0)
    assert np.all(np.isfinite(want))
    assert_equal_with_nan(got, want)
    for batch, seq in [(1, 1), (2, 5)]:
        feeds = masks(batch=batch, seq=seq) if batch > 1 else {
            "X": np.ones((1, 1, D_IN), F32), "C": np.zeros((1, 1, 1, 1), bool)
        }  # fmt: skip
        assert_equal_with_nan(run(result, feeds)[0], run(model, feeds)[0])


@pytest.mark.parametrize("masked_value", [-np.inf, np.finfo(F32).min])
@pytest.mark.parametrize("special", [np.nan, np.inf, -np.inf])
def test_nan_or_an_infinity_in_x_gives_the_sources_outputs(masked_value, special):
    # The source's fully masked rows are the sum over the keys of 0 * V: NaN in a batch
    # element whose X holds NaN or an infinity, zeros elsewhere; Attention's NaN rows
    # must become exactly that, not zeros.
    model = sdpa_graph(masked_value)
    _, result = optimize(model)
    assert "Attention" in ops(result)
    feeds = masks()
    feeds["X"][0, 1, 3] = special
    feeds["X"][1, 0, 0] = special
    (want,), (got,) = run(model, feeds), run(result, feeds)
    assert np.all(np.isnan(want[0])) and np.all(np.isnan(want[1]))
    assert np.all(np.isfinite(want[2]))
    assert_equal_with_nan(got, want)


@pytest.mark.parametrize("masked_value", [np.inf, np.nan])
def test_a_mask_value_that_makes_nan_rows_does_not_fuse(masked_value):
    # +inf or NaN make NaN rows that are not fully masked: neither Attention nor the flag
    # reproduces the source's zeros there.
    applied, result = optimize(sdpa_graph(masked_value))
    assert applied == {FINITE: 0, INF: 0}
    assert "Attention" not in ops(result)


def test_a_runtime_masked_value_does_not_fuse():
    applied, _ = optimize(sdpa_graph(None, runtime_f=True))
    assert applied == {FINITE: 0, INF: 0}


def test_a_per_head_mask_fuses_only_when_finite():
    applied, _ = optimize(sdpa_graph(-np.inf, mask_heads=HEADS))
    assert applied == {FINITE: 0, INF: 0}
    model = sdpa_graph(np.finfo(F32).min, mask_heads=HEADS)
    applied, result = optimize(model)
    assert applied == {FINITE: 1, INF: 0}
    feeds = masks(heads=HEADS)
    assert_equal_with_nan(run(result, feeds)[0], run(model, feeds)[0])


# End to end: transformers' BERT with attn_implementation="sdpa", exported by dynamo (from the
# export cache tests/models/test_exports.py shares, exported here if missing).
def _export(name: str):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from exports.export import export_by_name

    export = export_by_name(name)
    return export.spec, onnx.load(export.path)


def _with_masked_value(model: onnx.ModelProto, value: float) -> onnx.ModelProto:
    """The export with the mask's masked value (the float32 minimum) replaced."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    masks = [n for n in model.graph.node if n.op_type == "Where" and n.input[0] == "bitwise_and_1"]
    assert len(masks) == 1, "the export's mask is no longer Where(bitwise_and_1, 0, min)"
    for init in model.graph.initializer:
        if init.name == masks[0].input[2]:
            assert numpy_helper.to_array(init) == np.finfo(F32).min
            init.CopyFrom(numpy_helper.from_array(np.array(value, F32), init.name))
    return model


def _bert_feeds(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, 100, (3, 6)).astype(I64)
    mask = np.ones((3, 6), I64)
    mask[0] = 0  # a sequence with no token to attend to
    mask[2, 4:] = 0
    return {"input_ids": ids, "attention_mask": mask}


@pytest.mark.parametrize(
    ("name", "masked_value"),
    [
        ("bert-sdpa-h64-dynamo18", "export"),
        ("bert-sdpa-h64-dynamo20", "export"),
        ("bert-sdpa-h64-dynamo18", -np.inf),
    ],
)
def test_bert_sdpa_export_fuses_and_keeps_masked_rows(name, masked_value):
    from onnxfuse.api import select_rules

    spec, model = _export(name)
    if masked_value != "export":
        model = _with_masked_value(model, masked_value)
    report, result = optimize_proto(model, select_rules(), target=load_target("cpu"))
    layers = spec.config["layers"]
    fired = INF if masked_value != "export" else FINITE
    assert report.rules[fired].applied == layers
    assert ops(result).count("Attention") == layers and "Softmax" not in ops(result)
    feeds = _bert_feeds()
    (want,), (got,) = run(model, feeds), run(result, feeds)
    if masked_value != "export":
        # -inf: the source's IsNaN/Where zeroes the attention of the fully masked sequence,
        # whatever the layers make of it after; the fusion must give the same.
        assert np.all(np.isfinite(want))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
