"""The proof harness itself: the verify format, the generator, the oracle, and that it
catches wrong rules (numerics, firing on negatives, domains that never fire)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import pytest
from helpers import MUL_ONE_RULE, relu_relu_rule, rules_from_text
from hypothesis import given
from hypothesis import strategies as st

from onnxfuse.proof.check import (
    check_rule,
    load_counterexample,
    replay,
    sample_mutations,
    save_counterexample,
)
from onnxfuse.proof.domain import (
    DEFAULT_TOLERANCES,
    Broadcast,
    Literal,
    Subset,
    VerifyError,
    parse_domain,
    parse_spec,
)
from onnxfuse.proof.draw import HypothesisDrawer, RandomDrawer, Reject, draw
from onnxfuse.proof.expr import ExprError, parse_expr
from onnxfuse.proof.instance import build_model, generate, make_feeds, random_array
from onnxfuse.proof.negatives import Mutation
from onnxfuse.proof.runtime import compare
from onnxfuse.targets.capabilities import load_target


def rule_with(verify: str):
    return rules_from_text(relu_relu_rule("my-relu-relu") + verify + "\n")[0]


def domain_error(verify: str) -> str:
    with pytest.raises(VerifyError) as caught:
        parse_domain(rule_with(verify))
    return str(caught.value)


# -- the verify format -------------------------------------------------------------


def test_a_rule_without_a_domain_is_an_error():
    assert "no verification domain" in domain_error("")


@pytest.mark.parametrize(
    ("verify", "fragment"),
    [
        ("    verify: {dtypes: [float], inputs: {X: [2]}, ranks: [1]}", "unknown key 'ranks'"),
        ("    verify: {inputs: {X: [2]}}", "'dtypes' must list"),
        ("    verify: {dtypes: [string], inputs: {X: [2]}}", "instances are not drawn in string"),
        ("    verify: {dtypes: [float]}", "no shape for variable 'X'"),
        ("    verify: {dtypes: [float], inputs: {X: [2], Z: [2]}}", "inputs.Z: not a variable"),
        (
            "    verify: {dtypes: [float], inputs: {X: [2]}, special_values: false}",
            "needs a reason",
        ),
        (
            "    verify: {dtypes: [float], inputs: {X: [2]}, tolerance: {rtol: 0.1}}",
            "needs a 'reason'",
        ),
        ("    verify: {dtypes: [float], inputs: {X: [2]}, opsets: [x]}", "opsets"),
        ("    verify: {dtypes: [float], dims: {X: 2}, inputs: {X: [2]}}", "both"),
        ("    verify: {dtypes: [float], inputs: {X: ['import os']}}", "invalid expression"),
        (
            "    verify: {dtypes: [float], inputs: {X: [2]}, node_attributes: {T: {a: 1}}}",
            "copy_attributes",
        ),
        ("    verify: {dtypes: [float], inputs: {X: [2]}, attributes: {eps: [1]}}", "eps"),
        (
            "    verify: {dtypes: [float], inputs: {X: {shape: [2], range: [-1, 1]}}}",
            "inputs.X.range: narrowing the values",
        ),
        (
            "    verify: {dtypes: [float], inputs: {X: {shape: [2], reason: why}}}",
            "a reason is for a 'range'",
        ),
    ],
)
def test_malformed_domains_are_named(verify, fragment):
    message = domain_error(verify)
    assert "my-relu-relu" in message
    assert fragment in message


def test_tolerance_and_special_values_with_reasons():
    domain = parse_domain(
        rule_with(
            "    verify:\n"
            "      dtypes: [float, float16]\n"
            "      inputs: {X: [2]}\n"
            "      special_values: {inputs: [nan, inf], constants: none, reason: why}\n"
            "      tolerance: {float16: {rtol: 1.0e-2}, reason: because}\n"
        )
    )
    assert domain.special_inputs == {"nan", "inf"}
    assert domain.special_constants == frozenset()
    assert domain.tolerance("float16") == (1e-2, DEFAULT_TOLERANCES["float16"][1])
    assert domain.tolerance("float") == DEFAULT_TOLERANCES["float"]
    assert domain.tolerance("int32") == (0.0, 0.0)


# -- element type names ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("verify", "message"),
    [
        (
            {"dtypes": ["float32"], "inputs": {"X": [2]}},
            "verify: dtypes: unknown element type 'float32' (did you mean float?)",
        ),
        (
            {"dtypes": ["float", "flaot"], "inputs": {"X": [2]}},
            "verify: dtypes: unknown element type 'flaot' (did you mean float?)",
        ),
        (
            {"dtypes": ["float"], "inputs": {"X": {"shape": [2], "dtype": "float64"}}},
            "verify: inputs.X.dtype: unknown element type 'float64' (did you mean double?)",
        ),
        (
            {"dtypes": ["float"], "inputs": {"X": [2]}, "negatives": [{"dtype": "float64"}]},
            "verify: negatives[0].dtype: unknown element type 'float64' (did you mean double?)",
        ),
        (
            {"dtypes": ["float"], "inputs": {"X": [2]},
             "tolerance": {"float32": {}, "reason": "r"}},
            "verify: tolerance: unknown element type 'float32' (did you mean float?)",
        ),
        (
            {"dtypes": ["float"], "dims": {"R": "1..(3 if dt == 'float32' else 2)"},
             "inputs": {"X": ["R"]}},
            "verify: dims.R: in \"(3 if dt == 'float32' else 2)\": "
            "unknown element type 'float32' (did you mean float?)",
        ),
        (
            {"dtypes": ["float"], "inputs": {"X": [2]},
             "where": ["dt in ('float', 'float64')"]},
            "verify: in \"dt in ('float', 'float64')\": "
            "unknown element type 'float64' (did you mean double?)",
        ),
    ],
)  # fmt: skip
def test_a_domain_naming_another_type_is_refused(verify, message):
    """The proof checks a domain's names itself: a rule need not come from a file."""
    rule = rule_with("    verify: {dtypes: [float], inputs: {X: [2]}}")
    rule.verify = verify
    with pytest.raises(VerifyError) as caught:
        parse_domain(rule)
    assert str(caught.value) == f"test.yaml:2: rule 'my-relu-relu': {message}"


def test_domain_expressions_take_onnx_names():
    assert (
        parse_expr("onnx_type('double') if dt == 'float' else onnx_type(dt)").evaluate(
            {"dt": "float"}
        )
        == 11
    )
    assert parse_expr("onnx_type(dt)").evaluate({"dt": "bfloat16"}) == 16
    with pytest.raises(ExprError, match=r"unknown element type 'float32' \(did you mean float\?\)"):
        parse_expr("onnx_type('float32')")
    with pytest.raises(ExprError, match="unknown element type 'float64'"):
        parse_expr("dtype(X) == 'float64'")
    with pytest.raises(ExprError, match="unknown element type 'float32'"):
        parse_expr("onnx_type(d)").evaluate({"d": "float32"})


# -- draws and expressions -------------------------------------------------------------


def test_spec_kinds():
    env = {"R": 3, "D": [2, 3, 4]}
    drawer = RandomDrawer(1)
    assert draw(parse_spec("1..1", "t"), env, drawer, "t") == 1
    assert isinstance(draw(parse_spec("-1.0..1.0", "t"), env, drawer, "t"), float)
    assert draw(parse_spec("1..R", "t"), env, drawer, "t") in (1, 2, 3)
    assert draw(parse_spec("[d * 2 for d in D]", "t"), env, drawer, "t") == [4, 6, 8]
    assert draw(parse_spec("'NOTSET'", "t"), env, drawer, "t") == "NOTSET"
    assert sorted(draw(parse_spec({"permutation": "R"}, "t"), env, drawer, "t")) == [0, 1, 2]
    assert len(draw(parse_spec({"rank": "R", "each": [5]}, "t"), env, drawer, "t")) == 3
    assert parse_spec(None, "t") == Literal(None)


def test_expressions_are_whitelisted():
    for text in ("__import__('os')", "D.append(1)", "lambda: 1", "{1: 2}", "open('x')"):
        with pytest.raises(ExprError):
            parse_expr(text)
    assert parse_expr("[a + b for a, b in zip(x, y) if a]").evaluate(
        {"x": [1, 0, 2], "y": [3, 4, 5]}
    ) == [4, 7]


@given(st.data())
def test_subset_and_broadcast_draws(data):
    drawer = HypothesisDrawer(data)
    pool = data.draw(st.lists(st.integers(0, 9), min_size=0, max_size=6, unique=True))
    size = data.draw(st.integers(0, len(pool)))
    chosen = draw(Subset(Literal(pool), Literal(size)), {}, drawer, "t")
    assert len(chosen) == size and set(chosen) <= set(pool)
    assert [pool.index(c) for c in chosen] == sorted(pool.index(c) for c in chosen)
    shape = data.draw(st.lists(st.integers(1, 4), max_size=4))
    small = draw(Broadcast(Literal(shape)), {}, drawer, "t")
    assert np.broadcast_shapes(tuple(small), tuple(shape)) == tuple(shape)


# -- instances ----------------------------------------------------------------------


def test_instance_of_a_folding_rule():
    from onnxfuse.language.packs import load_builtin_rules

    rule = {r.name: r for r in load_builtin_rules(["core"])}["conv-bn-fold"]
    domain = parse_domain(rule)
    built = 0
    for seed in range(20):
        try:
            instance = generate(rule, domain, RandomDrawer(seed))
            model = build_model(instance.spec)  # onnx's full checker passed
        except Reject:  # the domain's where, or a weight drawn at a rank Conv cannot take
            continue
        built += 1
        # Constants are drawn as initializers or as Constant nodes.
        constants = {i.name for i in model.graph.initializer} | {
            o for n in model.graph.node if n.op_type == "Constant" for o in n.output
        }
        assert {"W", "B", "scale", "bias", "mean", "var"} <= constants
        assert [i.name for i in model.graph.input] == ["X"]
        computing = [n.op_type for n in model.graph.node if n.op_type != "Constant"]
        assert computing[:2] == ["Conv", "BatchNormalization"]
    assert built >= 5


def test_special_values_in_random_data():
    rng = np.random.default_rng(0)
    data = random_array(rng, "float", (64,), None, frozenset({"nan", "inf", "neg_zero"}))
    assert np.isnan(data).any() and np.isinf(data).any()
    plain = random_array(rng, "float", (64,), None, frozenset())
    assert np.isfinite(plain).all()
    bf16 = random_array(rng, "bfloat16", (64,), None, frozenset({"subnormal"}))
    assert bf16.dtype == ml_dtypes.bfloat16
    tiny = np.abs(bf16.astype(np.float64))
    assert ((tiny > 0) & (tiny < float(ml_dtypes.finfo(ml_dtypes.bfloat16).tiny))).any()
    ints = random_array(rng, "int8", (256,), None, frozenset({"large"}))
    assert ints.min() == -128 or ints.max() == 127


def test_feeds_hold_special_values_only_where_allowed():
    rule = rule_with(
        "    verify:\n"
        "      dtypes: [float]\n"
        "      inputs: {X: [64]}\n"
        "      special_values: {inputs: none, constants: all, reason: test}\n"
    )
    instance = generate(rule, parse_domain(rule), RandomDrawer(0))
    for feed in make_feeds(instance.spec, 0):
        assert all(np.isfinite(v).all() for v in feed.values())


# -- comparison ------------------------------------------------------------------------


def test_compare_nan_inf_and_tolerances():
    tol = parse_domain(rule_with("    verify: {dtypes: [float], inputs: {X: [2]}}")).tolerance
    a = np.array([np.nan, np.inf, -np.inf, 1.0, 0.0], np.float32)
    assert compare([a], [a.copy()], ["y"], tol) is None
    b = a.copy()
    b[3] = 1.0 + 2e-6  # beyond rtol 1.3e-6 but within atol 1e-5
    assert compare([a], [b], ["y"], tol) is None
    b[3] = 1.001
    assert "differ" in compare([a], [b], ["y"], tol).message
    c = a.copy()
    c[0] = 0.0  # a number where the source has NaN
    assert compare([a], [c], ["y"], tol) is not None
    d = a.copy()
    d[1] = np.finfo(np.float32).max
    assert compare([a], [d], ["y"], tol) is not None
    assert "dtype" in compare([a], [a.astype(np.float64)], ["y"], tol).message
    assert "shape" in compare([a], [a[:2]], ["y"], tol).message
    ints = np.array([1, 2], np.int32)
    assert compare([ints], [ints + np.array([0, 1], np.int32)], ["y"], tol) is not None


def test_integer_outputs_may_move_by_the_steps_a_tolerance_allows():
    tol = parse_domain(
        rule_with(
            "    verify: {dtypes: [float], inputs: {X: [2]}, tolerance: {steps: 1, reason: why}}"
        )
    ).tolerance
    q = np.array([0, 127, 255], np.uint8)
    assert compare([q], [np.array([1, 126, 255], np.uint8)], ["y"], tol) is None
    mismatch = compare([q], [np.array([2, 127, 255], np.uint8)], ["y"], tol)
    assert mismatch is not None and "max difference 2 steps" in mismatch.message
    assert tol("float") == DEFAULT_TOLERANCES["float"]
    bad = "    verify: {dtypes: [float], inputs: {X: [2]}, tolerance: {steps: -1, reason: why}}"
    assert "tolerance.steps" in domain_error(bad)


# -- catching wrong rules ---------------------------------------------------------------

# onnxscript's BatchNormalization-into-Gemm rule ignored Gemm's beta. This one does too.
GEMM_BN_IGNORING_BETA = """\
rules:
  - name: gemm-bn-fold-wrong
    copy_attributes: {G: Y}
    source: |
      gemm_bn <eps> (A, B, C, scale, bias, mean, var) => (Y) {
        G = Gemm(A, B, C)
        Y = BatchNormalization<epsilon = @eps>(G, scale, bias, mean, var)
      }
    where:
      - dtype(A) == "float"
      - is_constant(B) and is_constant(C) and rank(C) == 1
      - is_constant(scale) and is_constant(bias) and is_constant(mean) and is_constant(var)
      # A NaN or an infinity folds into other values: the excluded-value cases try them.
      - all_finite(B) and all_finite(C) and all_finite(scale) and all_finite(bias)
      - all_finite(mean) and all_finite(var)
    target: |
      gemm_bn <eps> (A, B, C, scale, bias, mean, var) => (Y) {
        e = Constant<value_float: float = @eps>()
        v = Add(var, e)
        sd = Sqrt(v)
        f = Div(scale, sd)
        B2 = Mul(B, f)
        d = Sub(C, mean)
        d2 = Mul(d, f)
        C2 = Add(d2, bias)
        Y = Gemm(A, B2, C2)
      }
    verify:
      opsets: [15]
      dtypes: [float]
      dims: {M: 1..3, K: 1..4, N: 1..4}
      attributes: {eps: [1.0e-5]}
      node_attributes:
        G: {alpha: [1.0], beta: [1.0, 0.5, 2.0]}
      inputs:
        A: [M, K]
        B: {shape: [K, N], constant: true}
        C: {shape: [N], constant: true}
        scale: {shape: [N], constant: true}
        bias: {shape: [N], constant: true}
        mean: {shape: [N], constant: true}
        var: {shape: [N], constant: true, range: [0.5, 2.0], reason: variances are positive}
      special_values:
        inputs: [nan, inf, neg_zero, subnormal]
        constants: none
        reason: the fold reassociates products, which overflow at different points
"""


def test_catches_a_gemm_bn_fold_that_ignores_beta():
    rule = rules_from_text(GEMM_BN_IGNORING_BETA)[0]
    report = check_rule(rule, examples=30, negative=False, shrink_seconds=5)
    assert report.failure is not None, report.summary()
    assert report.failure.kind == "numerics"
    assert "beta=0.5" in report.failure.instance or "beta=2.0" in report.failure.instance


def test_accepts_the_same_fold_without_beta():
    text = GEMM_BN_IGNORING_BETA.replace("beta: [1.0, 0.5, 2.0]", "beta: [1.0]")
    report = check_rule(rules_from_text(text)[0], examples=15, shrink_seconds=5)
    assert report.ok, report.failure.format() if report.failure else report.error


def test_catches_a_relu_clip_rule_that_forgets_the_lower_bound():
    text = """\
rules:
  - name: relu-clip-wrong
    opset: {"": 11}
    source: |
      f (X, A, B) => (Y) {
        T = Relu(X)
        Y = Clip(T, A, B)
      }
    where: [is_constant(A) and is_constant(B)]
    target: |
      f (X, A, B) => (Y) {
        Y = Clip(X, A, B)
      }
    verify:
      opsets: [13]
      dtypes: [float]
      dims: {D: {rank: 1..2, each: 1..4}, a: "-2.0..0.5", b: "0.5..3.0"}
      inputs: {X: [D], A: {shape: [], value: a}, B: {shape: [], value: b}}
"""
    report = check_rule(rules_from_text(text)[0], examples=40, negative=False, shrink_seconds=5)
    assert report.failure is not None and report.failure.kind == "numerics"


def test_catches_a_rule_that_fires_on_a_declared_negative():
    # C is a graph input with a fixed value: a constant would also be drawn at ranks
    # that make this unguarded rule ill-typed, another failure.
    text = """\
rules:
  - name: add-zero-unguarded
    source: |
      f (X, C) => (Y) {
        Y = Add(X, C)
      }
    replacement: |
      f (X, C) => (Y) {
        Y = Identity(X)
      }
    verify:
      opsets: [17]
      dtypes: [float]
      dims: {D: {rank: 1..2, each: 2..3}}
      inputs: {X: [D], C: {shape: [1], value: 0.0, constant: false}}
      negatives:
        - {input: C, value: 1.0, reason: adding 1 is no identity}
"""
    report = check_rule(rules_from_text(text)[0], examples=30, shrink_seconds=5)
    assert report.failure is not None
    assert report.failure.kind == "fired-on-negative"
    assert report.failure.expect == "no-fire"


def test_an_unguarded_rule_that_changes_a_shape_fails_with_a_counterexample():
    # Without rank(C) <= rank(X), a C of shape [1, 1] broadcasts X[N] to [1, N]: the
    # rewrite would hand X's shape on. Drawn only with C at another rank than [1],
    # and only caught when the engine's block counts as the rule's failure.
    text = (
        MUL_ONE_RULE.lstrip("\n")
        + """\
    verify:
      dtypes: [float]
      dims: {D: {rank: 1..2, each: 1..4}}
      inputs: {X: [D], C: {shape: [1], value: 1.0}}
"""
    )
    rule = rules_from_text(text)[0]
    report = check_rule(rule, examples=50, shrink_seconds=5)
    assert report.failure is not None, report.summary()
    assert report.failure.kind == "ill-typed"
    assert "changes the shape of 'Y'" in report.failure.message
    guarded = text.replace("all_equal(C, 1.0)", "all_equal(C, 1.0) and rank(C) <= rank(X)")
    report = check_rule(rules_from_text(guarded)[0], examples=50, shrink_seconds=5)
    assert report.ok, report.failure.format() if report.failure else report.error


def test_pattern_outputs_feed_a_node_in_some_instances():
    rule = rule_with("""    verify: {dtypes: [float], inputs: {X: [3]}}""")
    outputs = set()
    for seed in range(8):
        spec = generate(rule, parse_domain(rule), RandomDrawer(seed)).spec
        outputs.add(tuple(spec.outputs))
        if spec.outputs == ["Y__use"]:
            assert [n.op_type for n in spec.nodes][-1] == "Identity"
    assert outputs == {("Y",), ("Y__use",)}


def test_constants_are_drawn_at_other_ranks_in_some_instances():
    rule = rules_from_text(MUL_BY_CONSTANT)[0]
    shapes = {
        generate(rule, parse_domain(rule), RandomDrawer(seed)).spec.tensors["C"].dims
        for seed in range(40)
    }
    assert (1, 3) in shapes and (3,) in shapes and ((1, 1, 3) in shapes or (1, 1, 1, 3) in shapes)


MUL_BY_CONSTANT = """
rules:
  - name: mul-by-constant
    source: |
      f (X, C) => (Y) {
        Y = Mul(X, C)
      }
    replacement: |
      f (X, C) => (Y) {
        Y = Mul(C, X)
      }
    verify:
      dtypes: [float]
      inputs: {X: [2, 3], C: {shape: [1, 3], constant: true}}
"""


def test_a_failing_negative_case_prints_the_instance_it_ran_and_saved():
    # The negative case changes the element type: the instance shown is the int8 one
    # its saved model holds, not the float instance it was derived from.
    rule = rule_with(
        """    verify:
      opsets: [17]
      dtypes: [float]
      inputs: {X: [3]}
      negatives:
        - {dtype: int8, reason: wrong since Relu runs int8 too}"""
    )
    report = check_rule(rule, examples=5, shrink_seconds=2)
    failure = report.failure
    assert failure is not None and failure.kind == "fired-on-negative", report.summary()
    assert failure.instance.startswith("opset 17; dtype int8"), failure.instance
    assert "X: input int8[3]" in failure.instance and "float" not in failure.instance
    assert failure.model.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.INT8


def test_a_domain_that_never_fires_fails_coverage():
    text = """\
rules:
  - name: never
    source: |
      f (X) => (Y) {
        T = Relu(X)
        Y = Relu(T)
      }
    where: [rank(X) > 10]
    target: |
      f (X) => (Y) {
        Y = Relu(X)
      }
    verify: {dtypes: [float], inputs: {X: [2]}}
"""
    report = check_rule(rules_from_text(text)[0], examples=10)
    assert report.error is not None
    assert "no firing instance" in report.error and "rank(X) > 10" in report.error


def test_counterexample_roundtrip(tmp_path):
    rule = rules_from_text(GEMM_BN_IGNORING_BETA)[0]
    report = check_rule(rule, examples=30, negative=False, shrink_seconds=2)
    assert report.failure is not None
    path, command = save_counterexample(report.failure, tmp_path, "rules.yaml", "cpu")
    assert path.exists() and path.stat().st_size < 10_000
    assert "\n" not in command and "--replay" in command and str(path) in command
    model, meta, feeds = load_counterexample(path)
    assert meta["rule"] == rule.name and meta["expect"] == "match"
    assert set(feeds) == {"A"}
    problem = replay(model, meta["expect"], feeds, rule, load_target("cpu"))
    assert problem is not None and "differ" in problem


def test_sampled_negatives_keep_declared_ones_and_cover_every_kind():
    kinds = ["extra-consumer"] * 60 + ["constant-literal"] * 40 + ["dtype"] * 5 + ["declared"] * 3
    mutations = [Mutation(kind, f"{kind} {i}", None, True) for i, kind in enumerate(kinds)]
    chosen = sample_mutations(mutations, 12, seed=5)
    assert len(chosen) == 12
    assert [m.kind for m in chosen].count("declared") == 3
    assert {m.kind for m in chosen} == set(kinds)
    assert len({m.description for m in chosen}) == 12
    assert chosen == sample_mutations(mutations, 12, seed=5)
    assert chosen != sample_mutations(mutations, 12, seed=6)
    assert sample_mutations(mutations[:10], 12, seed=5) == mutations[:10]


def test_a_range_without_a_reason_is_placed_at_its_line():
    text = relu_relu_rule("my-relu-relu") + (
        "    verify:\n"
        "      dtypes: [float]\n"
        "      inputs:\n"
        "        X: {shape: [2], range: [-1.0, 1.0]}\n"
    )
    with pytest.raises(VerifyError) as caught:
        parse_domain(rules_from_text(text)[0])
    assert (
        caught.value.line
        == text.splitlines().index("        X: {shape: [2], range: [-1.0, 1.0]}") + 1
    )


# A rule exact only inside [-2, 2]: on a graph input no guard sees the values.
CLIP_DROPPED = """\
rules:
  - name: clip-dropped
    source: |
      f (X) => (Y) {
        lo = Constant<value_float = -2.0>()
        hi = Constant<value_float = 2.0>()
        T = Clip(X, lo, hi)
        Y = Neg(T)
      }
    replacement: |
      f (X) => (Y) {
        Y = Neg(X)
      }
    verify:
      opsets: [13]
      dtypes: [float]
      inputs:
        X: {shape: [2, 3], range: [-2.0, 2.0], reason: the values the clip leaves alone}
        lo: {shape: []}
        hi: {shape: []}
"""

# The same mistake on a constant, which a guard could have looked at.
WEIGHT_CLIPPED = """\
rules:
  - name: weight-clipped
    source: |
      f (X, W) => (Y) {
        Y = Mul(X, W)
      }
    where: [is_constant(W)]
    replacement: |
      f (X, W) => (Y) {
        lo = Constant<value_float = -1.0>()
        hi = Constant<value_float = 1.0>()
        Wc = Clip(W, lo, hi)
        Y = Mul(X, Wc)
      }
    verify:
      opsets: [13]
      dtypes: [float]
      inputs:
        X: [3]
        W: {shape: [3], constant: true, range: [-1.0, 1.0], reason: weights the clip leaves alone}
"""


def test_values_a_range_excludes_from_a_graph_input_are_expected_failures_with_the_reason():
    report = check_rule(rules_from_text(CLIP_DROPPED)[0], examples=3, shrink_seconds=5)
    assert report.ok, report.failure.format() if report.failure else report.error
    cases = " ".join(report.expected_failures)
    assert "X (graph input) holds inf" in cases
    assert "X (graph input) holds values outside its range" in cases
    assert "the values the clip leaves alone" in cases
    assert "expected failure(s) on values the domain excludes" in report.summary()


def test_a_rule_that_fires_on_a_constant_its_range_excludes_and_changes_it_fails():
    report = check_rule(rules_from_text(WEIGHT_CLIPPED)[0], examples=3, shrink_seconds=5)
    assert report.failure is not None and report.failure.kind == "numerics"
    assert "constant holding values its domain excludes" in report.failure.message
    assert "weights the clip leaves alone" in report.failure.message
    assert report.failure.mutation is not None and "W (constant) holds" in report.failure.mutation
