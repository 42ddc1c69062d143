"""Element type names in rule files: ONNX's spelling, other names refused at load."""

from __future__ import annotations

import pytest
from helpers import make_model, optimize_proto, relu_relu_rule, rules_from_text, tensor_input
from onnx import TensorProto, helper

from onnxfuse.errors import RuleError

RULE = relu_relu_rule("typed")  # keys appended from line 12
X4 = [2, 3, 4, 5]


def load_error(extra: str) -> str:
    with pytest.raises(RuleError) as caught:
        rules_from_text(RULE + extra)
    return str(caught.value)


@pytest.mark.parametrize(
    ("guard", "literal", "suggestion"),
    [
        ("dtype(X) == 'float32'", "float32", "float"),
        ("dtype(X) != 'float64'", "float64", "double"),
        ("dtype(X) == 'flaot'", "flaot", "float"),
        ("'float32' == dtype(X)", "float32", "float"),
        ("dtype(X) in ('float', 'float16', 'float64')", "float64", "double"),
        ("dtype(X) not in ['bfloat16', 'doubel']", "doubel", "double"),
        ("rank(X) == 4 and (dtype(X), dtype(Y)) in (('float', 'float32'),)", "float32", "float"),
        ("all(dtype(v) == 'Float16' for v in (X, Y))", "Float16", "float16"),
    ],
)
def test_a_guard_comparing_dtype_with_another_name_is_refused(guard, literal, suggestion):
    text = guard.replace('"', '\\"')
    assert load_error(f'    where: "{text}"\n') == (
        f"test.yaml:12: where: in guard {guard!r}: "
        f"unknown element type '{literal}' (did you mean {suggestion}?)"
    )


def test_the_error_names_the_guard_s_own_line():
    message = load_error("    where:\n      - rank(X) == 4\n      - dtype(X) == 'float32'\n")
    assert message.startswith("test.yaml:14: where: in guard \"dtype(X) == 'float32'\"")


def test_dtype_name_and_let_values_are_checked_too():
    assert load_error("    where: dtype_name(3) == 'int8' or dtype_name(1) == 'float32'\n") == (
        "test.yaml:12: where: in guard \"dtype_name(3) == 'int8' or dtype_name(1) == 'float32'\": "
        "unknown element type 'float32' (did you mean float?)"
    )
    assert "unknown element type 'float64'" in load_error(
        "    let:\n      t: '1 if dtype(X) == \"float64\" else 0'\n"
    )


def test_onnx_names_load():
    guards = [
        "dtype(X) == 'float'",
        "dtype(X) in ('double', 'float16', 'bfloat16', 'int64', 'bool', 'string')",
        "dtype(X) != dtype(Y)",  # no literal
        "'float32' != 'float32x'",  # literals not compared with a dtype
    ]
    rules = rules_from_text(RULE + "    where:\n" + "".join(f'      - "{g}"\n' for g in guards))
    assert [g.text for g in rules[0].guards] == guards


def test_dtype_gives_onnx_names():
    rule = RULE + "    where: dtype(X) == 'double'\n"
    nodes = [helper.make_node("Relu", ["x"], ["t"]), helper.make_node("Relu", ["t"], ["y"])]
    for elem, expected in ((TensorProto.DOUBLE, 1), (TensorProto.FLOAT, 0)):
        model = make_model(nodes, [tensor_input("x", X4, elem)], [tensor_input("y", X4, elem)])
        report, _ = optimize_proto(model, rules_from_text(rule))
        assert report.rules["typed"].applied == expected


@pytest.mark.parametrize(
    ("verify", "line", "message"),
    [
        (
            "    verify: {dtypes: [float32], inputs: {X: [2]}}\n",
            12,
            "verify: dtypes: unknown element type 'float32' (did you mean float?)",
        ),
        (
            "    verify:\n      dtypes:\n        - float\n        - flaot\n",
            15,
            "verify: dtypes: unknown element type 'flaot' (did you mean float?)",
        ),
        (
            "    verify:\n      dtypes: [float]\n      inputs:\n"
            "        X: {shape: [2], dtype: float64}\n",
            15,
            "verify: inputs.X.dtype: unknown element type 'float64' (did you mean double?)",
        ),
        (
            "    verify:\n      dtypes: [float]\n      negatives:\n"
            "        - {dtype: int64}\n        - {dtype: float64, reason: kernels}\n",
            16,
            "verify: negatives[1].dtype: unknown element type 'float64' (did you mean double?)",
        ),
        (
            "    verify:\n      dtypes: [float]\n      tolerance:\n"
            "        float32: {rtol: 1.0e-3}\n        reason: why\n",
            15,
            "verify: tolerance: unknown element type 'float32' (did you mean float?)",
        ),
    ],
)
def test_a_verify_domain_naming_another_type_is_refused_at_load(verify, line, message):
    assert load_error(verify) == f"test.yaml:{line}: {message}"


def test_per_op_verify_is_checked():
    text = (
        RULE.replace("T = Relu(X)", "T = Op(X)")
        + "    ops: {Op: [Relu, Sigmoid]}\n"
        + "    per_op: {Sigmoid: {verify: {dtypes: [float32]}}}\n"
    )
    with pytest.raises(RuleError, match=r"unknown element type 'float32' \(did you mean float\?\)"):
        rules_from_text(text)
