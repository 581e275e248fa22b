"""Where the TopologyEditor's canvas puts things: an automatic layered layout, label placement, and the layout
saved with a spec.

``arrange`` places a canvas (``widgets.topology_canvas`` builds it from a spec) in bands, as the papers draw
their systems: the main flow on top, left to right in layers (longest path from its start, loops back
reversed, a few barycenter sweeps against crossings, each node level with its predecessors; a step reached
by a branch that skips layers goes below the steps that branch passes, and a step that loops back sits a row
below where it returns to, so that those branches, drawn stepped, run in free lanes); below it each subflow as
a framed group laid out the same way inside (wrapped into rows); then the roles, the tools and the policies,
each in a row, just right of what links to it. Every node has a fixed size (``SIZES``; the canvas stylesheet
draws them at exactly that size), so nothing overlaps by construction.

``place_labels`` puts each edge label where it overlaps no node and no other label: React Flow centres a label
on an anchor of its edge (the middle of a curve, the bend of a stepped edge), and the canvas moves it by the
offset found here (a CSS translate on the label), searching outward from the best spot for it. Labels are
monospace, so their width is known in advance.

A layout is editor metadata, not part of the spec: ``with_layout`` appends it to a spec's YAML as comment
lines (``# workbench-layout: {...}``), which every YAML reader, the engine included, ignores; ``read_layout``
finds it again. Positions are by canvas node id; a subflow's steps are relative to their group.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass, field

#: Node sizes by kind (width, height) in canvas pixels; the stylesheet gives the nodes exactly these.
SIZES = {
    "step": (168.0, 50.0),
    "end": (56.0, 56.0),
    "role": (160.0, 46.0),
    "tool": (160.0, 46.0),
    "policy": (150.0, 46.0),
}
X_GAP, Y_GAP = 150.0, 36.0  # between layers (room for a branch label) and between nodes of one layer
GROUP_PAD, GROUP_TITLE = 22.0, 30.0  # inside a subflow's frame
BAND_GAP, ITEM_GAP = 56.0, 28.0  # between bands, between nodes of one row
ROW_WIDTH = 1500.0  # subflow groups wrap into rows no wider than this
LABEL_CHAR, LABEL_H, LABEL_PAD, LABEL_MAX = 6.7, 14.0, 4.0, 24  # monospace 11px labels
LABEL_MARGIN = 4.0
LAYOUT_TAG = "# workbench-layout: "

Box = tuple[float, float, float, float]  # x, y, width, height
Point = tuple[float, float]


@dataclass
class FlowPart:
    """One flow of a canvas: its group node (None for the main flow), step ids, start and end ids, branches."""

    group: str | None
    steps: list[str]
    start: str | None
    end: str
    branches: list[tuple[str, str]]


@dataclass
class Canvas:
    """What ``arrange`` needs to know about a canvas: its flows, the other nodes and every edge."""

    flows: list[FlowPart]
    roles: list[str]
    tools: list[str]
    policies: list[str]
    links: list[tuple[str, str]] = field(default_factory=list)


def size_of(kind: str) -> tuple[float, float]:
    return SIZES.get(kind, SIZES["step"])


def flow_positions(part: FlowPart, sizes: dict[str, tuple[float, float]]) -> tuple[dict[str, Point], Point]:
    """Positions of a flow's steps and end, left to right in layers from (0, 0), and the size they take."""
    nodes = [*part.steps, part.end]
    forward = _forward_branches(part, nodes)
    rank = _ranks(nodes, forward, part)
    layers: dict[int, list[str]] = {}
    for node in nodes:
        layers.setdefault(rank[node], []).append(node)
    order = [layers[r] for r in sorted(layers)]
    predecessors: dict[str, list[str]] = {n: [] for n in nodes}
    for source, target in forward:
        predecessors[target].append(source)
    back = [(s, t) for s, t in _unique(part.branches) if (s, t) not in set(forward) and s != t]
    position: dict[str, Point] = {}
    x = 0.0
    index = {n: i for i, n in enumerate(nodes)}
    for r, layer in enumerate(order):
        for _sweep in range(2):  # order by where the predecessors are, then place level with them
            layer.sort(
                key=lambda n: (_mean([position[p][1] for p in predecessors[n] if p in position]), index[n])
            )
        width = max(sizes[n][0] for n in layer)
        y_next = -math.inf
        for node in layer:
            w, h = sizes[node]
            wanted = _mean([position[p][1] + sizes[p][1] / 2 for p in predecessors[node] if p in position])
            top = (wanted - h / 2) if wanted != math.inf else 0.0
            # a branch that skips layers runs below everything in the layers it passes
            skipped = [
                n
                for p in predecessors[node]
                for layer_between in order[rank[p] + 1 : r]
                for n in layer_between
            ]
            floor = max(
                [position[n][1] + sizes[n][1] + Y_GAP for n in skipped if n in position] or [-math.inf]
            )
            top = max(top, y_next, floor)
            for source, target in back:  # a loop back starts a row below where it returns to
                if source == node and target in position and abs(position[target][1] - top) < h:
                    top = max(top, position[target][1] + sizes[target][1] + Y_GAP)
            position[node] = (x + (width - w) / 2, top)
            y_next = top + h + Y_GAP
        x += width + X_GAP
    top = min(p[1] for p in position.values())
    position = {n: (p[0], p[1] - top) for n, p in position.items()}
    width = max(position[n][0] + sizes[n][0] for n in nodes)
    height = max(position[n][1] + sizes[n][1] for n in nodes)
    return position, (width, height)


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else math.inf


def _unique(pairs: list[tuple[str, str]]) -> list[tuple[str, str]]:
    return list(dict.fromkeys(pairs))


def _forward_branches(part: FlowPart, nodes: list[str]) -> list[tuple[str, str]]:
    """The branches without the ones that close a loop (found depth first from the start)."""
    known = set(nodes)
    out: dict[str, list[str]] = {n: [] for n in nodes}
    for source, target in part.branches:
        if source in known and target in known and target not in out[source]:
            out[source].append(target)
    back: set[tuple[str, str]] = set()
    state: dict[str, int] = {}  # 1 on the stack, 2 done
    roots = [part.start] if part.start in known else []
    for root in [*roots, *nodes]:
        if root in state:
            continue
        stack = [(root, iter(out[root]))]
        state[root] = 1
        while stack:
            node, children = stack[-1]
            child = next(children, None)
            if child is None:
                state[node] = 2
                stack.pop()
            elif state.get(child) == 1:
                back.add((node, child))
            elif child not in state:
                state[child] = 1
                stack.append((child, iter(out[child])))
    return [(s, t) for s in nodes for t in out[s] if (s, t) not in back]


def _ranks(nodes: list[str], forward: list[tuple[str, str]], part: FlowPart) -> dict[str, int]:
    """Longest path from the sources; the end one layer after everything that reaches it (or after all)."""
    incoming = {n: 0 for n in nodes}
    for _, target in forward:
        incoming[target] += 1
    rank = {n: 0 for n in nodes}
    ready = [n for n in nodes if incoming[n] == 0 and n != part.end]
    if part.start in ready:
        ready.remove(part.start)
        ready.insert(0, part.start)
    seen: list[str] = []
    while ready:
        node = ready.pop(0)
        seen.append(node)
        for source, target in forward:
            if source == node:
                rank[target] = max(rank[target], rank[node] + 1)
                incoming[target] -= 1
                if incoming[target] == 0:
                    ready.append(target)
    last = max([rank[n] for n in nodes if n != part.end] or [0])
    if not any(t == part.end for _, t in forward):
        rank[part.end] = last + 1 if part.steps else 0
    return rank


def arrange(
    canvas: Canvas, sizes: dict[str, tuple[float, float]]
) -> tuple[dict[str, Point], dict[str, Point]]:
    """Positions of every node of ``canvas`` (a subflow's steps relative to their group) and each group's size."""
    positions: dict[str, Point] = {}
    group_sizes: dict[str, Point] = {}
    absolute: dict[str, Point] = {}
    main = next((p for p in canvas.flows if p.group is None), None)
    bottom = 0.0
    if main is not None:
        placed, (_, height) = flow_positions(main, sizes)
        positions.update(placed)
        absolute.update(placed)
        bottom = height
    x, y, row_height = 0.0, bottom + BAND_GAP, 0.0
    for part in canvas.flows:
        if part.group is None:
            continue
        placed, (width, height) = flow_positions(part, sizes)
        box = (width + 2 * GROUP_PAD, height + 2 * GROUP_PAD + GROUP_TITLE)
        if x > 0 and x + box[0] > ROW_WIDTH:
            x, y, row_height = 0.0, y + row_height + BAND_GAP, 0.0
        positions[part.group] = (x, y)
        group_sizes[part.group] = box
        for node, (nx, ny) in placed.items():
            relative = (nx + GROUP_PAD, ny + GROUP_PAD + GROUP_TITLE)
            positions[node] = relative
            absolute[node] = (x + relative[0], y + relative[1])
        x += box[0] + ITEM_GAP * 2
        row_height = max(row_height, box[1])
    y = y + row_height + BAND_GAP if group_sizes else bottom + BAND_GAP
    for row in (canvas.roles, canvas.tools, canvas.policies):
        if not row:
            continue
        centres = {}
        for node in row:  # just right of what links to it (what it links to, failing that)
            callers = [s for s, t in canvas.links if t == node and s != node and s in absolute]
            near = callers or [o for o in _neighbours(node, canvas.links) if o in absolute]
            right = [absolute[o][0] + sizes[o][0] + ITEM_GAP + sizes[node][0] / 2 for o in near]
            centres[node] = _mean(right)
        placed_row = _row(row, centres, sizes, y)
        positions.update(placed_row)
        absolute.update(placed_row)
        y += max(sizes[n][1] for n in row) + BAND_GAP
    return positions, group_sizes


def _neighbours(node: str, links: Iterable[tuple[str, str]]) -> list[str]:
    return [t if s == node else s for s, t in links if node in (s, t) and s != t]


def _row(
    row: list[str], centres: dict[str, float], sizes: dict[str, tuple[float, float]], y: float
) -> dict[str, Point]:
    """Nodes in one row, each as near the x its neighbours want as the others allow (never overlapping)."""
    known = [n for n in row if centres[n] != math.inf]
    unknown = [n for n in row if centres[n] == math.inf]
    ordered = sorted(known, key=lambda n: centres[n]) + unknown
    left: dict[str, float] = {}
    edge = -math.inf
    for node in ordered:
        width = sizes[node][0]
        wanted = (
            centres[node] - width / 2 if centres[node] != math.inf else (edge if edge > -math.inf else 0.0)
        )
        left[node] = max(wanted, edge, 0.0)
        edge = left[node] + width + ITEM_GAP
    return {n: (left[n], y) for n in ordered}


# ---------------------------------------------------------------------------------------------------- labels
def label_size(text: str) -> Point:
    return (len(text) * LABEL_CHAR + 2 * LABEL_PAD, LABEL_H + 2 * LABEL_PAD / 2)


def short_label(text: str, limit: int = LABEL_MAX) -> str:
    """``text`` on one line, cut to ``limit`` characters with an ellipsis (the canvas's labels)."""
    one = " ".join(str(text).split())
    return one if len(one) <= limit else one[: limit - 1] + "…"


def _overlaps(a: Box, b: Box, margin: float = LABEL_MARGIN) -> bool:
    return (
        a[0] < b[0] + b[2] + margin
        and b[0] < a[0] + a[2] + margin
        and a[1] < b[1] + b[3] + margin
        and b[1] < a[1] + a[3] + margin
    )


def _inside(inner: Box, outer: Box) -> bool:
    return (
        inner[0] >= outer[0]
        and inner[1] >= outer[1]
        and inner[0] + inner[2] <= outer[0] + outer[2]
        and inner[1] + inner[3] <= outer[1] + outer[3]
    )


def place_labels(
    boxes: dict[str, Box], labels: list[tuple[str, Point, Point, str, str]], groups: Iterable[str] = ()
) -> dict[str, Point]:
    """For each (edge id, anchor, wanted, text, source node): the offset from the anchor (where React Flow
    centres the label) to the spot nearest ``wanted`` that overlaps no node and no label placed before it.

    ``boxes`` are absolute node boxes; a group's frame is an obstacle only for its title strip, and the label
    of an edge that starts inside a group stays inside it.
    """
    groups = set(groups)
    solid = [b for n, b in boxes.items() if n not in groups]
    titles = [(b[0], b[1], b[2], GROUP_TITLE) for n, b in boxes.items() if n in groups]
    placed: list[Box] = []
    offsets: dict[str, Point] = {}
    for edge_id, anchor, wanted, text, source in labels:
        width, height = label_size(text)
        within = [
            b for n, b in boxes.items() if n in groups and source in boxes and _inside(boxes[source], b)
        ]
        obstacles = solid + titles + placed
        best = (wanted[0] - anchor[0], wanted[1] - anchor[1])
        for dx, dy in _spiral():
            box = (wanted[0] + dx - width / 2, wanted[1] + dy - height / 2, width, height)
            if within and not _inside(box, within[0]):
                continue
            if not any(_overlaps(box, other) for other in obstacles):
                best = (wanted[0] + dx - anchor[0], wanted[1] + dy - anchor[1])
                break
        offsets[edge_id] = best
        placed.append((anchor[0] + best[0] - width / 2, anchor[1] + best[1] - height / 2, width, height))
    return offsets


def _spiral(step: float = 12.0, rings: int = 24) -> Iterable[Point]:
    """(0, 0), then points on growing rings around it, vertical moves first (labels slide along a layer gap)."""
    yield (0.0, 0.0)
    for ring in range(1, rings + 1):
        r = ring * step
        for dy in (-r, r):
            yield (0.0, dy)
        for k in range(1, ring + 1):
            d = k * step
            for dx, dy in ((d, -r), (-d, -r), (d, r), (-d, r), (r, -d + step), (-r, -d + step)):
                yield (dx, dy)
            yield (r, d)
            yield (-r, d)


# ---------------------------------------------------------------------------------------------------- saving
def with_layout(yaml_text: str, layout: dict) -> str:
    """A spec's YAML with its layout appended as comment lines that YAML readers (and the engine) ignore."""
    body = yaml_text.rstrip("\n") + "\n"
    if not layout:
        return body
    lines = [
        "# The TopologyEditor's layout: comments, ignored by the engine and every YAML reader.",
        *(LAYOUT_TAG + json.dumps({key: value}, separators=(",", ":")) for key, value in layout.items()),
    ]
    return body + "\n".join(lines) + "\n"


def read_layout(text: str) -> dict:
    """The layout ``with_layout`` wrote into ``text`` ({} where there is none or it cannot be read)."""
    layout: dict = {}
    for line in text.splitlines():
        if line.startswith(LAYOUT_TAG):
            try:
                part = json.loads(line[len(LAYOUT_TAG) :])
            except ValueError:
                continue
            if isinstance(part, dict):
                layout.update(part)
    return layout
