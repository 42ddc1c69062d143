"""Decoders with a KV cache: onnxfuse and its peers beside onnxruntime-genai's model builder.

    python bench/llm.py [--families NAME ...] [--exporters dynamo legacy] [--runs N]
                        [--warmup W] [--no-int4] [--json FILE] [--markdown [FILE]]

For each tiny decoder family of tests/exports (CAUSAL_LM_MODELS: Llama, Qwen2, Phi-3, Mistral,
Gemma; hidden 256, 4 layers, 4 heads sharing 2 KV heads, seeded random weights), the model is
exported with its KV cache as plain tensors (past_key_values.{i}.key/value in,
present.{i}.key/value out) by the dynamo exporter (opset 18) and the legacy one (opset 17),
cached like the test set's exports. The same weights, saved as a HuggingFace folder, go
through onnxruntime-genai's builder (`onnxruntime_genai.models.builder`, fp32 CPU, and int4
CPU unless --no-int4): the reference, written by hand for onnxruntime.

Each export is then optimized by

| tool             | what runs                                                             |
|------------------|-----------------------------------------------------------------------|
| onnxfuse         | every pack `--target cpu` selects (`onnxfuse optimize --target cpu`)  |
| ort-transformers | `onnxruntime.transformers.optimizer.optimize_model`, model type gpt2, |
|                  | opt_level 1 and 99, the valid one with fewer nodes                    |
| onnxscript       | `onnxscript.optimizer.optimize`, then `ort_fusions.optimize_for_ort`  |

(tests/exports/anchors.py runs them). A result counts when onnxruntime runs it and its
outputs equal the export's on the export's own inputs (2 sequences, one left-padded, past 8),
at 1e-4 relative; one that does not is reported and not timed. The builder's model is
checked against the export on one unpadded sequence (its GroupQueryAttention assumes that
padding, if any, is on the right and takes no batch above 1 with a past when prefilling).

Latency: onnxruntime CPU, ORT_ENABLE_ALL, 1 thread; decode = 1 token with a past of 32,
prefill = 32 tokens with no past, batch 1. All models of one family run in one process,
alternating (tests/exports/anchors.py's round_robin): W warm-up runs each, then N rounds.
The table shows medians and the ratio to the builder's fp32 model (below 1: faster).
A tool that cannot run is skipped with its one-line reason. `--markdown` writes the tables
as the "Decoders with a KV cache" section of docs/parity.md (bench/parity.py keeps it).
"""

from __future__ import annotations

import argparse
import collections
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

import numpy as np  # noqa: E402
import onnx  # noqa: E402
import onnxruntime as ort  # noqa: E402
from environment import environment as environment_record  # noqa: E402
from exports.anchors import compare, count_nodes, quiet, round_robin, worst_error  # noqa: E402
from fusion_speed import session  # noqa: E402
from quantized import write_section  # noqa: E402

EXPORTERS = (("dynamo", 18), ("legacy", 17))
PEERS = ("ort-transformers", "onnxscript")
# The ops the builder writes, counted in every result.
FUSED_OPS = {
    "GQA": ("com.microsoft", "GroupQueryAttention"),
    "MHA": ("com.microsoft", "MultiHeadAttention"),
    "Rotary": ("com.microsoft", "RotaryEmbedding"),
    "SkipSLN": ("com.microsoft", "SkipSimplifiedLayerNormalization"),
    "NBits": ("com.microsoft", "MatMulNBits"),
}
WEIGHT_MATMULS = ("MatMul", "FusedMatMul", "Gemm", "MatMulNBits")
DECODE_PAST, PREFILL = 32, 32


@dataclass
class Model:
    """One model of the comparison: its file, what is in it, and how it ran."""

    family: str
    source: str  # dynamo18, legacy17, builder
    tool: str  # export, onnxfuse, ort-transformers, onnxscript, fp32, int4
    path: Path | None = None
    nodes: int | None = None
    weight_matmuls: int | None = None
    fused: dict[str, int] = field(default_factory=dict)
    error: str | None = None  # it failed or computes something else: not timed
    note: str = ""  # what to know about a model that is timed
    decode_ms: float | None = None
    prefill_ms: float | None = None

    @property
    def label(self) -> str:
        return f"{self.family}/{self.source}/{self.tool}"


def describe(model: Model) -> None:
    """Node count, weight MatMuls (a MatMul-like node with a constant weight) and fused ops."""
    assert model.path is not None
    graph = onnx.load(model.path, load_external_data=False).graph
    model.nodes = count_nodes(graph)
    constants = {i.name for i in graph.initializer}
    constants |= {o for n in graph.node if n.op_type == "Constant" for o in n.output}
    model.weight_matmuls = sum(
        1 for n in graph.node if n.op_type in WEIGHT_MATMULS and n.input[1] in constants
    )
    ops = collections.Counter((n.domain or "", n.op_type) for n in graph.node)
    model.fused = {short: ops[key] for short, key in FUSED_OPS.items() if ops[key]}


# --- the builder's reference models -----------------------------------------------------


def hf_folder(spec, folder: Path) -> None:
    """The spec's weights as a HuggingFace folder the builder reads, with a word-level
    tokenizer of the model's vocabulary (the builder copies a tokenizer; it is never used)."""
    from exports.models import build
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    built = build(spec)
    built.module.model.save_pretrained(folder)
    vocab = {f"t{i}": i for i in range(spec.config["vocab"])}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="t0"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, unk_token="t0", bos_token="t1", eos_token="t2"
    ).save_pretrained(folder)


def builder_model(spec, precision: str) -> Path:
    """The builder's model.onnx for the spec at `precision` (fp32, int4), cached by the spec."""
    from exports.export import cache_dir, cache_key

    out = cache_dir() / f"{spec.name}-builder-{precision}-{cache_key(spec, 'builder', 0)}"
    model_path = out / "model.onnx"
    if model_path.exists():
        return model_path
    if importlib.util.find_spec("onnxruntime_genai") is None:
        raise RuntimeError("skipped: onnxruntime-genai is not installed (pip install '.[llm]')")
    with tempfile.TemporaryDirectory(dir=cache_dir()) as tmp:
        folder, written = Path(tmp) / "hf", Path(tmp) / "out"
        with quiet():
            hf_folder(spec, folder)
        command = [sys.executable, "-m", "onnxruntime_genai.models.builder"]
        command += ["-i", str(folder), "-o", str(written), "-p", precision, "-e", "cpu"]
        command += ["-c", str(Path(tmp) / "cache")]
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0 or not (written / "model.onnx").exists():
            lines = (done.stderr or done.stdout).strip().splitlines()
            raise RuntimeError(f"the builder failed: {lines[-1] if lines else done.returncode}")
        os.replace(written, out)  # the folder appears whole, model and external data
    return model_path


# --- inputs ----------------------------------------------------------------------------------


def step_feeds(spec, seq: int, past: int) -> dict[str, np.ndarray]:
    """One unpadded sequence of `seq` new tokens after `past` cached ones."""
    from exports.models import causal_lm_inputs

    inputs = causal_lm_inputs(spec.config, batch=1, seq=seq, past=past)
    inputs["attention_mask"][:] = 1
    inputs["position_ids"] = inputs["attention_mask"].cumsum(-1)[:, past:] - 1
    return {k: v.numpy() for k, v in inputs.items()}


def _taken(sess: ort.InferenceSession, feeds: dict) -> dict:
    return {i.name: feeds[i.name] for i in sess.get_inputs()}


def _named_outputs(path: Path, feeds: dict) -> dict[str, np.ndarray]:
    sess = session(path)
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(None, _taken(sess, feeds))))


def check_builder(model: Model, export: Path, spec) -> None:
    """Which outputs of the builder's fp32 model differ from the export's (one sequence,
    past 8), by name: the builder orders its outputs otherwise. Its cost does not depend
    on the values, so a model that differs is still timed, with the difference noted."""
    assert model.path is not None
    feeds = step_feeds(spec, seq=4, past=8)
    want, got = _named_outputs(export, feeds), _named_outputs(model.path, feeds)
    differ = [n for n in want if n not in got or worst_error([got[n]], [want[n]]) > 1.0]
    if differ:
        worst = max(float(np.abs(got[n] - want[n]).max()) for n in differ if n in got)
        model.note = f"differs from the export in {', '.join(differ)} (max abs {worst:.3g})"


# --- one family --------------------------------------------------------------------------


def family_models(spec, exporters, int4: bool, work: Path) -> list[Model]:
    from exports.export import get_export

    from onnxfuse.api import select_rules

    family = spec.config["arch"]
    models: list[Model] = []
    first_export: Path | None = None
    for exporter, opset in exporters:
        source = f"{exporter}{opset}"
        try:
            with quiet():
                export = get_export(spec, exporter, opset)
        except Exception as exc:  # an exporter that cannot export this family is a result
            models.append(Model(family, source, "export", error=f"export failed: {_line(exc)}"))
            continue
        first_export = first_export or export.path
        original = Model(family, source, "export", export.path)
        describe(original)
        models.append(original)
        folder = work / f"{family}-{source}"
        folder.mkdir()
        results = compare(
            export.path,
            folder,
            spec.transformer,
            export.feeds,
            select_rules(target="cpu"),
            PEERS,
            ("cpu",),
        )
        for tool, result in results.items():
            name = "onnxfuse" if tool == "onnxfuse-cpu" else tool
            model = Model(family, source, name, result.path, error=result.error)
            if result.path is not None:
                describe(model)
            models.append(model)
    for precision in ("fp32", "int4") if int4 else ("fp32",):
        try:
            model = Model(family, "builder", precision, builder_model(spec, precision))
        except Exception as exc:
            models.append(Model(family, "builder", precision, error=_line(exc)))
            continue
        describe(model)
        if precision == "fp32" and first_export is not None:
            check_builder(model, first_export, spec)
        models.append(model)
    return models


def time_family(models: list[Model], spec, runs: int, warmup: int) -> None:
    """Decode and prefill medians of every model that runs, all alternating in one process."""
    sessions: dict[str, ort.InferenceSession] = {}
    for model in models:
        if model.error is None and model.path is not None:
            try:
                sessions[model.label] = session(model.path)
            except Exception as exc:
                model.error = f"does not load: {_line(exc)}"
    if not sessions:
        return
    by_label = {m.label: m for m in models}
    for phase, feeds in (
        ("decode", step_feeds(spec, seq=1, past=DECODE_PAST)),
        ("prefill", step_feeds(spec, seq=PREFILL, past=0)),
    ):
        times = round_robin(sessions, feeds, runs, warmup)
        for label, samples in times.items():
            setattr(by_label[label], f"{phase}_ms", statistics.median(samples))


def _line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:300]


# --- report ------------------------------------------------------------------------------


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _ratio(value: float | None, base: float | None) -> str:
    return "-" if value is None or not base else f"{value / base:.2f}"


HEADER = (
    "| family | model | tool | nodes | weight MatMuls | fused ops | decode ms | prefill ms "
    "| decode / builder | prefill / builder | note |"
)


def table(models: list[Model]) -> list[str]:
    lines = [HEADER, "|" + "---|" * 11]
    builders = {m.family: m for m in models if m.source == "builder" and m.tool == "fp32"}
    for m in models:
        base = builders.get(m.family)
        fused = ", ".join(f"{k} {v}" for k, v in m.fused.items())
        cells = [
            m.family,
            m.source,
            m.tool,
            "-" if m.nodes is None else str(m.nodes),
            "-" if m.weight_matmuls is None else str(m.weight_matmuls),
            fused,
            _ms(m.decode_ms),
            _ms(m.prefill_ms),
            _ratio(m.decode_ms, base.decode_ms if base else None),
            _ratio(m.prefill_ms, base.prefill_ms if base else None),
            (m.error or m.note).replace("|", "/"),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def summary(models: list[Model]) -> list[str]:
    """Per family and export: onnxfuse's and the best peer's ratio to the builder's fp32."""
    lines = [
        "| family | model | onnxfuse decode / builder | best peer decode / builder "
        "| onnxfuse prefill / builder | best peer prefill / builder |",
        "|---|---|---|---|---|---|",
    ]
    builders = {m.family: m for m in models if m.source == "builder" and m.tool == "fp32"}
    groups: dict[tuple[str, str], list[Model]] = collections.defaultdict(list)
    for m in models:
        if m.source != "builder":
            groups[(m.family, m.source)].append(m)
    for (family, source), group in groups.items():
        base = builders.get(family)
        fuse = next((m for m in group if m.tool == "onnxfuse"), None)
        peers = [m for m in group if m.tool in PEERS]
        best_decode = min((m.decode_ms for m in peers if m.decode_ms is not None), default=None)
        best_prefill = min((m.prefill_ms for m in peers if m.prefill_ms is not None), default=None)
        b_decode, b_prefill = (base.decode_ms, base.prefill_ms) if base else (None, None)
        lines.append(
            f"| {family} | {source} "
            f"| {_ratio(fuse.decode_ms if fuse else None, b_decode)} "
            f"| {_ratio(best_decode, b_decode)} "
            f"| {_ratio(fuse.prefill_ms if fuse else None, b_prefill)} "
            f"| {_ratio(best_prefill, b_prefill)} |"
        )
    return lines


SECTION = "## Decoders with a KV cache"


def section(models: list[Model], record: dict) -> list[str]:
    versions = record["versions"]
    return [
        SECTION,
        "",
        f"Generated by `{record['command']}` on {record['date']} (commit {record['commit']}, "
        f"{record['machine']}, onnxruntime {versions['onnxruntime']}, onnxruntime-genai "
        f"{versions['onnxruntime_genai']}, onnxscript {versions['onnxscript']}, torch "
        f"{versions['torch']}, transformers {versions['transformers']}).",
        "",
        "Tiny decoders (hidden 256, 4 layers, 4 heads sharing 2 KV heads, vocabulary 1000, "
        "seeded random weights) exported with their KV cache by the dynamo (opset 18) and "
        "the legacy (opset 17) exporter, optimized by each tool, beside onnxruntime-genai's "
        "model builder (fp32 and int4, CPU) on the same weights. `weight MatMuls`: "
        "MatMul-like nodes with a constant weight (29 unpacked: q, k, v, o, gate, up, down "
        "per layer and the LM head). Latency: onnxruntime CPU, ORT_ENABLE_ALL, 1 thread, "
        "median of the runs, every model of a family alternating in one process; decode = "
        f"1 token after a past of {DECODE_PAST}, prefill = {PREFILL} tokens, batch 1; "
        "ratios to the builder's fp32 model (below 1: faster). The machine's 2 cores are "
        "shared: compare within a family. Method and tools: `bench/llm.py`.",
        "",
        *table(models),
        "",
        *summary(models),
        "",
    ]


def main(argv: list[str] | None = None) -> int:
    from exports.models import CAUSAL_LM_MODELS

    families = [spec.config["arch"] for spec in CAUSAL_LM_MODELS]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", nargs="+", choices=families, default=families)
    parser.add_argument("--exporters", nargs="+", choices=[e for e, _ in EXPORTERS])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--no-int4", action="store_true", help="skip the builder's int4 model")
    parser.add_argument("--json", type=Path)
    parser.add_argument(
        "--markdown",
        nargs="?",
        const=str(ROOT / "docs" / "parity.md"),
        help=f"write the tables as the '{SECTION[3:]}' section of docs/parity.md (or FILE)",
    )
    args = parser.parse_args(argv)
    exporters = [e for e in EXPORTERS if not args.exporters or e[0] in args.exporters]
    specs = [s for s in CAUSAL_LM_MODELS if s.config["arch"] in args.families]
    models: list[Model] = []
    with tempfile.TemporaryDirectory(prefix="onnxfuse-llm-") as tmp:
        for spec in specs:
            found = family_models(spec, exporters, not args.no_int4, Path(tmp))
            time_family(found, spec, args.runs, args.warmup)
            models += found
            print("\n".join(table(found)[2:]), flush=True)
    record = environment_record(
        "llm.py",
        ["onnxruntime", "onnxruntime_genai", "onnxscript", "onnx", "torch", "transformers"],
        runs=args.runs,
        warmup=args.warmup,
    )
    lines = section(models, record)
    print("\n" + "\n".join(lines))
    if args.markdown:
        write_section(Path(args.markdown), lines)
    if args.json:
        rows = [
            {k: str(v) if isinstance(v, Path) else v for k, v in m.__dict__.items()} for m in models
        ]
        args.json.write_text(json.dumps({"environment": record, "models": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
