"""`onnxfuse check RULES...`: prove rule files on instances drawn from their domains."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from onnxfuse.cli.arguments import positive_int
from onnxfuse.errors import OnnxfuseError
from onnxfuse.support import workers

DEFAULT_EXAMPLES = 100
DEFAULT_SAVE_DIR = "onnxfuse-check"


def add_check_command(subparsers: argparse._SubParsersAction) -> None:
    check = subparsers.add_parser(
        "check",
        help="prove rules on generated instances: they fire, keep numerics, and spare negatives",
        description=(
            "Draw instances of each rule's source pattern from its verification domain "
            "(the rule's verify: mapping), and check that the rule fires, that onnxruntime "
            "gives the same outputs before and after within per-dtype tolerances (special "
            "values included), and that derived negative cases do not fire. A failing case "
            "is shrunk, printed, and saved as a small .onnx file with a one-line command "
            "that replays it. Exit code 0: every rule holds; 1: a rule failed; 2: bad input."
        ),
    )
    check.add_argument("rules", nargs="+", metavar="RULES", help="rule file(s) or pack folder(s)")
    check.add_argument(
        "--examples",
        type=positive_int,
        default=DEFAULT_EXAMPLES,
        metavar="N",
        help=f"instances to draw per rule (default {DEFAULT_EXAMPLES})",
    )
    check.add_argument(
        "--target",
        default="cpu",
        help="execution provider whose capabilities gate the rules (default cpu)",
    )
    check.add_argument(
        "--rule",
        action="append",
        default=[],
        metavar="NAME",
        help="check only this rule or op-set family",
    )
    check.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    check.add_argument(
        "--save-dir",
        default=DEFAULT_SAVE_DIR,
        metavar="DIR",
        help=f"where counterexamples are written (default ./{DEFAULT_SAVE_DIR})",
    )
    check.add_argument(
        "--replay", metavar="FILE", help="re-run a counterexample saved by an earlier check"
    )
    check.add_argument(
        "--no-negatives", action="store_true", help="skip the negative cases (faster)"
    )
    check.add_argument(
        "--negatives-per-instance",
        type=positive_int,
        default=None,
        metavar="N",
        help="check at most N of the negative and boundary cases derived from each instance, "
        "every kind in turn (default: all)",
    )
    workers.add_arguments(check, jobs_help="rules checked at once, in worker processes")
    check.set_defaults(handler=run_check)


def run_check(args: argparse.Namespace) -> int:
    try:
        import hypothesis  # noqa: F401
    except ImportError:
        raise OnnxfuseError("onnxfuse check needs hypothesis: pip install hypothesis") from None
    from onnxfuse.language.packs import check_unique, load_rules
    from onnxfuse.proof.hypothesis_home import keep_hypothesis_files_out_of_the_working_directory
    from onnxfuse.targets.capabilities import load_target

    keep_hypothesis_files_out_of_the_working_directory()
    run_on = workers.from_arguments(args)
    rules = load_rules(list(args.rules))
    check_unique(rules)
    if args.rule:
        # An op-set family's name (transpose-unary) stands for all its members.
        names = {r.name for r in rules} | {r.family for r in rules if r.family}
        unknown = [n for n in args.rule if n not in names]
        if unknown:
            raise OnnxfuseError(
                f"--rule: no rule named {', '.join(unknown)} in {' '.join(args.rules)}"
            )
        rules = [r for r in rules if r.name in set(args.rule) or r.family in set(args.rule)]
    target = load_target(args.target)
    _check_domains(rules)
    if args.replay:
        return _replay(args, rules, target)
    return _check(args, rules, target, run_on)


def _check(args: argparse.Namespace, rules, target, run_on: workers.Workers) -> int:
    from onnxfuse.proof.check import run_job, save_counterexample
    from onnxfuse.proof.hypothesis_home import keep_hypothesis_files_out_of_the_working_directory

    where = " ".join(args.rules)
    print(
        f"onnxfuse check {where}: {len(rules)} rule(s), {args.examples} instances each, "
        f"target {args.target}" + ("" if run_on.in_process else f", {run_on.describe()}"),
        flush=True,
    )
    width = max((len(r.name) for r in rules), default=4)
    failed = 0
    options = {
        "examples": args.examples,
        "target": target,
        "seed": args.seed,
        "negative": not args.no_negatives,
        "negatives_per_instance": args.negatives_per_instance,
    }
    jobs = [(rule, options) for rule in rules]
    reports = workers.run_jobs(
        run_job, jobs, run_on, keep_hypothesis_files_out_of_the_working_directory
    )
    # Each rule's lines in the order of the rules, whichever worker finishes first.
    for rule, report in zip(rules, workers.in_order(reports)):
        if report.unavailable is not None:
            print(f"  skip  {rule.name:<{width}}  {report.summary()}", flush=True)
            continue
        if report.ok:
            print(f"  ok    {rule.name:<{width}}  {report.summary()}", flush=True)
            continue
        failed += 1
        if report.error is not None:
            print(f"  FAIL  {rule.name:<{width}}  {report.error}", flush=True)
            continue
        failure = report.failure
        assert failure is not None
        text = failure.format().replace("\n", "\n        ")
        print(f"  FAIL  {rule.name:<{width}}  {text}")
        if failure.kind != "domain-error":
            rules_path = _rule_path(rule, args.rules)
            path, command = save_counterexample(
                failure, Path(args.save_dir), rules_path, args.target
            )
            print(f"        counterexample: {path}")
            print(f"        reproduce: {command}", flush=True)
    print(
        f"{failed} of {len(rules)} rule(s) failed" if failed else f"all {len(rules)} rule(s) hold"
    )
    return 1 if failed else 0


def _check_domains(rules) -> None:
    """A malformed verification domain is bad input (file:line, exit 2) before anything
    runs; a rule without one fails its check instead (nothing proves it)."""
    from onnxfuse.proof.domain import parse_domain

    for rule in rules:
        if rule.verify:
            parse_domain(rule)


def _rule_path(rule, given: list[str]) -> str:
    origin = rule.origin.rsplit(":", 1)[0] if rule.origin else ""
    return origin or given[0]


def _replay(args: argparse.Namespace, rules, target) -> int:
    from onnxfuse.proof.check import load_counterexample, replay

    path = Path(args.replay)
    if not path.is_file():
        raise OnnxfuseError(f"{path}: no such file")
    try:
        model, meta, feeds = load_counterexample(path)
    except Exception as exc:
        raise OnnxfuseError(
            f"{path}: not a counterexample saved by onnxfuse check ({exc})"
        ) from None
    name = meta.get("rule")
    chosen = [r for r in rules if r.name == name] if name else rules
    if len(chosen) != 1:
        raise OnnxfuseError(
            f"{path}: rule {name!r} is not among the rules given"
            if name
            else f"{path}: name the rule with --rule"
        )
    rule = chosen[0]
    expect = meta.get("expect", "match")
    problem = replay(model, expect, feeds, rule, target)
    if problem is None:
        print(f"{rule.name}: {path} no longer fails")
        return 0
    print(f"{rule.name}: {path} still fails: {problem}", file=sys.stdout)
    return 1
