"""Which fusions fire for each target, on a few models, side by side.

    python bench/targets_table.py [--write-docs] [MODEL.onnx ...]

Models: the bundled sample ResNet (`onnxfuse.sample_model`), a MobileNet-style
CNN built here (Conv + BatchNormalization + Clip(0, 6), depthwise Conv,
HardSigmoid, a residual Add + Relu, Gemm + Relu), the BERT-style encoder of
bench/plan.py (MatMul + Add, erf Gelu, LayerNormalization, attention),
torch exports of BERT and GPT-2 from tests/exports when torch is installed
(legacy exporter, opset 17), and any models named on the command line.

Every model is optimized with all built-in packs for every built-in target.
For each target the table gives the node count after optimizing and the rules
that fired (with how often). Results that use standard ops only are run in
onnxruntime's CPU provider against the original (float32 tolerance of the
tests); `cpu` results are run too. `--write-docs` puts the tables into
docs/targets.md between the bench markers.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from onnxfuse.api import sample_model_path, select_rules
from onnxfuse.files.model_io import check_model, load_model
from onnxfuse.passes.pipeline import Options, optimize
from onnxfuse.targets.capabilities import builtin_target_names, load_target

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs" / "targets.md"
BEGIN, END = "<!-- bench:targets begin -->", "<!-- bench:targets end -->"
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT))


def mobilenet_cnn() -> onnx.ModelProto:
    """A MobileNet-style CNN: Conv+BN+Clip(0,6), depthwise Conv, HardSigmoid gate,
    a residual Add + Relu, global pooling, Gemm + Relu, Gemm."""
    rng = np.random.default_rng(0)
    inits: list[TensorProto] = []
    nodes: list[onnx.NodeProto] = []

    def const(name: str, value: np.ndarray) -> str:
        inits.append(numpy_helper.from_array(np.asarray(value, np.float32), name))
        return name

    def node(op: str, inputs: list[str], out: str, **attrs) -> str:
        nodes.append(helper.make_node(op, inputs, [out], name=out, **attrs))
        return out

    def conv_bn(x: str, name: str, c_in: int, c_out: int, k: int, group: int = 1) -> str:
        w = const(f"{name}.w", rng.normal(0, 0.2, (c_out, c_in // group, k, k)))
        b = const(f"{name}.b", rng.normal(0, 0.1, c_out))
        conv = node("Conv", [x, w, b], f"{name}.conv", pads=[k // 2] * 4, group=group)
        stats = [
            const(f"{name}.{s}", v)
            for s, v in (
                ("scale", 1 + rng.normal(0, 0.1, c_out)),
                ("bias", rng.normal(0, 0.1, c_out)),
                ("mean", rng.normal(0, 0.1, c_out)),
                ("var", 1 + rng.random(c_out)),
            )
        ]
        return node("BatchNormalization", [conv, *stats], f"{name}.bn")

    def relu6(x: str, name: str) -> str:
        return node("Clip", [x, const(f"{name}.lo", 0.0), const(f"{name}.hi", 6.0)], name)

    x = relu6(conv_bn("input", "stem", 3, 16, 3), "stem.act")
    for i in range(2):
        dw = relu6(conv_bn(x, f"b{i}.dw", 16, 16, 3, group=16), f"b{i}.dw.act")
        pw = conv_bn(dw, f"b{i}.pw", 16, 16, 1)
        gate = node("HardSigmoid", [conv_bn(x, f"b{i}.se", 16, 16, 1)], f"b{i}.gate")
        mixed = node("Mul", [pw, gate], f"b{i}.mixed")
        x = node("Relu", [node("Add", [mixed, x], f"b{i}.res")], f"b{i}.out")
    pooled = node("Flatten", [node("GlobalAveragePool", [x], "pool")], "flat")
    hidden = node(
        "Relu",
        [
            node(
                "Gemm",
                [
                    pooled,
                    const("fc1.w", rng.normal(0, 0.2, (32, 16))),
                    const("fc1.b", np.zeros(32)),
                ],
                "fc1",
                transB=1,
            )
        ],
        "fc1.act",
    )
    logits = node(
        "Gemm",
        [hidden, const("fc2.w", rng.normal(0, 0.2, (32, 10))), const("fc2.b", np.zeros(10))],
        "logits",
    )
    graph = helper.make_graph(
        nodes,
        "mobilenet_style",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, 32, 32])],
        [helper.make_tensor_value_info(logits, TensorProto.FLOAT, [1, 10])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model, full_check=True)
    return model


Model = tuple[str, onnx.ModelProto, dict[str, int], dict[str, np.ndarray] | None]


def _exports() -> list[Model]:
    """A BERT and a GPT-2 torch export (tests/exports), when torch and the exporter are there."""
    try:
        from tests.exports.export import get_export  # type: ignore[import-not-found]
        from tests.exports.models import MODELS  # type: ignore[import-not-found]
    except Exception as exc:  # torch missing, or the export helpers changed
        print(f"tests/exports not used: {type(exc).__name__}: {exc}", file=sys.stderr)
        return []
    found: list[Model] = []
    for family in ("bert", "gpt2"):
        spec = next((s for s in MODELS if s.family == family), None)
        if spec is None:
            continue
        try:
            exported = get_export(spec, "legacy", 17)
        except Exception as exc:
            print(f"{spec.name}: not exported: {type(exc).__name__}: {exc}", file=sys.stderr)
            continue
        model = ir.serde.serialize_model(load_model(exported.path))
        found.append((f"{exported.name} (torch export)", model, {}, exported.feeds))
    return found


def bench_models(extra: list[str]) -> list[Model]:
    from plan import build_encoder

    encoder = ir.serde.serialize_model(build_encoder(layers=2))
    models: list[Model] = [
        ("sample ResNet", onnx.load(sample_model_path()), {}, None),
        ("MobileNet-style CNN", mobilenet_cnn(), {}, None),
        ("BERT-style encoder (built)", encoder, {"batch": 1, "seq": 128}, None),
    ]
    models += _exports()
    for path in extra:
        models.append((Path(path).stem, ir.serde.serialize_model(load_model(path)), {}, None))
    return models


def _feeds(model: onnx.ModelProto, dims: dict[str, int]) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    initializers = {i.name for i in model.graph.initializer}
    feeds = {}
    for value in model.graph.input:
        if value.name in initializers:
            continue
        tensor = value.type.tensor_type
        shape = [d.dim_value or dims.get(d.dim_param, 2) for d in tensor.shape.dim]
        dtype = helper.tensor_dtype_to_np_dtype(tensor.elem_type)
        if np.issubdtype(dtype, np.floating):
            feeds[value.name] = rng.standard_normal(shape).astype(dtype)
        else:
            feeds[value.name] = rng.integers(0, 4, shape).astype(dtype)
    return feeds


def _run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), options, ["CPUExecutionProvider"])
    return session.run(None, feeds)


def bench_one(model_entry: Model, rules, targets) -> dict:
    """For each target: node count after, rules fired, and whether the result ran the same."""
    name, model, dims, given = model_entry
    feeds = given if given is not None else _feeds(model, dims)
    expected = _run(model, feeds)
    row: dict = {"model": name, "before": len(model.graph.node), "targets": {}}
    for target in targets:
        result = ir.from_proto(model)
        report = optimize(result, rules, Options(target=target))
        check_model(result)
        fired = Counter({r: s.applied for r, s in report.rules.items() if s.applied})
        proto = ir.serde.serialize_model(result)
        standard = all(n.domain in ("", "ai.onnx") for n in proto.graph.node)
        verdict = "not run (needs the target's kernels)"
        if standard or target.name == "cpu":
            actual = _run(proto, feeds)
            close = all(
                np.allclose(a, e, rtol=1.3e-6, atol=1e-5, equal_nan=True)
                for a, e in zip(actual, expected)
            )
            verdict = "same outputs" if close else "MISMATCH"
        row["targets"][target.name] = {
            "after": report.nodes_after,
            "fired": fired,
            "verdict": verdict,
        }
    return row


def render(rows: list[dict], target_names: list[str]) -> str:
    header = "| target | " + " | ".join(f"{r['model']} ({r['before']})" for r in rows) + " |"
    lines = [
        "Nodes after optimizing (nodes before in the header):",
        "",
        header,
        "|---|" + "---:|" * len(rows),
    ]
    for name in target_names:
        counts = " | ".join(str(r["targets"][name]["after"]) for r in rows)
        lines.append(f"| `{name}` | {counts} |")
    for row in rows:
        lines += ["", f"Rules that fired on the {row['model']}:", ""]
        lines += ["| target | nodes | rules fired (times) | run on the CPU |", "|---|---:|---|---|"]
        for name in target_names:
            entry = row["targets"][name]
            fired = ", ".join(f"{r} ({n})" for r, n in sorted(entry["fired"].items())) or "none"
            lines.append(f"| `{name}` | {entry['after']} | {fired} | {entry['verdict']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", help="more models")
    parser.add_argument("--write-docs", action="store_true", help="update docs/targets.md")
    args = parser.parse_args(argv)
    names = builtin_target_names()
    targets = [load_target(n) for n in names]
    rules = select_rules()
    rows = []
    for entry in bench_models(args.models):
        rows.append(bench_one(entry, rules, targets))
        print(f"{entry[0]}: done", file=sys.stderr)
    table = render(rows, names)
    print(table)
    mismatches = [
        f"{r['model']} for {t}"
        for r in rows
        for t, e in r["targets"].items()
        if e["verdict"] == "MISMATCH"
    ]
    if mismatches:
        print(f"\nOutputs differ: {', '.join(mismatches)}")
    if args.write_docs:
        text = DOCS.read_text(encoding="utf-8")
        head, _, rest = text.partition(BEGIN)
        _, _, tail = rest.partition(END)
        DOCS.write_text(f"{head}{BEGIN}\n{table}\n{END}{tail}", encoding="utf-8")
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
