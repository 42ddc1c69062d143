"""ort-attention-gpt2 (rules/ort/attention_gpt2.yaml) on the graph GPT-2's dynamo export
has once the other rules ran: packed QKV MatMul + Add, Split in three, heads, scaled
FusedMatMul, the Where-built mask added, Softmax, ·V, and the c_proj Conv1D (Gemm between
Reshapes). It must become Attention + MatMul + Add and keep the outputs; other masks,
splits and output shapes must stay."""

from __future__ import annotations

import numpy as np
import onnx
from core_pack_support import node
from helpers import assert_close, make_model, optimize_proto, run, tensor_input
from onnx import helper, numpy_helper

from onnxfuse.language.packs import load_builtin_rules
from onnxfuse.targets.capabilities import load_target

RULE = "ort-attention-gpt2"
RULES = {rule.name: rule for rule in load_builtin_rules(["ort", "core"])}
F32, I64 = np.float32, np.int64
HEADS, HEAD, D_IN, N_OUT = 2, 4, 8, 6
D = HEADS * HEAD
MS = "com.microsoft"


def gpt2_attention(mask_dims=("batch", 1, "seq", "seq"), out_order=(0, 1)) -> onnx.ModelProto:
    rng = np.random.default_rng(7)

    def w(*shape):
        return (rng.standard_normal(shape) * 0.3).astype(F32)

    inits = {
        "W": w(D_IN, 3 * D),
        "B": w(3 * D),
        "Wo": w(D, N_OUT),
        "Bo": w(N_OUT),
        "sh": np.array([0, 0, HEADS, HEAD], I64),
        "flat": np.array([-1, D], I64),
        "n": np.array([N_OUT], I64),
    }
    starts = {0: (0, 1), 1: (1, 2)}
    nodes = [
        node("MatMul", ["X", "W"], "qkv0"),
        node("Add", ["qkv0", "B"], "qkv"),
        helper.make_node("Split", ["qkv"], ["q", "k", "v"], name="split", axis=2, num_outputs=3),
        node("Reshape", ["q", "sh"], "qr"),
        node("Transpose", ["qr"], "qt", perm=[0, 2, 1, 3]),
        node("Reshape", ["k", "sh"], "kr"),
        node("Transpose", ["kr"], "kt", perm=[0, 2, 3, 1]),
        node("Reshape", ["v", "sh"], "vr"),
        node("Transpose", ["vr"], "vt", perm=[0, 2, 1, 3]),
        node("FusedMatMul", ["qt", "kt"], "s", domain=MS, alpha=float(HEAD**-0.5)),
        node("Add", ["s", "M"], "a"),
        node("Softmax", ["a"], "p", axis=-1),
        node("MatMul", ["p", "vt"], "o"),
        node("Transpose", ["o"], "ot", perm=[0, 2, 1, 3]),
        node("Reshape", ["ot", "flat"], "f"),
        node("Gemm", ["f", "Wo", "Bo"], "g"),
    ]
    for i, axis in enumerate(out_order):
        nodes.append(node("Shape", ["X"], f"d{i}", start=starts[axis][0], end=starts[axis][1]))
    nodes += [
        node("Concat", ["d0", "d1", "n"], "sy", axis=0),
        node("Reshape", ["g", "sy"], "y"),
    ]
    y_dims = [["batch", "seq"][a] for a in out_order] + [N_OUT]
    model = make_model(
        nodes,
        [tensor_input("X", ["batch", "seq", D_IN]), tensor_input("M", list(mask_dims))],
        [tensor_input("y", y_dims)],
        [numpy_helper.from_array(a, n) for n, a in inits.items()],
        opset=18,
        extra_opsets={MS: 1},
    )
    # Value types as the exporter declares them (onnx cannot infer through FusedMatMul).
    return onnx.shape_inference.infer_shapes(model)


def feeds(batch=2, seq=5, mask_shape=None):
    rng = np.random.default_rng(8)
    mask = np.where(np.tril(np.ones((seq, seq), bool)), 0.0, np.finfo(F32).min).astype(F32)
    mask = np.broadcast_to(mask, mask_shape or (batch, 1, seq, seq)).copy()
    return {"X": rng.standard_normal((batch, seq, D_IN)).astype(F32), "M": mask}


def optimize(model):
    report, result = optimize_proto(model, [RULES[RULE]], target=load_target("cpu"))
    return report.rules[RULE].applied, result


def test_gpt2_attention_fuses_and_keeps_the_outputs():
    model = gpt2_attention()
    applied, result = optimize(model)
    assert applied == 1
    ops = [n.op_type for n in result.graph.node]
    assert ops.count("Attention") == 1 and "Softmax" not in ops and "Gemm" not in ops
    for shape in [dict(batch=2, seq=5), dict(batch=1, seq=1), dict(batch=3, seq=2)]:
        f = feeds(**shape)
        assert_close(run(result, f), run(model, f))


def test_a_key_padding_mask_shape_does_not_fuse():
    # [batch, 1, 1, seq] broadcasts over the rows; Attention's attention_bias may not.
    applied, _ = optimize(gpt2_attention(mask_dims=("batch", 1, 1, "seq")))
    assert applied == 0


def test_an_output_in_another_order_does_not_fuse():
    applied, _ = optimize(gpt2_attention(out_order=(1, 0)))
    assert applied == 0
