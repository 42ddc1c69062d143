"""`onnxfuse explain IN --rule NAME`: why a rule does or does not match, node by node."""

from __future__ import annotations

import argparse

from onnxfuse.cli.arguments import add_rule_options
from onnxfuse.errors import OnnxfuseError


def add_explain_command(sub: argparse._SubParsersAction) -> None:
    explain = sub.add_parser("explain", help="why a rule does or does not match")
    explain.add_argument("model", help="input .onnx model")
    explain.add_argument("--rule", required=True, help="rule or op-set family name")
    explain.add_argument("--node", help="only this node (by name)")
    explain.add_argument(
        "--after-rules",
        action="store_true",
        help="explain on the model as the other rules leave it (a run without this rule)",
    )
    add_rule_options(explain)
    explain.set_defaults(handler=_run_explain)


def _run_explain(args: argparse.Namespace) -> int:
    from onnxfuse import api
    from onnxfuse.cli.report import warn_repairs
    from onnxfuse.files.model_io import load_model
    from onnxfuse.rewrite.report import REPAIRS_META
    from onnxfuse.targets.capabilities import load_target

    target = load_target(args.target)
    rules = api.select_rules(args.rules, builtin=not args.no_builtin, target=target)
    # An op-set family's name (transpose-unary) explains each of its members.
    chosen = [r for r in rules if args.rule in (r.name, r.family)]
    if not chosen:
        elsewhere = api.why_not_selected(
            args.rule, args.rules, builtin=not args.no_builtin, target=target
        )
        raise OnnxfuseError(elsewhere or f"no rule named '{args.rule}' (see `onnxfuse rules list`)")
    model = load_model(args.model, target=target)
    if args.after_rules:
        others = [r for r in rules if all(r is not c for c in chosen)]
        _, report = api.optimize(model, target, others, builtin=False, return_report=True)
        fired = sorted((n, s.applied) for n, s in report.rules.items() if s.applied)
        applied = ", ".join(f"{n} {count}x" for n, count in fired)
        print(f"after the other rules ({applied or 'none fired'}):")
    for rule in chosen:
        prefix = f"{rule.name}: " if len(chosen) > 1 else ""
        refused = rule.refused_by(target.params)
        if refused is not None:
            print(
                f"{rule.name}: not tried on target '{target.name}': the guard "
                f'"{refused}" is false for its parameters'
            )
            continue
        results = api.explain(model, rule, args.node, target)
        if not results:
            print(f"{rule.name}: no node in the model can anchor this rule")
        for item in results:
            where = f"{item.op_type} '{item.node}'" + (
                f" in graph '{item.graph}'" if item.graph else ""
            )
            verdict = "matches" if item.matched else f"no match: {item.reason}"
            print(f"{prefix}{where}: {verdict}")
    warn_repairs(model.meta.get(REPAIRS_META, ()))  # the node names above may be new ones
    return 0
