"""The HTML report: the original and the optimized graph side by side, fused regions
coloured by rule and linked across, the rule table, the op diff, why the rules that never
applied did not, and the target's coverage. One file: no request leaves it."""

from __future__ import annotations

import html
import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import onnx_ir as ir

from onnxfuse import api
from onnxfuse.errors import OnnxfuseError
from onnxfuse.files.model_io import load_model
from onnxfuse.files.output_paths import write_text
from onnxfuse.language.rule import Rule
from onnxfuse.report.graph_view import GraphView, assign_blocks, graph_view
from onnxfuse.report.layout import render_svg, require_dot
from onnxfuse.report.views import SideViews, rule_colours, side_views
from onnxfuse.rewrite.explain import Explanation, explain_rule
from onnxfuse.rewrite.matcher import Rank
from onnxfuse.targets.capabilities import Target, load_target

# The key of the JSON report that says where the page's models and rules are.
RUN_KEY = "run"


def run_record(
    source: str | os.PathLike,
    output: str | os.PathLike | None,
    target: str,
    rules: Sequence[str],
    disable: Sequence[str],
    builtin: bool,
) -> dict[str, Any]:
    """What ``onnxfuse report REPORT.json --html`` reads back: the models as absolute
    paths (the report may be read from elsewhere), and the rules and target of the run,
    so that the page explains the rules that did not apply as the run saw them."""

    def absolute(path: str | os.PathLike) -> str:
        return os.path.abspath(path)

    spec = target
    if Path(target.partition(":")[0]).suffix in (".yaml", ".yml"):
        spec = absolute(target)
    return {
        "input": absolute(source),
        "output": absolute(output) if output is not None else None,
        "target": spec,
        "rules": [absolute(path) for path in rules],
        "disable": list(disable),
        "builtin": builtin,
    }


@dataclass
class _Side:
    key: str  # "L" (the input) or "R" (the optimized model)
    view: GraphView
    colour_by: list[str | None]  # the rule each node is coloured by
    status: list[str]  # kept, fused, gone (the input's nodes no rule replaced and not kept)
    links: list[list[int]]  # the other side's nodes each node is linked to


def write_page(
    data: dict[str, Any],
    destination: str | os.PathLike,
    optimized: str | os.PathLike | None = None,
    progress: Callable[[str], None] | None = None,
) -> None:
    """Write the page of the JSON report ``data`` (with its ``run`` record) to
    ``destination``. ``optimized``: where the optimized model is, when the run wrote it
    elsewhere than the record says (optimize --html without -o)."""
    require_dot()
    run = _checked(data)
    output = optimized if optimized is not None else run["output"]
    if output is None:
        raise OnnxfuseError("the JSON report records no optimized model: optimize ran without -o")
    for path, what in ((run["input"], "input"), (output, "optimized")):
        if not Path(path).is_file():
            raise OnnxfuseError(f"{path}: no such file (the {what} model of the JSON report)")
    target = load_target(run["target"])
    chosen = api.select_rules(run["rules"], run["disable"], builtin=run["builtin"], target=target)
    started = time.perf_counter()
    before = load_model(run["input"], target=target)
    after = load_model(output, target=target)
    left, right = graph_view(before), graph_view(after)
    assign_blocks(left)
    assign_blocks(right, left)
    sides = _link(left, right)
    rules = sorted({n.rule for n in right.nodes if n.rule is not None})
    colours = rule_colours(rules)
    drawn = [side_views(s.key, s.view, s.colour_by, s.status, colours) for s in sides]
    svgs = render_svg([source for views in drawn for source in views.sources])
    if progress is not None:
        count = sum(len(views.sources) for views in drawn)
        progress(f"page: {count} views laid out in {time.perf_counter() - started:.2f} s")
    explained = _not_applied(after, chosen, data, target)
    shown = run.get("output") or "not written (no -o)"
    page = _page(data, run, shown, sides, drawn, svgs, rules, colours, explained)
    write_text(destination, page)


def _checked(data: dict[str, Any]) -> dict[str, Any]:
    """The run record of a JSON report, each field of its type, and the report's rule
    table a table: a report edited by hand is one line, not a traceback."""
    run = data.get(RUN_KEY)
    if not isinstance(run, dict):
        raise OnnxfuseError(
            f"the JSON report has no '{RUN_KEY}' record of its models (made by optimize "
            "--report-json of this version)"
        )
    fields: dict[str, tuple[Callable[[Any], bool], str]] = {
        "input": (lambda v: isinstance(v, str), "a path"),
        "output": (lambda v: v is None or isinstance(v, str), "a path or null"),
        "target": (lambda v: isinstance(v, str), "a target"),
        "rules": (lambda v: isinstance(v, list) and all(isinstance(p, str) for p in v), "paths"),
        "disable": (lambda v: isinstance(v, list) and all(isinstance(n, str) for n in v), "names"),
        "builtin": (lambda v: isinstance(v, bool), "true or false"),
    }
    for name, (valid, what) in fields.items():
        if name not in run or not valid(run[name]):
            raise OnnxfuseError(f"the JSON report's {RUN_KEY}.{name} is not {what}")
    rules = data.get("rules", {})
    if not isinstance(rules, dict) or not all(isinstance(s, dict) for s in rules.values()):
        raise OnnxfuseError("the JSON report's rules are not a table of rule counts")
    return run


def _link(left: GraphView, right: GraphView) -> list[_Side]:
    """Each created node of the optimized model linked to the input's nodes it replaced;
    those take its rule's colour."""
    by_name = left.index()
    kept = right.index()
    left_links: list[list[int]] = [[] for _ in left.nodes]
    right_links: list[list[int]] = [[] for _ in right.nodes]
    left_rules: list[str | None] = [None] * len(left.nodes)
    for j, node in enumerate(right.nodes):
        for name in node.replaced:
            i = by_name.get(name)
            if i is not None:
                right_links[j].append(i)
                left_links[i].append(j)
                left_rules[i] = left_rules[i] or node.rule
    left_status = [
        "fused" if left_rules[i] else "kept" if n.kind != "node" or n.name in kept else "gone"
        for i, n in enumerate(left.nodes)
    ]
    right_status = ["fused" if n.rule else "kept" for n in right.nodes]
    return [
        _Side("L", left, left_rules, left_status, left_links),
        _Side("R", right, [n.rule for n in right.nodes], right_status, right_links),
    ]


def _not_applied(
    model: ir.Model, rules: list[Rule], data: dict[str, Any], target: Target
) -> list[tuple[str, Explanation, str | None]]:
    """For each rule that never applied but got past its anchor somewhere in the
    optimized model (or matched and was blocked), its nearest node as ``explain`` gives
    it: a match there, else the failure that got furthest."""
    stats = data.get("rules") or {}
    found = []
    for rule in rules:
        counts = stats.get(rule.name) or {}
        if counts.get("applied", 0):
            continue
        candidates = [
            e
            for e in explain_rule(model, rule, None, target)
            if e.matched or (e.rank is not None and (e.rank.whole_match or e.rank.nodes >= 2))
        ]
        if candidates:
            nearest = max(candidates, key=lambda e: (e.matched, e.rank or Rank()))
            found.append((rule.name, nearest, counts.get("blocked_reason")))
    return found


def _page(
    data: dict[str, Any],
    run: dict[str, Any],
    output: str,
    sides: list[_Side],
    drawn: list[SideViews],
    svgs: list[str],
    rules: list[str],
    colours: dict[str, str],
    explained: list[tuple[str, Explanation, str | None]],
) -> str:
    panes = []
    position = 0
    for side, views, title, path in zip(
        sides, drawn, ("original", "optimized"), (run["input"], output)
    ):
        parts = []
        for number, _ in enumerate(views.sources):
            hidden = "" if number == 0 else " hidden"
            parts.append(
                f'<div class="view" data-view="{number - 1}"{hidden}>{svgs[position]}</div>'
            )
            position += 1
        count = sum(n.kind == "node" for n in side.view.nodes)
        panes.append(
            f'<section class="pane" id="pane-{side.key}" data-side="{side.key}">'
            f'<header><b>{title}</b> <span class="path">{_e(path)}</span> '
            f'<span>{count} nodes</span> <nav class="crumbs"></nav></header>'
            f'<div class="stage">{"".join(parts)}</div></section>'
        )
    client = {
        "rules": rules,
        "colours": [colours[r] for r in rules],
        "sides": {
            side.key: {
                "names": [n.name for n in side.view.nodes],
                "ops": [n.op for n in side.view.nodes],
                "kinds": [n.kind for n in side.view.nodes],
                "blocks": views.blocks,
                "block": [views.blocks.index(n.block) if n.block else -1 for n in side.view.nodes],
                "rule": [rules.index(r) if r else -1 for r in side.colour_by],
                "links": side.links,
                "ports": views.ports,
            }
            for side, views in zip(sides, drawn)
        },
    }
    sections = [
        _summary(data, run, output),
        _legend(data, rules, colours),
        '<div class="panes">' + "".join(panes) + "</div>",
        _rule_table(data, colours),
        _op_diff(data),
        _explained(explained),
    ]
    coverage = coverage_section(data)
    if coverage:
        sections.append(coverage)
    payload = json.dumps(client, separators=(",", ":")).replace("</", "<\\/")
    return _TEMPLATE.format(
        title=_e(f"onnxfuse: {Path(run['input']).name}"),
        style=_asset("page.css"),
        body="\n".join(sections),
        data=payload,
        script=_asset("page.js"),
    )


def _summary(data: dict[str, Any], run: dict[str, Any], output: str) -> str:
    nodes_before, nodes_after = data.get("nodes_before", 0), data.get("nodes_after", 0)
    items = [
        f"<b>{nodes_before}</b> → <b>{nodes_after}</b> nodes",
        f"{data.get('rewrites', 0)} rewrites",
        f"{data.get('folded', 0)} constants folded",
        f"{data.get('iterations', 0)} iteration(s)",
        f"{data.get('seconds', 0):.3f} s",
        f"target <b>{_e(str(run.get('target') or 'cpu'))}</b>",
    ]
    stopped = data.get("stopped")
    notes = ""
    if isinstance(stopped, dict) and stopped.get("message"):
        notes += f'<p class="warn">stopped early: {_e(stopped["message"])}</p>'
    for repair in data.get("repairs") or []:
        notes += f'<p class="note">{_e(str(repair.get("message", "")))}</p>'
    return (
        '<header class="top"><h1>onnxfuse report</h1>'
        f'<p class="files">{_e(run["input"])} → {_e(output)}</p>'
        f'<p class="figures">{" · ".join(items)}</p>{notes}'
        '<div class="tools"><input id="search" type="search" autocomplete="off"'
        ' placeholder="search nodes by name or op"> <span id="found"></span>'
        ' <button id="fit" type="button">fit</button>'
        ' <span class="hint">wheel: zoom · drag: pan · click a block: open it ·'
        " hover a node: what it replaced</span></div>"
        '<ol id="results"></ol><div id="info"></div></header>'
    )


def _legend(data: dict[str, Any], rules: list[str], colours: dict[str, str]) -> str:
    if not rules:
        return (
            '<p class="legend">no node of the optimized model names the rule that created it'
            " (none fired, or it was written with --no-provenance): nothing is coloured</p>"
        )
    stats = data.get("rules") or {}
    items = "".join(
        f'<li data-rule="{i}"><span class="swatch" style="background:{colours[r]}"></span>'
        f"{_e(r)} <small>×{(stats.get(r) or {}).get('applied', '?')}</small></li>"
        for i, r in enumerate(rules)
    )
    return f'<ul class="legend">{items}</ul>'


def _rule_table(data: dict[str, Any], colours: dict[str, str]) -> str:
    stats: dict[str, dict[str, Any]] = data.get("rules") or {}
    shown = [
        (n, s) for n, s in stats.items() if s.get("matched") or s.get("applied") or s.get("blocked")
    ]
    shown.sort(key=lambda item: (-item[1].get("applied", 0), item[0]))
    rows = []
    for name, s in shown:
        swatch = (
            f'<span class="swatch" style="background:{colours[name]}"></span>'
            if name in colours
            else ""
        )
        reason = s.get("blocked_reason") or ""
        rows.append(
            f"<tr><td>{swatch}{_e(name)}</td><td>{s.get('matched', 0)}</td>"
            f"<td>{s.get('applied', 0)}</td><td>{s.get('blocked', 0)}</td>"
            f"<td>{s.get('seconds', 0) * 1000:.1f}</td><td>{_e(reason)}</td></tr>"
        )
    quiet = len(stats) - len(shown)
    body = "".join(rows) or '<tr><td colspan="6">no rule matched</td></tr>'
    return (
        '<section class="table" id="rules"><h2>Rules</h2><table><thead><tr><th>rule</th>'
        "<th>matched</th><th>applied</th><th>blocked</th><th>ms</th><th>blocked because</th>"
        f"</tr></thead><tbody>{body}</tbody></table>"
        f'<p class="note">{quiet} other rule(s) were tried and never matched.</p></section>'
    )


def _op_diff(data: dict[str, Any]) -> str:
    before: dict[str, int] = data.get("ops_before") or {}
    after: dict[str, int] = data.get("ops_after") or {}
    rows = []
    for op in sorted(set(before) | set(after), key=lambda o: (before.get(o) == after.get(o), o)):
        old, new = before.get(op, 0), after.get(op, 0)
        change = "same" if old == new else "up" if new > old else "down"
        rows.append(
            f'<tr class="{change}"><td>{_e(op)}</td><td>{old}</td><td>{new}</td>'
            f"<td>{new - old:+d}</td></tr>"
        )
    return (
        '<section class="table" id="ops"><h2>Ops</h2><table><thead><tr><th>op</th>'
        "<th>before</th><th>after</th><th>change</th></tr></thead>"
        f"<tbody>{''.join(rows)}</tbody></table></section>"
    )


def _explained(explained: list[tuple[str, Explanation, str | None]]) -> str:
    if not explained:
        body = "<p>No rule that never applied comes near a match in the optimized model.</p>"
    else:
        rows = []
        for rule, item, blocked in explained:
            where = f"{item.op_type} '{item.node}'" + (
                f" in graph '{item.graph}'" if item.graph else ""
            )
            verdict = (
                f"matches here, blocked: {blocked}"
                if item.matched and blocked
                else "matches here"
                if item.matched
                else f"no match: {item.reason}"
            )
            rows.append(
                f'<tr><td>{_e(rule)}</td><td><a class="goto" data-name="{_e(item.node)}">'
                f"{_e(where)}</a></td><td>{_e(verdict)}</td></tr>"
            )
        body = (
            "<table><thead><tr><th>rule</th><th>nearest node</th><th>first failing constraint"
            f"</th></tr></thead><tbody>{''.join(rows)}</tbody></table>"
        )
    return (
        '<section class="table" id="explain"><h2>Rules that never applied</h2>'
        '<p class="note">Each rule that did not apply but got past its anchor op somewhere '
        "in the optimized model, at the node it got furthest, as <code>onnxfuse explain</code> "
        f"says it.</p>{body}</section>"
    )


# Nodes the target cannot run listed per side; more are counted.
_UNCOVERED_LISTED = 50


def coverage_section(data: dict[str, Any]) -> str | None:
    """The target's coverage, when the report has one, as ``Coverage.to_json`` writes
    it; what is read, and nothing else:

    ``coverage: {"before": SIDE, "after": SIDE}``, each SIDE ``{"target": NAME,
    "nodes": N, "uncovered_ops": {OP: COUNT}, "uncovered": [{"node", "op", "reason",
    "graph"}], "partitions": [...]}``: per op (``Op`` or ``domain::Op``) how many nodes
    the target cannot run, which ones and why, and the runs of nodes it can."""
    coverage = data.get("coverage")
    if not isinstance(coverage, dict):
        return None
    before, after = coverage.get("before") or {}, coverage.get("after") or {}
    old: dict[str, int] = before.get("uncovered_ops") or {}
    new: dict[str, int] = after.get("uncovered_ops") or {}
    rows = (
        "".join(
            f"<tr><td>{_e(op)}</td><td>{old.get(op, 0)}</td><td>{new.get(op, 0)}</td></tr>"
            for op in sorted(set(old) | set(new))
        )
        or '<tr><td colspan="3">the target runs every node, before and after</td></tr>'
    )
    target = after.get("target") or before.get("target") or ""

    def totals(side: dict[str, Any], when: str) -> str:
        runs = len(side.get("partitions") or [])
        return (
            f"{sum((side.get('uncovered_ops') or {}).values())} of {side.get('nodes', '?')} "
            f"nodes {when} ({runs} run{'s' if runs != 1 else ''} of nodes it runs)"
        )

    listed = ""
    for side, key, title in ((before, "L", "original"), (after, "R", "optimized")):
        uncovered = [u for u in side.get("uncovered") or [] if isinstance(u, dict)]
        items = "".join(
            f'<li><a class="goto" data-side="{key}" data-name="{_e(str(u.get("node", "")))}">'
            f"{_e(str(u.get('op', '')))} &#x27;{_e(str(u.get('node', '')))}&#x27;</a>: "
            f"{_e(str(u.get('reason', '')))}</li>"
            for u in uncovered[:_UNCOVERED_LISTED]
        )
        more = len(uncovered) - _UNCOVERED_LISTED
        if more > 0:
            items += f"<li>and {more} more</li>"
        if items:
            listed += f"<h3>Not run in the {title} model</h3><ul>{items}</ul>"
    return (
        '<section class="table" id="coverage"><h2>Coverage</h2>'
        f"<p>Not run by <b>{_e(str(target))}</b>: {totals(before, 'before')}, "
        f"{totals(after, 'after')}.</p>"
        "<table><thead><tr><th>op the target cannot run</th><th>before</th>"
        f"<th>after</th></tr></thead><tbody>{rows}</tbody></table>{listed}</section>"
    )


def _e(text: str) -> str:
    return html.escape(text, quote=True)


def _asset(name: str) -> str:
    return (resources.files("onnxfuse.report") / "assets" / name).read_text(encoding="utf-8")


# The page's Content-Security-Policy: nothing is fetched, only the inline script and style run.
_POLICY = "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:"
_TEMPLATE = (
    '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">\n'
    f'<meta http-equiv="Content-Security-Policy" content="{_POLICY}">\n'
    '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
    "<title>{title}</title>\n<style>\n{style}</style></head>\n<body>\n{body}\n"
    '<script type="application/json" id="onnxfuse-data">{data}</script>\n'
    "<script>\n{script}</script>\n</body></html>\n"
)
