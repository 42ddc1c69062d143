"""Uniform values fold on one element and stay fills (``folding_uniform``).

Every case folds the same node twice: with the uniform path, and with it switched
off (the old path: full arrays, ``np.full`` of every fill). Values, dtype and shape
must agree bit for bit; where the uniform path applies, its result is a FillTensor.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import numpy_helper

from onnxfuse.fold import spill
from onnxfuse.fold import uniform as folding_uniform
from onnxfuse.fold.folder import FoldContext, Folder
from onnxfuse.fold.spill import FillTensor
from onnxfuse.graph.names import NameSource

FLOATS = [np.float16, np.float32, np.float64]
INTS = [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64]
PLAIN = [*FLOATS, *INTS, np.bool_]
# Enough elements for a large output at any item size (bool and int8 included).
BIG = spill.FILL_MIN_BYTES


@dataclass(frozen=True)
class Fill:
    """A uniform input: ``element`` over ``shape``, held as ``form``: "fill" (a
    FillTensor when large), "array" (materialized) or "view" (an ir.Tensor of a
    stride-0 view)."""

    element: np.ndarray
    shape: tuple[int, ...]
    form: str = "fill"


def _tensor(value: Fill | np.ndarray) -> ir.TensorProtocol:
    if isinstance(value, np.ndarray):
        return ir.Tensor(value)
    view = np.broadcast_to(value.element, value.shape)
    if value.form == "view":
        return ir.Tensor(view)
    if value.form == "fill":
        fill = spill.fill_tensor(view, None)
        if fill is not None:
            return fill
    return ir.Tensor(np.ascontiguousarray(view))


def _fold(op, inputs, attrs, opset, uniform) -> ir.TensorProtocol | None:
    tensors = [_tensor(v) for v in inputs]
    values = [
        ir.Value(name=f"i{k}", type=ir.TensorType(t.dtype), shape=ir.Shape(t.shape), const_value=t)
        for k, t in enumerate(tensors)
    ]
    attributes = [ir.convenience.convert_attribute(k, v) for k, v in (attrs or {}).items()]
    node = ir.Node("", op, values, attributes, num_outputs=1)
    node.outputs[0].name = "y"
    graph = ir.Graph(
        [], [node.outputs[0]], nodes=[node], initializers=values, opset_imports={"": opset}
    )
    folder = Folder(FoldContext(10, {"": opset}), NameSource(ir.Model(graph, ir_version=10)))
    if uniform:
        folded = folder.fold_node(node)
    else:
        with mock.patch.object(folding_uniform, "uniform_result", return_value=None):
            folded = folder.fold_node(node)
    return graph.outputs[0].const_value if folded else None


def check(op: str, inputs: list, attrs: dict | None = None, opset: int = 21) -> bool:
    """Fold both ways, assert the same result; True when the uniform path made a fill."""
    new = _fold(op, inputs, attrs, opset, uniform=True)
    old = _fold(op, inputs, attrs, opset, uniform=False)
    assert (new is None) == (old is None)
    if new is None or old is None:
        return False
    assert new.dtype == old.dtype
    assert tuple(new.shape) == tuple(old.shape)
    assert new.tobytes() == old.tobytes()
    return isinstance(new, FillTensor)


# --- strategies -------------------------------------------------------------------


@st.composite
def elements(draw, dtype) -> np.ndarray:
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return np.array(draw(st.booleans()))
    if dtype.kind == "f":
        info = np.finfo(dtype)
        special = [np.nan, -np.nan, -0.0, 0.0, np.inf, -np.inf, 1.0, -1.0, 0.5, 3.0]
        special += [info.smallest_subnormal, -info.smallest_subnormal, info.tiny]
        special += [info.max, info.min, 2.0**31, -(2.0**31), 2.0**63, 255.5, -0.5]
        bits = dtype.itemsize * 8
        return draw(
            st.one_of(
                st.sampled_from(special).map(lambda v: _as(v, dtype)),
                st.integers(0, 2**bits - 1).map(  # any bit pattern: NaN payloads too
                    lambda b: np.array(b, f"u{dtype.itemsize}").view(dtype)
                ),
            )
        )
    info = np.iinfo(dtype)
    edges = [info.min, info.max, 0, 1, info.max - 1, info.min + 1]
    edges += [v for v in (-1, 2, -2) if info.min <= v]
    return np.array(
        draw(st.one_of(st.sampled_from(edges), st.integers(int(info.min), int(info.max)))),
        dtype=dtype,
    )


def _as(value: float, dtype: np.dtype) -> np.ndarray:
    with np.errstate(over="ignore"):  # float64 extremes are infinities in float16
        return np.array(value).astype(dtype)


@st.composite
def big_shapes(draw, min_items: int = BIG) -> tuple[int, ...]:
    """Rank 1-4, at least ``min_items`` elements, one large dimension."""
    rank = draw(st.integers(1, 4))
    dims = [draw(st.sampled_from([1, 2, 3, 5])) for _ in range(rank - 1)]
    big = -(-min_items // max(1, math.prod(dims))) + draw(st.integers(0, 3))
    dims.insert(draw(st.integers(0, rank - 1)), big)
    return tuple(dims)


@st.composite
def operand_shapes(draw, out: tuple[int, ...], count: int) -> list[tuple[int, ...]]:
    """``count`` shapes broadcasting to ``out`` (one of them ``out`` itself)."""
    shapes = []
    for _ in range(count):
        drop = draw(st.integers(0, len(out)))
        shapes.append(tuple(d if draw(st.booleans()) else 1 for d in out[drop:]))
    shapes[draw(st.integers(0, count - 1))] = out
    return shapes


forms = st.sampled_from(["fill", "fill", "array", "view"])


@st.composite
def fills(draw, dtype, shape) -> Fill:
    return Fill(draw(elements(dtype)), shape, draw(forms))


# --- elementwise ops -----------------------------------------------------------------

# Ops drawn one at a time: a third of the profile's examples each (the suite's time).
per_op = settings(max_examples=max(5, settings.default.max_examples // 3))

ARITHMETIC = ["Add", "Sub", "Mul", "Div", "Max", "Min"]
COMPARISONS = ["Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual"]
UNARY = ["Neg", "Abs", "Sqrt", "Identity"]


@pytest.mark.parametrize("op", ARITHMETIC + COMPARISONS)
@per_op
@given(data=st.data())
def test_binary_ops_fold_fills_as_full_arrays(op, data):
    dtype = data.draw(st.sampled_from(PLAIN if op in COMPARISONS else PLAIN[:-1]))
    count = data.draw(st.integers(1, 3)) if op in ("Max", "Min") else 2
    out = data.draw(big_shapes())
    shapes = data.draw(operand_shapes(out, count))
    check(op, [data.draw(fills(dtype, shape)) for shape in shapes])


@pytest.mark.parametrize("op", UNARY)
@per_op
@given(data=st.data())
def test_unary_ops_fold_fills_as_full_arrays(op, data):
    dtype = data.draw(st.sampled_from(FLOATS if op == "Sqrt" else PLAIN[:-1]))
    check(op, [data.draw(fills(dtype, data.draw(big_shapes())))])


@pytest.mark.parametrize("op", ["And", "Or", "Xor", "Not"])
@per_op
@given(data=st.data())
def test_logic_ops_fold_fills_as_full_arrays(op, data):
    out = data.draw(big_shapes())
    shapes = data.draw(operand_shapes(out, 1 if op == "Not" else 2))
    check(op, [data.draw(fills(np.bool_, shape)) for shape in shapes])


@given(data=st.data())
def test_where_folds_fills_as_full_arrays(data):
    dtype = data.draw(st.sampled_from(PLAIN))
    out = data.draw(big_shapes())
    shapes = data.draw(operand_shapes(out, 3))
    inputs = [data.draw(fills(np.bool_, shapes[0]))]
    inputs += [data.draw(fills(dtype, shape)) for shape in shapes[1:]]
    check("Where", inputs)


@given(data=st.data())
def test_cast_folds_fills_as_full_arrays(data):
    source = data.draw(st.sampled_from(PLAIN))
    target = data.draw(st.sampled_from(PLAIN))
    to = ir.DataType.from_numpy(np.dtype(target)).value
    check("Cast", [data.draw(fills(source, data.draw(big_shapes())))], {"to": to})


# --- data movement -------------------------------------------------------------------

data_dtypes = st.sampled_from([np.float32, np.int64, np.uint8, np.bool_, np.float16])


@given(data=st.data())
def test_reshape_folds_fills_as_full_arrays(data):
    shape = data.draw(big_shapes())
    dims = list(shape)
    target: list[int] = []
    while dims:  # merge runs of dimensions, insert ones
        take = data.draw(st.integers(1, len(dims)))
        target.append(math.prod(dims[:take]))
        dims = dims[take:]
        if data.draw(st.booleans()):
            target.append(1)
    k = data.draw(st.integers(0, len(target) - 1))
    target[k] = data.draw(st.sampled_from([-1, 0, target[k], target[k] + 1]))
    allowzero = data.draw(st.sampled_from([None, 0, 1]))
    attrs = {} if allowzero is None else {"allowzero": allowzero}
    source = data.draw(fills(data.draw(data_dtypes), shape))
    check("Reshape", [source, np.array(target, np.int64)], attrs)


@given(data=st.data())
def test_transpose_unsqueeze_squeeze_flatten_fold_fills_as_full_arrays(data):
    shape = data.draw(big_shapes())
    rank = len(shape)
    source = data.draw(fills(data.draw(data_dtypes), shape))
    op = data.draw(st.sampled_from(["Transpose", "Unsqueeze", "Squeeze", "Flatten"]))
    if op == "Transpose":
        perm = data.draw(st.permutations(range(rank)))
        check(op, [source], {"perm": list(perm)} if data.draw(st.booleans()) else {})
    elif op == "Flatten":
        check(op, [source], {"axis": data.draw(st.integers(-rank, rank))})
    else:
        bound = rank if op == "Squeeze" else rank + 1
        axes = data.draw(st.lists(st.integers(-bound, bound - 1), min_size=1, max_size=2))
        if op == "Squeeze" and data.draw(st.booleans()):
            check(op, [source])  # every dimension of size 1
        elif data.draw(st.booleans()):
            check(op, [source, np.array(axes, np.int64)])  # opset 13: axes input
        else:
            check(op, [source], {"axes": axes}, opset=11)


@given(data=st.data())
def test_slice_folds_fills_as_full_arrays(data):
    shape = data.draw(big_shapes(4 * BIG))  # room for a large slice of bytes
    rank = len(shape)
    source = data.draw(fills(data.draw(data_dtypes), shape))
    axes = data.draw(st.lists(st.integers(-rank, rank - 1), min_size=1, max_size=rank, unique=True))
    if len({a % rank for a in axes}) != len(axes):
        axes = axes[:1]
    lowest, highest = np.iinfo(np.int64).min, np.iinfo(np.int64).max

    def bound(axis: int, low: bool):
        d = shape[axis]
        edges = [0, 1, -d, -d - 1, lowest] if low else [d, -1, d + 1, d // 2, highest]
        return st.one_of(st.sampled_from(edges), st.integers(-d - 3, d + 3))

    steps = [data.draw(st.sampled_from([1, 1, 2, -1, -3, 5])) for _ in axes]
    starts = [data.draw(bound(a, low=step > 0)) for a, step in zip(axes, steps)]
    ends = [data.draw(bound(a, low=step < 0)) for a, step in zip(axes, steps)]
    params = [np.array(v, np.int64) for v in (starts, ends, axes, steps)]
    check("Slice", [source, *params])


@given(data=st.data())
def test_expand_folds_fills_as_full_arrays(data):
    out = data.draw(big_shapes())
    (shape,) = data.draw(operand_shapes(out, 1))
    source = data.draw(fills(data.draw(st.sampled_from(PLAIN)), shape))
    small = data.draw(operand_shapes(out, 2))[0]  # ones where `out` is not needed
    target = data.draw(st.sampled_from([out, out, small, (2, *out), (0, *out)]))
    check("Expand", [source, np.array(target, np.int64)])


@given(data=st.data())
def test_tile_folds_fills_as_full_arrays(data):
    shape = data.draw(big_shapes(BIG // 4))
    source = data.draw(fills(data.draw(st.sampled_from(PLAIN)), shape))
    repeats = [data.draw(st.integers(0, 3)) for _ in shape]
    if data.draw(st.integers(0, 5)) == 0:
        repeats = repeats[1:]  # fewer repeats than dimensions: np.tile pads, ONNX refuses
    check("Tile", [source, np.array(repeats, np.int64)])


@given(data=st.data())
def test_concat_folds_fills_as_full_arrays(data):
    out = data.draw(big_shapes())
    axis = data.draw(st.integers(-len(out), len(out) - 1))
    dtype = data.draw(st.sampled_from(PLAIN))
    element = data.draw(elements(dtype))
    parts = []
    for _ in range(data.draw(st.integers(1, 3))):
        shape = list(out)
        shape[axis] = data.draw(st.integers(1, 3)) if data.draw(st.booleans()) else out[axis]
        other = data.draw(elements(dtype)) if data.draw(st.integers(0, 4)) == 0 else element
        parts.append(Fill(other, tuple(shape), data.draw(forms)))
    check("Concat", parts, {"axis": axis})


# --- the uniform path is taken where it applies, and only there -----------------------


def _f32(value: float, shape: tuple[int, ...]) -> Fill:
    return Fill(np.array(value, np.float32), shape)


W = (64, 3, 7, 7)  # 37 KiB: 4 x 3 x 7 x 7 floats of it below FILL_MIN_BYTES
BIG_W = (256, 64, 3, 3)  # 576 KiB
i64 = lambda *v: np.array(v, np.int64)  # noqa: E731

TAKEN = {
    "conv_bn_scale": ("Mul", [_f32(0.02, BIG_W), _f32(0.5, (256, 1, 1, 1))], {}),
    "add_broadcast": ("Add", [_f32(1.0, (256, 1)), _f32(-0.0, (1, 1024))], {}),
    "div": ("Div", [_f32(1.0, BIG_W), _f32(0.0, (1,))], {}),
    "max_variadic": ("Max", [_f32(1.0, BIG_W), _f32(2.0, (1,)), _f32(np.nan, (3, 1))], {}),
    "sqrt": ("Sqrt", [_f32(-1.0, BIG_W)], {}),
    "neg": ("Neg", [Fill(np.array(-128, np.int8), (1 << 17,))], {}),
    "less": ("Less", [_f32(1.0, BIG_W), _f32(2.0, ())], {}),
    "cast": ("Cast", [_f32(3.7, BIG_W)], {"to": ir.DataType.INT32.value}),
    "where": ("Where", [Fill(np.array(True), (1,)), _f32(1.0, BIG_W), _f32(2.0, ())], {}),
    "int_div": (
        "Div",
        [Fill(np.array(-7, np.int32), (1 << 16,)), Fill(np.array(2, np.int32), ())],
        {},
    ),
    "reshape": ("Reshape", [_f32(0.02, BIG_W), i64(256, -1)], {}),
    "transpose": ("Transpose", [_f32(0.02, BIG_W)], {"perm": [1, 0, 2, 3]}),
    "slice": ("Slice", [_f32(0.02, BIG_W), i64(-1), i64(-(2**63)), i64(0), i64(-2)], {}),
    "expand": ("Expand", [_f32(0.02, (256, 1, 3, 3)), i64(1, 64, 1, 1)], {}),
    "tile": ("Tile", [_f32(0.02, (256, 1, 3, 3)), i64(1, 64, 1, 1)], {}),
    "concat": ("Concat", [_f32(0.02, BIG_W), _f32(0.02, (1, 64, 3, 3))], {"axis": 0}),
}


@pytest.mark.parametrize("case", sorted(TAKEN))
def test_uniform_inputs_give_a_fill(case):
    op, inputs, attrs = TAKEN[case]
    assert check(op, inputs, attrs)


RANDOM = np.random.default_rng(0).standard_normal((256, 1, 1, 1)).astype(np.float32)
INT7, INT0 = Fill(np.array(7, np.int32), (1 << 16,)), Fill(np.array(0, np.int32), ())
REFUSED = {
    "small_input_not_uniform": ("Mul", [_f32(0.02, BIG_W), RANDOM], {}, 21),
    "signed_zeros_differ": ("Mul", [_f32(1.0, BIG_W), np.array([0.0, -0.0], np.float32)], {}, 21),
    "large_input_not_held_as_one_value": (
        "Mul",
        [Fill(np.array(1.0, np.float32), BIG_W, "array"), _f32(2.0, ())],
        {},
        21,
    ),
    "op_outside_the_list": ("Exp", [_f32(0.5, BIG_W)], {}, 21),
    "pow_outside_the_list": ("Pow", [_f32(0.5, BIG_W), _f32(2.0, ())], {}, 21),
    "cast_nan_to_int": ("Cast", [_f32(np.nan, BIG_W)], {"to": ir.DataType.INT32.value}, 21),
    "cast_out_of_range": ("Cast", [_f32(3e9, BIG_W)], {"to": ir.DataType.INT32.value}, 21),
    "int_div_by_zero": ("Div", [INT7, INT0], {}, 21),
    "concat_of_two_values": ("Concat", [_f32(1.0, BIG_W), _f32(2.0, BIG_W)], {"axis": 0}, 21),
    "small_output": ("Mul", [_f32(1.0, W), _f32(2.0, ())], {}, 21),
    "legacy_broadcast_opset": ("Add", [_f32(1.0, BIG_W), _f32(2.0, BIG_W)], {}, 6),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_other_inputs_take_the_old_path(case):
    op, inputs, attrs, opset = REFUSED[case]
    assert not check(op, inputs, attrs, opset)


def test_a_large_tensor_is_never_read_to_test_it():
    reads = []

    def full() -> ir.Tensor:
        reads.append(1)
        return ir.Tensor(np.ones(BIG_W, np.float32))

    lazy = ir.LazyTensor(full, ir.DataType.FLOAT, ir.Shape(BIG_W))
    node = ir.Node("", "Mul", [ir.Value(name="a"), ir.Value(name="b")], num_outputs=1)
    small = ir.Tensor(np.full((1,), 2.0, np.float32))
    assert folding_uniform.uniform_result(node, [lazy, small], 21, _no_evaluation) is None
    assert reads == []


def _no_evaluation(node, inputs):
    raise AssertionError("evaluated")


# --- end to end: onnx's IR-3 light models -------------------------------------------

LIGHT = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"


@pytest.mark.skipif(not (LIGHT / "light_resnet50.onnx").exists(), reason="onnx test data")
def test_light_resnet50_conv_bn_weights_stay_fills(tmp_path):
    from onnxfuse.api import optimize_file, select_rules
    from onnxfuse.files.model_io import load_model, save_model
    from onnxfuse.passes.pipeline import Options, optimize
    from onnxfuse.targets.capabilities import load_target

    source = LIGHT / "light_resnet50.onnx"
    rules, options = select_rules(), Options(target=load_target("cpu"))
    model = load_model(source, target=options.target)
    with spill.spilling(model):
        optimize(model, rules, options)
        # Per Conv: equal fills are one initializer (shared weights stay shared).
        weights = [
            (node.inputs[1].name, node.inputs[1].const_value)
            for node in model.graph
            if node.op_type in ("Conv", "FusedConv")
        ]
        fills = [(name, w) for name, w in weights if isinstance(w, FillTensor)]
        save_model(model, tmp_path / "new.onnx", options.target)
    # Folded Conv+BatchNormalization weights (W * scale / sqrt(var + eps)) stay one value.
    assert len(fills) >= 40
    with mock.patch.object(folding_uniform, "uniform_result", return_value=None):
        optimize_file(source, tmp_path / "old.onnx", rules, options)
    assert (tmp_path / "new.onnx").read_bytes() == (tmp_path / "old.onnx").read_bytes()
    saved = {t.name: t for t in onnx.load(tmp_path / "new.onnx").graph.initializer}
    for name, fill in fills:
        array = numpy_helper.to_array(saved[name])
        assert np.array_equal(array, np.full(fill.dims, fill.value[0]), equal_nan=True)


@given(st.lists(st.lists(st.sampled_from([0, 1, 1, 2, 3]), max_size=4), min_size=1, max_size=3))
def test_output_shapes_broadcast_as_numpy(shapes):
    try:
        expected = tuple(np.broadcast_shapes(*map(tuple, shapes)))
    except ValueError:
        expected = None
    assert folding_uniform._broadcast(*map(tuple, shapes)) == expected


@pytest.mark.parametrize(
    "count", [1, 1000, spill.FILL_CHUNK_BYTES // 4, spill.FILL_CHUNK_BYTES // 2 + 3]
)
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.uint8])
def test_fill_chunks_are_the_fill_bytes(count, dtype):
    fill = FillTensor(np.array([-0.0 if dtype != np.uint8 else 7], dtype), (2, count))
    chunks = fill.chunks()
    assert b"".join(bytes(c) for c in chunks) == np.full((2, count), fill.value[0]).tobytes()
    # One shared buffer, never larger than the tensor (nor than FILL_CHUNK_BYTES).
    assert max(len(c) for c in chunks) <= min(spill.FILL_CHUNK_BYTES, fill.nbytes)


def test_a_fill_no_array_can_hold_is_left_unfolded_whatever_the_limit():
    shape = ir.Value(name="s", const_value=ir.Tensor(np.array([2**40, 2**40], np.int64)))
    node = ir.Node("", "ConstantOfShape", [shape], num_outputs=1)
    node.outputs[0].name = "y"
    graph = ir.Graph([], [node.outputs[0]], nodes=[node], initializers=[shape])
    model = ir.Model(graph, ir_version=10)
    folder = Folder(FoldContext(10, {"": 21}, 10**30), NameSource(model))
    assert not folder.fold_node(node)
    assert list(graph) == [node]
