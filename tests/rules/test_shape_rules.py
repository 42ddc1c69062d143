"""Shape and small-pattern rules on onnxruntime's peer models and on hand-built graphs.

Rules: reshape-computed-shape, shape-cast, shape-transpose (shape.yaml),
not-where, not-not (logic.yaml), reciprocal-mul and gather-mul-fold (arith.yaml), the attribute
forms of the Pad folds (pad.yaml). Also what the engine does around them:
constants that are graph outputs fold, two graph outputs of one value keep one
Identity, and what onnxruntime removes that onnxfuse keeps on purpose.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from core_pack_support import RULES, build, fire, no_fire, node
from helpers import assert_close, make_model, optimize_proto, random_feeds, run
from hypothesis import assume, given
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from onnxfuse.api import optimize_file, select_rules
from onnxfuse.language import symbolic
from onnxfuse.language.guards import constant_tensor
from onnxfuse.passes.pipeline import Options
from onnxfuse.targets.capabilities import load_target

DATA = Path(__file__).resolve().parents[1] / "data" / "ort-fusion"
MANIFEST = {e["model"]: e for e in json.loads((DATA / "manifest.json").read_text())}
F32, I64 = np.float32, np.int64


# -- peer models ---------------------------------------------------------------


@pytest.fixture(scope="module")
def all_rules():
    return select_rules()


def optimize_peer(name: str, rules, tmp_path: Path) -> tuple[dict, onnx.ModelProto]:
    """All built-in packs, --target cpu, as the peer-model parity is measured."""
    out = tmp_path / name
    report = optimize_file(DATA / name, out, rules, Options(target=load_target("cpu")))
    applied = {n: s.applied for n, s in report.rules.items() if s.applied}
    return applied, onnx.load(out)


def histogram(model: onnx.ModelProto) -> Counter:
    return Counter(
        f"{n.domain}::{n.op_type}" if n.domain not in ("", "ai.onnx") else n.op_type
        for n in model.graph.node
    )


def ort_histogram(name: str) -> Counter:
    return Counter(MANIFEST[name]["ops_after_ort_cpu_extended"])


def initializer(model: onnx.ModelProto, name: str) -> np.ndarray:
    found = [i for i in model.graph.initializer if i.name == name]
    assert found, f"no initializer {name!r}"
    return numpy_helper.to_array(found[0])


def reshape_shape(model: onnx.ModelProto) -> list[int]:
    (reshape,) = [n for n in model.graph.node if n.op_type == "Reshape"]
    return initializer(model, reshape.input[1]).tolist()


def assert_same(original: onnx.ModelProto | Path, optimized: onnx.ModelProto, feeds) -> None:
    expected = run(original, feeds)
    actual = run(optimized, feeds)
    assert_close(actual, expected)


# Models where onnxfuse now has exactly onnxruntime's ops.
SAME_AS_ORT = [
    ("reshape_fusion_internal_nodes_reused.onnx", {"reshape-computed-shape"}),
    ("reshape_fusion_input_is_graph_input.onnx", {"reshape-computed-shape"}),
    ("reshape_fusion_internal_node_is_graph_output.onnx", set()),
    ("reshape_fusion_concat_subgraph_multiple_outputs.onnx", set()),
    ("reshape_fusion_concat_subgraph.onnx", set()),
    ("reshape_fusion_concat_subgraph_div.onnx", set()),
    ("reshape_fusion_concat_subgraph_mul.onnx", set()),
    ("reshape_fusion_multiple_values_in_initializer_tensor_1.onnx", set()),
    ("reshape_fusion_multiple_values_in_initializer_tensor_2.onnx", set()),
    ("reshape_fusion_overridable_initializer.onnx", set()),
    ("fuse-pad-avgpool.onnx", {"pad-avgpool-fold-attr"}),
    ("fuse-pad-avgpool_with_pad.onnx", {"pad-avgpool-fold-attr"}),
    ("fuse-pad-avgpool_with_pad-nofuse.onnx", set()),
]


@pytest.mark.parametrize("name, fired", SAME_AS_ORT, ids=[m for m, _ in SAME_AS_ORT])
def test_peer_model_reaches_onnxruntimes_ops(name, fired, all_rules, tmp_path):
    applied, result = optimize_peer(name, all_rules, tmp_path)
    assert fired <= set(applied), applied
    assert histogram(result) == ort_histogram(name)


def test_shape_of_cast_peer_model_goes_one_node_below_onnxruntime(all_rules, tmp_path):
    # onnxruntime keeps Cast(bool -> float) -> Cast(float -> float16); the first Cast is
    # exact, so cast-widen-cast makes it one Cast, and the Shape of the float Cast reads
    # X's shape (the same value as the first Shape's: an Identity for the second output).
    applied, result = optimize_peer("shape_opt_cast.onnx", all_rules, tmp_path)
    assert {"shape-cast", "cast-widen-cast"} <= set(applied), applied
    assert histogram(result) == Counter({"Shape": 2, "Cast": 1, "Identity": 1})
    assert sum(ort_histogram("shape_opt_cast.onnx").values()) == 5


def test_reshape_of_shape_parts_of_its_own_input(all_rules, tmp_path):
    # Shape(x)[0], 128, Shape(x)[2], Shape(x)[3], -1 -> copies become 0 (x has
    # symbolic dims 0, 2, 3); Shape -> Gather(3) stays for the graph output.
    name = "reshape_fusion_internal_nodes_reused.onnx"
    applied, result = optimize_peer(name, all_rules, tmp_path)
    assert applied["reshape-computed-shape"] == 1
    assert reshape_shape(result) == [0, 128, 0, 0, -1]
    original = onnx.load(DATA / name)
    assert_same(original, result, random_feeds(original, dims=MANIFEST[name]["dims"]))


def test_reshape_with_an_unknown_element_beside_known_nonzero_ones(all_rules, tmp_path):
    # Concat([1, 200], Shape(AnotherInput)[2]): the third element is another
    # input's dimension, unknown here; 1 and 200 fix it through the element count.
    name = "reshape_fusion_input_is_graph_input.onnx"
    _, result = optimize_peer(name, all_rules, tmp_path)
    assert reshape_shape(result) == [1, 200, -1]
    feeds = {
        "SubgraphRoot": np.random.default_rng(0).standard_normal((10, 20, 30)).astype(F32),
        "AnotherInput": np.zeros((4, 4, 30), F32),  # only its dimension 2 = 30 is read
    }
    assert_same(DATA / name, result, feeds)


@pytest.mark.parametrize(
    "name, output, value",
    [
        ("reshape_fusion_internal_node_is_graph_output.onnx", "gather0_out", 10),
        ("reshape_fusion_concat_subgraph_multiple_outputs.onnx", "slice_out", [30]),
    ],
)
def test_constant_graph_outputs_fold_and_keep_their_names(name, output, value, all_rules, tmp_path):
    _, result = optimize_peer(name, all_rules, tmp_path)
    assert [o.name for o in result.graph.output] == [
        o.name for o in onnx.load(DATA / name).graph.output
    ]
    assert initializer(result, output).tolist() == value
    original = onnx.load(DATA / name)
    assert_same(original, result, random_feeds(original))


def test_shape_of_transpose_becomes_a_gather(all_rules, tmp_path):
    name = "shape_opt_transpose.onnx"
    applied, result = optimize_peer(name, all_rules, tmp_path)
    # Shape(Transpose) of the default perm and of the written [1, 0] (the same on 2-D);
    # the Transpose that is also a graph output stays, as an identity perm once the pair
    # before it merged: one Transpose where onnxruntime keeps two.
    assert applied["shape-transpose"] == 2
    ours, theirs = histogram(result), ort_histogram(name)
    assert sum(ours.values()) <= sum(theirs.values())
    assert ours["Gather"] == 1 and ours["Transpose"] == 1 and theirs["Transpose"] == 2
    original = onnx.load(DATA / name)
    assert_same(original, result, random_feeds(original, dims=MANIFEST[name]["dims"]))


def test_not_where_peer_model(all_rules, tmp_path):
    # After CSE one Not(X) feeds every Where and is itself a graph output; each
    # Where is rewritten, the Not stays only for the graph output. Y3, Y4, Y5
    # compute Y1's value: one Identity each keeps their names (onnxruntime
    # keeps three duplicate Wheres instead: the same count).
    name = "not_where.onnx"
    applied, result = optimize_peer(name, all_rules, tmp_path)
    assert applied["not-where"] >= 1 and applied["not-where"] + applied.get("not-not", 0) >= 2
    assert histogram(result) == Counter({"Not": 1, "Where": 2, "Identity": 3})
    assert sum(histogram(result).values()) == sum(ort_histogram(name).values())
    (not_node,) = [n for n in result.graph.node if n.op_type == "Not"]
    assert list(not_node.output) == ["not_X_2"]
    for where in (n for n in result.graph.node if n.op_type == "Where"):
        assert where.input[0] == "X"
    original = onnx.load(DATA / name)
    assert_same(original, result, random_feeds(original, dims=MANIFEST[name]["dims"]))


def test_div_mul_peer_model_has_fewer_nodes_than_onnxruntime(all_rules, tmp_path):
    # CSE merges the two Div(1, A) first, so that reciprocal is shared (no
    # fusion); the unused Mul and the Identity go, and nothing is fused on the
    # int64 chain, where onnxruntime's DivMulFusion changes the results.
    name = "div_mul.onnx"
    _, result = optimize_peer(name, all_rules, tmp_path)
    assert sum(histogram(result).values()) < sum(ort_histogram(name).values())
    original = onnx.load(DATA / name)
    assert_same(original, result, random_feeds(original, dims=MANIFEST[name]["dims"]))


def test_pad_folds_into_opset7_average_pool_as_onnxruntime_does(all_rules, tmp_path):
    for name, pads in [
        ("fuse-pad-avgpool.onnx", [1, 1, 1, 1]),
        ("fuse-pad-avgpool_with_pad.onnx", [2, 2, 1, 1]),
    ]:
        _, result = optimize_peer(name, all_rules, tmp_path)
        (pool,) = result.graph.node
        attrs = {a.name: helper.get_attribute_value(a) for a in pool.attribute}
        assert attrs["pads"] == pads and attrs["count_include_pad"] == 1
        original = onnx.load(DATA / name)
        assert_same(original, result, random_feeds(original))


def test_pad_stays_before_a_pool_that_does_not_count_its_pads(all_rules, tmp_path):
    _, result = optimize_peer("fuse-pad-avgpool_with_pad-nofuse.onnx", all_rules, tmp_path)
    assert [n.op_type for n in result.graph.node] == ["Pad", "AveragePool"]


BIAS_DROPOUT = sorted(m for m in MANIFEST if m.startswith("bias_dropout_"))


@pytest.mark.parametrize("name", BIAS_DROPOUT)
def test_training_mode_dropout_is_kept(name, all_rules, tmp_path):
    # onnxruntime's EliminateDropout removes these (training_mode is a constant
    # true): the output changes from a random mask times 1/(1-ratio) to the input.
    _, result = optimize_peer(name, all_rules, tmp_path)
    assert histogram(result)["Dropout"] == 1


def test_graph_output_renamed_onto_a_kept_node_instead_of_an_identity(all_rules, tmp_path):
    # Identity(tp0) -> output2: the Transpose producing tp0 now writes output2.
    _, result = optimize_peer("gemm_transpose_2outputs_from_transpose.onnx", all_rules, tmp_path)
    assert "Identity" not in histogram(result)
    producers = {o for n in result.graph.node for o in n.output}
    assert {"output", "output2"} <= producers


def test_two_outputs_of_one_value_keep_one_identity(all_rules, tmp_path):
    # Both layer norms compute the same value (CSE merges them); the second
    # graph output needs a node of its own to keep its name: one Identity, the
    # fewest possible (onnxruntime keeps a duplicate Add instead).
    name = "layer_norm_shared_input.onnx"
    _, result = optimize_peer(name, all_rules, tmp_path)
    identities = [n for n in result.graph.node if n.op_type == "Identity"]
    assert len(identities) == 1
    assert list(identities[0].input) == ["LN1/C"] and list(identities[0].output) == ["LN2/C"]
    original = onnx.load(DATA / name)
    assert_same(original, result, random_feeds(original))


def test_add_of_zero_is_kept_because_it_changes_negative_zero(all_rules, tmp_path):
    # onnxruntime removes Add(x, ConstantOfShape(Shape(x))) = x + 0.0; for x = -0.0
    # that Add gives +0.0, so removing it changes the result's sign.
    name = "constant_folding_with_scalar_shape_to_initializer.onnx"
    _, result = optimize_peer(name, all_rules, tmp_path)
    # The Add stays; squeeze-unsqueeze-attr[Add] moves it off its Squeeze/Unsqueeze pair.
    assert histogram(result) == Counter({"Add": 1})
    feeds = {"input": np.array([-0.0], F32)}
    for model in (onnx.load(DATA / name), result):
        (out,) = run(model, feeds)
        assert out[0] == 0.0 and not np.signbit(out[0])


# -- reshape-computed-shape on hand-built graphs --------------------------------


def reshape_model(
    nodes,
    shape_value: str,
    inputs,
    out_rank: int,
    opset: int = 17,
    allowzero: int | None = None,
    inits=None,
) -> onnx.ModelProto:
    attrs = {} if allowzero is None else {"allowzero": allowzero}
    nodes = [*nodes, node("Reshape", ["x", shape_value], "y", **attrs)]
    out_shape = [f"o{i}" for i in range(out_rank)]
    return build(nodes, inputs, inits=inits, opset=opset, output_shapes={"y": out_shape})


def shape_parts(x_rank: int) -> dict[str, np.ndarray]:
    return {f"i{k}": np.array(k, I64) for k in range(-x_rank, x_rank)}


def idx(k: int) -> str:
    return f"i{k}"


def test_reshape_copies_become_zero_and_constants_stay():
    inits = {**shape_parts(3), "c": np.array([8], I64), "z": np.array([0], I64)}
    nodes = [
        node("Shape", ["x"], "s"),
        node("Gather", ["s", idx(0)], "g0", axis=0),
        node("Unsqueeze", ["g0", "z"], "u0"),
        node("Gather", ["s", idx(-2)], "g1", axis=0),  # -2 of rank 3 is axis 1
        node("Unsqueeze", ["g1", "z"], "u1"),
        node("Concat", ["u0", "u1", "c"], "shape", axis=0),
    ]
    model = reshape_model(nodes, "shape", {"x": (["N", "T", 8], F32)}, 3, inits=inits)
    result = fire(model, "reshape-computed-shape", feeds={"x": np.ones((2, 3, 8), F32)})
    assert reshape_shape(result) == [0, 0, 8]
    assert [n.op_type for n in result.graph.node] == ["Reshape"]


def test_reshape_slice_of_shape_and_shape_start_end():
    inits = {"st": np.array([1], I64), "en": np.array([3], I64), "m": np.array([-1], I64)}
    nodes = [
        node("Shape", ["x"], "s"),
        node("Slice", ["s", "st", "en"], "mid"),  # dims 1 and 2, at positions 1 and 2
        node("Shape", ["x"], "head", start=0, end=1),
        node("Concat", ["head", "mid", "m"], "shape", axis=0),
    ]
    model = reshape_model(
        nodes, "shape", {"x": (["N", "C", "H", 5], F32)}, 4, opset=18, inits=inits
    )
    result = fire(model, "reshape-computed-shape")
    assert reshape_shape(result) == [0, 0, 0, -1]


@pytest.mark.parametrize("narrow", [False, True])
def test_reshape_through_opset9_slice_squeeze_identity_and_casts(narrow):
    # [2, W] reshaped to [2, Shape(x)[1:2]] through Squeeze/Unsqueeze: W is x's
    # dimension 1 at position 1 -> 0. A Cast to int32 could wrap, so through it
    # the element is unknown: -1, fixed by the known 2 beside it.
    to = TensorProto.INT32 if narrow else TensorProto.INT64
    nodes = [
        node("Shape", ["x"], "s"),
        node("Slice", ["s"], "s1", starts=[1], ends=[2]),
        node("Squeeze", ["s1"], "q", axes=[0]),
        node("Cast", ["q"], "c", to=to),
        node("Cast", ["c"], "c64", to=TensorProto.INT64),
        node("Identity", ["c64"], "d"),
        node("Unsqueeze", ["d"], "u", axes=[0]),
        node("Concat", ["two", "u"], "shape", axis=0),
    ]
    inits = {"two": np.array([2], I64)}
    model = reshape_model(nodes, "shape", {"x": ([2, "W"], F32)}, 2, opset=9, inits=inits)
    result = fire(model, "reshape-computed-shape", feeds={"x": np.ones((2, 5), F32)})
    assert reshape_shape(result) == ([2, -1] if narrow else [2, 0])


def test_reshape_allowzero_keeps_no_copy_and_needs_known_neighbours():
    inits = {**shape_parts(2), "z": np.array([0], I64), "six": np.array([6], I64)}
    nodes = [
        node("Shape", ["x"], "s"),
        node("Gather", ["s", idx(0)], "g0", axis=0),
        node("Unsqueeze", ["g0", "z"], "u0"),
        node("Concat", ["six", "u0"], "shape", axis=0),
    ]
    # allowzero=1: x's dim 0 at position 1 is unknown; 6 is known -> [6, -1].
    model = reshape_model(
        nodes, "shape", {"x": (["N", 6], F32)}, 2, opset=14, allowzero=1, inits=inits
    )
    result = fire(model, "reshape-computed-shape", feeds={"x": np.ones((3, 6), F32)})
    assert reshape_shape(result) == [6, -1]


def test_no_minus_one_beside_a_symbolic_dimension():
    # [Shape(x)[0], n]: n is a runtime input. [0, -1] would be wrong for an
    # empty x: the source reshapes (0, 6) to (0, 6), onnxruntime refuses -1
    # beside a zero dimension.
    inits = {**shape_parts(2), "z": np.array([0], I64)}
    nodes = [
        node("Shape", ["x"], "s"),
        node("Gather", ["s", idx(0)], "g0", axis=0),
        node("Unsqueeze", ["g0", "z"], "u0"),
        node("Concat", ["u0", "n"], "shape", axis=0),
    ]
    model = reshape_model(nodes, "shape", {"x": (["N", 6], F32), "n": ([1], I64)}, 2, inits=inits)
    no_fire(model, "reshape-computed-shape")
    feeds = {"x": np.ones((0, 6), F32), "n": np.array([6], I64)}
    assert run(model, feeds)[0].shape == (0, 6)
    wrong = reshape_model(
        [], "fixed", {"x": (["N", 6], F32)}, 2, inits={"fixed": np.array([0, -1], I64)}
    )
    with pytest.raises(ort.capi.onnxruntime_pybind11_state.Fail, match="cannot be reshaped"):
        run(wrong, {"x": feeds["x"]})


@pytest.mark.parametrize(
    "case",
    ["two-unknowns", "dimension-at-another-position", "constant-minus-one", "zero-beside"],
)
def test_reshape_negative_cases(case):
    inits = {**shape_parts(2), "z": np.array([0], I64), "m": np.array([-1], I64)}
    inits["zero"] = np.array([0], I64)
    nodes = []
    inputs = {"x": (["N", "C"], F32), "n": ([1], I64), "k": ([1], I64)}
    if case == "two-unknowns":
        parts = ["n", "k"]
    elif case == "dimension-at-another-position":
        nodes += [
            node("Shape", ["x"], "s"),
            node("Gather", ["s", idx(1)], "g", axis=0),
            node("Unsqueeze", ["g", "z"], "u"),
        ]
        parts = ["u", "n"]  # x's dimension 1 at position 0: unknown, and n unknown
    elif case == "constant-minus-one":
        parts = ["m", "n"]  # -1 taken already
    else:
        parts = ["zero", "n"]  # 0 copies x's dim 0, which may be 0
    nodes.append(node("Concat", parts, "shape", axis=0))
    model = reshape_model(nodes, "shape", inputs, 2, inits=inits)
    no_fire(model, "reshape-computed-shape")


def test_reshape_with_a_constant_shape_is_left_to_other_rules():
    fixed = {"fixed": np.array([-1], I64)}
    model = reshape_model([], "fixed", {"x": (["N", 6], F32)}, 1, inits=fixed)
    no_fire(model, "reshape-computed-shape")


# Random shape computations: whenever the source runs, the result must give the
# same tensor; the rule must turn the shape constant exactly when it should.

_KINDS = ("const", "minus1", "zero", "copy", "wrongpos", "input", "other")


@st.composite
def reshape_cases(draw):
    rank = draw(st.integers(1, 4))
    dims = draw(st.lists(st.integers(0, 4), min_size=rank, max_size=rank))
    symbolic_axes = draw(st.lists(st.booleans(), min_size=rank, max_size=rank))
    opset = draw(st.sampled_from([13, 14, 15, 18, 21]))
    allowzero = draw(st.sampled_from([None, 0, 1])) if opset >= 14 else None
    keep = draw(st.integers(0, rank))
    out = dims[:keep] + ([int(np.prod(dims[keep:]))] if keep < rank else [])
    elements = []
    minus1 = False
    for i, size in enumerate(out):
        rest = int(np.prod([d for j, d in enumerate(out) if j != i]))
        # A 0 in the shape copies the input's dimension unless allowzero=1.
        zero_ok = allowzero == 1 or (i < rank and dims[i] == 0)
        choices = ["const", "input", "other"] if size != 0 or zero_ok else []
        if not minus1 and rest != 0:
            choices.append("minus1")
        if i < rank and size == dims[i]:
            choices.append("copy")
            if allowzero != 1:
                choices.append("zero")
        if allowzero == 1 and size == 0:
            choices.append("zero")
        if (size != 0 or zero_ok) and any(j != i and dims[j] == size for j in range(rank)):
            choices.append("wrongpos")
        assume(choices)
        kind = draw(st.sampled_from(choices))
        minus1 |= kind == "minus1"
        if kind == "copy":
            form = draw(st.sampled_from(["gather", "gather-neg", "gather-1d", "slice", "shape-se"]))
            if form == "shape-se" and opset < 15:
                form = "slice"
            elements.append((kind, i, form, draw(st.booleans())))
        elif kind == "wrongpos":
            j = draw(st.sampled_from([j for j in range(rank) if j != i and dims[j] == size]))
            elements.append((kind, j, "gather", False))
        elif kind == "other":
            elements.append((kind, size, draw(st.booleans()), False))
        else:
            elements.append((kind, size, None, False))
    return rank, dims, symbolic_axes, opset, allowzero, out, elements


def _build_case(rank, dims, symbolic_axes, opset, allowzero, elements, out_rank):
    x_shape = [f"d{i}" if s else d for i, (d, s) in enumerate(zip(dims, symbolic_axes))]
    inputs = {"x": (x_shape, F32)}
    inits = {"z": np.array([0], I64)}
    feeds = {"x": np.random.default_rng(0).standard_normal(dims).astype(F32)}
    nodes = [node("Shape", ["x"], "s")]
    parts = []
    for k, (kind, a, b, cast) in enumerate(elements):
        name = f"e{k}"
        if kind in ("const", "minus1", "zero"):
            inits[name] = np.array([{"const": a, "minus1": -1, "zero": 0}[kind]], I64)
        elif kind == "input":
            inputs[name] = ([1], I64)
            feeds[name] = np.array([a], I64)
        elif kind == "other":
            inputs[f"w{k}"] = (["w" if b else a], F32)
            feeds[f"w{k}"] = np.zeros(a, F32)
            nodes += [
                node("Shape", [f"w{k}"], f"ws{k}"),
                node("Slice", [f"ws{k}", "z", "one"], name),
            ]
            inits["one"] = np.array([1], I64)
        else:  # copy or wrongpos: dimension a of x
            form = b
            if form in ("gather", "gather-neg"):
                index = a if form == "gather" else a - rank
                inits[f"ix{k}"] = np.array(index, I64)
                nodes += [
                    node("Gather", ["s", f"ix{k}"], f"g{k}", axis=0),
                    node("Unsqueeze", [f"g{k}", "z"], name),
                ]
            elif form == "gather-1d":
                inits[f"ix{k}"] = np.array([a], I64)
                nodes.append(node("Gather", ["s", f"ix{k}"], name, axis=0))
            elif form == "slice":
                inits[f"sa{k}"], inits[f"sb{k}"] = np.array([a], I64), np.array([a + 1], I64)
                nodes.append(node("Slice", ["s", f"sa{k}", f"sb{k}"], name))
            else:
                nodes.append(node("Shape", ["x"], name, start=a - rank, end=a + 1))
            if cast:
                nodes.append(node("Identity", [name], f"{name}_id"))
                name = f"{name}_id"
        parts.append(name)
    nodes.append(node("Concat", parts, "shape", axis=0))
    attrs = {} if allowzero is None else {"allowzero": allowzero}
    nodes.append(node("Reshape", ["x", "shape"], "y", **attrs))
    graph_inputs = [
        helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(np.dtype(t)), s)
        for n, (s, t) in inputs.items()
    ]
    model = make_model(
        nodes,
        graph_inputs,
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [f"o{i}" for i in range(out_rank)])],
        [numpy_helper.from_array(v, n) for n, v in inits.items()],
        opset=opset,
    )
    return model, feeds


def _expected_constant(rank, dims, symbolic_axes, allowzero, elements) -> bool:
    """Mirror of the rule: which elements are known, which copy, which are free."""
    known, free = [], []
    for i, (kind, a, b, _) in enumerate(elements):
        if kind in ("const", "minus1", "zero"):
            known.append({"const": a, "minus1": -1, "zero": 0}[kind])
        elif kind == "input":
            free.append(i)
        elif kind == "other":
            (known.append(a) if not b else free.append(i))
        elif not symbolic_axes[a]:
            known.append(dims[a])
        elif kind == "copy" and allowzero != 1:
            known.append(1)  # a copy: never free, and a symbolic size (not known nonzero)
            free.append(("copy", i))
        else:
            free.append(i)
    copies = [f for f in free if isinstance(f, tuple)]
    free = [f for f in free if not isinstance(f, tuple)]
    if not free:
        return True
    others_known = not copies and all(v not in (0, -1) for v in known)
    return len(free) == 1 and others_known


@given(reshape_cases())
def test_reshape_computed_shape_keeps_every_result(case):
    rank, dims, symbolic_axes, opset, allowzero, out, elements = case
    model, feeds = _build_case(rank, dims, symbolic_axes, opset, allowzero, elements, len(out))
    _, result = optimize_proto(model, [RULES["reshape-computed-shape"]])
    (reshape,) = [n for n in result.graph.node if n.op_type == "Reshape"]
    constant = reshape.input[1] in {i.name for i in result.graph.initializer}
    assert constant == _expected_constant(rank, dims, symbolic_axes, allowzero, elements)
    (expected,) = run(model, feeds)
    used = {i.name for i in result.graph.input}
    (actual,) = run(result, {k: v for k, v in feeds.items() if k in used})
    assert actual.shape == expected.shape == tuple(out)
    np.testing.assert_array_equal(actual, expected)


# -- elements(): what it looks through -------------------------------------------


def _elements_of(model: onnx.ModelProto, name: str):
    import onnx_ir as ir

    graph = ir.from_proto(model).graph
    value = next(v for n in graph for v in n.outputs if v.name == name)
    return symbolic.elements(value, lambda v: constant_tensor(v, 10))


def test_elements_clamps_slices_and_refuses_what_is_not_exact():
    inits = {
        "lo": np.array([-100], I64),
        "hi": np.array([2**62], I64),
        "two": np.array([2], I64),
        "big": np.array(7, I64),
    }
    nodes = [
        node("Shape", ["x"], "s"),
        node("Slice", ["s", "lo", "hi"], "all"),  # clamps to the whole shape
        node("Slice", ["s", "lo", "hi", "z", "two"], "stepped"),  # step 2: not looked into
        node("Gather", ["s", "big"], "out_of_range", axis=0),  # fails at run time
        node("Cast", ["s"], "narrow", to=TensorProto.INT32),  # could wrap
        node("Concat", ["all", "stepped"], "y", axis=0),
    ]
    inits["z"] = np.array([0], I64)
    model = make_model(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, "H"])],
        [helper.make_tensor_value_info("y", TensorProto.INT64, ["k"])],
        [numpy_helper.from_array(v, n) for n, v in inits.items()],
        opset=17,
    )
    model = onnx.shape_inference.infer_shapes(model)  # as the optimizer sees it
    rank, items = _elements_of(model, "all")
    assert (
        rank == 1
        and items[1] == 3
        and [repr(d) for d in (items[0], items[2])]
        == [
            "x.shape[0]",
            "x.shape[2]",
        ]
    )
    assert _elements_of(model, "stepped") == (1, [None, None])
    assert _elements_of(model, "out_of_range") == (0, [None])
    assert _elements_of(model, "narrow") == (1, [None, None, None])


# -- shape-cast, shape-transpose ------------------------------------------------


def test_shape_cast_keeps_start_and_end():
    model = build(
        [node("Cast", ["x"], "c", to=TensorProto.FLOAT16), node("Shape", ["c"], "y", start=-2)],
        {"x": (["N", 3, "W"], F32)},
        opset=15,
    )
    result = fire(model, "shape-cast", feeds={"x": np.ones((2, 3, 5), F32)})
    assert [n.op_type for n in result.graph.node] == ["Shape"]


def test_shape_cast_leaves_a_shared_cast():
    model = build(
        [
            node("Cast", ["x"], "c", to=TensorProto.FLOAT16),
            node("Shape", ["c"], "y"),
            node("Relu", ["c"], "r"),
        ],
        {"x": (["N", 3], F32)},
        outputs=("y", "r"),
    )
    no_fire(model, "shape-cast")


@pytest.mark.parametrize(
    "perm, start, end",
    [(None, None, None), ([2, 0, 1], None, None), ([1, 2, 0], 1, None), ([2, 1, 0], -1, None)],
)
def test_shape_transpose_gathers_the_permuted_dims(perm, start, end):
    attrs = {k: v for k, v in {"start": start, "end": end}.items() if v is not None}
    tattrs = {} if perm is None else {"perm": perm}
    model = build(
        [node("Transpose", ["x"], "t", **tattrs), node("Shape", ["t"], "y", **attrs)],
        {"x": (["N", 3, "W"], F32)},
        opset=15,
    )
    result = fire(model, "shape-transpose", feeds={"x": np.ones((2, 3, 5), F32)})
    assert sorted(n.op_type for n in result.graph.node) == ["Gather", "Shape"]


def test_a_static_part_of_a_transposed_shape_folds():
    """Shape(Transpose(x))[-2:-1] holds x's static dim: it folds before any rule runs."""
    model = build(
        [
            node("Transpose", ["x"], "t", perm=[2, 1, 0]),
            node("Shape", ["t"], "y", start=-2, end=-1),
        ],
        {"x": (["N", 3, "W"], F32)},
        opset=15,
    )
    report, result = optimize_proto(model, [RULES["shape-transpose"]])
    assert report.rules["shape-transpose"].applied == 0
    assert list(result.graph.node) == []
    assert onnx.numpy_helper.to_array(result.graph.initializer[0]).tolist() == [3]


# -- not-where, not-not -----------------------------------------------------------


def test_not_shared_by_wheres_and_another_user():
    model = build(
        [
            node("Not", ["c"], "n"),
            node("Where", ["n", "a", "b"], "y1"),
            node("Where", ["n", "b", "a"], "y2"),
            node("Cast", ["n"], "y3", to=TensorProto.FLOAT),
        ],
        {"c": (["N", 4], np.bool_), "a": (["N", 4], F32), "b": ([4], F32)},
        outputs=("y1", "y2", "y3"),
    )
    result = fire(model, "not-where")
    assert Counter(n.op_type for n in result.graph.node) == Counter(
        {"Where": 2, "Not": 1, "Cast": 1}
    )
    assert all(n.input[0] == "c" for n in result.graph.node if n.op_type == "Where")


def test_not_where_only_for_the_condition():
    model = build(
        [node("Not", ["c"], "n"), node("Where", ["m", "n", "b"], "y")],
        {"c": ([4], np.bool_), "m": ([4], np.bool_), "b": ([4], np.bool_)},
    )
    no_fire(model, "not-where")


def test_not_not_cancels_and_a_shared_inner_not_stays():
    model = build(
        [node("Not", ["x"], "n"), node("Not", ["n"], "nn"), node("Xor", ["nn", "x2"], "y")],
        {"x": (["N"], np.bool_), "x2": (["N"], np.bool_)},
    )
    result = fire(model, "not-not")
    assert [n.op_type for n in result.graph.node] == ["Xor"]
    shared = build(
        [node("Not", ["x"], "n"), node("Not", ["n"], "nn"), node("Xor", ["nn", "x2"], "y")],
        {"x": (["N"], np.bool_), "x2": (["N"], np.bool_)},
        outputs=("y", "n"),
    )
    result = fire(shared, "not-not")
    assert sorted(n.op_type for n in result.graph.node) == ["Not", "Xor"]


# -- reciprocal-mul ---------------------------------------------------------------


@pytest.mark.parametrize("dtype", [F32, np.float64])
def test_reciprocal_mul_becomes_a_division(dtype):
    model = build(
        [node("Div", ["one", "x"], "r"), node("Mul", ["y_in", "r"], "y")],
        {"x": (["N", 3], dtype), "y_in": ([3], dtype)},
        inits={"one": np.array(1.0, dtype)},
    )
    result = fire(model, "reciprocal-mul", special=True)
    (div,) = result.graph.node
    assert div.op_type == "Div" and list(div.input) == ["y_in", "x"]


def test_reciprocal_mul_negatives():
    integer = build(
        [node("Div", ["one", "x"], "r"), node("Mul", ["r", "b"], "y")],
        {"x": ([3], I64), "b": ([3], I64)},
        inits={"one": np.array(1, I64)},
    )
    no_fire(integer, "reciprocal-mul")
    more_axes = build(
        [node("Div", ["one", "x"], "r"), node("Mul", ["r", "b"], "y")],
        {"x": ([3], F32), "b": ([3], F32)},
        inits={"one": np.ones((1, 1), F32)},
    )
    no_fire(more_axes, "reciprocal-mul")
    shared = build(
        [node("Div", ["one", "x"], "r"), node("Mul", ["r", "b"], "y")],
        {"x": ([3], F32), "b": ([3], F32)},
        outputs=("y", "r"),
        inits={"one": np.array(1.0, F32)},
    )
    no_fire(shared, "reciprocal-mul")
    two = build(
        [node("Div", ["two", "x"], "r"), node("Mul", ["r", "b"], "y")],
        {"x": ([3], F32), "b": ([3], F32)},
        inits={"two": np.array(2.0, F32)},
    )
    no_fire(two, "reciprocal-mul")


# -- gather-mul-fold ---------------------------------------------------------------


def _scaled_rows(scale: np.ndarray, outputs=("y",), extra=()) -> onnx.ModelProto:
    """An embedding as Gemma scales it: Gather(W, ids) * sqrt(hidden)."""
    return build(
        [node("Gather", ["w", "ids"], "g"), node("Mul", ["g", "s"], "y"), *extra],
        {"ids": (["B", "S"], I64)},
        outputs=outputs,
        inits={"w": np.random.default_rng(0).standard_normal((10, 4)).astype(F32), "s": scale},
    )


def test_gather_mul_fold_moves_the_scale_into_the_table():
    feeds = {"ids": np.array([[0, 9, 3], [-1, 2, 2]], I64)}
    result = fire(_scaled_rows(np.array(16.0**0.5, F32)), "gather-mul-fold", feeds=feeds)
    (gather,) = result.graph.node
    table = numpy_helper.to_array(next(t for t in result.graph.initializer))
    want = np.random.default_rng(0).standard_normal((10, 4)).astype(F32) * F32(4.0)
    np.testing.assert_array_equal(table, want)  # bit-exact: one product per element
    assert gather.op_type == "Gather"


def test_gather_mul_fold_negatives():
    # a table also read elsewhere (a tied LM head) would be copied
    tied = build(
        [
            node("Gather", ["w", "ids"], "g"),
            node("Mul", ["g", "s"], "y"),
            node("MatMul", ["h", "w"], "t"),
        ],
        {"ids": ([3], I64), "h": ([2, 10], F32)},
        outputs=("y", "t"),
        inits={"w": np.ones((10, 4), F32), "s": np.array(2.0, F32)},
    )
    no_fire(tied, "gather-mul-fold")
    no_fire(_scaled_rows(np.full(4, 2.0, F32)), "gather-mul-fold")  # one factor per column
    # a scale of higher rank adds axes to the rows
    no_fire(_scaled_rows(np.full((1, 1, 1, 1), 2.0, F32)), "gather-mul-fold")
    runtime = build(
        [node("Gather", ["w", "ids"], "g"), node("Mul", ["g", "s"], "y")],
        {"ids": ([3], I64), "s": ([], F32)},
        inits={"w": np.ones((10, 4), F32)},
    )
    no_fire(runtime, "gather-mul-fold")


# -- constant graph outputs ----------------------------------------------------------


def test_a_constant_graph_output_becomes_an_initializer_of_that_name():
    model = build(
        [node("Add", ["a", "b"], "k"), node("Mul", ["x", "k"], "y")],
        {"x": ([2], F32)},
        outputs=("y", "k"),
        inits={"a": np.array([1.0, 2.0], F32), "b": np.array([3.0, 4.0], F32)},
    )
    _, result = optimize_proto(model, [])
    assert [o.name for o in result.graph.output] == ["y", "k"]
    assert initializer(result, "k").tolist() == [4.0, 6.0]
    assert [n.op_type for n in result.graph.node] == ["Mul"]
    feeds = {"x": np.array([1.0, -1.0], F32)}
    assert_close(run(result, feeds), run(model, feeds))
