"""Capability files: the committed ones match their sources; loading, limits, gating facts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from onnxfuse.errors import OnnxfuseError
from onnxfuse.targets.capabilities import (
    Limits,
    builtin_target_names,
    builtin_targets_dir,
    load_target,
)
from onnxfuse.targets.facts import NodeFacts, ValueFacts
from onnxfuse.targets.generator.generate import GENERATED_BY, all_targets, dump, onnx_target
from onnxfuse.targets.generator.sources import PROVIDERS, SOURCES, builder_range, short_type

REPO = Path(__file__).resolve().parents[2]
NEW_TARGETS = [p.name for p in PROVIDERS]


def test_cpu_target_agrees_with_the_installed_onnxruntime(generated):
    """Its kernel registry, and the function ops its sessions inline (test_targets_functions)."""
    committed = (builtin_targets_dir() / "cpu.yaml").read_text(encoding="utf-8")
    assert committed == generated["cpu"], f"regenerate with: {GENERATED_BY}"


def test_onnx_target_is_generated():
    committed = yaml.safe_load((builtin_targets_dir() / "onnx.yaml").read_text())
    assert committed == onnx_target()


@pytest.fixture(scope="module")
def generated() -> dict[str, str]:
    return {t["name"]: dump(t) for t in all_targets()}


@pytest.mark.parametrize("name", NEW_TARGETS)
def test_committed_target_is_what_the_generator_writes(name, generated):
    committed = (builtin_targets_dir() / f"{name}.yaml").read_text(encoding="utf-8")
    assert committed == generated[name], f"regenerate with: {GENERATED_BY}"


def test_every_builtin_target_is_present():
    assert set(builtin_target_names()) == {"cpu", "onnx", *NEW_TARGETS}
    assert len(NEW_TARGETS) == 10  # with cpu and onnx: the twelve targets


def test_sources_are_in_the_repository_with_their_provenance():
    provenance = (SOURCES / "PROVENANCE.md").read_text(encoding="utf-8")
    for provider in PROVIDERS:
        source = json.loads((SOURCES / f"{provider.file}.json").read_text(encoding="utf-8"))
        assert source["provider"] == provider.file
        assert provider.file in provenance
    assert (SOURCES / "fused_ops_matrix.txt").exists()


def _matrix() -> dict[str, dict[str, list[str]]]:
    """fused_ops_matrix.txt: provider -> supported fused op -> domains."""
    rows: dict[str, dict[str, list[str]]] = {}
    for line in (SOURCES / "fused_ops_matrix.txt").read_text().splitlines():
        if "|" not in line:
            continue
        provider, listed = (part.strip() for part in line.split("|", 1))
        rows[provider] = {}
        for item in filter(None, (i.strip() for i in listed.split(","))):
            op, domains = item.split(":")
            rows[provider][op] = ["" if d == "ai.onnx" else d for d in domains.split("/")]
    return rows


@pytest.mark.parametrize("name", NEW_TARGETS)
def test_fused_ops_agree_with_the_reference_matrix(name):
    """Which fused ops each target lists is what the reference's own matrix says."""
    provider = next(p for p in PROVIDERS if p.name == name).file
    supported = _matrix()[provider]
    target = load_target(name)
    fused = {op for ops in _matrix().values() for op in ops} | {
        "FusedConv",
        "FusedGemm",
        "SkipLayerNormalization",
        "BiasGelu",
        "FastGelu",
    }
    for op in sorted(fused):
        for domain in ("", "com.microsoft"):
            listed = (domain, op) in target.ops
            expected = domain in supported.get(op, [])
            assert listed == expected, f"{name}: {domain or 'ai.onnx'}::{op}"


def test_cpu_lists_what_the_matrix_lists():
    target = load_target("cpu")
    for op, domains in _matrix()["CPUExecutionProvider"].items():
        for domain in domains:
            assert (domain, op) in target.ops, f"{domain}::{op}"


@pytest.mark.parametrize(
    ("target", "domain", "op", "opset", "expected"),
    [
        ("cpu", "", "Conv", 17, True),
        ("cpu", "com.microsoft", "FusedConv", 1, True),
        ("cpu", "", "Conv", 0, False),
        ("cpu", "vendor", "Magic", 1, False),
        ("onnx", "", "Relu", 17, True),
        ("onnx", "", "Gelu", 17, False),  # a standard op only from opset 20
        ("onnx", "", "Gelu", 20, True),
        ("onnx", "", "Anything", 17, False),
        ("onnx", "com.microsoft", "FusedConv", 1, False),
        ("coreml", "", "LayerNormalization", 17, True),
        ("coreml", "com.microsoft", "SkipLayerNormalization", 1, False),
        ("coreml", "", "Pad", 17, False),  # NeuralNetwork-only builder
        ("nnapi", "", "LayerNormalization", 17, False),
        ("qnn", "com.microsoft", "Gelu", 1, False),  # op-type lookup means ai.onnx only
        ("qnn", "", "Gelu", 20, True),
        ("tensorrt", "", "Relu", 20, True),
        ("tensorrt", "", "Relu", 21, False),  # the parser's models: opset 9 to 20
        ("tensorrt", "", "Relu", 8, False),
        ("webnn", "com.microsoft", "SkipSimplifiedLayerNormalization", 1, True),
        ("webnn", "com.microsoft", "SkipLayerNormalization", 1, False),
    ],
)
def test_supports(target, domain, op, opset, expected):
    assert load_target(target).supports(domain, op, opset) is expected


def test_builder_opsets_are_the_model_opsets_of_the_schema_versions_in_range():
    # Reshape: schema versions 1, 5, 13, 14, 19, 21, ... ; a builder for [5, 13]
    # runs models of opset 5 to 13 (opset 14 resolves to Reshape-14).
    assert builder_range("", "Reshape", 5, 13) == (5, 13)
    # Gelu exists from opset 20: a builder minimum of 6 means 20.
    assert builder_range("", "Gelu", 6, 25) == (20, None)
    assert builder_range("", "Relu", 30, 40) is None


@pytest.mark.parametrize(
    ("raw", "short"),
    [
        ("tensor(float)", "float"),
        ("tensor(uint8_t)", "uint8"),
        ("tensor(MLFloat16)", "float16"),
        ("INF64", "int64"),
        ("seq(tensor(float))", "seq(tensor(float))"),
        ("map(int64,tensor(float))", "map(int64,float)"),
    ],
)
def test_source_type_spellings(raw, short):
    assert short_type(raw) == short


def test_kernel_types_the_schema_rejects_are_dropped():
    # onnxruntime registers a double CPU kernel for SkipLayerNormalization, but the
    # op's schema allows float, float16 and bfloat16 only: a double node fails to load.
    (entry,) = load_target("cpu").ops[("com.microsoft", "SkipLayerNormalization")]
    assert "double" not in entry.types["T"] and "float" in entry.types["T"]


def test_builder_types_are_keyed_by_the_schema_type_variable():
    # The sources write `T`; Cast's input is T1, QuantizeLinear's uint8 is its output T2.
    (cast,) = load_target("nnapi").ops[("", "Cast")]
    assert cast.types == {"T1": ["float"]}
    (quantize,) = load_target("nnapi").ops[("", "QuantizeLinear")]
    assert quantize.types == {"T2": ["uint8"]}


def test_limits_from_the_sources_words():
    (conv,) = load_target("coreml").ops[("", "Conv")]
    assert conv.limits.spatial_dims == (1, 2) and conv.limits.input_constant == (2,)
    assert "bias must be constant" in conv.notes
    (gemm,) = load_target("coreml").ops[("", "Gemm")]
    assert dict(gemm.limits.attributes)["transA"] == (0,)
    assert all(s.limits.max_rank == 4 for ops in load_target("nnapi").ops.values() for s in ops)


def _node(op="Conv", inputs=(), outputs=(), attributes=None, domain="", opset=17):
    return NodeFacts(domain, op, opset, list(inputs), list(outputs), dict(attributes or {}))


def test_limits_check_known_facts_only():
    limits = Limits(
        max_rank=4,
        input_rank=((0, (3, 4)),),
        input_constant=(1, 2),
        attributes=(("transA", (0,)), ("alpha", (1.0,))),
        max_outputs=1,
    )
    x4, w = ValueFacts("float", 4), ValueFacts("float", 4, constant=True)
    assert limits.violation(_node("Gemm", [x4, w, None], [x4])) is None
    assert "rank 5" in limits.violation(_node("Gemm", [ValueFacts("float", 5), w], [x4]))
    assert "input 1 is not a constant" in limits.violation(
        _node("Gemm", [x4, ValueFacts("float", 2)], [x4])
    )
    assert "transA" in limits.violation(_node("Gemm", [x4, w], [x4], {"transA": 1}))
    # alpha is stored as float32: 1.0 written as a float32 still matches
    assert limits.violation(_node("Gemm", [x4, w], [x4], {"alpha": 1.0000000001})) is None
    assert limits.violation(_node("Gemm", [ValueFacts(), w], [ValueFacts()])) is None
    assert "outputs" in limits.violation(_node("Gemm", [x4, w], [x4, x4]))


def test_absent_attributes_take_the_schema_default():
    limits = Limits(attributes=(("transA", (0,)), ("output_shape", (None,))))
    x = ValueFacts("float", 2)
    assert limits.violation(_node("Gemm", [x, x], [x])) is None  # transA defaults to 0
    assert limits.violation(_node("ConvTranspose", [x, x], [x], {"output_shape": [4]}))


def test_dtype_gating_per_type_variable():
    cpu, cuda = load_target("cpu"), load_target("cuda")
    half = ValueFacts("float16", 4)
    gelu = _node("Gelu", [half], [half], domain="com.microsoft", opset=1)
    assert "T=float16" in cpu.check_node(gelu)
    assert cuda.check_node(gelu) is None
    unknown = _node("Gelu", [ValueFacts()], [ValueFacts()], domain="com.microsoft", opset=1)
    assert cpu.check_node(unknown) is None  # unknown type: opset-only gating


def test_the_onnx_target_checks_the_standard_schema_types():
    onnx_target_ = load_target("onnx")
    ints = ValueFacts("int64", 2)
    assert onnx_target_.check_node(_node("Relu", [ints], [ints])) is None
    assert "T=string" in onnx_target_.check_node(
        _node("Relu", [ValueFacts("string", 2)], [ValueFacts("string", 2)])
    )


def test_unknown_target_is_a_clear_error():
    with pytest.raises(OnnxfuseError, match="unknown target 'nope'"):
        load_target("nope")


def test_a_vendor_target_file(tmp_path):
    path = tmp_path / "npu.yaml"
    path.write_text(
        "name: npu\nops:\n- {domain: '', op: Relu, since: 6, until: null}\n"
        "- {domain: acme, op: FusedThing, since: 1, types: {T: [float]},\n"
        "   signature: {inputs: [T], outputs: [T]}}\n"
    )
    target = load_target(str(path))
    assert target.supports("", "Relu", 17)
    assert target.supports("acme", "FusedThing", 1)
    assert not target.supports("", "Conv", 17)
    half = ValueFacts("float16", 2)
    assert "T=float16" in target.check_node(_node("FusedThing", [half], [half], domain="acme"))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("name: bad\nops:\n- {since: 1}\n", r"bad.yaml:3: an op entry needs 'op'"),
        ("name: bad\nop:\n- {op: Relu}\n", r"bad.yaml:3: unknown key 'op'"),
        ("name: bad\nops:\n- op: Relu\n  since: x\n", r"bad.yaml:3: op 'Relu': 'since'"),
        ("name: bad\nops:\n- op: Relu\n  colour: red\n", r"bad.yaml:4: op 'Relu': unknown key"),
        (
            "name: bad\nops:\n- op: Relu\n  limits: {max_rnk: 4}\n",
            r"bad.yaml:4: op 'Relu' limits: unknown limit 'max_rnk'",
        ),
        (
            "name: bad\nops:\n- op: Relu\n  limits: {input_rank: {0: 4}}\n",
            r"bad.yaml:4: op 'Relu' limits: 'input_rank' must be",
        ),
        ("name: bad\nops:\n- op: Relu\n  types: {T: float}\n", r"bad.yaml:4: op 'Relu': 'types'"),
        ("name: bad\nops: [\n", r"bad.yaml:\d+: malformed YAML"),
        ("- just a list\n", r"bad.yaml:1: a target file is a mapping"),
    ],
)
def test_malformed_target_file(tmp_path, text, message):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    load_target.cache_clear()
    with pytest.raises(OnnxfuseError, match=message):
        load_target(str(path))


# -- element type names -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("types", "line", "message"),
    [
        ("T: [float32]", 6, "unknown element type 'float32' (did you mean float?)"),
        ("T: [float, float64]", 6, "unknown element type 'float64' (did you mean double?)"),
        ("T: [flaot]", 6, "unknown element type 'flaot' (did you mean float?)"),
        ("T: [float16]\n    T1: [FLOAT]", 7, "unknown element type 'FLOAT' (did you mean float?)"),
        ("T: [tensor(float)]", 6, "unknown element type 'tensor(float)' (did you mean float?)"),
        ("T: ['seq(tensor(float32))']", 6, "unknown element type 'float32' (did you mean float?)"),
        ("T: ['map(int64,flaot)']", 6, "unknown element type 'flaot' (did you mean float?)"),
        ("T:\n    - float\n    - unit8", 8, "unknown element type 'unit8' (did you mean uint8?)"),
    ],
)
def test_a_type_onnx_does_not_name_is_refused_with_its_line(tmp_path, types, line, message):
    path = tmp_path / "x.yaml"
    path.write_text(f"name: x\nops:\n- domain: ''\n  op: Relu\n  types:\n    {types}\n  since: 6\n")
    load_target.cache_clear()
    with pytest.raises(OnnxfuseError) as caught:
        load_target(str(path))
    assert str(caught.value) == f"{path}:{line}: {message}"


def test_unknown_element_type_without_a_near_name_lists_the_names(tmp_path):
    path = tmp_path / "x.yaml"
    path.write_text("name: x\nops:\n- {op: Relu, types: {T: [qwerty]}}\n")
    load_target.cache_clear()
    with pytest.raises(OnnxfuseError) as caught:
        load_target(str(path))
    assert str(caught.value).startswith(
        f"{path}:3: unknown element type 'qwerty' (ONNX's names: float, uint8, int8,"
    )


def test_containers_of_element_types_load(tmp_path):
    path = tmp_path / "x.yaml"
    path.write_text(
        "name: x\nops:\n- op: SequenceAt\n  types:\n"
        "    S: ['seq(tensor(float))', 'seq(tensor(bfloat16))', 'optional(seq(tensor(int8)))']\n"
        "    T: ['map(int64,float)', 'seq(map(string,float))', 'sparse_tensor(double)']\n"
        "    I: [int32, int64, float8e4m3fn, string, bool]\n"
    )
    load_target.cache_clear()
    assert load_target(str(path)).ops[("", "SequenceAt")][0].types["I"][-1] == "bool"
