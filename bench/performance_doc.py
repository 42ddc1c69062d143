"""Write docs/performance.md from the JSON of bench/speed.py, latency.py and hotspots.py.

    python bench/speed.py --repeat 3 --scaling 81000 --external-gb 2 --json speed.json
    python bench/latency.py --json latency.json
    python bench/hotspots.py --json hotspots.json
    python bench/performance_doc.py --speed speed.json --latency latency.json \
                                    [--hotspots hotspots.json] [--out FILE]

The doc holds the commands, machine, versions, dates and commits of both runs, the tables
and, for each performance target below, whether this run meets it, naming every model
that misses it. Nothing is measured here: the figures are the JSON's.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# What the figures are held to. Optimization time: MIN_SPEEDUP. Scaling: time ~ nodes^k
# with k at most MAX_EXPONENT. Memory: peak RSS of the external-data run at most
# MAX_RSS_SHARE of the weights. Latency: onnxfuse's result with onnxruntime's optimizations
# off at most MAX_LATENCY_RATIO of the original with all of them on (ours must not need
# onnxruntime's optimizer), and with them on no slower than that.
# onnxfuse's optimization time: at least this many times faster than each tool, every model.
MIN_SPEEDUP = {"onnxscript": 3.0, "ort-transformers": 1.0}
MAX_EXPONENT = 1.1
MAX_RSS_SHARE = 0.25
MAX_LATENCY_RATIO = 1.05  # medians of a shared 2-core machine: 5% is within their noise

# Near the floor: onnxfuse's time at most this many times `onnx.load` + `onnx.save` of the
# same file; the bytes it writes at most this share of its output; its peak RSS at most
# this many times the model's size (weights embedded).
MAX_FLOOR_RATIO = 2.0
MAX_WRITTEN_SHARE = 1.1
MAX_RSS_PER_MODEL = 1.5

TOOLS = {
    "onnxfuse": "onnxfuse",
    "onnxscript": "onnxscript",
    "onnxslim": "onnxslim",
    "ort-transformers": "ORT transformers",
}
VARIANTS = {
    "orig-all": "original, ORT all",
    "orig-none": "original, ORT off",
    "fuse-none": "onnxfuse cpu, ORT off",
    "fuse-all": "onnxfuse cpu, ORT all",
    "block-none": "onnxfuse cpu:block=auto, ORT off",
}
KIND_NOTES = {
    "cnn": "onnxscript leaves these unchanged: their initializers are also graph inputs, so "
    "it treats them as non-constant and has nothing to do; onnxfuse folds and fuses them. "
    "Their weights are ConstantOfShape fills: onnxfuse writes them out as initializers "
    "(alexnet 244 MB, vgg19 164 MB, zfnet512 47 MB) where onnxscript writes back the "
    "4-10 KB input. Writing alexnet's file alone takes about 0.06-0.07 s (4 GB/s, blocks "
    "allocated in one call), most of onnxscript's whole run on a fast machine. Left unfolded, "
    "the fills would be computed again at every inference with onnxruntime's optimizations "
    "off; `--fold-limit` caps what is folded.",
    "export": "The CNN exports have static shapes (1x3x224x224); the transformers take 2 "
    "sequences of 32 tokens. The BERT has BERT-base's depth and width (12 layers, hidden "
    "768) with a 1536 feed-forward.",
}
KINDS = {
    "decoder": "Synthetic decoder stacks (bench/synthetic.py)",
    "export": "Real torch exports at bench size (tests/exports/models.py, BENCH_EXPORTS)",
    "zoo": "Real models shipped in PyPI wheels and npm packages (tests/zoo/manifest.yaml)",
    "quantized": "Exports quantized by onnxruntime's tools (tests/exports/quantize.py)",
    "cnn": "The light CNNs of the onnx package (IR 3)",
    "sample": "The bundled sample ResNet",
    "other": "Models named on the command line",
}


def _environment(name: str, env: dict) -> list[str]:
    versions = ", ".join(f"{k} {v}" for k, v in env.get("versions", {}).items())
    dirty = (
        " plus uncommitted engine/rule/target changes in the working tree"
        if env.get("dirty")
        else ""
    )
    commit = f"commit `{env.get('commit', '?')}`"
    if env.get("commit_end", env.get("commit")) != env.get("commit"):
        commit = (
            f"commits `{env['commit']}` at the start to `{env['commit_end']}` at the end "
            "(the tree changed during the run)"
        )
    return [
        f"- {name}: `{env.get('command', '?')}` on {env.get('date', '?')}, {commit}"
        f"{dirty}; {env.get('machine', '?')}, "
        f"{env.get('cores', '?')} cores; {versions}.",
    ]


def _seconds(result: dict, base: float | None) -> str:
    if "seconds" not in result:
        return f"fails ({result.get('error', '?')[:60]})"
    ratio = f" (x{result['seconds'] / base:.1f})" if base and result is not None else ""
    return f"{result['seconds']:.2f} s{ratio}"


def speed_tables(rows: list[dict]) -> list[str]:
    out: list[str] = []
    for kind, title in KINDS.items():
        group = [r for r in rows if r.get("kind", "other") == kind]
        if not group:
            continue
        out += [f"### {title}", ""]
        if kind in KIND_NOTES:
            out += [KIND_NOTES[kind], ""]
        head = ["model", "nodes", *TOOLS.values(), "nodes after: " + " / ".join(TOOLS.values())]
        out += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for row in group:
            base = row["onnxfuse"].get("seconds")
            cells = [row["model"], f"{row['nodes']:,}"]
            after = []
            for tool in TOOLS:
                result = row.get(tool)
                if result is None:
                    cells.append("n/a")
                    after.append("-")
                    continue
                cells.append(_seconds(result, base if tool != "onnxfuse" else None))
                after.append(str(result.get("nodes", "-")))
            cells.append(" / ".join(after))
            out.append("| " + " | ".join(cells) + " |")
        out.append("")
        if any("io-floor" in row for row in group):
            out += resources_table(group)
    return out


def resources_table(group: list[dict]) -> list[str]:
    """onnxfuse beside the I/O floor and onnxruntime's own optimizer, and what it costs
    in system time, bytes written and memory."""
    head = [
        "model",
        "MB",
        "I/O floor",
        "onnxfuse / floor",
        "ORT session",
        "onnxfuse user / sys",
        "written / output MB",
        "peak RSS MB (above start)",
    ]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in group:
        ours, floor, session = row["onnxfuse"], row.get("io-floor", {}), row.get("ort-session", {})
        if "seconds" not in ours:
            continue
        cells = [row["model"], f"{row['size_mb']:.1f}"]
        cells.append(f"{floor['seconds']:.2f} s" if "seconds" in floor else "-")
        cells.append(f"x{ours['seconds'] / floor['seconds']:.1f}" if "seconds" in floor else "-")
        cells.append(_seconds(session, None) if session else "-")
        cells.append(f"{ours['user_seconds']:.2f} / {ours['system_seconds']:.2f} s")
        cells.append(f"{ours['written_mb']:.1f} / {ours['output_mb']:.1f}")
        growth = ours["rss_mb"] - ours["rss_start_mb"]
        cells.append(f"{ours['rss_mb']:.0f} ({growth:.0f})")
        out.append("| " + " | ".join(cells) + " |")
    return [*out, ""]


def scaling_table(scaling: dict) -> list[str]:
    out = ["| nodes | seconds | ms per node |", "|---|---|---|"]
    for nodes, seconds in scaling["points"]:
        out.append(f"| {nodes:,} | {seconds:.2f} | {1000 * seconds / nodes:.2f} |")
    return out


def commands_table(rows: list[dict]) -> list[str]:
    lines = [
        "| model | onnxfuse | import | rules | target | optimize_file | first run | onnxscript |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        ours, theirs = row["onnxfuse"], row["onnxscript"]
        first = row.get("first_run", {})
        if "seconds" not in ours or "seconds" not in theirs:
            error = ours.get("error") or theirs.get("error")
            lines.append(f"| {row['model']} | {error} | | | | | | |")
            continue
        phases = " | ".join(
            f"{ours[k]:.2f} s" for k in ("import", "rules", "target", "optimize_file")
        )
        first_cell = f"{first['seconds']:.2f} s" if "seconds" in first else "-"
        ratio = theirs["seconds"] / ours["seconds"]
        lines.append(
            f"| {row['model']} | {ours['seconds']:.2f} s | {phases} | {first_cell} | "
            f"{theirs['seconds']:.2f} s (x{ratio:.2f}) |"
        )
    return lines


def _latency_cell(v: dict | None) -> str:
    if v is None:
        return "-"
    if "median_ms" not in v:
        return "fails"
    iqr = v["q3_ms"] - v["q1_ms"]
    mark = " ✗" if v.get("differs") else ""
    return f"{v['median_ms']:.2f} ±{iqr:.2f} (x{v['ratio']:.2f}){mark}"


def latency_table(data: dict) -> list[str]:
    variants = [v for v in VARIANTS if v != "block-none" or data.get("block_target")]
    head = ["model", "nodes: original / onnxfuse" + (" / blocked" if len(variants) == 5 else "")]
    head += [VARIANTS[v] for v in variants]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    notes = []
    for row in data["models"]:
        vs = row["variants"]
        nodes = [vs["orig-none"].get("nodes"), vs["fuse-none"].get("nodes")]
        if "block-none" in variants:
            nodes.append(vs.get("block-none", {}).get("nodes"))
        cells = [row["model"], " / ".join("-" if n is None else str(n) for n in nodes)]
        cells += [_latency_cell(vs.get(v)) for v in variants]
        out.append("| " + " | ".join(cells) + " |")
        for name in variants:
            v = vs.get(name, {})
            if "error" in v:
                notes.append(f"- {row['model']}, {VARIANTS[name]}: {v['error']}")
            elif v.get("differs"):
                notes.append(
                    f"- {row['model']}, {VARIANTS[name]}: outputs differ from the original's, "
                    f"{v['max_error']:.3g}x the tolerance"
                )
    if notes:
        out += ["", "Notes:", "", *notes]
    return out


def _geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def targets(speed: dict | None, latency: dict | None) -> list[str]:
    """One line per target: met or missed, and where."""
    out = []
    if speed:
        for tool, factor in MIN_SPEEDUP.items():
            slower = [
                f"{r['model']} (x{r[tool]['seconds'] / r['onnxfuse']['seconds']:.2f})"
                for r in speed["models"]
                if "seconds" in r.get(tool, {}) and "seconds" in r["onnxfuse"]
                if r[tool]["seconds"] < factor * r["onnxfuse"]["seconds"]
            ]
            compared = sum(
                1
                for r in speed["models"]
                if "seconds" in r.get(tool, {}) and "seconds" in r["onnxfuse"]
            )
            if not compared:
                continue
            verdict = "met" if not slower else f"**missed** on {len(slower)} of {compared}"
            faster = f"at least {factor:g}x faster than" if factor > 1 else "faster than"
            line = f"- onnxfuse {faster} {TOOLS[tool]} on every model: {verdict}"
            out.append(line + (f": {', '.join(slower)} (its time over ours)." if slower else "."))
        out += _floor_targets(speed["models"])
        failed = [r["model"] for r in speed["models"] if "seconds" not in r["onnxfuse"]]
        if failed:
            out.append(f"- onnxfuse failed on: **{', '.join(failed)}**.")
        if "scaling" in speed:
            k = speed["scaling"]["exponent"]
            top = speed["scaling"]["points"][-1][0] if speed["scaling"]["points"] else 0
            verdict = "met" if k <= MAX_EXPONENT else "**missed**"
            out.append(
                f"- Scaling exponent at most {MAX_EXPONENT} (up to {top:,} nodes): {verdict}, "
                f"k = {k:.3f}."
            )
        if "external" in speed and "rss_mb" in speed["external"]:
            ext = speed["external"]
            share = ext["rss_mb"] / ext["weight_mb"]
            verdict = "met" if share <= MAX_RSS_SHARE else "**missed**"
            out.append(
                f"- Peak RSS at most {MAX_RSS_SHARE:.0%} of the external weights: {verdict}, "
                f"{share:.1%} ({ext['rss_mb']:.0f} MB for {ext['weight_mb']:.0f} MB)."
            )
    if latency:
        checked = [
            ("fuse-none", "onnxfuse's result with onnxruntime's optimizations off"),
            ("fuse-all", "onnxfuse's result with onnxruntime's optimizations on"),
        ]
        if latency.get("block_target"):
            checked.append(
                ("block-none", "the cpu:block=auto result with onnxruntime's optimizations off")
            )
        for variant, what in checked:
            results = {r["model"]: r["variants"].get(variant, {}) for r in latency["models"]}
            ratios = {m: v.get("ratio") for m, v in results.items()}
            slow = [f"{m} (x{x:.2f})" for m, x in ratios.items() if x and x > MAX_LATENCY_RATIO]
            broken = [m for m, v in results.items() if "median_ms" not in v or v["differs"]]
            good = [x for x in ratios.values() if x]
            verdict = "met" if not slow and not broken else "**missed**"
            mean = f" (geometric mean x{_geomean(good):.2f})" if good else ""
            line = (
                f"- Latency of {what} at most {MAX_LATENCY_RATIO:.2f}x the original's with all "
                f"of onnxruntime's optimizations: {verdict}{mean}"
            )
            if slow:
                line += f"; slower on {', '.join(slow)}"
            if broken:
                line += f"; failed or wrong on {', '.join(broken)}"
            out.append(line + ".")
    return out


def _floor_targets(rows: list[dict]) -> list[str]:
    measured = [
        r for r in rows if "seconds" in r["onnxfuse"] and "seconds" in r.get("io-floor", {})
    ]
    if not measured:
        return []
    checks = [
        (
            f"onnxfuse within {MAX_FLOOR_RATIO:g}x of the I/O floor (onnx.load + onnx.save)",
            lambda r: r["onnxfuse"]["seconds"] / r["io-floor"]["seconds"],
            MAX_FLOOR_RATIO,
        ),
        (
            f"Bytes written at most {MAX_WRITTEN_SHARE:g}x the output's size",
            lambda r: r["onnxfuse"]["written_mb"] / r["onnxfuse"]["output_mb"],
            MAX_WRITTEN_SHARE,
        ),
        (
            f"Peak RSS, above the process's before it reads the model, at most "
            f"{MAX_RSS_PER_MODEL:g}x the model's size",
            lambda r: (r["onnxfuse"]["rss_mb"] - r["onnxfuse"]["rss_start_mb"]) / r["size_mb"],
            MAX_RSS_PER_MODEL,
        ),
    ]
    out = []
    for what, ratio, limit in checks:
        over = [f"{r['model']} (x{ratio(r):.1f})" for r in measured if ratio(r) > limit]
        verdict = "met" if not over else f"**missed** on {len(over)} of {len(measured)}"
        shown = over[:8] + ([f"{len(over) - 8} more"] if len(over) > 8 else [])
        out.append(f"- {what}: {verdict}" + (f": {', '.join(shown)}." if over else "."))
    return out


def document(
    speed: dict | None,
    latency: dict | None,
    command: str,
    hotspots: dict | None = None,
    fusions: dict | None = None,
) -> str:
    out = [
        "# Performance",
        "",
        f"Generated by `{command}` from the JSON of the runs below; regenerate the same way.",
        "",
    ]
    if speed:
        out += _environment("Optimization speed", speed.get("environment", {}))
        for more in speed.get("more_environments", []):
            out += _environment("Optimization speed, more models", more)
    if latency:
        out += _environment("Latency", latency.get("environment", {}))
    if hotspots:
        out += _environment("Hot spots", hotspots.get("environment", {}))
    if fusions:
        out += _environment("Fusions", fusions.get("environment", {}))
    out += [
        "",
        "The machine is shared (2 cores, other work running): compare within a row, not",
        "across runs. The commit says which",
        "engine was measured.",
        "",
        "## Targets",
        "",
        *targets(speed, latency),
        "",
    ]
    if latency:
        env = latency.get("environment", {})
        out += [
            "## Inference latency (bench/latency.py)",
            "",
            f"onnxruntime CPU, {env.get('threads', '?')} intra-op threads, sequential; median of "
            f"{env.get('runs', '?')} runs per variant after {env.get('warmup', '?')} warm-up runs,",
            "the variants' runs alternating in one process, each round starting one variant",
            "later; `±` the interquartile range, `x` the",
            "median over the original's with ORT_ENABLE_ALL (below 1: faster). Every variant's",
            "outputs were compared with the original's first (1e-4 relative, 1e-5 absolute; `✗`:",
            "they differ). `ORT off` is ORT_DISABLE_ALL, `ORT all` ORT_ENABLE_ALL. On the CNNs",
            "most of what ORT_ENABLE_ALL gains is its NCHWc layout transformation (blocked",
            "convolutions), which the `cpu` target does not do and `cpu:block=auto` does: compare",
            "`onnxfuse cpu:block=auto, ORT off` with `original, ORT all` there.",
            "",
            *latency_table(latency),
            "",
        ]
        if not latency.get("block_target"):
            out += ["(`--target cpu:block=auto` was not available in the measured tree.)", ""]
    if speed:
        env = speed.get("environment", {})
        out += [
            "## Optimization time (bench/speed.py)",
            "",
            "File in to file out, each run in a fresh process, median of "
            f"{env.get('repeat', '?')} rounds (round robin).",
            *_quick_rounds(env),
            "`x`: the other tool's time over onnxfuse's (above 1: onnxfuse is",
            "faster). onnxfuse: `optimize_file`, target cpu, every built-in pack, full checker",
            "and save included; onnxscript: `optimizer.optimize` then",
            "`rewriter.ort_fusions.optimize_for_ort`; ORT transformers: `optimize_model` at",
            "opt_level 1 with the model's type, heads and hidden size (transformers only).",
            "Imports and set-up are outside every timing: onnxfuse's rule and target loading",
            "and onnx's schema registry (onnxscript's import builds its rules and sets that",
            "registry up); the whole-command table below has them all.",
            "",
            *speed_tables(speed["models"]),
        ]
        if speed.get("commands"):
            out += [
                "## Whole commands",
                "",
                "What a user waits for: interpreter start to exit, median of "
                f"{env.get('commands', '?')} runs",
                "alternating. onnxfuse: `python -m onnxfuse optimize MODEL -o OUT -q`; onnxscript:",
                "a `python -c` script importing onnxscript and doing the steps above. The phases",
                "are onnxfuse's own, timed in a separate child doing the same steps (interpreter",
                "start and exit are the rest). Both import onnx_ir, which imports sympy (0.25 s",
                "or more here); onnxfuse's command defers sympy until something reads it, and",
                "optimizing never does. Python keeps modules' bytecode, as by default (the bench",
                "clears PYTHONDONTWRITEBYTECODE). onnxfuse reads its rules and target from the",
                "load cache (README) that an untimed run filled; `first run` is one run with",
                "nothing cached.",
                "",
                *commands_table(speed["commands"]),
                "",
            ]
        if "scaling" in speed:
            out += [
                "## Scaling",
                "",
                "onnxfuse alone on decoder stacks with zero weights, file to file. Fit over this",
                f"run's points: time ~ nodes^{speed['scaling']['exponent']:.3f}. Compare per-node",
                "times only within one run.",
                "",
                *scaling_table(speed["scaling"]),
                "",
            ]
        if "external" in speed:
            ext = speed["external"]
            out += ["## External data", ""]
            if "rss_mb" in ext:
                if "environment" in ext:  # measured in a run of its own
                    out += [*_environment("Measured by", ext["environment"]), ""]
                out += [
                    f"A decoder stack with {ext['weight_mb']:,.0f} MB of weights in external data "
                    f"optimizes in {ext['seconds']:.1f} s with a peak RSS of "
                    f"{ext['rss_mb']:,.0f} MB ({ext['rss_mb'] / ext['weight_mb']:.1%} of the "
                    "weights; peak RSS is the child process's VmHWM). Weights no rule reads stay",
                    "on disk. On this stack the Attention fusion packs every layer's Q, K and V",
                    "weights (a quarter of the weights) into one new initializer: folded values of",
                    "1 MiB or more wait for the save in a temporary file, the weights a fold read",
                    "are unmapped after it, and the save copies both file to file.",
                    "",
                ]
            else:
                out += [f"The external-data run failed: {ext.get('error')}", ""]
    if hotspots:
        out += hotspots_section(hotspots)
    if fusions:
        out += fusions_section(fusions)
    return "\n".join(out)


def fusions_section(fusions: dict) -> list[str]:
    rows = fusions["models"]
    out = [
        "## Fusions slower than what they replace (bench/fusion_speed.py)",
        "",
        "`onnxfuse targets calibrate cpu MODEL` (1 thread, ORT_DISABLE_ALL, each match",
        "timed against its pattern in alternating rounds; docs/targets.md) at the feeds'",
        "sizes: median times, and the ratio fused / unfused as the median of the rounds'",
        "ratios (above 1.05: slower); one row per rule and size:",
        "",
    ]
    for row in rows[:1]:
        out += [f"{row['model']}:", "", "| rule | at | unfused µs | fused µs | ratio |"]
        out.append("|---|---|---:|---:|---:|")
        seen = set()
        for m in row["calibrated"]:
            if (m["rule"], m["at"]) in seen:
                continue
            seen.add((m["rule"], m["at"]))
            out.append(
                f"| {m['rule']} | {m['at']} | {m['unfused_us']:.1f} | {m['fused_us']:.1f} "
                f"| {m['ratio']:.2f} |"
            )
        out.append("")
    out += [
        "End to end: onnxruntime CPU, 1 intra-op thread, ORT_ENABLE_ALL, round robin, median",
        "(ms), `x` over the original's. `every fusion`: `--target cpu` with the",
        "SkipLayerNormalization rules firing (plain `cpu` before they needed a profile);",
        "`cpu:profile`: with the profile calibrated on that model. `SkipLN`: the",
        "SkipLayerNormalization nodes in each file (the original: none).",
        "",
        "| model | original | every fusion | cpu | cpu:profile | SkipLN (every / cpu / profile) |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for row in rows:
        med, ratio, skip = row["median_ms"], row["ratio"], row["skip_layer_norm"]
        cells = [
            f"{med[v]:.2f} (x{ratio[v]:.3f})"
            for v in ("original", "every-fusion", "cpu", "cpu-profile")
        ]
        counts = f"{skip['every-fusion']} / {skip['cpu']} / {skip['cpu-profile']}"
        out.append(f"| {row['model']} | {' | '.join(cells)} | {counts} |")
    skip_ratios = [
        m["ratio"]
        for row in rows[:1]
        for m in row["calibrated"]
        if m["rule"].startswith("ort-skip-layer-norm") and "fold-bias" not in m["rule"]
    ]
    worst = max(rows, key=lambda r: r["ratio"]["cpu"])
    slowest = worst["ratio"]["cpu"]
    gap = (
        [
            f"The gap on {worst['model']} is not SkipLayerNormalization's: plain `cpu` creates",
            f"{worst['skip_layer_norm']['cpu']} there; it is open (the other fusions, measured "
            "one by one, each",
            "leave part of it: an issue of its own).",
        ]
        if slowest > 1.02
        else []
    )
    out += [
        "",
        "What plain `cpu` does: it creates no SkipLayerNormalization (its rules carry",
        "`needs_profile: [cpu]`, docs/rules.md). The kernel measured"
        + (f" {min(skip_ratios):.1f}-{max(skip_ratios):.1f}x" if skip_ratios else "")
        + f" the time of the Add + LayerNormalization it replaces on {rows[0]['model']},",
        "and at ORT_ENABLE_ALL onnxruntime fuses",
        "Add + LayerNormalization itself where its own pattern matches: leaving them apart",
        "costs nothing against the original at ORT_ENABLE_ALL, which has them apart too.",
        f"Plain `cpu` is at most x{slowest:.3f} the original's latency here. Where the kernel",
        "is faster, a profile calibrated there (`--target cpu:profile=FILE`) fuses again. No",
        "profile ships: one measured on this CPU family says nothing of another, and plain",
        "`cpu` stays portable.",
        *gap,
        "",
    ]
    return out


def hotspots_section(hotspots: dict) -> list[str]:
    """Where onnxfuse's time goes: phases as shares of each model's run, then hot spots."""
    phases = hotspots["phases"]
    runs = hotspots.get("environment", {}).get("runs", "?")
    out = [
        "## Where the time goes (bench/hotspots.py)",
        "",
        f"`optimize_file` under pyinstrument's sampling profiler, {runs} fresh processes per",
        "model added up (the profiler slows Python calls, so the seconds here run above",
        "speed.py's; the shares are what to read). Each sample goes to the innermost engine",
        "phase on its stack: `match` is the structure pre-check and matching with guards",
        "and the target's verdicts, `rewrite` building target nodes, `fold` constant folding",
        "(in normalize and of new nodes), `infer` onnx's shape inference, `check` onnx's",
        "checker at load and save, `other` the driver's loop and bookkeeping.",
        "",
        "| model | seconds | " + " | ".join(phases) + " |",
        "|---|---|" + "---|" * len(phases),
    ]
    for row in hotspots["models"]:
        if "error" in row:
            out.append(f"| {row['model']} | {row['error']} |" + " |" * len(phases))
            continue
        shares = [f"{row['phases'].get(name, 0.0):.0%}" for name in phases]
        out.append(f"| {row['model']} | {row['seconds']:.2f} | " + " | ".join(shares) + " |")
    out += [
        "",
        "Hot spots: the functions with the most self time (callees excluded), as shares",
        "of the model's samples.",
        "",
        "| model | hot spots |",
        "|---|---|",
    ]
    for row in hotspots["models"]:
        if "hot" in row:
            spots = ", ".join(f"`{h['function']}` {h['share']:.0%}" for h in row["hot"][:5])
            out.append(f"| {row['model']} | {spots} |")
    return [*out, ""]


def _quick_rounds(env: dict) -> list[str]:
    """The rounds of models measured more often (runs before ``--quick-repeat`` had none)."""
    quick = env.get("quick_repeat")
    if not quick or quick <= env.get("repeat", 0):
        return []
    return [
        f"Models onnxfuse optimizes in under {env.get('quick_seconds')} s get {quick} rounds: at",
        "tens of milliseconds a shared machine's drift moves single runs by a third.",
    ]


def _joined(runs: list[dict]) -> dict:
    """Runs of bench/speed.py over other model sets as one: the first run's scaling,
    external-data and command figures, every run's rows, each run's environment."""
    first = dict(runs[0])
    first["models"] = [row for run in runs for row in run.get("models", [])]
    first["more_environments"] = [run.get("environment", {}) for run in runs[1:]]
    return first


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--speed",
        type=Path,
        nargs="+",
        help="JSON of bench/speed.py: one run, or runs of other model sets (their rows joined)",
    )
    parser.add_argument("--latency", type=Path, help="JSON of bench/latency.py")
    parser.add_argument("--hotspots", type=Path, help="JSON of bench/hotspots.py")
    parser.add_argument("--fusions", type=Path, help="JSON of bench/fusion_speed.py")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "performance.md")
    args = parser.parse_args(argv)
    if not args.speed and not args.latency:
        parser.error("give --speed, --latency or both")
    speed = _joined([json.loads(path.read_text()) for path in args.speed]) if args.speed else None
    latency = json.loads(args.latency.read_text()) if args.latency else None
    hotspots = json.loads(args.hotspots.read_text()) if args.hotspots else None
    fusions = json.loads(args.fusions.read_text()) if args.fusions else None
    command = "python bench/performance_doc.py " + " ".join(sys.argv[1:] if argv is None else argv)
    args.out.write_text(document(speed, latency, command.strip(), hotspots, fusions) + "\n")
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
