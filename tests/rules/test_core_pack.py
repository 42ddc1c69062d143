"""The core rule pack: metadata, and every elimination, merge and activation rule.

Each rule has positive cases (it fires, onnxruntime outputs agree, the result
passes the ONNX checker) and negative cases (it must not fire: the node count
stays the same). Folding rules (Conv, Gemm, Pad) are in test_core_folds.py.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from core_pack_support import (
    CORE_RULES,
    F16,
    F32,
    F64,
    RULES,
    build,
    fire,
    no_fire,
    node,
    ops,
)
from helpers import assert_close, assert_same_outputs, optimize_proto, run
from hypothesis import given
from hypothesis import strategies as st
from test_transpose_rules import TRANSPOSE_RULES

from onnxfuse.language.packs import check_unique

EXPECTED_RULES = {
    "identity-elim",
    "dropout-elim",
    "mul-one-elim",
    "div-one-elim",
    "focus-space-to-depth",
    "gather-channels-conv-fold",
    "cast-noop",
    "transpose-noop",
    "reshape-noop",
    "expand-noop",
    "transpose-transpose",
    "reshape-reshape",
    "unsqueeze-squeeze-cancel",
    "squeeze-unsqueeze-cancel",
    "unsqueeze-unsqueeze",
    "squeeze-squeeze",
    "conv-bn-fold",
    "conv-bn-fold-nobias",
    "convtranspose-bn-fold",
    "convtranspose-bn-fold-nobias",
    "conv-add-fold",
    "conv-add-fold-nobias",
    "conv-mul-fold",
    "conv-mul-fold-nobias",
    "matmul-add-gemm",
    "pad-conv-fold",
    "pad-avgpool-fold",
    "relu-relu",
    "clip-clip",
    "clip-relu",
    "relu-clip",
    "pad-conv-fold-attr",
    "pad-avgpool-fold-attr",
    "not-where",
    "not-not",
    "shape-cast",
    "shape-transpose",
    "reshape-computed-shape",
    "reciprocal-mul",
    "gather-mul-fold",
    "transpose-gemm-a",
    "transpose-gemm-b",
    "gemm-transpose",
    "gemm-transpose-const-c",
    "gemm-zero-c",
    "gemm-sum",
    "reshape-gemm-reshape-matmul",
    "reshape-gemm-reshape-matmul-heads",
    "reshape-same-dims",
    "dropout-zero-ratio",
    "cast-widen-roundtrip",
    "cast-widen-cast",
    *(f"squeeze-unsqueeze[{op}]" for op in ("Add", "Sub", "Mul", "Div")),
    *(f"squeeze-unsqueeze-attr[{op}]" for op in ("Add", "Sub", "Mul", "Div")),
    # transpose_split_resize.yaml
    "transpose-split2-transpose",
    "transpose-split3-transpose",
    "transpose-resize-nearest",
    "transpose-resize-nearest-sizes",
    "transpose-resize-linear",
} | TRANSPOSE_RULES

I64 = np.int64
# A consumer that runs in onnxruntime CPU for every dtype used here (float16 and bool too).
T10 = {"perm": [1, 0]}


# -- the pack ------------------------------------------------------------------


def test_pack_names_are_unique_and_complete():
    names = [r.name for r in CORE_RULES]
    assert len(names) == len(set(names))
    check_unique(CORE_RULES)
    assert set(names) == EXPECTED_RULES


@pytest.mark.parametrize("rule", CORE_RULES, ids=lambda r: r.name)
def test_every_rule_has_metadata(rule):
    assert rule.description.strip()
    assert rule.references and all(ref.strip() for ref in rule.references)
    assert isinstance(rule.verify, dict) and rule.verify.get("dtypes")
    assert rule.benefit >= 1
    assert rule.pack == "core"


def test_readme_lists_every_rule():
    from onnxfuse.language.packs import builtin_rules_dir

    readme = (builtin_rules_dir() / "core" / "README.md").read_text(encoding="utf-8")
    for name in EXPECTED_RULES:
        # An op-set member (transpose-unary[Relu]) is listed by its family's row.
        assert f"`{name.split('[')[0]}`" in readme, name


def test_rule_files_follow_the_json_schema():
    jsonschema = pytest.importorskip("jsonschema")
    yaml = pytest.importorskip("yaml")
    from conftest import REPO_ROOT

    from onnxfuse.language.packs import builtin_rules_dir

    schema_path = REPO_ROOT / "docs" / "rules.schema.json"
    if not schema_path.exists():
        pytest.skip("no rules.schema.json")
    schema = json.loads(schema_path.read_text(encoding="utf-8"))
    files = sorted((builtin_rules_dir() / "core").glob("*.yaml"))
    assert len(files) >= 5
    for path in files:
        jsonschema.validate(yaml.safe_load(path.read_text(encoding="utf-8")), schema)


# -- identity-elim -------------------------------------------------------------


@pytest.mark.parametrize("dtype", [F32, F16, F64, I64, np.bool_])
def test_identity_elim_fires(dtype):
    model = build(
        [node("Identity", ["x"], "t"), node("Transpose", ["t"], "y", **T10)],
        {"x": ([3, 4], dtype)},
    )
    result = fire(model, "identity-elim", special=True)
    assert ops(result) == ["Transpose"]


def test_identity_elim_keeps_graph_output_name():
    model = build([node("Relu", ["x"], "t"), node("Identity", ["t"], "y")], {"x": ([3, 4], F32)})
    result = fire(model, "identity-elim")
    assert ops(result) == ["Relu"]
    assert result.graph.output[0].name == "y"


def test_identity_elim_input_to_output_is_kept():
    # Removing it would rename a graph input onto a graph output.
    no_fire(build([node("Identity", ["x"], "y")], {"x": ([3, 4], F32)}), "identity-elim")


# -- dropout-elim --------------------------------------------------------------


def _dropout(inputs, opset, inits=None, outputs=("y",), dtype=F32, **attrs):
    nodes = [node("Dropout", inputs, ["t", *outputs[1:]], **attrs), node("Relu", ["t"], "y")]
    if dtype == F16:  # Relu has no float16 kernel in onnxruntime CPU
        nodes[1] = node("Transpose", ["t"], "y", **T10)
    return build(nodes, {"x": ([3, 4], dtype)}, outputs[:1], inits, opset=opset)


@pytest.mark.parametrize(
    ("inputs", "inits", "attrs"),
    [
        (["x"], {}, {}),
        (["x", "r"], {"r": np.array(0.3, F32)}, {}),
        (["x", "r", "tm"], {"r": np.array(0.3, F32), "tm": np.array(False)}, {"seed": 7}),
        (["x", "", "tm"], {"tm": np.array(False)}, {}),
    ],
)
@pytest.mark.parametrize("opset", [12, 13, 17])
def test_dropout_elim_fires_inference_mode(inputs, inits, attrs, opset):
    model = _dropout(inputs, opset, inits, **attrs)
    assert ops(fire(model, "dropout-elim", special=True)) == ["Relu"]


@pytest.mark.parametrize(("opset", "dtype"), [(7, F32), (7, F16), (10, F32), (10, F64)])
def test_dropout_elim_fires_legacy_opsets(opset, dtype):
    # Opset 7-11 Dropout is identity at inference; the mask output exists but is unused.
    model = _dropout(["x"], opset, outputs=("y", "mask"), dtype=dtype)
    assert len(fire(model, "dropout-elim", special=True).graph.node) == 1


def test_dropout_elim_not_in_training_mode():
    model = _dropout(["x", "r", "tm"], 13, {"r": np.array(0.3, F32), "tm": np.array(True)})
    no_fire(model, "dropout-elim")


def test_dropout_elim_not_with_runtime_training_mode():
    model = build(
        [node("Dropout", ["x", "", "tm"], "t"), node("Relu", ["t"], "y")],
        {"x": ([3, 4], F32), "tm": ([], np.bool_)},
        opset=13,
    )
    no_fire(model, "dropout-elim")


def test_dropout_elim_not_when_mask_is_used():
    model = build(
        [node("Dropout", ["x"], ["t", "mask"]), node("Relu", ["t"], "y")],
        {"x": ([3, 4], F32)},
        outputs=["y", "mask"],
        opset=13,
    )
    no_fire(model, "dropout-elim")


def test_dropout_elim_not_below_opset_7():
    # Dropout-6 defaults to is_test=0 (training).
    model = _dropout(["x"], 6)
    no_fire(model, "dropout-elim")


def test_dropout_elim_overridable_training_mode_initializer():
    # From IR 4 on, an initializer that is also a graph input may be overridden.
    model = build(
        [node("Dropout", ["x", "", "tm"], "t"), node("Relu", ["t"], "y")],
        {"x": ([3, 4], F32)},
        inits={"tm": np.array(False)},
        opset=13,
        inits_as_inputs=True,
    )
    no_fire(model, "dropout-elim")


# -- cast-noop -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("dtype", "to"),
    [(F32, 1), (F16, 10), (F64, 11), (I64, 7), (np.int32, 6), (np.bool_, 9), (np.uint8, 2)],
)
def test_cast_noop_fires(dtype, to):
    model = build(
        [node("Cast", ["x"], "t", to=to), node("Transpose", ["t"], "y", **T10)],
        {"x": ([3, 4], dtype)},
    )
    assert ops(fire(model, "cast-noop", special=True)) == ["Transpose"]


@pytest.mark.parametrize(("dtype", "to"), [(F32, 10), (F32, 11), (F16, 1), (I64, 6), (F32, 7)])
def test_cast_noop_not_for_real_casts(dtype, to):
    model = build(
        [node("Cast", ["x"], "t", to=to), node("Transpose", ["t"], "y", **T10)],
        {"x": ([3, 4], dtype)},
    )
    no_fire(model, "cast-noop")


# -- transpose-noop ------------------------------------------------------------


@pytest.mark.parametrize("dtype", [F32, F16, I64, np.bool_])
@pytest.mark.parametrize(("shape", "perm"), [([2, 3, 4], [0, 1, 2]), ([5], None), ([2, 3], [0, 1])])
def test_transpose_noop_fires(dtype, shape, perm):
    attrs = {} if perm is None else {"perm": perm}
    model = build(
        [node("Transpose", ["x"], "t", **attrs), node("Cast", ["t"], "y", to=1)],
        {"x": (shape, dtype)},
    )
    assert ops(fire(model, "transpose-noop", special=True)) == ["Cast"]


@pytest.mark.parametrize(("shape", "perm"), [([2, 3, 4], [0, 2, 1]), ([2, 3], None)])
def test_transpose_noop_not_for_real_permutations(shape, perm):
    attrs = {} if perm is None else {"perm": perm}
    model = build(
        [node("Transpose", ["x"], "t", **attrs), node("Cast", ["t"], "y", to=1)],
        {"x": (shape, F32)},
    )
    no_fire(model, "transpose-noop")


# -- reshape-noop --------------------------------------------------------------


def _reshape_model(shape, target, dtype=F32, x_shape=None, **attrs):
    return build(
        [node("Reshape", ["x", "s"], "t", **attrs), node("Cast", ["t"], "y", to=1)],
        {"x": (x_shape or shape, dtype)},
        inits={"s": np.array(target, I64)},
    )


@pytest.mark.parametrize("dtype", [F32, F16, I64])
@pytest.mark.parametrize("allowzero", [0, 1])
def test_reshape_noop_fires(dtype, allowzero):
    model = _reshape_model([2, 3, 4], [2, 3, 4], dtype, allowzero=allowzero)
    assert ops(fire(model, "reshape-noop", special=True)) == ["Cast"]


@pytest.mark.parametrize(
    ("x_shape", "target"),
    [
        ([2, 3, 4], [4, 3, 2]),  # same count, other shape
        ([2, 3, 4], [2, 12]),
        (["n", 3, 4], [2, 3, 4]),  # symbolic input dim: not provably equal
    ],
)
def test_reshape_noop_not_for_real_reshapes(x_shape, target):
    no_fire(_reshape_model(None, target, x_shape=x_shape), "reshape-noop")


def test_reshape_noop_not_for_runtime_shape():
    model = build(
        [node("Reshape", ["x", "s"], "t"), node("Cast", ["t"], "y", to=1)],
        {"x": ([2, 3, 4], F32), "s": ([3], I64)},
    )
    no_fire(model, "reshape-noop")


# -- expand-noop ---------------------------------------------------------------


@pytest.mark.parametrize("dtype", [F32, F16, I64, np.bool_])
@pytest.mark.parametrize(
    ("x_shape", "shape"),
    [
        ([2, 3, 4], [1, 1]),
        ([2, 3, 4], [2, 3, 4]),
        ([2, 3, 4], [1, 3, 1]),
        ([2, 3, 4], [4]),
        ([2, 3, 4], []),
        (["n", 3], [1]),
        (["n", 3], [3]),
    ],
)
def test_expand_noop_fires(dtype, x_shape, shape):
    model = build(
        [node("Expand", ["x", "s"], "t"), node("Cast", ["t"], "y", to=1)],
        {"x": (x_shape, dtype)},
        inits={"s": np.array(shape, I64)},
    )
    assert ops(fire(model, "expand-noop", special=True)) == ["Cast"]


@pytest.mark.parametrize(
    ("x_shape", "shape"),
    [([1, 3, 4], [2, 1, 1]), ([3, 4], [1, 1, 1]), ([3, 1], [3, 5]), (["n", 3], [2, 3])],
)
def test_expand_noop_not_for_real_expands(x_shape, shape):
    model = build(
        [node("Expand", ["x", "s"], "t"), node("Cast", ["t"], "y", to=1)],
        {"x": (x_shape, F32)},
        inits={"s": np.array(shape, I64)},
    )
    no_fire(model, "expand-noop")


# -- transpose-transpose -------------------------------------------------------


@pytest.mark.parametrize("dtype", [F32, F16])
@pytest.mark.parametrize(
    ("shape", "perm1", "perm2"),
    [
        ([2, 3, 4], [0, 2, 1], [1, 0, 2]),
        ([2, 3, 4, 5, 6], [4, 2, 0, 1, 3], [1, 3, 0, 4, 2]),
        ([2, 3, 4], None, [2, 0, 1]),
        ([2, 3, 4, 5], [3, 1, 0, 2], None),
    ],
)
def test_transpose_transpose_fires(dtype, shape, perm1, perm2):
    a1 = {} if perm1 is None else {"perm": perm1}
    a2 = {} if perm2 is None else {"perm": perm2}
    model = build(
        [node("Transpose", ["x"], "t", **a1), node("Transpose", ["t"], "y", **a2)],
        {"x": (shape, dtype)},
    )
    assert ops(fire(model, "transpose-transpose", special=True)) == ["Transpose"]


def test_transpose_transpose_inverse_pair_disappears_with_noop():
    model = build(
        [
            node("Transpose", ["x"], "t", perm=[0, 2, 3, 1]),
            node("Transpose", ["t"], "u", perm=[0, 3, 1, 2]),
            node("Cast", ["u"], "y", to=1),
        ],
        {"x": ([2, 3, 4, 5], F32)},
    )
    result = fire(model, "transpose-transpose", rules=["transpose-transpose", "transpose-noop"])
    assert ops(result) == ["Cast"]


@given(
    perms=st.integers(1, 6).flatmap(
        lambda r: st.tuples(st.permutations(range(r)), st.permutations(range(r)))
    )
)
def test_transpose_transpose_property(perms):
    perm1, perm2 = (list(p) for p in perms)
    shape = [2, 3, 1, 4, 2, 3][: len(perm1)]
    model = build(
        [
            node("Transpose", ["x"], "t", perm=perm1),
            node("Transpose", ["t"], "u", perm=perm2),
            node("Cast", ["u"], "y", to=1),
        ],
        {"x": (shape, F32)},
    )
    report, result = optimize_proto(model, [RULES["transpose-transpose"], RULES["transpose-noop"]])
    fired = report.rules["transpose-transpose"].applied + report.rules["transpose-noop"].applied
    assert fired >= 1
    assert len(result.graph.node) <= 2
    assert_same_outputs(model, result)


@pytest.mark.parametrize("blocker", ["consumer", "output"])
def test_transpose_transpose_not_when_intermediate_escapes(blocker):
    nodes = [
        node("Transpose", ["x"], "t", perm=[1, 0, 2]),
        node("Transpose", ["t"], "y", perm=[0, 2, 1]),
    ]
    outputs = ["y", "t"]
    if blocker == "consumer":
        nodes.append(node("Relu", ["t"], "z"))
        outputs = ["y", "z"]
    no_fire(build(nodes, {"x": ([2, 3, 4], F32)}, outputs), "transpose-transpose")


# -- reshape-reshape -----------------------------------------------------------


@pytest.mark.parametrize("dtype", [F32, F16, I64])
@pytest.mark.parametrize(
    ("s1", "s2", "allowzero2"),
    [([6, 4], [4, -1], 0), ([0, -1], [24], 0), ([3, 8], [2, 3, 4], 1), ([-1], [4, 6], 0)],
)
def test_reshape_reshape_fires(dtype, s1, s2, allowzero2):
    model = build(
        [
            node("Reshape", ["x", "s1"], "t"),
            node("Reshape", ["t", "s2"], "u", allowzero=allowzero2),
            node("Cast", ["u"], "y", to=1),
        ],
        {"x": ([2, 3, 4], dtype)},
        inits={"s1": np.array(s1, I64), "s2": np.array(s2, I64)},
    )
    result = fire(model, "reshape-reshape", special=True)
    assert ops(result) == ["Reshape", "Cast"]


def test_reshape_reshape_not_when_outer_copies_a_dim():
    # [2,3,4] -> [3,8] -> [0,-1] is [3,8]; [2,3,4] -> [0,-1] would be [2,12].
    model = build(
        [node("Reshape", ["x", "s1"], "t"), node("Reshape", ["t", "s2"], "y")],
        {"x": ([2, 3, 4], F32)},
        inits={"s1": np.array([3, 8], I64), "s2": np.array([0, -1], I64)},
    )
    no_fire(model, "reshape-reshape")


def test_reshape_reshape_not_with_runtime_outer_shape():
    model = build(
        [node("Reshape", ["x", "s1"], "t"), node("Reshape", ["t", "s2"], "y")],
        {"x": ([2, 3, 4], F32), "s2": ([2], I64)},
        inits={"s1": np.array([6, 4], I64)},
    )
    no_fire(model, "reshape-reshape")


def test_reshape_reshape_not_when_intermediate_escapes():
    model = build(
        [node("Reshape", ["x", "s1"], "t"), node("Reshape", ["t", "s2"], "y")],
        {"x": ([2, 3, 4], F32)},
        outputs=["y", "t"],
        inits={"s1": np.array([6, 4], I64), "s2": np.array([24], I64)},
    )
    no_fire(model, "reshape-reshape")


# -- squeeze / unsqueeze -------------------------------------------------------


def _pair(first, second, x_shape, a1, a2, dtype=F32, opset=13, extra=()):
    return build(
        [
            node(first, ["x", "a1"], "t"),
            node(second, ["t", "a2"], "u"),
            node("Cast", ["u"], "y", to=1),
            *extra,
        ],
        {"x": (x_shape, dtype)},
        ["y"] + [n.output[0] for n in extra],
        inits={"a1": np.array(a1, I64), "a2": np.array(a2, I64)},
        opset=opset,
    )


@pytest.mark.parametrize("dtype", [F32, F16, np.bool_])
@pytest.mark.parametrize(
    ("x_shape", "a1", "a2"),
    [([3, 4], [0, 2], [2, 0]), ([3, 4, 5], [-1], [3]), ([3], [0], [-2]), ([], [0], [0])],
)
@pytest.mark.parametrize("opset", [13, 17])
def test_unsqueeze_squeeze_cancel_fires(dtype, x_shape, a1, a2, opset):
    model = _pair("Unsqueeze", "Squeeze", x_shape, a1, a2, dtype, opset)
    assert ops(fire(model, "unsqueeze-squeeze-cancel", special=True)) == ["Cast"]


@pytest.mark.parametrize(("x_shape", "a1", "a2"), [([3, 1], [0], [2]), ([3, 1], [0, 1], [0])])
def test_unsqueeze_squeeze_cancel_not_for_other_axes(x_shape, a1, a2):
    no_fire(_pair("Unsqueeze", "Squeeze", x_shape, a1, a2), "unsqueeze-squeeze-cancel")


def test_unsqueeze_squeeze_cancel_not_when_intermediate_escapes():
    model = _pair("Unsqueeze", "Squeeze", [3, 4], [0], [0], extra=[node("Relu", ["t"], "z")])
    no_fire(model, "unsqueeze-squeeze-cancel")


@pytest.mark.parametrize("dtype", [F32, F16, I64])
@pytest.mark.parametrize(
    ("x_shape", "a1", "a2"),
    [([1, 3, 1, 4], [0, 2], [2, 0]), ([1, 3, 1, 4], [-2], [2]), ([3, 1], [1], [-1])],
)
def test_squeeze_unsqueeze_cancel_fires(dtype, x_shape, a1, a2):
    model = _pair("Squeeze", "Unsqueeze", x_shape, a1, a2, dtype)
    assert ops(fire(model, "squeeze-unsqueeze-cancel", special=True)) == ["Cast"]


@pytest.mark.parametrize(("x_shape", "a1", "a2"), [([1, 3, 1], [0], [1]), ([1, 3, 1], [0, 2], [0])])
def test_squeeze_unsqueeze_cancel_not_for_other_axes(x_shape, a1, a2):
    no_fire(_pair("Squeeze", "Unsqueeze", x_shape, a1, a2), "squeeze-unsqueeze-cancel")


def test_squeeze_unsqueeze_cancel_not_at_opset_11():
    # Opset 11 takes axes as an attribute; the rule covers the opset 13+ input form.
    model = build(
        [
            node("Squeeze", ["x"], "t", axes=[0]),
            node("Unsqueeze", ["t"], "u", axes=[0]),
            node("Cast", ["u"], "y", to=1),
        ],
        {"x": ([1, 3], F32)},
        opset=11,
    )
    no_fire(model, "squeeze-unsqueeze-cancel")


@pytest.mark.parametrize("dtype", [F32, F16, np.bool_])
@pytest.mark.parametrize(
    ("x_shape", "a1", "a2"),
    [([3, 4], [0], [3]), ([3, 4], [1], [2]), ([3, 4], [0, 2], [3, 5]), ([], [0], [1])],
)
def test_unsqueeze_unsqueeze_fires(dtype, x_shape, a1, a2):
    model = _pair("Unsqueeze", "Unsqueeze", x_shape, a1, a2, dtype)
    assert ops(fire(model, "unsqueeze-unsqueeze", special=True)) == ["Unsqueeze", "Cast"]


@pytest.mark.parametrize(("a1", "a2"), [([1], [0]), ([2], [-1]), ([-1], [3])])
def test_unsqueeze_unsqueeze_not_when_axes_interleave(a1, a2):
    no_fire(_pair("Unsqueeze", "Unsqueeze", [3, 4], a1, a2), "unsqueeze-unsqueeze")


@pytest.mark.parametrize("dtype", [F32, F16, I64])
@pytest.mark.parametrize(
    ("x_shape", "a1", "a2"),
    [([1, 3, 1, 4, 1], [4], [0]), ([1, 1, 3, 1], [3], [0, 1]), ([1, 3, 1], [2], [0])],
)
def test_squeeze_squeeze_fires(dtype, x_shape, a1, a2):
    model = _pair("Squeeze", "Squeeze", x_shape, a1, a2, dtype)
    assert ops(fire(model, "squeeze-squeeze", special=True)) == ["Squeeze", "Cast"]


@pytest.mark.parametrize(("a1", "a2"), [([0], [1]), ([-1], [0]), ([2], [-1])])
def test_squeeze_squeeze_not_when_axes_interleave(a1, a2):
    no_fire(_pair("Squeeze", "Squeeze", [1, 3, 1, 1], a1, a2), "squeeze-squeeze")


# -- Relu / Clip ---------------------------------------------------------------


@pytest.mark.parametrize("dtype", [F32, F64])
def test_relu_relu_fires(dtype):
    model = build([node("Relu", ["x"], "t"), node("Relu", ["t"], "y")], {"x": ([3, 4], dtype)})
    assert ops(fire(model, "relu-relu", special=True)) == ["Relu"]


def test_relu_relu_chain_collapses():
    nodes = [node("Relu", ["x"], "t0")] + [node("Relu", [f"t{i}"], f"t{i + 1}") for i in range(4)]
    nodes.append(node("Relu", ["t4"], "y"))
    model = build(nodes, {"x": ([3, 4], F32)})
    assert ops(fire(model, "relu-relu", special=True)) == ["Relu"]


def test_relu_relu_not_when_intermediate_escapes():
    model = build(
        [node("Relu", ["x"], "t"), node("Relu", ["t"], "y"), node("Neg", ["t"], "z")],
        {"x": ([3, 4], F32)},
        ["y", "z"],
    )
    no_fire(model, "relu-relu")


def _clip2(first, second, inits, dtype=F32, opset=13):
    return build(
        [node(*first, "t"), node(*second, "y")],
        {"x": ([4, 5], dtype)},
        inits={k: np.array(v, dtype) for k, v in inits.items()},
        opset=opset,
    )


@pytest.mark.parametrize("dtype", [F32, F16, F64, np.int32, I64])
@pytest.mark.parametrize(
    "bounds",
    [(-1, 2, 0, 3), (0, 6, 0, 6), (-3, 3, -1, 1), (1, 1, 0, 5), (-5, 0, 0, 2)],
)
def test_clip_clip_fires(dtype, bounds):
    a, b, c, d = bounds
    model = _clip2(
        ("Clip", ["x", "a", "b"]), ("Clip", ["t", "c", "d"]), dict(a=a, b=b, c=c, d=d), dtype
    )
    assert ops(fire(model, "clip-clip", special=True)) == ["Clip"]


@given(
    bounds=st.lists(st.floats(-4, 4, width=32), min_size=4, max_size=4),
    opset=st.sampled_from([11, 13, 17]),
)
def test_clip_clip_property(bounds, opset):
    a, b = sorted(bounds[:2])
    c, d = sorted(bounds[2:])
    model = _clip2(
        ("Clip", ["x", "a", "b"]), ("Clip", ["t", "c", "d"]), dict(a=a, b=b, c=c, d=d), opset=opset
    )
    report, result = optimize_proto(model, [RULES["clip-clip"]])
    overlap = max(a, c) <= min(b, d)
    assert report.rules["clip-clip"].applied == int(overlap)
    feeds = {"x": np.linspace(-5, 5, 20, dtype=F32).reshape(4, 5)}
    assert_close(run(result, feeds), run(model, feeds))


@pytest.mark.parametrize("bounds", [(0, 1, 2, 3), (2, 3, 0, 1)])
def test_clip_clip_not_for_disjoint_intervals(bounds):
    a, b, c, d = bounds
    model = _clip2(("Clip", ["x", "a", "b"]), ("Clip", ["t", "c", "d"]), dict(a=a, b=b, c=c, d=d))
    no_fire(model, "clip-clip")


def test_clip_clip_not_with_runtime_bound():
    model = build(
        [node("Clip", ["x", "a", "b"], "t"), node("Clip", ["t", "c", "d"], "y")],
        {"x": ([4, 5], F32), "d": ([], F32)},
        inits={"a": np.array(0, F32), "b": np.array(6, F32), "c": np.array(1, F32)},
    )
    no_fire(model, "clip-clip")


def test_clip_clip_not_with_absent_bound():
    model = build(
        [node("Clip", ["x", "a"], "t"), node("Clip", ["t", "c", "d"], "y")],
        {"x": ([4, 5], F32)},
        inits={"a": np.array(0, F32), "c": np.array(1, F32), "d": np.array(2, F32)},
    )
    no_fire(model, "clip-clip")


@pytest.mark.parametrize("dtype", [F32, F64])
@pytest.mark.parametrize("bounds", [(-1, 6), (0.5, 2), (-3, -1), (0, 6), (-1e30, 1)])
def test_clip_relu_fires(dtype, bounds):
    a, b = bounds
    model = _clip2(("Clip", ["x", "a", "b"]), ("Relu", ["t"]), dict(a=a, b=b), dtype)
    assert ops(fire(model, "clip-relu", special=True)) == ["Clip"]


@pytest.mark.parametrize("bounds", [(-np.inf, 1), (2, 1), (np.nan, 1)])
def test_clip_relu_not_for_unsafe_bounds(bounds):
    a, b = bounds
    model = _clip2(("Clip", ["x", "a", "b"]), ("Relu", ["t"]), dict(a=a, b=b))
    no_fire(model, "clip-relu")


@pytest.mark.parametrize("dtype", [F32, F64])
@pytest.mark.parametrize("bounds", [(-1, 6), (0.5, 2), (-3, -1), (0, 6)])
def test_relu_clip_fires(dtype, bounds):
    a, b = bounds
    model = _clip2(("Relu", ["x"]), ("Clip", ["t", "a", "b"]), dict(a=a, b=b), dtype)
    assert ops(fire(model, "relu-clip", special=True)) == ["Clip"]


def test_relu_clip_not_when_relu_output_escapes():
    model = build(
        [node("Relu", ["x"], "t"), node("Clip", ["t", "a", "b"], "y")],
        {"x": ([4, 5], F32)},
        ["y", "t"],
        inits={"a": np.array(-1, F32), "b": np.array(6, F32)},
    )
    no_fire(model, "relu-clip")


def test_relu_clip_not_with_runtime_bound():
    model = build(
        [node("Relu", ["x"], "t"), node("Clip", ["t", "a", "b"], "y")],
        {"x": ([4, 5], F32), "a": ([], F32)},
        inits={"b": np.array(6, F32)},
    )
    no_fire(model, "relu-clip")
