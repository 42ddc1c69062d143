"""The CNN exports optimized with `--target cpu:block=auto` (the NCHWc layout at the
block size of this machine's onnxruntime kernels: 8 with AVX2, 16 with AVX-512F), measured
against onnxruntime's own ORT_ENABLE_ALL result (its NchwcTransformer) in this run:

- the result runs at ORT_DISABLE_ALL and keeps torch's outputs (and the original's);
- it holds no more ReorderInput/ReorderOutput nodes than onnxruntime's, and no more
  nodes in all;
- it records the block size it assumes in its metadata.

The results run only where the block size is this machine's (test_nchwc.py checks the
other block size's layouts structurally).
"""

from __future__ import annotations

import collections

import numpy as np
import onnx
import onnxruntime as ort
import pytest

pytest.importorskip("torch")

from exports.anchors import session
from exports.export import get_export
from exports.models import CNN_NAMES, MODELS_BY_NAME

from onnxfuse import api
from onnxfuse.passes.pipeline import Options
from onnxfuse.targets.capabilities import load_target
from onnxfuse.targets.cpu_features import detect_block_size
from onnxfuse.targets.params import BLOCK_SIZE_METADATA

BLOCK = detect_block_size()
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(BLOCK is None, reason="this CPU has no NCHWc kernels"),
]

CNNS = CNN_NAMES
EXPORTS = [
    (name, exporter, opset) for name in CNNS for exporter, opset in (("legacy", 17), ("dynamo", 18))
]
EXPORTS.append(("mobilenet-relu6", "legacy", 14))
REORDERS = ("ReorderInput", "ReorderOutput")
# Node-count gaps that have nothing to do with the blocked layout, and why.
NODE_GAPS = {
    "convnext-small": (
        "onnxruntime's transpose optimizer (ORT_ENABLE_ALL) cancels the NCHW<->NHWC "
        "Transposes around each block's LayerNorm; the Reorder counts are equal"
    ),
}


def _ops(model: onnx.ModelProto) -> collections.Counter:
    return collections.Counter(n.op_type for n in model.graph.node)


@pytest.fixture(scope="module")
def target():
    return load_target(f"cpu:block={BLOCK}")


@pytest.fixture(scope="module")
def rules(target):
    return api.select_rules(target=target)


@pytest.mark.parametrize(
    ("name", "exporter", "opset"), EXPORTS, ids=[f"{n}-{e}{o}" for n, e, o in EXPORTS]
)
def test_cnn_export_blocked_like_onnxruntime(name, exporter, opset, target, rules, tmp_path):
    if name not in MODELS_BY_NAME:
        pytest.skip(f"{name} is not among the exports")
    export = get_export(MODELS_BY_NAME[name], exporter, opset)
    ours_path = tmp_path / "ours.onnx"
    api.optimize_file(export.path, ours_path, rules, Options(target=target))
    ours = onnx.load(str(ours_path))
    ort_path = tmp_path / "ort.onnx"
    session(export.path, ort.GraphOptimizationLevel.ORT_ENABLE_ALL, saved=ort_path)
    theirs = onnx.load(str(ort_path))

    mine, reference = _ops(ours), _ops(theirs)
    assert sum(mine[op] for op in REORDERS) <= sum(reference[op] for op in REORDERS), (
        mine,
        reference,
    )
    assert len(ours.graph.node) <= len(theirs.graph.node) or name in NODE_GAPS, (
        mine,
        reference,
    )
    assert mine["Conv"] > 0 and any(n.domain == "com.microsoft.nchwc" for n in ours.graph.node)
    props = {p.key: p.value for p in ours.metadata_props}
    assert props[BLOCK_SIZE_METADATA] == str(BLOCK)

    got = session(ours_path).run(None, export.feeds)
    original = session(export.path).run(None, export.feeds)
    for value, want, base in zip(got, export.expected, original):
        np.testing.assert_allclose(value, base, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(value, want, rtol=1e-3, atol=1e-4)
