"""Topology diagrams: a spec drawn as a self-contained SVG (or offline HTML page) in pure Python.

The main flow and every subflow become framed clusters, stacked top to bottom. Inside one, nodes
are laid out left to right in layers (longest path from the start marker, back edges reversed,
long edges routed through dummy points, barycenter sweeps against crossings, then an isotonic
placement that keeps edges straight). Back edges and self-loops are drawn as red curves; agent
nodes carry their tools underneath (dashed); agent tools and DAG nodes link to the subflows they
run through a gutter on the right. Same spec, byte-identical output.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from xml.sax.saxutils import escape

from workbench.topology.spec import END, AgentNode, CallNode, DagNode, Flow, MapNode, Topology

__all__ = ["DiagramError", "Signals", "measures_text", "save", "to_html", "to_svg"]

FONT = "Helvetica, Arial, 'DejaVu Sans', sans-serif"
COLORS = {  # kind -> (fill, stroke)
    "call": ("#e8f0fe", "#3b6fd8"),
    "agent": ("#e6f4ea", "#2e8b57"),
    "map": ("#fff3e0", "#d9822b"),
    "dag": ("#f3e8fd", "#8e44ad"),
    "missing": ("#fdecea", "#c0392b"),
}
INK, EDGE, BACK, LINK, TOOL = "#1f2933", "#55606e", "#c0392b", "#8e44ad", "#7f8c8d"
LABEL_MAX, NODE_H, TOOL_H, MARK_R = 32, 40.0, 32.0, 9.0
VGAP, PAD, TITLE_H, LANE = 26.0, 18.0, 34.0, 14.0


class DiagramError(ValueError):
    """A diagram could not be drawn or written (the message says what to change)."""


@dataclass(frozen=True)
class Signals:
    """Numbers to draw on a diagram (``workbench.analysis.signals`` reads them from a run).

    ``roles``: role -> {measure: value}; each node of a role is filled by its ``colour_by`` value on a scale
    from ``low`` (red) to ``high`` (green), shows that value, and lists every measure when hovered.
    ``edges``: (from node, to node) -> {measure: value} (``"<start>"``/``"<end>"`` for the markers); an edge
    with ``taken`` is labelled with that share, and every measure is listed when hovered. ``title`` says
    what the numbers are (a run, a step).
    """

    title: str
    roles: dict[str, dict[str, float]]
    colour_by: str
    edges: dict[tuple[str, str], dict[str, float]] = field(default_factory=dict)
    low: float = 0.0
    high: float = 1.0

    def fill(self, role: str) -> str | None:
        """The fill colour of a node of ``role``; None where the role has no ``colour_by`` value."""
        value = self.roles.get(role, {}).get(self.colour_by)
        if value is None or value != value:  # NaN: not measured
            return None
        t = min(max((value - self.low) / ((self.high - self.low) or 1.0), 0.0), 1.0)
        low, mid, high = (0xF4, 0xA5, 0xA0), (0xFF, 0xF6, 0xD5), (0x9B, 0xD8, 0xA5)
        a, b, u = (low, mid, 2 * t) if t < 0.5 else (mid, high, 2 * t - 1)
        return "#" + "".join(f"{round(x + (y - x) * u):02x}" for x, y in zip(a, b, strict=True))


def measures_text(values: dict[str, float]) -> str:
    """Measures one a line, ``name: value`` (what hovering a measured node or edge lists)."""
    return "\n".join(f"{name}: {_figure(v)}" for name, v in values.items())


def _figure(value: float) -> str:
    return "n/a" if value != value else f"{value:.3g}" if abs(value) < 1000 else f"{value:,.0f}"


def _w(text: str, size: float, bold: bool = False) -> float:
    """Approximate rendered width of ``text`` (errs wide, so boxes never clip)."""
    units = sum(
        0.34 if c in "iljtfrI.,;:!|' " else 0.92 if c in "mwMW@%" else 0.7 if c.isupper() else 0.62
        for c in text
    )
    return units * size * (1.08 if bold else 1.0)


def _n(v: float) -> str:
    s = f"{v:.1f}"
    return s[:-2] if s.endswith(".0") else s


def _a(value: object) -> str:
    return '"' + escape(str(value), {'"': "&quot;"}) + '"'


def _short(text: str, limit: int = LABEL_MAX) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def _text(
    x: float,
    y: float,
    s: str,
    size: float = 11,
    bold: bool = False,
    fill: str = INK,
    anchor: str = "middle",
    style: str = "",
) -> str:
    weight = ' font-weight="bold"' if bold else ""
    return (
        f'<text x="{_n(x)}" y="{_n(y)}" font-size="{_n(size)}"{weight}{style} fill="{fill}"'
        f' text-anchor="{anchor}">{escape(s)}</text>'
    )


def _label(x: float, y: float, s: str, color: str, italic: bool = False) -> str:
    w = _w(s, 10) + 8
    style = ' font-style="italic"' if italic else ""
    return (
        f'<g class="label"><rect x="{_n(x - w / 2)}" y="{_n(y - 7)}" width="{_n(w)}" height="14" rx="3"'
        f' fill="#ffffff" fill-opacity="0.92"/>' + _text(x, y + 3.5, s, 10, fill=color, style=style) + "</g>"
    )


@dataclass
class _Item:
    key: str
    kind: str  # call / agent / map / dag / missing, or start / end / dummy
    line2: str = ""
    role: str = ""  # the role (or graph) the node runs
    tip: str = ""
    w: float = 0.0  # whole block: loop room + box + tool row
    h: float = 0.0
    box_w: float = 0.0
    box_h: float = 0.0
    top: float = 0.0  # box offset inside the block (room for self-loops)
    tools: list[tuple[str, str, float]] = field(default_factory=list)  # name, detail, width
    loops: int = 0
    x: float = 0.0
    y: float = 0.0

    @property
    def cx(self) -> float:
        return self.x + self.w / 2

    @property
    def port(self) -> float:
        return self.y + self.top + self.box_h / 2

    @property
    def left(self) -> float:
        return self.cx - self.box_w / 2

    @property
    def right(self) -> float:
        return self.cx + self.box_w / 2

    def tool_boxes(self) -> list[tuple[str, str, float, float, float]]:
        """(name, detail, x, y, width) of each tool box under the node."""
        total = sum(t[2] for t in self.tools) + 10 * (len(self.tools) - 1)
        x, y, out = self.cx - total / 2, self.y + self.top + self.box_h + 22, []
        for name, detail, width in self.tools:
            out.append((name, detail, x, y, width))
            x += width + 10
        return out


@dataclass
class _Edge:
    src: str
    dst: str
    when: str | None
    label: str | None = None
    back: bool = False
    counted: bool = True
    chain: list[str] = field(default_factory=list)  # drawing order, dummies included


def _pava(targets: list[float], sizes: list[float]) -> list[float]:
    """Positions closest (least squares) to ``targets`` with p[k+1] >= p[k] + sizes[k]."""
    offs, o = [], 0.0
    for s in sizes:
        offs.append(o)
        o += s
    blocks: list[list[float]] = []
    for t, off in zip(targets, offs, strict=True):
        blocks.append([t - off, 1.0])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            s, c = blocks.pop()
            blocks[-1][0] += s
            blocks[-1][1] += c
    flat = [s / c for s, c in blocks for _ in range(int(c))]
    return [z + off for z, off in zip(flat, offs, strict=True)]


def _mark(key: str, kind: str) -> _Item:
    d = 2 * MARK_R
    return _Item(key, kind, tip=kind, w=d, h=d, box_w=d, box_h=d)


def _kind_role(node: CallNode | AgentNode | MapNode | DagNode) -> tuple[str, str]:
    if isinstance(node, DagNode):
        return "dag", node.dag
    if isinstance(node, AgentNode):
        return "agent", node.agent
    if isinstance(node, MapNode):
        return "map", node.map
    return "call", node.call


class _Cluster:
    """One flow laid out in local coordinates (origin at the frame's top-left corner)."""

    def __init__(self, topology: Topology, name: str, flow: Flow, title: str):
        self.name, self.flow, self.title = name, flow, title
        self.notes: list[str] = [f"inputs: {', '.join(flow.inputs)}"] if flow.inputs else []
        self.items: dict[str, _Item] = {}
        self.edges: list[_Edge] = []
        self.layer: dict[str, int] = {}
        self.sources: list[tuple[str, int | None, str, str]] = []  # item, tool index, subflow, note
        self._build(topology)
        self._rank()
        self._place()

    def _build(self, topology: Topology) -> None:
        items = self.items
        items["<start>"] = _mark("<start>", "start")
        for name, node in self.flow.nodes.items():
            kind, role = _kind_role(node)
            tip = f"{role}: {topology.roles[role].description}" if role in topology.roles else role
            if isinstance(node, DagNode):
                tip = f"runs the graph {role}: " + ", ".join(f"{a} -> {s}" for a, s in node.agents.items())
                subs = [s for s in topology.subflows if s in node.agents.values()]
                for sub in subs:
                    agents = ", ".join(a for a, s in node.agents.items() if s == sub)
                    self.sources.append((name, None, sub, f"DAG agent {agents} of {name}"))
            line2 = f"{kind} · {role}"
            bw = max(90.0, _w(name, 13, True) + 24, _w(line2, 11) + 20)
            item = _Item(name, kind, line2, role, tip, box_w=bw, box_h=NODE_H)
            for i, tname in enumerate(node.tools if isinstance(node, AgentNode) else []):
                tool = topology.tools.get(tname)
                if tool is None:
                    detail = "undefined tool"
                elif tool.kind == "agent":
                    detail = f"agent → {tool.subflow}"
                    if tool.subflow in topology.subflows:
                        self.sources.append((name, i, tool.subflow, f"agent tool {tname} of {name}"))
                elif tool.route is not None:
                    detail = f"{tool.kind} → {tool.route.via} distils"
                else:
                    detail = tool.kind
                item.tools.append((tname, detail, max(_w(tname, 11, True), _w(detail, 10)) + 16))
            items[name] = item

        def target(goto: str) -> str:
            key = "<end>" if goto == END else goto
            if key == "<end>" and key not in items:
                items[key] = _mark(key, "end")
            elif key not in items:
                items[key] = _Item(
                    key,
                    "missing",
                    "undefined node",
                    "",
                    "undefined node",
                    box_w=max(110.0, _w(key, 13, True) + 24),
                    box_h=NODE_H,
                )
            return key

        self.edges.append(_Edge("<start>", target(self.flow.start), None, counted=False))
        for name, node in self.flow.nodes.items():
            for branch in node.next:
                edge = _Edge(name, target(branch.goto), branch.when)
                edge.label = (
                    _short(branch.when) if branch.when else "otherwise" if len(node.next) > 1 else None
                )
                self.edges.append(edge)
        for e in self.edges:
            items[e.src].loops += e.src == e.dst
        for it in items.values():
            if it.loops:
                labels = [e.label or "" for e in self.edges if e.src == e.dst == it.key]
                it.top = 0.75 * (24 + 8 * (it.loops - 1)) + 8 + (14 if any(labels) else 0)
                it.w = max(_w(s, 10) + 12 for s in labels)
            tools_w = sum(t[2] for t in it.tools) + 10 * (len(it.tools) - 1)
            it.w = max(it.w, it.box_w, tools_w)
            it.h = it.top + it.box_h + (22 + TOOL_H if it.tools else 0)

    def _rank(self) -> None:
        items, edges = self.items, self.edges
        out: dict[str, list[_Edge]] = {k: [] for k in items}
        for e in edges:
            out[e.src].append(e)
        state: dict[str, int] = {}
        pre: list[str] = []
        post: list[str] = []

        def visit(k: str) -> None:
            state[k] = 1
            pre.append(k)
            for e in out[k]:
                if state.get(e.dst) == 1:
                    e.back = True
                elif e.dst not in state:
                    visit(e.dst)
            state[k] = 2
            post.append(k)

        for k in list(items):
            if k not in state:
                visit(k)
        succ: dict[str, list[str]] = {k: [] for k in items}
        for e in edges:
            if e.src != e.dst:
                a, b = (e.dst, e.src) if e.back else (e.src, e.dst)
                succ[a].append(b)
        layer = self.layer
        layer.update({k: 0 for k in items})
        for k in reversed(post):
            for b in succ[k]:
                layer[b] = max(layer[b], layer[k] + 1)
        rank = {k: float(i) for i, k in enumerate(pre)}
        self.up: dict[str, list[str]] = {k: [] for k in items}
        self.down: dict[str, list[str]] = {k: [] for k in items}
        for e in edges:
            if e.src == e.dst:
                e.chain = [e.src]
                continue
            a, b = (e.dst, e.src) if e.back else (e.src, e.dst)
            chain = [a]
            for i in range(layer[a] + 1, layer[b]):
                key = f"<d{len(items)}>"
                items[key] = _Item(key, "dummy", h=4.0, box_h=4.0)
                layer[key], rank[key] = i, rank[a] + 0.5
                self.up[key], self.down[key] = [], []
                chain.append(key)
            chain.append(b)
            for p, q in zip(chain, chain[1:], strict=False):
                self.down[p].append(q)
                self.up[q].append(p)
            e.chain = chain[::-1] if e.back else chain
        self.layers: list[list[str]] = [[] for _ in range(max(layer.values()) + 1)]
        for k in sorted(items, key=lambda k: rank[k]):
            self.layers[layer[k]].append(k)
        n = len(self.layers)
        for sweep in range(4):
            nbrs, order = (self.up, range(1, n)) if sweep % 2 == 0 else (self.down, range(n - 2, -1, -1))
            for i in order:
                pos = {k: j for lay in self.layers for j, k in enumerate(lay)}
                self.layers[i].sort(
                    key=lambda k, nb=nbrs, p=pos: (
                        sum(p[m] for m in nb[k]) / len(nb[k]) if nb[k] else p[k],
                        p[k],
                    )
                )

    def _place(self) -> None:
        items, layers = self.items, self.layers
        colw = [max(items[k].w for k in lay) for lay in layers]
        gaps = [56.0] * len(layers)
        for e in self.edges:
            if e.label and len(e.chain) > 1:
                g = min(self.layer[e.chain[0]], self.layer[e.chain[1]])
                gaps[g] = max(gaps[g], _w(e.label, 10) + 40)
        x = PAD
        for i, lay in enumerate(layers):
            for k in lay:
                it = items[k]
                if it.kind == "dummy":
                    it.w = it.box_w = colw[i]
                it.x = x + (colw[i] - it.w) / 2
            x += colw[i] + (gaps[i] if i < len(layers) - 1 else 0)
        self.content_w = x + PAD
        for lay in layers:
            y = 0.0
            for k in lay:
                items[k].y, y = y, y + items[k].h + VGAP
        for sweep in range(10):
            for i in range(len(layers)) if sweep % 2 == 0 else range(len(layers) - 1, -1, -1):
                targets = []
                for k in layers[i]:
                    it, nb = items[k], self.up[k] + self.down[k]
                    want = sum(items[m].port for m in nb) / len(nb) if nb else it.port
                    targets.append(want - it.top - it.box_h / 2)
                ys = _pava(targets, [items[k].h + VGAP for k in layers[i]])
                for k, y in zip(layers[i], ys, strict=True):
                    items[k].y = y
        low = min(it.y for it in items.values())
        for it in items.values():
            it.y += TITLE_H + 8 - low
        self.content_h = max(it.y + it.h for it in items.values()) + PAD + 6

    def width(self) -> float:
        head = _w(self.title, 13, True) + 36 + sum(_w(s, 11) + 20 for s in self.notes)
        return max(self.content_w, head)

    def shift(self, dx: float, dy: float, n_links: int) -> None:
        self.ox, self.oy = dx, dy
        self.h = self.content_h + (n_links * LANE + 4 if n_links else 0)
        for it in self.items.values():
            it.x += dx
            it.y += dy

    def source_point(self, key: str, tool: int | None, sub: str) -> tuple[float, float]:
        it = self.items[key]
        if tool is not None:
            _, _, x, y, w = it.tool_boxes()[tool]
            return x + w / 2, y + TOOL_H
        subs = [s for k, _, s, _ in self.sources if k == key]
        return it.left + it.box_w * (subs.index(sub) + 1) / (len(subs) + 1), it.y + it.top + it.box_h

    def svg(self, width: float, uid: str, signals: Signals | None = None) -> list[str]:
        ox, oy = self.ox, self.oy
        out = [
            f'<g class="cluster" data-flow={_a(self.name)}>'
            f'<rect x="{_n(ox)}" y="{_n(oy)}" width="{_n(width)}" height="{_n(self.h)}" rx="10"'
            f' fill="#fafbfc" stroke="#b0b7c3" stroke-width="1.2"/>',
            _text(ox + 12, oy + 21, self.title, 13, True, anchor="start"),
        ]
        nx = ox + 12 + _w(self.title, 13, True) + 18
        for note in self.notes:
            out.append(_text(nx, oy + 21, note, 11, fill="#6b7785", anchor="start"))
            nx += _w(note, 11) + 20
        out.append("</g>")
        labels, seen = [], {}
        for e in self.edges:
            d, mid = self._path(e, seen)
            color = BACK if e.back else EDGE
            cls = "edge back" if e.back else "edge" if e.counted else "start-edge"
            tip = f"{e.src} → {e.dst}" + (f" when {e.when}" if e.when else "")
            measured = signals.edges.get((e.src, e.dst)) if signals is not None else None
            label = e.label
            if measured:
                tip += "\n" + measures_text(measured)
                if "taken" in measured:
                    label = f"{label} · {measured['taken']:.0%}" if label else f"{measured['taken']:.0%}"
            out.append(
                f'<g class="{cls}" data-from={_a(e.src)} data-to={_a(e.dst)}><title>{escape(tip)}</title>'
                f'<path d="{d}" fill="none" stroke="{color}" stroke-width="1.5"'
                f' marker-end="url(#{uid}-{"back" if e.back else "fwd"})"/></g>'
            )
            if label:
                labels.append(_label(*mid, label, color, italic=not e.when))
        for it in self.items.values():
            out.extend(self._item(it, signals))
        return out + labels

    def _path(self, e: _Edge, seen: dict[tuple[str, str], int]) -> tuple[str, tuple[float, float]]:
        its = [self.items[k] for k in e.chain]
        m = seen[(e.src, e.dst)] = seen.get((e.src, e.dst), -1) + 1
        if len(its) == 1:
            it = its[0]
            top, cx, hgt = it.y + it.top, it.cx, 24 + 8 * m
            d = f"M {_n(cx + 14)} {_n(top)} C {_n(cx + 36)} {_n(top - hgt)} {_n(cx - 36)} {_n(top - hgt)} "
            return d + f"{_n(cx - 14)} {_n(top)}", (cx, top - 0.75 * hgt - 8)
        back, dy = e.back, 8.0 if e.back else 0.0
        bulge = 16.0 * m + (22.0 if back and len(its) == 2 else 0.0)
        x0, y0 = (its[0].left if back else its[0].right), its[0].port + dy
        d, mid = f"M {_n(x0)} {_n(y0)}", None
        for b in its[1:]:
            x1 = b.right if back else b.left
            y1 = b.port + (dy if b is its[-1] else 0.0)
            c = (x1 - x0) / 2
            d += f" C {_n(x0 + c)} {_n(y0 + bulge)} {_n(x1 - c)} {_n(y1 + bulge)} {_n(x1)} {_n(y1)}"
            mid = mid or ((x0 + x1) / 2, (y0 + y1) / 2 + 0.75 * bulge)
            x0, y0 = x1, y1
            if b.kind == "dummy":
                x0 = b.left if back else b.right
                d += f" L {_n(x0)} {_n(y0)}"
        return d, mid or (x0, y0)

    def _item(self, it: _Item, signals: Signals | None = None) -> list[str]:
        if it.kind == "dummy":
            return []
        if it.kind in ("start", "end"):
            inner = (
                ""
                if it.kind == "start"
                else f'<circle cx="{_n(it.cx)}" cy="{_n(it.port)}" r="5" fill="{INK}"/>'
            )
            fill = INK if it.kind == "start" else "#ffffff"
            return [
                f'<g class="{it.kind}"><title>{it.kind}</title><circle cx="{_n(it.cx)}" cy="{_n(it.port)}"'
                f' r="{_n(MARK_R)}" fill="{fill}" stroke="{INK}" stroke-width="1.5"/>{inner}</g>'
            ]
        fill, stroke = COLORS[it.kind]
        top, tip, line2, value = it.y + it.top, it.tip, it.line2, ""
        measured = signals.roles.get(it.role) if signals is not None else None
        if measured:
            fill = signals.fill(it.role) or fill
            tip += f"\n{signals.title}\n" + measures_text(measured)
            if signals.colour_by in measured:
                shown = measured[signals.colour_by]
                line2 = f"{it.role} · {shown:.2f}"  # as wide as "kind · role": the box fits it
                value = f" data-value={_a(shown)}"
        out = [
            f'<g class="node" data-name={_a(it.key)} data-kind="{it.kind}" data-role={_a(it.role)}{value}>'
            f"<title>{escape(tip)}</title>"
            f'<rect x="{_n(it.left)}" y="{_n(top)}" width="{_n(it.box_w)}" height="{_n(it.box_h)}" rx="6"'
            f' fill="{fill}" stroke="{stroke}" stroke-width="1.4"/>',
            _text(it.cx, top + 17, it.key, 13, True),
            _text(it.cx, top + 32, line2, 11, fill=stroke) + "</g>",
        ]
        for name, detail, x, y, w in it.tool_boxes():
            sx = min(max(x + w / 2, it.left + 10), it.right - 10)
            out.append(
                f'<path class="tool-edge" d="M {_n(sx)} {_n(top + it.box_h)} L {_n(x + w / 2)} {_n(y)}"'
                f' fill="none" stroke="{TOOL}" stroke-width="1.2" stroke-dasharray="4 3"/>'
                f'<g class="tool" data-name={_a(name)}><title>{escape(name + ": " + detail)}</title>'
                f'<rect x="{_n(x)}" y="{_n(y)}" width="{_n(w)}" height="{_n(TOOL_H)}" rx="4" fill="#f4f6f7"'
                f' stroke="{TOOL}" stroke-width="1.1"/>'
                + _text(x + w / 2, y + 13.5, name, 11, True)
                + _text(x + w / 2, y + 26, detail, 10, fill="#566573")
                + "</g>"
            )
        return out


def _marker(uid: str, name: str, color: str) -> str:
    return (
        f'<marker id="{uid}-{name}" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7"'
        f' orient="auto"><path d="M 0 0 L 10 5 L 0 10 z" fill="{color}"/></marker>'
    )


def to_svg(topology: Topology, signals: Signals | None = None) -> str:
    """The topology as a standalone SVG document (a string; no XML declaration, so it can be inlined), its
    nodes and edges coloured and labelled by ``signals`` where given."""
    if not isinstance(topology, Topology):
        raise DiagramError(
            f"cannot draw a {type(topology).__name__}: pass a Topology (workbench.topology.load(name))"
        )
    uid = "wb" + hashlib.sha1(topology.model_dump_json().encode()).hexdigest()[:8]
    clusters = [_Cluster(topology, "main", topology.flow, "main flow")]
    clusters += [_Cluster(topology, n, f, f"subflow {n}") for n, f in topology.subflows.items()]
    links = []  # (gutter order key, source cluster, source item, tool index, target cluster)
    for ci, c in enumerate(clusters):
        for key, tool, sub, note in c.sources:
            ti = 1 + list(topology.subflows).index(sub)
            clusters[ti].notes.append(note)
            links.append(((ti, ci, key, tool if tool is not None else -1), ci, key, tool, ti))
    links.sort(key=lambda link: link[0])
    width = max(c.width() for c in clusters)
    lines = textwrap.wrap(topology.description, int(max(width, 640) / 6.6))[:3]
    y = 40.0 + 15 * len(lines)
    for ci, c in enumerate(clusters):
        c.shift(16, y, sum(1 for link in links if link[1] == ci))
        y += c.h + 22
    gutter = 16 + width + 14
    total_w = max([gutter + (len(links) * LANE + 8 if links else 0)] + [_w(s, 11.5) + 32 for s in lines])
    total_h = y - 22 + 16
    body = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{_n(total_w)}" height="{_n(total_h)}"'
        f' viewBox="0 0 {_n(total_w)} {_n(total_h)}" font-family={_a(FONT)} class="topology-diagram"'
        f" data-topology={_a(topology.name)}>",
        f"<title>{escape(topology.name)} topology</title>",
        f"<defs>{_marker(uid, 'fwd', EDGE)}{_marker(uid, 'back', BACK)}{_marker(uid, 'link', LINK)}</defs>",
        f'<rect width="{_n(total_w)}" height="{_n(total_h)}" fill="#ffffff"/>',
        _text(16, 26, topology.name, 16, True, anchor="start"),
    ]
    body += [
        _text(16, 44 + 15 * i, line, 11.5, fill="#52606d", anchor="start") for i, line in enumerate(lines)
    ]
    if signals is not None:
        body.append(
            _text(
                16 + _w(topology.name, 16, True) + 14, 26, signals.title, 11.5, fill="#52606d", anchor="start"
            )
        )
    for c in clusters:
        body += c.svg(width, uid, signals)
    incoming: dict[int, int] = {}
    for g, (_, ci, key, tool, ti) in enumerate(links):
        src, dst = clusters[ci], clusters[ti]
        mine = [link for link in links if link[1] == ci]
        lane = src.oy + src.content_h + (len(mine) - 1 - mine.index(links[g])) * LANE
        sx, sy = src.source_point(key, tool, dst.name)
        gx, ty = gutter + g * LANE, dst.oy + 16 + 6 * incoming.get(ti, 0)
        incoming[ti] = incoming.get(ti, 0) + 1
        body.append(
            f'<path class="link" data-from={_a(key)} data-to={_a(dst.name)}'
            f' d="M {_n(sx)} {_n(sy)} V {_n(lane)} H {_n(gx)} V {_n(ty)} H {_n(16 + width)}" fill="none"'
            f' stroke="{LINK}" stroke-width="1.3" stroke-dasharray="6 3" marker-end="url(#{uid}-link)"/>'
        )
    return "\n".join(body) + "\n</svg>\n"


def to_html(topology: Topology, standalone: bool = True, signals: Signals | None = None) -> str:
    """The diagram inside HTML: a whole offline page, or (``standalone=False``) a fragment for notebooks."""
    svg = to_svg(topology, signals)
    div = f'<div class="topology-diagram" style="overflow:auto;max-width:100%">\n{svg}</div>\n'
    if not standalone:
        return div
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head><meta charset="utf-8">'
        f"<title>{escape(topology.name)} topology</title></head>\n"
        f'<body style="margin:16px;background:#ffffff">\n{div}</body>\n</html>\n'
    )


def notebook_html(topology: Topology) -> str:
    """The diagram as a fragment of a notebook's output (a Topology's ``_repr_html_``)."""
    return to_html(topology, standalone=False)


def save(topology: Topology, path: str | Path, signals: Signals | None = None) -> Path:
    """Write the diagram (coloured by ``signals`` where given) to ``path`` (``.svg``, ``.html`` or ``.htm``),
    atomically; returns the path."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in (".svg", ".html", ".htm"):
        raise DiagramError(f"cannot write a diagram to {path.name}: use a .svg or .html path")
    text = to_svg(topology, signals) if suffix == ".svg" else to_html(topology, signals=signals)
    if not path.parent.is_dir():
        raise DiagramError(f"cannot write {path}: folder {path.parent} does not exist; create it first")
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
