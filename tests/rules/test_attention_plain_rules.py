"""rules/ort/attention_plain.yaml on a hand-built graph in the legacy exporter's Whisper form:
attention with no mask and no bias term, Q scaled after its bias, K without bias, and the
head split computed at run time as [Shape(x)[0], -1, heads, head_size] (the -1 against a
symbolic batch, which onnx's inference cannot size until the batch is copied with 0)."""

from __future__ import annotations

import numpy as np
import onnx
from helpers import assert_close, make_model, optimize_proto, random_feeds, run
from onnx import TensorProto, helper, numpy_helper

from onnxfuse.api import select_rules
from onnxfuse.targets.capabilities import load_target

HIDDEN, HEADS, SEQ = 16, 4, 6
HEAD = HIDDEN // HEADS


def _const(name: str, values, dtype=np.int64) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(values, dtype=dtype), name)


def whisper_legacy_attention(k_bias: bool) -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    weights = {f"W{p}": rng.uniform(-0.5, 0.5, (HIDDEN, HIDDEN)).astype(np.float32) for p in "qkv"}
    biases = {f"b{p}": rng.uniform(-0.5, 0.5, HIDDEN).astype(np.float32) for p in "qkv"}
    inits = [numpy_helper.from_array(v, k) for k, v in {**weights, **biases}.items()]
    inits += [
        _const("zero", 0),
        _const("axes0", [0]),
        _const("seq", [SEQ]),
        _const("minus1", [-1]),
        _const("heads", [HEADS]),
        _const("head", [HEAD]),
        _const("hidden", [HIDDEN]),
        numpy_helper.from_array(np.array(0.25, np.float32), "scale"),
    ]
    n = helper.make_node
    nodes = [
        n("Shape", ["X"], ["shape"]),
        n("Gather", ["shape", "zero"], ["batch"], axis=0),
        n("Unsqueeze", ["batch", "axes0"], ["batch1"]),
        n("Concat", ["batch1", "seq", "minus1", "head"], ["q_shape"], axis=0),
        n("Concat", ["batch1", "minus1", "heads", "head"], ["kv_shape"], axis=0),
        n("Concat", ["batch1", "seq", "hidden"], ["out_shape"], axis=0),
        n("MatMul", ["X", "Wq"], ["mq"]),
        n("Add", ["bq", "mq"], ["q"]),
        n("Mul", ["q", "scale"], ["qs"]),
        n("Reshape", ["qs", "q_shape"], ["qr"]),
        n("Transpose", ["qr"], ["qt"], perm=[0, 2, 1, 3]),
        n("MatMul", ["X", "Wk"], ["mk"]),
    ]
    if k_bias:
        nodes.append(n("Add", ["bk", "mk"], ["k"]))
    else:
        inits = [i for i in inits if i.name != "bk"]
    nodes += [
        n("Reshape", ["k" if k_bias else "mk", "kv_shape"], ["kr"]),
        n("Transpose", ["kr"], ["kt"], perm=[0, 2, 3, 1]),
        n("MatMul", ["X", "Wv"], ["mv"]),
        n("Add", ["bv", "mv"], ["v"]),
        n("Reshape", ["v", "kv_shape"], ["vr"]),
        n("Transpose", ["vr"], ["vt"], perm=[0, 2, 1, 3]),
        n("MatMul", ["qt", "kt"], ["scores"]),
        n("Softmax", ["scores"], ["p"], axis=-1),
        n("MatMul", ["p", "vt"], ["o"]),
        n("Transpose", ["o"], ["ot"], perm=[0, 2, 1, 3]),
        n("Reshape", ["ot", "out_shape"], ["Y"]),
    ]
    x = helper.make_tensor_value_info("X", TensorProto.FLOAT, ["batch", SEQ, HIDDEN])
    y = helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["batch", SEQ, HIDDEN])
    return make_model(nodes, [x], [y], inits, opset=17)


def test_legacy_whisper_attention_packs_into_attention():
    rules = select_rules()
    for k_bias in (False, True):
        model = whisper_legacy_attention(k_bias)
        _, optimized = optimize_proto(model, rules, target=load_target("cpu"))
        ops = [node.op_type for node in optimized.graph.node]
        assert ops == ["Attention"], ops
        (attention,) = optimized.graph.node
        scale = next(a.f for a in attention.attribute if a.name == "scale")
        assert scale == 0.25
        for batch in (1, 3):
            feeds = random_feeds(model, seed=batch, dims={"batch": batch})
            assert_close(run(optimized, feeds), run(model, feeds))


def sdpa_symbolic_attention() -> onnx.ModelProto:
    """torch's SDPA decomposition as the dynamo exporter writes it for a BERT-style encoder
    of symbolic batch and sequence: Q and K each scaled by sqrt(scale), Kᵀ through reshapes
    whose shapes are computed from Shape(kh), an additive Where mask, the IsNaN guard."""
    rng = np.random.default_rng(1)
    inits = [
        numpy_helper.from_array(rng.uniform(-0.5, 0.5, (HIDDEN, HIDDEN)).astype(np.float32), w)
        for w in ("Wq", "Wk", "Wv")
    ]
    inits += [
        _const("split", [0, 0, HEADS, HEAD]),
        _const("merge", [0, 0, -1]),
        _const("minus1", [-1]),
        _const("minus2", [-2]),
        _const("first", [np.iinfo(np.int64).min]),
        _const("head", [HEAD]),
        numpy_helper.from_array(np.array(HEAD**-0.25, np.float32), "root_scale"),
        numpy_helper.from_array(np.array(0.0, np.float32), "zero"),
        numpy_helper.from_array(np.array(np.finfo(np.float32).min, np.float32), "lowest"),
        numpy_helper.from_array(np.array(0.0, np.float32), "zero_p"),
    ]
    n = helper.make_node
    nodes = [
        n("MatMul", ["X", "Wq"], ["q"]),
        n("Reshape", ["q", "split"], ["qr"]),
        n("Transpose", ["qr"], ["qt"], perm=[0, 2, 1, 3]),
        n("MatMul", ["X", "Wk"], ["k"]),
        n("Reshape", ["k", "split"], ["kr"]),
        n("Transpose", ["kr"], ["kh"], perm=[0, 2, 1, 3]),
        n("Shape", ["kh"], ["kh_shape"]),
        n("Slice", ["kh_shape", "minus2", "minus1"], ["kh_seq"]),
        n("Slice", ["kh_shape", "first", "minus2"], ["kh_lead"]),
        n("Concat", ["minus1", "kh_seq", "head"], ["S1"], axis=0),
        n("Reshape", ["kh", "S1"], ["k3"]),
        n("Transpose", ["k3"], ["k3t"], perm=[0, 2, 1]),
        n("Concat", ["kh_lead", "head", "kh_seq"], ["S2"], axis=0),
        n("Reshape", ["k3t", "S2"], ["kt"]),
        n("MatMul", ["X", "Wv"], ["v"]),
        n("Reshape", ["v", "split"], ["vr"]),
        n("Transpose", ["vr"], ["vt"], perm=[0, 2, 1, 3]),
        n("Mul", ["qt", "root_scale"], ["qs"]),
        n("Mul", ["kt", "root_scale"], ["ks"]),
        n("MatMul", ["qs", "ks"], ["scores"]),
        n("Where", ["C", "zero", "lowest"], ["M"]),
        n("Add", ["scores", "M"], ["masked"]),
        n("Softmax", ["masked"], ["p"], axis=-1),
        n("IsNaN", ["p"], ["nan"]),
        n("Where", ["nan", "zero_p", "p"], ["pz"]),
        n("MatMul", ["pz", "vt"], ["o"]),
        n("Transpose", ["o"], ["ot"], perm=[0, 2, 1, 3]),
        n("Reshape", ["ot", "merge"], ["Y"]),
    ]
    x = helper.make_tensor_value_info("X", TensorProto.FLOAT, ["batch", "seq", HIDDEN])
    c = helper.make_tensor_value_info("C", TensorProto.BOOL, ["batch", 1, "seq", "seq"])
    y = helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["batch", "seq", HIDDEN])
    return make_model(nodes, [x, c], [y], inits, opset=18)


def test_sdpa_attention_with_shapes_computed_on_symbolic_dims_fuses():
    model = sdpa_symbolic_attention()
    report, optimized = optimize_proto(model, select_rules(), target=load_target("cpu"))
    assert report.rules["ort-mha-sdpa-mask-scaled"].applied == 1
    ops = [node.op_type for node in optimized.graph.node]
    assert ops.count("MultiHeadAttention") == 1 and "Softmax" not in ops, ops
    for batch, seq in ((1, 3), (2, 5)):
        feeds = random_feeds(model, seed=seq, dims={"batch": batch, "seq": seq})
        assert_close(run(optimized, feeds), run(model, feeds))
