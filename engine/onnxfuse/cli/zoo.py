"""`onnxfuse zoo DIR|MANIFEST`: optimize every model of a folder or a zoo manifest, check
each result against the original on onnxruntime, optionally beside the peers, and write
one table (Markdown, JSON lines)."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import tempfile
from pathlib import Path

from onnxfuse.cli.arguments import add_rule_options
from onnxfuse.errors import OnnxfuseError
from onnxfuse.support import workers
from onnxfuse.zoo import PEERS


def add_zoo_command(subparsers: argparse._SubParsersAction) -> None:
    zoo = subparsers.add_parser(
        "zoo",
        help="optimize every model of a folder or manifest and check each against the original",
        description=(
            "Optimize every .onnx file under DIR, or every model of a zoo MANIFEST (fetched "
            "and cached), check each result against the original on onnxruntime (the "
            "manifest's inputs, or random ones from the declared shapes, symbolic dimensions "
            "set to 1), optionally run the peers on it, and report per model: nodes, sizes, "
            "time, max diff, latency ratio, the rules that fired, and for a failure the "
            "command that reproduces it. A line per model as it is done; the last says "
            "`N passed, M failed`. Exit code 0: every result is valid; 1: one is not; 2: "
            "bad input."
        ),
    )
    zoo.add_argument("source", metavar="DIR|MANIFEST", help="a folder of models or a manifest")
    add_rule_options(zoo)
    zoo.add_argument(
        "--peers",
        default="",
        metavar="LIST",
        help="comma-separated peers to run too: " + ",".join(PEERS),
    )
    zoo.add_argument(
        "--every-pack",
        action="store_true",
        help="every built-in pack, not only those for the target",
    )
    zoo.add_argument(
        "--every-fusion",
        action="store_true",
        help="also the fusions a target profile gates (as the peers are compared)",
    )
    zoo.add_argument("--seed", type=int, default=0, help="random inputs' seed (default 0)")
    zoo.add_argument(
        "--latency-runs",
        type=int,
        default=5,
        metavar="N",
        help="runs per model to time the original and the result (0: no latency)",
    )
    zoo.add_argument("--json", metavar="FILE", help="write a JSON line per model here")
    zoo.add_argument("--markdown", metavar="FILE", help="write the tables here")
    workers.add_arguments(zoo, jobs_help="models at once, in worker processes")
    zoo.set_defaults(handler=run_zoo)


def run_zoo(args: argparse.Namespace) -> int:
    from onnxfuse.zoo import run, table

    source = Path(args.source)
    if not source.exists():
        raise OnnxfuseError(f"{source}: no such folder or manifest")
    peers = [p for p in args.peers.split(",") if p]
    unknown = [p for p in peers if p not in PEERS]
    if unknown:
        raise OnnxfuseError(f"--peers: unknown {', '.join(unknown)} (one of {', '.join(PEERS)})")
    if args.latency_runs < 0:
        raise OnnxfuseError("--latency-runs must be >= 0")
    for path in (args.json, args.markdown):
        if path and (Path(path).is_dir() or not Path(path).resolve().parent.is_dir()):
            raise OnnxfuseError(f"{path}: not a file in an existing directory")
    run_on = workers.from_arguments(args)
    _check_rules(args)
    settings = run.Settings(
        target=args.target,
        rules=tuple(str(Path(p).resolve()) for p in args.rules),
        builtin=not args.no_builtin,
        every_pack=args.every_pack,
        every_fusion=args.every_fusion,
        peers=tuple(PEERS[p] for p in peers),
        latency_runs=args.latency_runs,
        seed=args.seed,
    )
    command = (
        "onnxfuse zoo " + " ".join(sys.argv[2:]) if sys.argv[1:2] == ["zoo"] else "onnxfuse zoo"
    )
    if source.is_dir() and next(source.rglob("*.onnx"), None) is None:
        raise OnnxfuseError(f"{source}: no .onnx file in this folder")
    with tempfile.TemporaryDirectory(prefix="onnxfuse-zoo-") as tmp:
        lines = Path(args.json) if args.json else Path(tmp) / "rows.jsonl"
        passed, failed = _run(run.jobs_of(source, settings), run_on, lines)
        if args.markdown:
            text = table.markdown(table.reader(lines), f"onnxfuse zoo: {source}", command)
            Path(args.markdown).write_text(text, encoding="utf-8")
            print(f"tables: {args.markdown}", file=sys.stderr)
    print(f"{passed} passed, {failed} failed", flush=True)
    return 1 if failed else 0


def _command(args: argparse.Namespace) -> str:
    """The command line of this run, as the report's header gives it."""
    words = ["onnxfuse", "zoo", args.source, "--target", args.target]
    for path in args.rules:
        words += ["--rules", path]
    flags = [("--no-builtin", args.no_builtin), ("--every-pack", args.every_pack)]
    flags.append(("--every-fusion", args.every_fusion))
    words += [flag for flag, on in flags if on]
    if args.peers:
        words += ["--peers", args.peers]
    return shlex.join(words)


def _check_rules(args: argparse.Namespace) -> None:
    """A bad rule file or target: one line, before any model runs."""
    from onnxfuse.api import select_rules
    from onnxfuse.targets.capabilities import load_target

    load_target(args.target)
    select_rules(args.rules, builtin=not args.no_builtin, target=args.target)


def _run(jobs, run_on: workers.Workers, lines: Path) -> tuple[int, int]:
    """Each row written (a JSON line) and shown as its model is done, in the models' order."""
    from onnxfuse.zoo.run import run_job

    passed = failed = 0
    with lines.open("w", encoding="utf-8") as out:
        for row in workers.in_order(workers.run_jobs(run_job, jobs, run_on)):
            out.write(json.dumps(row) + "\n")
            out.flush()
            passed += row["ok"]
            failed += not row["ok"]
            print(_line(row), flush=True)
    return passed, failed


def _line(row: dict) -> str:
    if not row["ok"]:
        why = row.get("error") or row["tools"]["onnxfuse"]["error"]
        return f"  FAIL  {row['model']}: {why}\n        reproduce: {row['repro']}"
    ours = row["tools"]["onnxfuse"]
    parts = [f"nodes {row['nodes']} -> {ours['nodes']}", f"max diff {ours['max_error']:.3g}"]
    if "latency" in row:
        parts.append(f"latency x{row['latency']['ratio']:.3f}")
    parts.append(f"{sum(row['fired'].values())} rewrites by {len(row['fired'])} rules")
    parts.append(f"inputs {row['inputs']}")
    return f"  ok    {row['model']}: " + "; ".join(parts)
