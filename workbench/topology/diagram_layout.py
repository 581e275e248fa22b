"""Topology diagram layout: each flow as a cluster of boxes placed in layers, in local coordinates.

Nodes are ranked left to right by longest path from the start marker (back edges reversed), long
edges get dummy points, barycenter sweeps order each layer against crossings, and an isotonic
regression places the boxes so edges stay straight. Sizes come from :func:`text_width`, an estimate
that errs wide. Drawing is :mod:`workbench.topology.diagram_svg`'s.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from workbench.topology.spec import END, AgentNode, CallNode, DagNode, Flow, MapNode, Topology

LABEL_MAX, NODE_H, TOOL_H, MARK_R = 32, 40.0, 32.0, 9.0
VGAP, PAD, TITLE_H, LANE = 26.0, 18.0, 34.0, 14.0


def text_width(text: str, size: float, bold: bool = False) -> float:
    """Approximate rendered width of ``text`` (errs wide, so boxes never clip)."""
    units = sum(
        0.34 if c in "iljtfrI.,;:!|' " else 0.92 if c in "mwMW@%" else 0.7 if c.isupper() else 0.62
        for c in text
    )
    return units * size * (1.08 if bold else 1.0)


def shorten(text: str, limit: int = LABEL_MAX) -> str:
    """``text`` on one line, cut to ``limit`` characters with an ellipsis."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


@dataclass
class Item:
    """A node, marker or dummy point of a cluster: its text, its block's size and its place."""

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
class Edge:
    """A branch between two items; ``back`` when it closes a cycle, ``chain`` the items it passes."""

    src: str
    dst: str
    when: str | None
    label: str | None = None
    back: bool = False
    counted: bool = True
    chain: list[str] = field(default_factory=list)  # drawing order, dummies included


def isotonic_positions(targets: list[float], sizes: list[float]) -> list[float]:
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


def _mark(key: str, kind: str) -> Item:
    d = 2 * MARK_R
    return Item(key, kind, tip=kind, w=d, h=d, box_w=d, box_h=d)


def _kind_role(node: CallNode | AgentNode | MapNode | DagNode) -> tuple[str, str]:
    if isinstance(node, DagNode):
        return "dag", node.dag
    if isinstance(node, AgentNode):
        return "agent", node.agent
    if isinstance(node, MapNode):
        return "map", node.map
    return "call", node.call


class Cluster:
    """One flow laid out in local coordinates (origin at the frame's top-left corner)."""

    def __init__(self, topology: Topology, name: str, flow: Flow, title: str):
        self.name, self.flow, self.title = name, flow, title
        self.notes: list[str] = [f"inputs: {', '.join(flow.inputs)}"] if flow.inputs else []
        self.items: dict[str, Item] = {}
        self.edges: list[Edge] = []
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
            bw = max(90.0, text_width(name, 13, True) + 24, text_width(line2, 11) + 20)
            item = Item(name, kind, line2, role, tip, box_w=bw, box_h=NODE_H)
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
                item.tools.append(
                    (tname, detail, max(text_width(tname, 11, True), text_width(detail, 10)) + 16)
                )
            items[name] = item

        def target(goto: str) -> str:
            key = "<end>" if goto == END else goto
            if key == "<end>" and key not in items:
                items[key] = _mark(key, "end")
            elif key not in items:
                items[key] = Item(
                    key,
                    "missing",
                    "undefined node",
                    "",
                    "undefined node",
                    box_w=max(110.0, text_width(key, 13, True) + 24),
                    box_h=NODE_H,
                )
            return key

        self.edges.append(Edge("<start>", target(self.flow.start), None, counted=False))
        for name, node in self.flow.nodes.items():
            for branch in node.next:
                edge = Edge(name, target(branch.goto), branch.when)
                edge.label = (
                    shorten(branch.when) if branch.when else "otherwise" if len(node.next) > 1 else None
                )
                self.edges.append(edge)
        for e in self.edges:
            items[e.src].loops += e.src == e.dst
        for it in items.values():
            if it.loops:
                labels = [e.label or "" for e in self.edges if e.src == e.dst == it.key]
                it.top = 0.75 * (24 + 8 * (it.loops - 1)) + 8 + (14 if any(labels) else 0)
                it.w = max(text_width(s, 10) + 12 for s in labels)
            tools_w = sum(t[2] for t in it.tools) + 10 * (len(it.tools) - 1)
            it.w = max(it.w, it.box_w, tools_w)
            it.h = it.top + it.box_h + (22 + TOOL_H if it.tools else 0)

    def _rank(self) -> None:
        items, edges = self.items, self.edges
        out: dict[str, list[Edge]] = {k: [] for k in items}
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
                items[key] = Item(key, "dummy", h=4.0, box_h=4.0)
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
                gaps[g] = max(gaps[g], text_width(e.label, 10) + 40)
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
                ys = isotonic_positions(targets, [items[k].h + VGAP for k in layers[i]])
                for k, y in zip(layers[i], ys, strict=True):
                    items[k].y = y
        low = min(it.y for it in items.values())
        for it in items.values():
            it.y += TITLE_H + 8 - low
        self.content_h = max(it.y + it.h for it in items.values()) + PAD + 6

    def width(self) -> float:
        head = text_width(self.title, 13, True) + 36 + sum(text_width(s, 11) + 20 for s in self.notes)
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
