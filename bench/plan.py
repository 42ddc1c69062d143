"""Arena sizes per strategy on real models, side by side in one run.

    python bench/plan.py [--write-docs] [MODEL.onnx ...]

Models: the onnx package's `light` models, every model in engine/data/ (the
sample model and any transformer exports placed there), a hand-built BERT-style
encoder (symbolic batch and sequence dims, bound to 1 x 128), and any models
named on the command line. For each model and configuration it reports
arena / lower bound, arena / naive, arena / ort-policy; for the best
configuration it runs the checker against the model and verifies the plan by
running the model inside the arena. `--write-docs` puts the table into
docs/planner.md between the bench markers.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
from onnx import TensorProto, helper, numpy_helper

from onnxfuse.files.model_io import load_model
from onnxfuse.planner import check_plan, plan_model, verify_plan

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs" / "planner.md"
BEGIN, END = "<!-- bench:plan begin -->", "<!-- bench:plan end -->"

# (label, strategy, in-place, memory-aware schedule)
CONFIGS = [
    ("greedy-size", "greedy-size", False, False),
    ("greedy-size+inplace", "greedy-size", True, False),
    ("search+inplace", "search", True, False),
    ("search+inplace+schedule", "search", True, True),
]


def bench_models(extra: list[str]) -> list[tuple[str, ir.Model, dict[str, int]]]:
    models = []
    light = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
    for path in sorted(light.glob("*.onnx")):
        models.append((path.stem.removeprefix("light_"), load_model(path), {}))
    data = sorted((ROOT / "engine" / "data").glob("*.onnx"))
    if not any(p.name == "sample_resnet.onnx" for p in data):
        print("engine/data/sample_resnet.onnx not found: skipped", file=sys.stderr)
    for path in data + [Path(p) for p in extra]:
        models.append((path.stem, load_model(path), {}))
    models.append(("bert-style encoder (built)", build_encoder(), {"batch": 1, "seq": 128}))
    return models


def build_encoder(
    layers: int = 4, hidden: int = 256, heads: int = 4, ffn: int = 1024, vocab: int = 1000
) -> ir.Model:
    """A BERT-style encoder as exporters write it: MatMul+Add, Reshape/Transpose heads,
    masked Softmax attention, erf-GELU, LayerNormalization; seeded random weights."""
    rng = np.random.default_rng(0)
    inits: list[TensorProto] = []
    nodes: list[onnx.NodeProto] = []

    def weight(name: str, *shape: int) -> str:
        inits.append(numpy_helper.from_array(rng.normal(0, 0.05, shape).astype(np.float32), name))
        return name

    def const(name: str, value: np.ndarray) -> str:
        inits.append(numpy_helper.from_array(value, name))
        return name

    def node(op: str, inputs: list[str], out: str, **attrs) -> str:
        nodes.append(helper.make_node(op, inputs, [out], name=out, **attrs))
        return out

    def dense(x: str, name: str, n_in: int, n_out: int) -> str:
        y = node("MatMul", [x, weight(f"{name}.w", n_in, n_out)], f"{name}.mm")
        return node("Add", [y, weight(f"{name}.b", n_out)], f"{name}.out")

    def layer_norm(x: str, name: str) -> str:
        g = const(f"{name}.g", (1 + rng.normal(0, 0.05, hidden)).astype(np.float32))
        return node("LayerNormalization", [x, g, weight(f"{name}.b", hidden)], name, axis=-1)

    dh = hidden // heads
    heads_shape = const("heads_shape", np.array([0, 0, heads, dh], np.int64))
    merged_shape = const("merged_shape", np.array([0, 0, hidden], np.int64))
    emb = node("Gather", [weight("embed", vocab, hidden), "input_ids"], "emb")
    x = layer_norm(node("Add", [emb, weight("pos", 128, hidden)], "emb_pos"), "emb_ln")
    mask = node("Unsqueeze", ["attention_mask", const("axes", np.array([1, 2], np.int64))], "m4")
    inverted = node("Sub", [const("one", np.array(1, np.float32)), mask], "m_inv")
    bias = node("Mul", [inverted, const("neg", np.array(-1e4, np.float32))], "m_bias")
    for i in range(layers):
        p = f"l{i}"
        split = {}
        for part, perm in (("q", [0, 2, 1, 3]), ("k", [0, 2, 3, 1]), ("v", [0, 2, 1, 3])):
            y = node(
                "Reshape", [dense(x, f"{p}.{part}", hidden, hidden), heads_shape], f"{p}.{part}4"
            )
            split[part] = node("Transpose", [y], f"{p}.{part}t", perm=perm)
        scores = node("MatMul", [split["q"], split["k"]], f"{p}.scores")
        scale = const(f"{p}.scale", np.array(1 / np.sqrt(dh), np.float32))
        scaled = node("Add", [node("Mul", [scores, scale], f"{p}.scaled"), bias], f"{p}.masked")
        probs = node("Softmax", [scaled], f"{p}.probs", axis=-1)
        ctx = node("MatMul", [probs, split["v"]], f"{p}.ctx")
        ctx = node("Transpose", [ctx], f"{p}.ctxt", perm=[0, 2, 1, 3])
        ctx = node("Reshape", [ctx, merged_shape], f"{p}.ctx3")
        attn = dense(ctx, f"{p}.o", hidden, hidden)
        x = layer_norm(node("Add", [x, attn], f"{p}.res1"), f"{p}.ln1")
        f = dense(x, f"{p}.ff1", hidden, ffn)
        erf = node(
            "Erf",
            [node("Mul", [f, const(f"{p}.rs2", np.array(0.70710677, np.float32))], f"{p}.fs")],
            f"{p}.erf",
        )
        gate = node("Add", [erf, const(f"{p}.one", np.array(1, np.float32))], f"{p}.gate")
        half = node("Mul", [f, const(f"{p}.half", np.array(0.5, np.float32))], f"{p}.half_x")
        gelu = node("Mul", [half, gate], f"{p}.gelu")
        out = dense(gelu, f"{p}.ff2", ffn, hidden)
        x = layer_norm(node("Add", [x, out], f"{p}.res2"), f"{p}.ln2")
    nodes.append(helper.make_node("Identity", [x], ["last_hidden_state"], name="output"))
    graph = helper.make_graph(
        nodes,
        "encoder",
        [
            helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"]),
            helper.make_tensor_value_info("attention_mask", TensorProto.FLOAT, ["batch", "seq"]),
        ],
        [
            helper.make_tensor_value_info(
                "last_hidden_state", TensorProto.FLOAT, ["batch", "seq", hidden]
            )
        ],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model, full_check=True)
    return ir.from_proto(model)


def bench_one(name: str, model: ir.Model, dims: dict[str, int]) -> tuple[list[str], dict]:
    """Table rows for one model, and a summary of its best plan."""
    rows, best = [], None
    for label, strategy, inplace, schedule in CONFIGS:
        start = time.perf_counter()
        plan = plan_model(model, dims, strategy=strategy, inplace=inplace, schedule=schedule)
        seconds = time.perf_counter() - start
        rows.append(
            f"| {name} | {label} | {plan.arena_bytes:,} | {plan.lower_bound_bytes:,} "
            f"| {plan.arena_bytes / plan.lower_bound_bytes:.4f} "
            f"| {plan.arena_bytes / plan.naive_bytes:.4f} "
            f"| {plan.arena_bytes / plan.ort_policy_bytes:.4f} | {seconds:.2f} |"
        )
        # On a tie the later, stronger configuration is the one reported.
        if best is None or plan.arena_bytes <= best.arena_bytes:
            best = plan
    check_plan(best, model)
    result = verify_plan(model, best)
    summary = {
        "model": name,
        "tensors": len(best.tensors),
        "best": best,
        "within_5pct": best.arena_bytes <= 1.05 * best.lower_bound_bytes,
        "below_ort": best.arena_bytes < best.ort_policy_bytes,
        "verified": result.ok,
        "max_abs_diff": max(result.max_abs_diff.values(), default=0.0),
        "schedule_gain": best.graph_order_lower_bound_bytes / best.lower_bound_bytes,
    }
    return rows, summary


def render(rows: list[str], summaries: list[dict]) -> str:
    lines = [
        "| model | configuration | arena bytes | lower bound | arena/bound | arena/naive "
        "| arena/ort-policy | seconds |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
        *rows,
        "",
        "Best configuration per model (checked against the model, verified in the arena):",
        "",
        "| model | intermediates | best | arena/bound | arena/ort-policy | peak gain from "
        "scheduling | checker | verify (max abs diff) |",
        "|---|---:|---|---:|---:|---:|---|---|",
    ]
    for s in summaries:
        best = s["best"]
        config = f"{best.strategy}{'+inplace' if best.inplace else ''}"
        config += "+schedule" if best.schedule == "memory" else ""
        lines.append(
            f"| {s['model']} | {s['tensors']} | {config} "
            f"| {best.arena_bytes / best.lower_bound_bytes:.4f} "
            f"| {best.arena_bytes / best.ort_policy_bytes:.4f} | {s['schedule_gain']:.4f} "
            f"| pass | {'match' if s['verified'] else 'MISMATCH'} ({s['max_abs_diff']:.2g}) |"
        )
    return "\n".join(lines)


def _shortfall(summary: dict) -> str:
    best = summary["best"]
    return (
        f"{summary['model']} (arena/bound {best.arena_bytes / best.lower_bound_bytes:.4f}, "
        f"arena/ort {best.arena_bytes / best.ort_policy_bytes:.4f})"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", help="more models to bench")
    parser.add_argument("--write-docs", action="store_true", help="update docs/planner.md")
    args = parser.parse_args(argv)
    rows, summaries = [], []
    for name, model, dims in bench_models(args.models):
        model_rows, summary = bench_one(name, model, dims)
        rows += model_rows
        summaries.append(summary)
        print(f"{name}: done", file=sys.stderr)
    table = render(rows, summaries)
    print(table)
    failed = [_shortfall(s) for s in summaries if not (s["within_5pct"] and s["below_ort"])]
    failed += [f"{s['model']} (verify MISMATCH)" for s in summaries if not s["verified"]]
    if failed:
        print(f"\nNot within 5% of the bound and below ort-policy, or not verified: {failed}")
    if args.write_docs:
        text = DOCS.read_text()
        head, _, rest = text.partition(BEGIN)
        _, _, tail = rest.partition(END)
        DOCS.write_text(f"{head}{BEGIN}\n{table}\n{END}{tail}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
