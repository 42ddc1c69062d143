"""Transformer fusions (rules/ort/transformer.yaml, rules/onnx/*.yaml): fire, keep numerics."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from core_pack_support import as_arrays, build, node
from helpers import assert_close, optimize_proto, random_feeds, run

from onnxfuse.api import optimize_file, select_rules
from onnxfuse.language.packs import load_builtin_rules
from onnxfuse.optimizer import Options
from onnxfuse.targets import load_target

RULES = {rule.name: rule for rule in load_builtin_rules(["ort", "onnx"])}
F16, F32 = np.float16, np.float32
RNG = np.random.default_rng(11)
SQRT2 = float(np.sqrt(2.0))
DATA = Path(__file__).resolve().parents[1] / "data" / "ort-fusion"


def weights(*shape: int, dtype=F32) -> np.ndarray:
    return RNG.standard_normal(shape).astype(dtype)


def scalar(value: float, dtype=F32) -> np.ndarray:
    return np.array(value, dtype)


def domain_ops(model: onnx.ModelProto) -> list[str]:
    return [f"{n.domain}::{n.op_type}" if n.domain else n.op_type for n in model.graph.node]


def fires(model, names, *, target="cpu", rtol=None, atol=None, feeds=None):
    """The rules fire (the first at least once), the result is checked and agrees numerically."""
    names = [names] if isinstance(names, str) else list(names)
    report, result = optimize_proto(model, [RULES[n] for n in names], target=load_target(target))
    assert report.rules[names[0]].applied >= 1, f"{names[0]} did not fire"
    feeds = as_arrays(feeds if feeds is not None else random_feeds(model))
    actual, expected = run(result, feeds), run(model, feeds)
    if rtol is None:
        assert_close(actual, expected)
    else:
        for a, e in zip(actual, expected):
            np.testing.assert_allclose(a, e, rtol=rtol, atol=atol)
    return result


def does_not_fire(model, name, *, target="cpu"):
    report, result = optimize_proto(model, [RULES[name]], target=load_target(target))
    assert report.rules[name].applied == 0, f"{name} fired where it must not"
    assert len(result.graph.node) == len(model.graph.node)


# --------------------------------------------------------------------------- Gelu (erf)


def gelu_erf(
    form="half_first", scale="div", const=None, opset=17, shape=(2, 3, 8), extra_use=None
):
    """0.5 * x * (1 + erf(x / sqrt2)) in one of the exporters' operand orders."""
    if const is None:
        const = SQRT2 if scale == "div" else 1 / SQRT2
    inits = {"r2": scalar(const), "one": scalar(1.0), "half": scalar(0.5)}
    nodes = [
        node("Div" if scale == "div" else "Mul", ["x", "r2"], "s"),
        node("Erf", ["s"], "e"),
        node("Add", ["one", "e"], "a"),
    ]
    if form == "half_first":
        nodes += [node("Mul", ["half", "x"], "m"), node("Mul", ["m", "a"], "y")]
    elif form == "half_inner":
        nodes += [node("Mul", ["a", "half"], "m"), node("Mul", ["x", "m"], "y")]
    else:
        nodes += [node("Mul", ["x", "a"], "m"), node("Mul", ["m", "half"], "y")]
    outputs = ("y",)
    if extra_use:
        nodes.append(node("Neg", [extra_use], "z"))
        outputs = ("y", "z")
    return build(nodes, {"x": (list(shape), F32)}, outputs=outputs, inits=inits, opset=opset)


@pytest.mark.parametrize("form", ["half_first", "half_inner", "half_last"])
@pytest.mark.parametrize("scale", ["div", "mul"])
def test_gelu_erf_forms_fuse(form, scale):
    result = fires(gelu_erf(form, scale), "ort-gelu-erf")
    assert domain_ops(result) == ["com.microsoft::Gelu"]


@pytest.mark.parametrize(("scale", "const"), [("div", 1.4142), ("mul", 0.7071)])
def test_gelu_erf_rounded_constants_fuse(scale, const):
    # The model's rounded constant differs from sqrt(2) by ~1e-5 relative: so do the outputs.
    fires(gelu_erf(scale=scale, const=const), "ort-gelu-erf", rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(("scale", "const"), [("div", 1.5), ("mul", 0.5)])
def test_gelu_erf_wrong_constant_does_not_fuse(scale, const):
    does_not_fire(gelu_erf(scale=scale, const=const), "ort-gelu-erf")


@pytest.mark.parametrize("value", ["e", "a", "m"])
def test_gelu_erf_intermediate_used_elsewhere_does_not_fuse(value):
    does_not_fire(gelu_erf(extra_use=value), "ort-gelu-erf")


def test_gelu_erf_needs_a_target_with_com_microsoft_gelu():
    does_not_fire(gelu_erf(), "ort-gelu-erf", target="onnx")
