"""The views of one side of the page as dot graphs: the top level (each folded block one
box) and each block's own nodes, with a port for every edge that leaves the block."""

from __future__ import annotations

import colorsys
import html
from collections import Counter
from dataclasses import dataclass, field

from onnxfuse.report.graph_view import GraphView

_GRAPH = (
    'graph [rankdir=TB nodesep=0.12 ranksep=0.22 bgcolor="transparent" fontname="Helvetica"];\n'
    'node [shape=box style="rounded,filled" fillcolor="#ffffff" color="#8a8a8a" '
    'fontname="Helvetica" fontsize=10 height=0.24 margin="0.06,0.02"];\n'
    'edge [color="#9a9a9a" arrowsize=0.5];\n'
)
_RULE_CELLS_SHOWN = 8
# A node read by more blocks or nodes than this is drawn beside each reader instead.
_FANOUT_DRAWN = 4  # colour cells in a block's box; more rules than that show as "+N"


def rule_colours(rules: list[str]) -> dict[str, str]:
    """A distinct, readable fill per rule: hues a golden angle apart, pale enough for
    black text, in the order given (the page's legend order)."""
    colours = {}
    for i, rule in enumerate(rules):
        red, green, blue = colorsys.hls_to_rgb((i * 0.381966) % 1.0, 0.72, 0.75)
        colours[rule] = f"#{round(red * 255):02x}{round(green * 255):02x}{round(blue * 255):02x}"
    return colours


@dataclass
class SideViews:
    """The dot sources of one side's views (the top level first, then each block's), and
    where each port of a block view leads: (block number or -1 for the top, node or -1)."""

    blocks: list[str]
    sources: list[str]
    ports: dict[str, tuple[int, int]] = field(default_factory=dict)


def side_views(
    side: str, view: GraphView, rules: list[str | None], status: list[str], colours: dict[str, str]
) -> SideViews:
    """``rules``: the rule each node is coloured by (a created node's own, or that of the
    node that replaced it); ``status``: each node's class (kept, fused, gone)."""
    return _Drawer(side, view, rules, status, colours).views()


class _Drawer:
    def __init__(
        self,
        side: str,
        view: GraphView,
        rules: list[str | None],
        status: list[str],
        colours: dict[str, str],
    ) -> None:
        self.side, self.view, self.rules, self.status, self.colours = (
            side,
            view,
            rules,
            status,
            colours,
        )
        self.blocks = list(dict.fromkeys(node.block for node in view.nodes if node.block))
        self.number = {key: k for k, key in enumerate(self.blocks)}
        self.result = SideViews(self.blocks, [])

    def views(self) -> SideViews:
        self.result.sources.append(self._top())
        for key in self.blocks:
            self.result.sources.append(self._block(key))
        return self.result

    def _representative(self, i: int) -> str:
        block = self.view.nodes[i].block
        return f"{self.side}{i}" if not block else f"{self.side}b{self.number[block]}"

    def _leads_to(self, i: int) -> tuple[int, int]:
        """Where a port standing for node ``i`` leads: its block, or the node itself."""
        block = self.view.nodes[i].block
        return (self.number[block], -1) if block else (-1, i)

    def _where(self, i: int) -> str:
        block = self.view.nodes[i].block
        return block.rpartition("/")[2] if block else self.view.nodes[i].name

    def _port(self, lines: list[str], port: str, i: int, label: str) -> None:
        self.result.ports[port] = self._leads_to(i)
        lines.append(
            f'"{port}" [id="{port}" class="p" shape=plaintext style="" fontcolor="#4a6fa5" '
            f'label="{_quoted(label)}"];'
        )

    def _node(self, i: int) -> str:
        side, node, rule = self.side, self.view.nodes[i], self.rules[i]
        attributes = [f'id="{side}{i}"', f'class="n {self.status[i]}"']
        label = node.op.rpartition("::")[2] if node.kind == "node" else node.name
        if node.kind != "node":
            attributes.append('shape=ellipse fillcolor="#eef2f7"')
        if rule is not None:
            attributes.append(f'fillcolor="{self.colours[rule]}" color="#444444"')
        elif self.status[i] == "gone":
            attributes.append('style="rounded,dashed" color="#b0b0b0" fontcolor="#909090"')
        return f'"{side}{i}" [{" ".join(attributes)} label="{_quoted(label)}"];'

    def _top(self) -> str:
        members: dict[str, list[int]] = {key: [] for key in self.blocks}
        lines: list[str] = []
        for i, node in enumerate(self.view.nodes):
            if node.block:
                members[node.block].append(i)
            else:
                lines.append(self._node(i))
        for key, inside in members.items():
            found = [self.rules[i] for i in inside]
            lines.append(_block_line(self.side, self.number[key], key, found, self.colours))
        edges = dict.fromkeys(
            (a, self._representative(a), self._representative(b))
            for a, b in self.view.edges
            if self._representative(a) != self._representative(b)
        )
        fanout = Counter(source for _, source, _ in edges)
        for producer, source, consumer in edges:
            if fanout[source] <= _FANOUT_DRAWN:
                lines.append(f'"{source}" -> "{consumer}";')
                continue
            # A value read by many blocks (an attention mask) drawn as one edge to each
            # would cross the whole stack: dot takes minutes on it, and a reader gets lost.
            stub = f"{self.side}s{len(self.result.ports)}"
            self._port(lines, stub, producer, self._where(producer))
            lines.append(f'"{stub}" -> "{consumer}";')
        return _digraph(lines)

    def _block(self, key: str) -> str:
        """A block's nodes; an edge from or to the rest of the graph ends at a port."""
        k, nodes = self.number[key], self.view.nodes
        lines = [self._node(i) for i, node in enumerate(nodes) if node.block == key]
        ports: dict[tuple[str, tuple[int, int]], str] = {}

        def port(direction: str, outside: int) -> str:
            found = ports.get((direction, self._leads_to(outside)))
            if found is None:
                found = ports[(direction, self._leads_to(outside))] = (
                    f"{self.side}p{k}_{len(ports)}"
                )
                arrow = "from" if direction == "in" else "to"
                self._port(lines, found, outside, f"{arrow} {self._where(outside)}")
            return found

        for a, b in self.view.edges:
            inside_a, inside_b = nodes[a].block == key, nodes[b].block == key
            if inside_a and inside_b:
                lines.append(f'"{self.side}{a}" -> "{self.side}{b}";')
            elif inside_b:
                lines.append(f'"{port("in", a)}" -> "{self.side}{b}";')
            elif inside_a:
                lines.append(f'"{self.side}{a}" -> "{port("out", b)}";')
        return _digraph(list(dict.fromkeys(lines)))


def _block_line(
    side: str, k: int, key: str, rules: list[str | None], colours: dict[str, str]
) -> str:
    found = list(dict.fromkeys(r for r in rules if r is not None))
    cells = "".join(
        f'<TD BGCOLOR="{colours[r]}" WIDTH="10" HEIGHT="8"></TD>' for r in found[:_RULE_CELLS_SHOWN]
    )
    if len(found) > _RULE_CELLS_SHOWN:
        cells += f"<TD><FONT POINT-SIZE='8'>+{len(found) - _RULE_CELLS_SHOWN}</FONT></TD>"
    fused = sum(r is not None for r in rules)
    title = html.escape(key.rpartition("/")[2])
    count = f"{len(rules)} nodes" + (f", {fused} fused" if fused else "")
    rows = f"<TR><TD COLSPAN='{max(1, len(found))}'><B>{title}</B></TD></TR>"
    rows += f"<TR><TD COLSPAN='{max(1, len(found))}'><FONT POINT-SIZE='8'>{count}</FONT></TD></TR>"
    if cells:
        rows += f"<TR>{cells}</TR>"
    label = f"<<TABLE BORDER='0' CELLSPACING='1' CELLPADDING='1'>{rows}</TABLE>>"
    style = 'style="filled,bold" fillcolor="#f4f4f4" color="#555555"'
    return f'"{side}b{k}" [id="{side}b{k}" class="b" shape=box {style} label={label}];'


def _digraph(lines: list[str]) -> str:
    return "digraph {\n" + _GRAPH + "\n".join(lines) + "\n}\n"


def _quoted(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"')
