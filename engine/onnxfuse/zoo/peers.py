"""onnxfuse and the tools it is measured against (its peers), each run file to file on one
model: `onnxfuse zoo --peers`, the tests' exports and the benchmarks measure alike.

| tool | what runs |
|---|---|
| onnxfuse | `onnxfuse.api.optimize_file`, every built-in pack, `--target cpu`, every fusion |
|   | (also those plain `cpu` leaves to a target profile: `gate_by_profile=False`) |
| ort-extended | an onnxruntime CPU session at ORT_ENABLE_EXTENDED, `optimized_model_filepath` |
| ort-transformers | `onnxruntime.transformers.optimizer.optimize_model` (model type, heads and |
|   | hidden size: the model's `Transformer`) at opt_level 1 and 99 on CPU; the better valid |
|   | result counts; `n/a` for a model without one |
| onnxscript | `onnxscript.optimizer.optimize`, then `rewriter.ort_fusions.optimize_for_ort` |
| onnxslim | `onnxslim.slim(model, out)`: constant folding, dead-code removal, its fusions |

A tool's result is *valid* when onnxruntime (graph optimizations off) loads and runs it and
its outputs equal the original model's within RTOL/ATOL. Only valid results count as
anchors: a smaller graph that does not run, or computes something else, sets no bar.
"""

from __future__ import annotations

import collections
import contextlib
import io
import logging
import statistics
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from onnxfuse.zoo.models import Transformer

TOOLS = ("onnxfuse", "ort-extended", "ort-transformers", "onnxscript", "onnxslim")
ANCHORS = TOOLS[1:]
RTOL, ATOL = 1e-4, 1e-5  # "equal within 1e-4 relative"; atol for values near zero
# A result that fails to run is reported in the result; onnxruntime need not print it too.
ort.set_default_logger_severity(4)


@dataclass
class Result:
    tool: str
    path: Path | None = None
    nodes: int | None = None
    ops: collections.Counter = field(default_factory=collections.Counter)  # the main graph's
    all_ops: collections.Counter = field(default_factory=collections.Counter)  # with subgraphs
    error: str | None = None  # the tool failed, or its result does not run or differs
    max_error: float | None = None  # worst |ours - original| / (ATOL + RTOL |original|)
    detail: str = ""  # e.g. which opt_level
    seconds: float | None = None  # wall time of the tool itself, file to file
    fired: dict[str, int] = field(default_factory=dict)  # onnxfuse's: rewrites per rule

    @property
    def valid(self) -> bool:
        return self.error is None and self.nodes is not None


def count_nodes(graph: onnx.GraphProto) -> int:
    """Nodes of the graph and of every subgraph (If/Loop/Scan bodies)."""
    total = len(graph.node)
    for node in graph.node:
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.GRAPH:
                total += count_nodes(attribute.g)
            elif attribute.type == onnx.AttributeProto.GRAPHS:
                total += sum(count_nodes(g) for g in attribute.graphs)
    return total


def op_histogram(graph: onnx.GraphProto, subgraphs: bool = False) -> collections.Counter:
    """Op types as the manifest of tests/data/ort-fusion writes them (`domain::Op` off ai.onnx);
    with `subgraphs`, those of every If/Loop/Scan body too."""
    counts = collections.Counter(
        (f"{n.domain}::" if n.domain not in ("", "ai.onnx") else "") + n.op_type for n in graph.node
    )
    if subgraphs:
        for node in graph.node:
            for attribute in node.attribute:
                bodies = [attribute.g] if attribute.type == onnx.AttributeProto.GRAPH else []
                if attribute.type == onnx.AttributeProto.GRAPHS:
                    bodies = list(attribute.graphs)
                for body in bodies:
                    counts += op_histogram(body, subgraphs=True)
    return counts


def session(
    path: Path, level=ort.GraphOptimizationLevel.ORT_DISABLE_ALL, saved: Path | None = None
):
    options = ort.SessionOptions()
    options.graph_optimization_level = level
    options.log_severity_level = 4
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    if saved is not None:
        options.optimized_model_filepath = str(saved)
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def run(path: Path, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    sess = session(path)
    wanted = {i.name for i in sess.get_inputs()}
    return sess.run(None, {k: v for k, v in feeds.items() if k in wanted})


def worst_error(got: list[np.ndarray], want: list[np.ndarray]) -> float:
    """The largest |got - want| / (ATOL + RTOL |want|) over all outputs (<= 1: within tolerance)."""
    if len(got) != len(want):
        return float("inf")
    worst = 0.0
    for g, w in zip(got, want):
        if g.shape != w.shape:
            return float("inf")
        g64, w64 = np.asarray(g, np.float64), np.asarray(w, np.float64)
        if not np.array_equal(np.isnan(g64), np.isnan(w64)):
            return float("inf")
        finite = ~np.isnan(w64)
        ratio = np.abs(g64[finite] - w64[finite]) / (ATOL + RTOL * np.abs(w64[finite]))
        worst = max(worst, float(ratio.max(initial=0.0)))
    return worst


@contextlib.contextmanager
def quiet():
    """The anchors log and warn at length; only their results matter here."""
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        with (
            warnings.catch_warnings(),
            contextlib.redirect_stdout(io.StringIO()),
            contextlib.redirect_stderr(io.StringIO()),
        ):
            warnings.simplefilter("ignore")
            yield
    finally:
        root.setLevel(level)


def _run_onnxfuse(
    source: Path,
    out: Path,
    rules,
    target: str = "cpu",
    gate_by_profile: bool = False,
    fired: dict[str, int] | None = None,
) -> str:
    from onnxfuse.api import optimize_file
    from onnxfuse.passes.pipeline import Options
    from onnxfuse.targets.capabilities import load_target

    # Fusion coverage is compared: by default the rules that wait for a profile's
    # measurement on cpu (SkipLayerNormalization, slower on some CPUs) fire too.
    options = Options(target=load_target(target), gate_by_profile=gate_by_profile)
    report = optimize_file(source, out, rules, options)
    if fired is not None:
        fired.update({name: s.applied for name, s in report.rules.items() if s.applied})
    # Why the output is larger than the input, when it is: the report must say.
    return "; ".join(report.larger_because)


def _run_ort_extended(source: Path, out: Path) -> str:
    session(source, ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED, saved=out)
    return ""


def _run_onnxscript(source: Path, out: Path) -> str:
    import onnx_ir as ir
    import onnxscript.optimizer
    from onnxscript.rewriter import ort_fusions

    model = ir.load(str(source))
    onnxscript.optimizer.optimize(model)
    model, fusions = ort_fusions.optimize_for_ort(model)
    ir.save(model, str(out))
    applied = {k: v for k, v in fusions.items() if v}
    return ", ".join(f"{k}={v}" for k, v in sorted(applied.items()))


def _run_onnxslim(source: Path, out: Path) -> str:
    import onnxslim

    onnxslim.slim(str(source), str(out))
    return ""


def _ort_transformers_at(source: Path, out: Path, transformer: Transformer, level: int) -> None:
    from onnxruntime.transformers.optimizer import optimize_model

    optimized = optimize_model(
        str(source),
        model_type=transformer.ort_model_type,
        num_heads=transformer.num_heads,
        hidden_size=transformer.hidden_size,
        opt_level=level,
        use_gpu=False,
    )
    optimized.save_model_to_file(str(out))


TRANSFORMERS_LEVELS = (1, 99)


def ort_transformers(
    source: Path, workdir: Path, transformer: Transformer | None, feeds, want
) -> Result:
    """Both CPU opt levels the optimizer documents; the valid one with fewer nodes counts."""
    if transformer is None:
        return Result("ort-transformers", error="n/a: not a transformer model")
    results = []
    for level in TRANSFORMERS_LEVELS:
        out = workdir / f"ort-transformers-{level}.onnx"
        result = _measure(
            "ort-transformers",
            out,
            feeds,
            want,
            lambda o, lv=level: _ort_transformers_at(source, o, transformer, lv),
        )
        result.detail = f"opt_level={level}" + (f"; {result.detail}" if result.detail else "")
        results.append(result)
    valid = [r for r in results if r.valid]
    if valid:
        return min(valid, key=lambda r: r.nodes or 0)
    return results[0]


def _measure(tool: str, out: Path, feeds, want, produce) -> Result:
    result = Result(tool)
    start = time.perf_counter()
    try:
        with quiet():
            result.detail = produce(out) or ""
    except Exception as exc:  # any failure of another tool is a result to report, not a crash
        result.error = f"optimizer failed: {type(exc).__name__}: {_line(exc)}"
        return result
    finally:
        result.seconds = time.perf_counter() - start
    if not out.exists():  # a tool that gives up may say so only in its (silenced) log
        result.error = "optimizer failed: wrote no model"
        return result
    result.path = out
    graph = onnx.load(out, load_external_data=False).graph
    result.nodes = count_nodes(graph)
    result.ops = op_histogram(graph)
    result.all_ops = op_histogram(graph, subgraphs=True)
    try:
        got = run(out, feeds)
    except Exception as exc:
        result.error = f"does not run in onnxruntime: {_line(exc)}"
        return result
    result.max_error = worst_error(got, want)
    if result.max_error > 1.0:
        result.error = f"outputs differ: {result.max_error:.3g}x the tolerance"
    return result


def _line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else "")[:600]


def compare(
    source: Path,
    workdir: Path,
    transformer: Transformer | None,
    feeds: dict[str, np.ndarray],
    rules,
    tools: tuple[str, ...] = TOOLS,
    targets: tuple[str, ...] = (),
    target: str = "cpu",
    gate_by_profile: bool = False,
) -> dict:
    """Each of `tools` on `source`: {tool: Result}. `want` is the original model's own output.
    The tool `onnxfuse` optimizes for `target` (the rules that fired in its `fired`).
    Each of `targets` adds onnxfuse for that target, with the rules selected for it, as the
    tool `onnxfuse-<target>`. `transformer`: what the ort-transformers tool is told of the
    model (None: it does not run, its result is `n/a`)."""
    want = run(source, feeds)
    runners = {
        "ort-extended": _run_ort_extended,
        "onnxscript": _run_onnxscript,
        "onnxslim": _run_onnxslim,
    }
    results: dict[str, Result] = {}
    for tool in tools:
        if tool == "ort-transformers":
            results[tool] = ort_transformers(source, workdir, transformer, feeds, want)
            continue
        out = workdir / f"{tool}.onnx"
        if tool == "onnxfuse":
            fired: dict[str, int] = {}
            results[tool] = _measure(
                tool,
                out,
                feeds,
                want,
                lambda o, f=fired: _run_onnxfuse(source, o, rules, target, gate_by_profile, f),
            )
            results[tool].fired = fired
            continue
        runner = runners[tool]
        results[tool] = _measure(tool, out, feeds, want, lambda o, r=runner: r(source, o))
    for other in targets:
        from onnxfuse.api import select_rules

        tool = f"onnxfuse-{other}"
        # The packs that target's optimization loads, as `onnxfuse optimize --target` does.
        target_rules = select_rules(target=other)
        results[tool] = _measure(
            tool,
            workdir / f"{tool}.onnx",
            feeds,
            want,
            lambda o, t=other, r=target_rules: _run_onnxfuse(source, o, r, t),
        )
    return results


def best_anchor(results: dict[str, Result]) -> Result | None:
    valid = [results[t] for t in ANCHORS if t in results and results[t].valid]
    return min(valid, key=lambda r: r.nodes or 0) if valid else None


def round_robin(
    sessions: dict[str, ort.InferenceSession], feeds: dict, runs: int, warmup: int
) -> dict[str, list[float]]:
    """Per-run milliseconds of each session: warm-up first, then the runs in turn, so that
    drift in the machine's load hits every session alike; each round starts one session
    later than the last, as a session's place in the round biases it (two identical
    models, last and second to last, measured 19% apart). Each gets the feeds it takes."""
    inputs = {
        name: {k: v for k, v in feeds.items() if k in {i.name for i in sess.get_inputs()}}
        for name, sess in sessions.items()
    }
    for _ in range(warmup):
        for name, sess in sessions.items():
            sess.run(None, inputs[name])
    names = list(sessions)
    times: dict[str, list[float]] = {name: [] for name in sessions}
    for round_index in range(runs):
        start_at = round_index % len(names)
        for name in names[start_at:] + names[:start_at]:
            start = time.perf_counter()
            sessions[name].run(None, inputs[name])
            times[name].append((time.perf_counter() - start) * 1000)
    return times


def latency_ms(paths: dict[str, Path], feeds, runs: int) -> dict[str, float]:
    """Median per-run latency of each model under onnxruntime with optimizations off,
    sessions created once, runs alternating between the models."""
    sessions = {tool: session(path) for tool, path in paths.items()}
    times = round_robin(sessions, feeds, runs, warmup=1)
    return {tool: statistics.median(t) for tool, t in times.items()}
