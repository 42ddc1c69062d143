"""Op-set families (`ops:`): one rule per member, each checked, gated and fired on its own."""

from __future__ import annotations

import onnx
import pytest
from helpers import assert_same_outputs, make_model, optimize_proto, rules_from_text, tensor_input
from onnx import TensorProto, helper
from rule_cases import X4, fired

OP_SET = """
rules:
  - name: t-unary
    description: An elementwise op commutes with a permutation.
    references: [math]
    ops:
      Op: [Relu, LeakyRelu, Cast, com.microsoft::Gelu]
    copy_attributes: {Y: Z}
    source: |
      f <perm> (X) => (Y) {
        T = Transpose<perm = @perm>(X)
        Y = Op(T)
      }
    target: |
      f <perm> (X) => (Y) {
        Z = Op(X)
        Y = Transpose<perm = @perm>(Z)
      }
"""


def _transposed(op: str, domain: str = "", opset: int = 17, **attributes) -> onnx.ModelProto:
    nodes = [
        helper.make_node("Transpose", ["x"], ["t"], name="tr", perm=[0, 2, 3, 1]),
        helper.make_node(op, ["t"], ["y"], name="op", domain=domain, **attributes),
    ]
    out_type = TensorProto.INT64 if op == "Cast" else TensorProto.FLOAT
    y = helper.make_tensor_value_info("y", out_type, [2, 4, 5, 3])
    extra = {domain: 1} if domain else None
    return make_model(nodes, [tensor_input("x", X4)], [y], opset=opset, extra_opsets=extra)


def test_op_set_expands_to_one_rule_per_member():
    rules = rules_from_text(OP_SET)
    assert [r.name for r in rules] == [
        "t-unary[Relu]",
        "t-unary[LeakyRelu]",
        "t-unary[Cast]",
        "t-unary[com.microsoft::Gelu]",
    ]
    gelu = rules[3]
    assert gelu.family == "t-unary" and gelu.op_bindings == {"Op": "com.microsoft::Gelu"}
    # The op-type index (could_match) and capability gating see the concrete op.
    assert gelu.anchor_keys == {("com.microsoft", "Gelu")}
    assert gelu.created_ops() == {("com.microsoft", "Gelu"), ("", "Transpose")}
    assert all(r.description and r.references == ["math"] for r in rules)


@pytest.mark.parametrize(
    ("op", "attributes"), [("Relu", {}), ("LeakyRelu", {"alpha": 0.3}), ("Cast", {"to": 7})]
)
def test_op_set_member_fires_and_keeps_its_attributes(op, attributes):
    model = _transposed(op, **attributes)
    report, result = optimize_proto(model, rules_from_text(OP_SET))
    assert fired(report, f"t-unary[{op}]") == 1
    assert sum(r.applied for r in report.rules.values()) == 1
    assert [n.op_type for n in result.graph.node] == [op, "Transpose"]
    moved = result.graph.node[0]
    assert {a.name: helper.get_attribute_value(a) for a in moved.attribute} == pytest.approx(
        attributes
    )
    assert_same_outputs(model, result)


def test_op_set_gates_each_member_on_the_target():
    from onnxfuse.targets.capabilities import load_target

    rules = rules_from_text(OP_SET)
    model = _transposed("Gelu", domain="com.microsoft")
    report, _ = optimize_proto(model, rules, target=load_target("onnx"))
    assert fired(report, "t-unary[com.microsoft::Gelu]") == 0
    report, _ = optimize_proto(model, rules, target=load_target("cpu"))
    assert fired(report, "t-unary[com.microsoft::Gelu]") == 1
    # The standard members still fire for the standard-only target.
    report, _ = optimize_proto(_transposed("Relu"), rules, target=load_target("onnx"))
    assert fired(report, "t-unary[Relu]") == 1


def test_op_set_per_op_keys_and_first_opset():
    text = OP_SET.replace("Op: [Relu, LeakyRelu, Cast, com.microsoft::Gelu]", "Op: [Relu, Gelu]")
    text += "    per_op:\n      Relu: {where: rank(X) == 3, opset: {'': [13, 16]}}\n"
    relu, gelu = rules_from_text(text)
    assert relu.opset == {"": (13, 16)} and len(relu.guards) == 1
    # Gelu exists from opset 20: its rule applies from there, without a guard of Relu's.
    assert gelu.opset == {"": (20, None)} and not gelu.guards
    report, _ = optimize_proto(_transposed("Relu"), [relu])
    assert fired(report, "t-unary[Relu]") == 0  # rank 4: the per-op guard refuses
    report, _ = optimize_proto(_transposed("Gelu", opset=20), [gelu])
    assert fired(report, "t-unary[Gelu]") == 1


@pytest.mark.parametrize(
    ("change", "line", "message"),
    [
        ((OP_SET_LINE := "      Op: [Relu, LeakyRelu, Cast, com.microsoft::Gelu]"), 6, None),
        ("      Op: [Relu, Rleu]", 7, "unknown op 'Rleu' in the set 'Op'"),
        ("      Op: [Relu, com.microsoft::NoSuchOp]", 7, "unknown op 'com.microsoft::NoSuchOp'"),
        ("      Op: []", 7, "'Op' must be a non-empty list of op types"),
        ("      Op: Relu", 7, "'Op' must be a non-empty list of op types"),
        ("      Op: [Relu, Relu]", 7, "'Relu' is listed twice"),
        ("      op: [Relu]", 7, "must be a name starting with a capital letter"),
        ("      Sigmoid: [Relu]", 7, "is the name of an ONNX op"),
        ("      Fn: [Relu]", 10, "op-type variable 'Fn' is not used as an op type"),
        (
            "      Op: [Relu, Sigmoid]\n    per_op: {Tanh: {where: 'True'}}",
            8,
            "'Tanh' is not a member",
        ),
        ("      Op: [Relu]\n    per_op: {Relu: {benefit: 3}}", 8, "'benefit' cannot differ"),
    ],
)
def test_op_set_errors_are_one_line_with_file_and_line(change, line, message):
    from onnxfuse.errors import RuleError

    text = OP_SET.replace(OP_SET_LINE, change)
    if message is None:  # the unchanged rule loads
        assert len(rules_from_text(text)) == 4
        return
    with pytest.raises(RuleError) as caught:
        rules_from_text(text, path="ops.yaml")
    assert str(caught.value).startswith(f"ops.yaml:{line}: ")
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_op_set_checks_each_member_against_its_schema():
    from onnxfuse.errors import RuleError

    text = OP_SET.replace("Y = Op(T)", "Y = Op<alpha: float = @a>(T)").replace(
        "<perm>", "<perm, a>"
    )
    text = text.replace("Op: [Relu, LeakyRelu, Cast, com.microsoft::Gelu]", "Op: [LeakyRelu, Relu]")
    with pytest.raises(RuleError, match=r"member \[Relu\]: source: Relu has no attribute 'alpha'"):
        rules_from_text(text)
    # Without copy_attributes a member's required attribute must be named (Cast's `to`).
    text = OP_SET.replace("    copy_attributes: {Y: Z}\n", "")
    with pytest.raises(RuleError, match=r"member \[Cast\]: .*required attribute 'to'"):
        rules_from_text(text)


def test_check_takes_an_op_set_family_name(tmp_path, capsys):
    from onnxfuse.cli.main import main

    verify = """    verify:
      dtypes: [float]
      dims: {p: {permutation: 3}}
      attributes: {perm: p}
      inputs: {X: [2, 3, 4]}
"""
    text = OP_SET.replace("[Relu, LeakyRelu, Cast, com.microsoft::Gelu]", "[Relu, Sigmoid]")
    path = tmp_path / "ops.yaml"
    path.write_text(text + verify)
    argv = ["check", str(path), "--rule", "t-unary", "--examples", "3", "--save-dir", str(tmp_path)]
    code = main(argv)
    out = capsys.readouterr().out
    assert code == 0, out
    assert "2 rule(s)" in out and "t-unary[Relu]" in out and "t-unary[Sigmoid]" in out
