"""ort-embed-layer-norm (and its DistilBERT and RoBERTa forms) and ort-attention-legacy-mask on
BERT-family encoders as torch.onnx's legacy exporter writes them with an attention_mask.

The property tests draw the mask from bool inputs of one layout; here the real graph runs on
masks of every layout the model accepts: right and left padding, holes, a fully masked row,
and a [batch, 1] mask that the source broadcasts over the keys. The fused graph must give
the source's outputs on all of them, and stop with an error (never other numbers) on a mask
with more rows than the batch. Changing the position-ids or token-type buffers must keep the
embeddings unfused.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

pytest.importorskip("torch")
pytest.importorskip("transformers")

from exports.anchors import session, worst_error
from exports.export import export_by_name

from onnxfuse.api import optimize_file, select_rules
from onnxfuse.passes.pipeline import Options
from onnxfuse.targets.capabilities import load_target

pytestmark = pytest.mark.slow

EXPORTS = ("bert-mask-legacy14", "bert-mask-legacy17")
F32_MIN = float(np.finfo(np.float32).min)


@pytest.fixture(scope="module")
def rules():
    return select_rules()


def _optimize(source: Path, out: Path, rules) -> onnx.ModelProto:
    optimize_file(source, out, rules, Options(target=load_target("cpu")))
    return onnx.load(str(out))


@pytest.fixture(scope="module")
def fused(rules, tmp_path_factory):
    """(export, path of the optimized model, its proto), once per export."""
    cache = {}

    def get(name: str):
        if name not in cache:
            export = export_by_name(name)
            out = tmp_path_factory.mktemp(name) / "fused.onnx"
            cache[name] = (export, out, _optimize(export.path, out, rules))
        return cache[name]

    return get


def _ops(model: onnx.ModelProto) -> dict[str, int]:
    counts: dict[str, int] = {}
    for n in model.graph.node:
        key = f"{n.domain}::{n.op_type}" if n.domain else n.op_type
        counts[key] = counts.get(key, 0) + 1
    return counts


def _masks(batch: int, seq: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(3)
    right = np.ones((batch, seq), np.int64)
    right[0, seq // 2 :] = 0
    left = np.ones((batch, seq), np.int64)
    left[-1, : seq // 2] = 0
    holes = rng.integers(0, 2, (batch, seq)).astype(np.int64)
    holes[:, 0] = 1
    dead_row = np.ones((batch, seq), np.int64)
    dead_row[0] = 0
    odd_values = rng.integers(-3, 4, (batch, seq)).astype(np.int64)  # nonzero means kept
    keys_1 = np.array([[1]] + [[0]] * (batch - 1), np.int64)  # broadcast over the keys
    return {
        "right": right,
        "left": left,
        "holes": holes,
        "dead-row": dead_row,
        "odd-values": odd_values,
        "keys-1": keys_1,
    }


@pytest.mark.parametrize("name", EXPORTS)
def test_embeddings_and_every_attention_fused(name, fused):
    export, _, model = fused(name)
    ops = _ops(model)
    layers = export.spec.config["layers"]
    assert ops.get("com.microsoft::Attention") == layers, ops
    assert ops.get("com.microsoft::EmbedLayerNormalization") == 1, ops
    # Nothing of the decomposed attention, the mask construction or the embeddings is left.
    for op in ("Softmax", "Range", "Flatten", "And", "Where", "Slice", "GatherElements"):
        assert op not in ops, ops
    for n in model.graph.node:
        if n.op_type == "Attention":
            attrs = {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}
            assert attrs["mask_filter_value"] == pytest.approx(F32_MIN, rel=1e-7)
        if n.op_type == "EmbedLayerNormalization":
            # Position ids left to the op (0..seq-1), no token-type input (folded).
            assert list(n.input)[1] == "" and list(n.input)[4] == ""
            assert len(n.input) <= 7


@pytest.mark.parametrize("name", EXPORTS)
@pytest.mark.parametrize(
    "mask", ["right", "left", "holes", "dead-row", "odd-values", "keys-1", "longer"]
)
def test_fused_model_keeps_outputs_for_every_mask(name, mask, fused):
    export, path, _ = fused(name)
    ids = export.feeds["input_ids"]
    batch, seq = ids.shape
    if mask == "longer":
        ids = np.random.default_rng(5).integers(0, 100, (batch, seq + 3)).astype(np.int64)
        seq += 3
        attention_mask = _masks(batch, seq)["holes"]
    else:
        attention_mask = _masks(batch, seq)[mask]
    feeds = {"input_ids": ids, "attention_mask": attention_mask}
    want = session(export.path).run(None, feeds)
    got = session(path).run(None, feeds)
    assert worst_error(got, want) <= 1.0, worst_error(got, want)


@pytest.mark.parametrize("name", EXPORTS)
def test_mask_with_extra_rows_fails_instead_of_differing(name, fused):
    """The source reads the first rows of a mask longer than the batch; Attention rejects it."""
    export, path, _ = fused(name)
    ids = export.feeds["input_ids"]
    batch, seq = ids.shape
    feeds = {"input_ids": ids, "attention_mask": np.ones((batch + 1, seq), np.int64)}
    session(export.path).run(None, feeds)  # the source runs
    with pytest.raises(Exception, match="mask_index"):
        session(path).run(None, feeds)


def _constant_node(model: onnx.ModelProto, name: str) -> onnx.NodeProto:
    return next(n for n in model.graph.node if n.op_type == "Constant" and n.output[0] == name)


def _embedding_buffers(model: onnx.ModelProto) -> tuple[str, str]:
    """The position-ids buffer (the Slice's data) and the token-type buffer (the Expand's)."""
    slice_ = next(n for n in model.graph.node if n.op_type == "Slice")
    gather = next(n for n in model.graph.node if n.op_type == "GatherElements")
    expand = next(
        n for n in model.graph.node if n.op_type == "Expand" and gather.input[0] in n.output
    )
    return slice_.input[0], expand.input[0]


def _with_buffer(model: onnx.ModelProto, name: str, change) -> onnx.ModelProto:
    changed = onnx.ModelProto()
    changed.CopyFrom(model)
    node = _constant_node(changed, name)
    value = numpy_helper.to_array(node.attribute[0].t)
    node.attribute[0].t.CopyFrom(numpy_helper.from_array(change(value), node.attribute[0].t.name))
    return changed


@pytest.mark.parametrize("buffer", ["positions", "token-types"])
def test_other_embedding_buffers_stay_unfused(buffer, rules, tmp_path):
    export = export_by_name("bert-mask-legacy17")
    source = onnx.load(str(export.path))
    positions, token_types = _embedding_buffers(source)
    if buffer == "positions":  # positions 1, 2, ... instead of 0, 1, ...
        source = _with_buffer(source, positions, lambda v: np.minimum(v + 1, v.shape[-1] - 1))
    else:  # token type 1 everywhere
        source = _with_buffer(source, token_types, np.ones_like)
    path = tmp_path / "source.onnx"
    onnx.save(source, str(path))
    model = _optimize(path, tmp_path / "fused.onnx", rules)
    assert "com.microsoft::EmbedLayerNormalization" not in _ops(model)
    feeds = export.feeds
    got = session(tmp_path / "fused.onnx").run(None, feeds)
    want = session(path).run(None, feeds)
    assert worst_error(got, want) <= 1.0


# The embeddings of BERT's family as the legacy exporter writes them, by the rule each
# needs: DistilBERT's have no token types, RoBERTa's compute the positions from the
# padding token (1 here) and gather the token types at them.
EMBEDDING_VARIANTS = {
    "distilbert-legacy14": "ort-embed-layer-norm-no-token-types",
    "distilbert-legacy17": "ort-embed-layer-norm-no-token-types",
    "roberta-legacy14": "ort-embed-layer-norm-position-ids",
    "roberta-legacy17": "ort-embed-layer-norm-position-ids",
}


def _variant_ids(ids: np.ndarray, kind: str) -> np.ndarray:
    """Token ids the positions depend on (RoBERTa): padding tokens inside a sequence and at
    its start, or a longer sequence."""
    rng = np.random.default_rng(11)
    if kind == "longer":
        return rng.integers(0, 100, (ids.shape[0], ids.shape[1] + 3)).astype(np.int64)
    changed = ids.copy()
    if kind == "pad-inside":
        changed[:, 2] = 1
    elif kind == "pad-first":
        changed[0, :3] = 1
    return changed


@pytest.mark.parametrize("name", EMBEDDING_VARIANTS)
@pytest.mark.parametrize("ids", ["stored", "pad-inside", "pad-first", "longer"])
def test_embedding_variants_fuse_and_keep_outputs(name, ids, fused):
    export, path, model = fused(name)
    ops = _ops(model)
    assert ops.get("com.microsoft::EmbedLayerNormalization") == 1, ops
    for op in ("Slice", "GatherElements"):  # the position and token-type buffers' reads
        assert op not in ops, ops
    feeds = dict(export.feeds)
    feeds["input_ids"] = _variant_ids(feeds["input_ids"], ids)
    feeds["attention_mask"] = np.ones(feeds["input_ids"].shape, np.int64)
    feeds["attention_mask"][-1, -2:] = 0
    want = session(export.path).run(None, feeds)
    got = session(path).run(None, feeds)
    assert worst_error(got, want) <= 1.0, worst_error(got, want)


@pytest.mark.parametrize(
    ("name", "reader", "change"),
    [
        # RoBERTa's token types all 1: every token adds row 1, which no rule folds.
        ("roberta-legacy17", "Expand", np.ones_like),
        # DistilBERT's positions from 1: not the 0..seq-1 the op computes.
        ("distilbert-legacy17", "Slice", lambda v: np.minimum(v + 1, v.shape[-1] - 1)),
    ],
)
def test_embedding_variants_with_other_buffers_stay_unfused(name, reader, change, rules, tmp_path):
    export = export_by_name(name)
    source = onnx.load(str(export.path))
    buffer = next(n for n in source.graph.node if n.op_type == reader).input[0]
    source = _with_buffer(source, buffer, change)
    path = tmp_path / "source.onnx"
    onnx.save(source, str(path))
    model = _optimize(path, tmp_path / "fused.onnx", rules)
    assert "com.microsoft::EmbedLayerNormalization" not in _ops(model)
    got = session(tmp_path / "fused.onnx").run(None, export.feeds)
    want = session(path).run(None, export.feeds)
    assert worst_error(got, want) <= 1.0
