"""rules/core/cast.yaml: Cast chains whose first Cast is exact.

The derived property tests (tests/proof) draw every pair of types the rules
cover; here: the chains that look alike but round or convert out of range
(which must stay), a shared inner Cast, and onnxruntime's fp16 MatMul test
model, whose rounding Casts stay.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from core_pack_support import F16, F32, build, fire, no_fire, node, ops
from helpers import optimize_proto
from onnx import TensorProto

from onnxfuse.api import select_rules

PEERS = Path(__file__).parent.parent / "data" / "ort-fusion"


@pytest.fixture(scope="module")
def all_rules():
    return select_rules()


U8, I8, I32 = np.uint8, np.int8, np.int32


def _chain(dtype, mid: int, to: int, shared: bool = False) -> onnx.ModelProto:
    # The Identity in front: an elimination may not rename a graph input onto an output.
    nodes = [
        node("Identity", ["x0"], "x"),
        node("Cast", ["x"], "m", to=mid),
        node("Cast", ["m"], "y", to=to),
    ]
    outputs = ["y"]
    if shared:
        nodes.append(node("Neg" if mid != TensorProto.BOOL else "Not", ["m"], "z"))
        outputs.append("z")
    return build(nodes, {"x0": ([3, 4], dtype)}, outputs=outputs)


@pytest.mark.parametrize(
    ("dtype", "mid"),
    [
        (F16, TensorProto.FLOAT),
        (F32, TensorProto.DOUBLE),
        (I8, TensorProto.FLOAT16),
        (U8, TensorProto.INT32),
        (I32, TensorProto.DOUBLE),
    ],
)
def test_exact_roundtrip_goes(dtype, mid):
    to = onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    result = fire(_chain(dtype, mid, to), "cast-widen-roundtrip", special=True)
    assert ops(result) == ["Identity"]


@pytest.mark.parametrize(
    ("dtype", "mid"),
    [(F32, TensorProto.FLOAT16), (I32, TensorProto.FLOAT), (F16, TensorProto.INT8)],
)
def test_rounding_roundtrip_stays(dtype, mid):
    to = onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    no_fire(_chain(dtype, mid, to), "cast-widen-roundtrip")


def test_shared_inner_cast_stays_for_its_other_user():
    result = fire(
        _chain(F16, TensorProto.FLOAT, TensorProto.FLOAT16, shared=True), "cast-widen-roundtrip"
    )
    assert ops(result) == ["Identity", "Cast", "Neg"]


@pytest.mark.parametrize(
    ("dtype", "mid", "to"),
    [
        (F16, TensorProto.FLOAT, TensorProto.DOUBLE),
        (I8, TensorProto.INT32, TensorProto.FLOAT16),
        (U8, TensorProto.INT32, TensorProto.INT8),  # integers wrap alike
        (U8, TensorProto.FLOAT, TensorProto.BOOL),
        (F16, TensorProto.FLOAT, TensorProto.BOOL),
    ],
)
def test_exact_first_cast_merges(dtype, mid, to):
    result = fire(_chain(dtype, mid, to), "cast-widen-cast", special=True)
    assert ops(result) == ["Identity", "Cast"]
    assert result.graph.node[1].input[0] == "x"


@pytest.mark.parametrize(
    ("dtype", "mid", "to"),
    [
        (F32, TensorProto.FLOAT16, TensorProto.DOUBLE),  # the first Cast rounds
        (U8, TensorProto.FLOAT, TensorProto.INT8),  # 200.0 to int8 is the implementation's
        (F16, TensorProto.FLOAT, TensorProto.INT32),  # NaN to int32 too
        (I32, TensorProto.INT8, TensorProto.FLOAT),  # the first Cast wraps
    ],
)
def test_inexact_or_implementation_defined_chain_stays(dtype, mid, to):
    no_fire(_chain(dtype, mid, to), "cast-widen-cast")


@pytest.mark.parametrize("k", [0, 1, 2, 4])
def test_fp16_matmul_peer_model_keeps_its_rounding_casts(k, all_rules):
    # onnxruntime drops these Casts (it runs the MatMul in float32); the spec rounds
    # the inputs to float16 first, so onnxfuse keeps both.
    model = onnx.load(PEERS / f"transpose_cast_matmul_4d_fusion{k}.onnx")
    _, result = optimize_proto(model, all_rules)
    assert ops(result).count("Cast") == 2
