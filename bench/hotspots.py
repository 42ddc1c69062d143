"""Where onnxfuse's time goes: each model optimized under pyinstrument, by phase and hot spot.

    python bench/hotspots.py [--models SET ...] [--only EXPORT ...] [--runs N] [--top K]
                            [--work-dir DIR] [--json FILE] [MODEL.onnx ...]

Each run is `optimize_file` (target cpu, every built-in pack, file to file) in a fresh
process under pyinstrument's sampling profiler; rule and target loading are left out,
as in speed.py. A model's `--runs` runs (default 3) are added up. Every sample is given
to the innermost engine phase on its stack (PHASES: a fold inside normalize counts as
folding, the checker inside the save as checking); what is in none of them is `other`
(the driver's own loop, naming, bookkeeping). Hot spots are the functions with the most
self time (time in their own code, callees excluded), over all runs.

Sets are speed.py's: `decoder`, `exports`, `cnn`, `sample` (default: `sample` and
`exports`). Needs pyinstrument (`pip install pyinstrument`).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from environment import environment as environment_record  # noqa: E402
from speed import model_set  # noqa: E402

# (phase, engine module, function): the innermost of these on a sample's stack takes it.
PHASES = (
    ("load", "files.model_io", "load_model_and_types"),
    ("normalize", "passes.normalize", "normalize"),
    ("match", "rewrite.matcher", "could_match"),
    ("match", "rewrite.matcher", "candidates"),
    ("match", "rewrite.conditions", "accept"),
    ("rewrite", "rewrite.apply", "apply_match"),
    ("fold", "fold.folder", "fold_node"),
    ("infer", "ops.inference", "infer_shapes"),
    ("infer", "ops.inference", "infer_node"),
    ("infer", "ops.inference", "inferred_types"),
    ("cleanup", "passes.cleanup", "call"),
    ("check", "files.model_io", "_check_loaded"),
    ("check", "files.model_io", "_check_serialized"),
    ("serialize", "files.writer", "serialize_stripped"),
    ("write", "files.writer", "write_model"),
)
PHASE_NAMES = (*dict.fromkeys(name for name, _, _ in PHASES), "other")
INTERVAL = 0.0005  # seconds between samples: 100+ samples on a 50 ms run


# -- one run, in a child process ---------------------------------------------------------


def _run_one(source: str, output: str) -> dict:
    import onnx.defs
    from pyinstrument import Profiler

    from onnxfuse.api import optimize_file, select_rules
    from onnxfuse.passes.pipeline import Options
    from onnxfuse.targets.capabilities import load_target

    rules, options = select_rules(), Options(target=load_target("cpu"))
    # onnx's schema registry is set up on its first use (~20 ms): by a load that parses
    # the rules, not by one from the cache. Setup, as imports are: not profiled.
    onnx.defs.has("Relu", 1, "")
    profiler = Profiler(interval=INTERVAL)
    profiler.start()
    optimize_file(source, output, rules, options)
    profiler.stop()
    root = profiler.last_session.root_frame()
    phases: Counter[str] = Counter()
    hot: Counter[str] = Counter()
    _walk(root, "other", phases, hot)
    return {"seconds": root.time, "phases": dict(phases), "hot": dict(hot)}


def _walk(frame, phase: str, phases: Counter, hot: Counter) -> None:
    """Add ``frame``'s self time to its phase and its function; recurse."""
    phase = _phase_of(frame) or phase
    own = frame.time - sum(child.time for child in frame.children)
    if frame.is_synthetic_leaf:  # pyinstrument's "[self]" frames: the parent's own time
        return
    own += sum(child.time for child in frame.children if child.is_synthetic_leaf)
    phases[phase] += own
    hot[_name(frame)] += own
    for child in frame.children:
        _walk(child, phase, phases, hot)


def _phase_of(frame) -> str | None:
    module = _module(frame).removeprefix("onnxfuse.")
    for name, phase_module, function in PHASES:
        if frame.function == function and module == phase_module:
            return name
    return None


def _module(frame) -> str:
    """The module a frame's file is, as it is imported."""
    path = Path(frame.file_path or "?")
    module = path.stem
    for parent in path.parents:  # the package a file belongs to, as it is imported
        if parent.name == "onnxfuse":
            module = "onnxfuse." + ".".join(path.relative_to(parent).with_suffix("").parts)
            break
        if parent.name == "site-packages":
            module = ".".join(path.relative_to(parent).with_suffix("").parts)
            break
    return module


def _name(frame) -> str:
    owner = f"{frame.class_name}." if frame.class_name else ""
    return f"{_module(frame)}:{owner}{frame.function}"


# -- all runs of one model ---------------------------------------------------------------


def profile(path: Path, runs: int, folder: Path) -> dict:
    seconds = 0.0
    phases: Counter[str] = Counter()
    hot: Counter[str] = Counter()
    for _ in range(runs):
        output = folder / f"{path.stem}.profiled.onnx"
        done = subprocess.run(
            [sys.executable, __file__, "--run-one", str(path), str(output)],
            capture_output=True,
            text=True,
        )
        output.unlink(missing_ok=True)
        if done.returncode != 0:
            lines = (done.stderr or done.stdout).strip().splitlines() or ["no output"]
            return {"error": lines[-1][:200]}
        result = json.loads(done.stdout.strip().splitlines()[-1])
        seconds += result["seconds"]
        phases.update(result["phases"])
        hot.update(result["hot"])
    return {"seconds": seconds / runs, "runs": runs, "phases": phases, "hot": hot}


def summary(row: dict, top: int) -> dict:
    """Shares of the time, per phase and for the ``top`` hottest functions."""
    total = sum(row["phases"].values()) or 1.0
    return {
        "seconds": row["seconds"],
        "runs": row["runs"],
        "phases": {name: row["phases"].get(name, 0.0) / total for name in PHASE_NAMES},
        "hot": [
            {"function": name, "share": own / total} for name, own in row["hot"].most_common(top)
        ],
    }


def _line(label: str, result: dict) -> str:
    if "error" in result:
        return f"{label:>28}: {result['error']}"
    phases = " ".join(f"{k} {v:.0%}" for k, v in result["phases"].items() if v >= 0.005)
    hot = ", ".join(f"{h['function']} {h['share']:.0%}" for h in result["hot"][:3])
    return f"{label:>28} {result['seconds']:.2f} s | {phases} | {hot}"


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--run-one":
        print(json.dumps(_run_one(sys.argv[2], sys.argv[3])))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="*", type=Path)
    parser.add_argument("--models", dest="sets", nargs="*", default=["sample", "exports"])
    parser.add_argument("--only", nargs="+", help="bench export names (the exports set)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--top", type=int, default=8)
    parser.add_argument("--work-dir", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    try:
        import pyinstrument  # noqa: F401
    except ImportError:
        print("bench/hotspots.py needs pyinstrument: pip install pyinstrument", file=sys.stderr)
        return 2
    if args.runs < 1 or args.top < 1:
        print("--runs and --top must be at least 1", file=sys.stderr)
        return 2
    folder = args.work_dir or Path(tempfile.mkdtemp(prefix="onnxfuse-profile-"))
    folder.mkdir(parents=True, exist_ok=True)
    rows = []
    for model in model_set(args.sets, folder, args.models, args.only):
        found = profile(model.path, args.runs, folder)
        result = found if "error" in found else summary(found, args.top)
        rows.append({"model": model.label, "kind": model.kind, **result})
        print(_line(model.label, result), flush=True)
    record = {
        "environment": environment_record(
            "hotspots.py", ["onnx", "onnxruntime", "onnx_ir", "pyinstrument"], runs=args.runs
        ),
        "phases": list(PHASE_NAMES),
        "models": rows,
    }
    if args.json:
        args.json.write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
