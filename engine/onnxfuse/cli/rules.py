"""`onnxfuse rules list`: the rules that would be loaded."""

from __future__ import annotations

import argparse

from onnxfuse.cli.arguments import Parser, add_rule_options


def add_rules_command(sub: argparse._SubParsersAction) -> None:
    rules = sub.add_parser("rules", help="inspect rule packs")
    rules_sub = rules.add_subparsers(dest="rules_command", required=True, parser_class=Parser)
    listing = rules_sub.add_parser("list", help="list rules")
    add_rule_options(listing)
    listing.set_defaults(handler=_run_rules_list)


def _run_rules_list(args: argparse.Namespace) -> int:
    from onnxfuse import api

    rules = api.select_rules(args.rules, builtin=not args.no_builtin, target=args.target)
    width = max((len(r.name) for r in rules), default=4)
    print(f"{'rule':<{width}}  {'pack':<10} benefit  description")
    for rule in rules:
        summary = " ".join(rule.description.split())
        print(f"{rule.name:<{width}}  {rule.pack:<10} {rule.benefit:>7}  {summary}")
    print(f"{len(rules)} rules")
    return 0
