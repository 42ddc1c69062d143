"""Greedy decoding through a KV cache: onnxfuse's result of a decoder export generates what the
export generates, token for token, with each model carrying its own cache from step to step.

Every tiny decoder family of tests/exports (CAUSAL_LM_MODELS: Llama, Qwen2, Phi-3, Mistral,
Gemma, the models bench/llm.py measures), exported with its cache as plain tensors by both
exporters (cached), is optimized for `--target cpu` (RotaryEmbedding, the packed projections or
Phi-3's own, SkipSimplifiedLayerNormalization); both run in onnxruntime: a prompt of two
sequences, the second left-padded, then 16 generated tokens, one step each (~2 s a model).
"""

from __future__ import annotations

import collections

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from onnxfuse.api import optimize_file, select_rules
from onnxfuse.passes.pipeline import Options
from onnxfuse.targets.capabilities import load_target

STEPS, PROMPT, PAD = 16, 6, 2
# The fused kernels sum in their own order; 16 steps through the cache compound it a little.
RTOL, ATOL = 1e-4, 1e-4


def _session(path) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.intra_op_num_threads = 1
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def greedy(session: ort.InferenceSession, config: dict, prompt: np.ndarray, mask: np.ndarray):
    """The logits of every step and the tokens chosen, the cache carried through."""
    layers, kv_heads = config["layers"], config["kv_heads"]
    head = config["hidden"] // config["heads"]
    batch = prompt.shape[0]
    past = {
        f"past_key_values.{layer}.{kind}": np.zeros((batch, kv_heads, 0, head), np.float32)
        for layer in range(layers)
        for kind in ("key", "value")
    }
    names = [o.name for o in session.get_outputs()]
    ids, logits, tokens = prompt, [], []
    for _ in range(STEPS):
        positions = (mask.cumsum(-1) - 1).clip(min=0)[:, -ids.shape[1] :]
        feeds = {"input_ids": ids, "attention_mask": mask, "position_ids": positions, **past}
        outputs = dict(zip(names, session.run(None, feeds)))
        step = outputs["logits"][:, -1]
        logits.append(step)
        ids = step.argmax(-1).astype(np.int64)[:, None]
        tokens.append(ids[:, 0])
        del outputs["logits"]
        past = {k.replace("present", "past_key_values"): v for k, v in outputs.items()}
        mask = np.concatenate([mask, np.ones((batch, 1), np.int64)], axis=1)
    return np.stack(logits, 1), np.stack(tokens, 1)


FAMILIES = ("llama", "qwen2", "phi3", "mistral", "gemma")
EXPORTERS = (("dynamo", 18), ("legacy", 17))


@pytest.fixture(
    scope="module",
    params=[(f, *e) for f in FAMILIES for e in EXPORTERS],
    ids=lambda p: f"{p[0]}-{p[1]}",
)
def decoder(request, tmp_path_factory):
    pytest.importorskip("torch", reason="the export extra (pip install '.[export]') is missing")
    pytest.importorskip("transformers", reason="the export extra is missing")
    from exports.export import get_export
    from exports.models import CAUSAL_LM_MODELS_BY_NAME

    family, exporter, opset = request.param
    export = get_export(CAUSAL_LM_MODELS_BY_NAME[f"{family}-kv"], exporter, opset)
    out = tmp_path_factory.mktemp("decode") / "fused.onnx"
    options = Options(target=load_target("cpu"))
    optimize_file(export.path, out, select_rules(target="cpu"), options)
    return export, out


def test_fused_decoder_generates_what_the_export_generates(decoder):
    export, fused = decoder
    config = export.spec.config
    ops = collections.Counter(
        n.op_type for n in onnx.load(fused, load_external_data=False).graph.node
    )
    # Every layer's two norms after the first take the residual Add (Gemma's (1 + w) scale
    # folded into the weight), its queries and keys rotate in RotaryEmbedding, and its
    # packed projections are split; Phi-3's legacy export reaches them once its folded
    # shape arithmetic names the dims.
    layers = config["layers"]
    assert ops["SkipSimplifiedLayerNormalization"] == 2 * layers
    assert ops["RotaryEmbedding"] == 2 * layers
    assert ops["Split"] >= 2 * layers
    rng = np.random.default_rng(3)
    prompt = rng.integers(3, config["vocab"], (2, PROMPT)).astype(np.int64)
    mask = np.ones((2, PROMPT), np.int64)
    mask[1, :PAD] = 0
    want_logits, want_tokens = greedy(_session(export.path), config, prompt, mask)
    got_logits, got_tokens = greedy(_session(fused), config, prompt, mask)
    np.testing.assert_array_equal(got_tokens, want_tokens)
    np.testing.assert_allclose(got_logits, want_logits, rtol=RTOL, atol=ATOL)
