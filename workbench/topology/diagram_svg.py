"""Topology diagram drawing: a laid-out cluster's frame, edges, nodes and tools as SVG elements.

Colours by node kind, the arrow markers, and the small SVG writers (numbers, quoted attributes,
text and labels) that :mod:`workbench.topology.diagram` also uses for the page around the clusters.
"""

from __future__ import annotations

from xml.sax.saxutils import escape

from workbench.topology.diagram_layout import MARK_R, TOOL_H, Cluster, Edge, Item, text_width
from workbench.topology.diagram_signals import Signals, measures_text

FONT = "Helvetica, Arial, 'DejaVu Sans', sans-serif"
COLORS = {  # kind -> (fill, stroke)
    "call": ("#e8f0fe", "#3b6fd8"),
    "agent": ("#e6f4ea", "#2e8b57"),
    "map": ("#fff3e0", "#d9822b"),
    "dag": ("#f3e8fd", "#8e44ad"),
    "missing": ("#fdecea", "#c0392b"),
}
INK, EDGE, BACK, LINK, TOOL = "#1f2933", "#55606e", "#c0392b", "#8e44ad", "#7f8c8d"


def num(v: float) -> str:
    """A coordinate with one decimal at most (``12``, ``12.5``)."""
    s = f"{v:.1f}"
    return s[:-2] if s.endswith(".0") else s


def quoted(value: object) -> str:
    """An XML attribute value, escaped and in double quotes."""
    return '"' + escape(str(value), {'"': "&quot;"}) + '"'


def svg_text(
    x: float,
    y: float,
    s: str,
    size: float = 11,
    bold: bool = False,
    fill: str = INK,
    anchor: str = "middle",
    style: str = "",
) -> str:
    """A ``<text>`` element at (x, y)."""
    weight = ' font-weight="bold"' if bold else ""
    return (
        f'<text x="{num(x)}" y="{num(y)}" font-size="{num(size)}"{weight}{style} fill="{fill}"'
        f' text-anchor="{anchor}">{escape(s)}</text>'
    )


def svg_label(x: float, y: float, s: str, color: str, italic: bool = False) -> str:
    """An edge label: small text on a white, nearly opaque box centred at (x, y)."""
    w = text_width(s, 10) + 8
    style = ' font-style="italic"' if italic else ""
    return (
        f'<g class="label"><rect x="{num(x - w / 2)}" y="{num(y - 7)}" width="{num(w)}" height="14" rx="3"'
        f' fill="#ffffff" fill-opacity="0.92"/>'
        + svg_text(x, y + 3.5, s, 10, fill=color, style=style)
        + "</g>"
    )


def svg_marker(uid: str, name: str, color: str) -> str:
    """An arrowhead ``<marker>`` named ``{uid}-{name}``."""
    return (
        f'<marker id="{uid}-{name}" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7"'
        f' orient="auto"><path d="M 0 0 L 10 5 L 0 10 z" fill="{color}"/></marker>'
    )


def draw_cluster(cluster: Cluster, width: float, uid: str, signals: Signals | None = None) -> list[str]:
    """SVG elements of one placed cluster: its frame and title, edges, nodes with their tools, then labels."""
    ox, oy = cluster.ox, cluster.oy
    out = [
        f'<g class="cluster" data-flow={quoted(cluster.name)}>'
        f'<rect x="{num(ox)}" y="{num(oy)}" width="{num(width)}" height="{num(cluster.h)}" rx="10"'
        f' fill="#fafbfc" stroke="#b0b7c3" stroke-width="1.2"/>',
        svg_text(ox + 12, oy + 21, cluster.title, 13, True, anchor="start"),
    ]
    nx = ox + 12 + text_width(cluster.title, 13, True) + 18
    for note in cluster.notes:
        out.append(svg_text(nx, oy + 21, note, 11, fill="#6b7785", anchor="start"))
        nx += text_width(note, 11) + 20
    out.append("</g>")
    labels, seen = [], {}
    for e in cluster.edges:
        d, mid = _edge_path(cluster, e, seen)
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
            f'<g class="{cls}" data-from={quoted(e.src)} data-to={quoted(e.dst)}><title>{escape(tip)}</title>'
            f'<path d="{d}" fill="none" stroke="{color}" stroke-width="1.5"'
            f' marker-end="url(#{uid}-{"back" if e.back else "fwd"})"/></g>'
        )
        if label:
            labels.append(svg_label(*mid, label, color, italic=not e.when))
    for it in cluster.items.values():
        out.extend(_draw_item(it, signals))
    return out + labels


def _edge_path(
    cluster: Cluster, e: Edge, seen: dict[tuple[str, str], int]
) -> tuple[str, tuple[float, float]]:
    its = [cluster.items[k] for k in e.chain]
    m = seen[(e.src, e.dst)] = seen.get((e.src, e.dst), -1) + 1
    if len(its) == 1:
        it = its[0]
        top, cx, hgt = it.y + it.top, it.cx, 24 + 8 * m
        d = f"M {num(cx + 14)} {num(top)} C {num(cx + 36)} {num(top - hgt)} {num(cx - 36)} {num(top - hgt)} "
        return d + f"{num(cx - 14)} {num(top)}", (cx, top - 0.75 * hgt - 8)
    back, dy = e.back, 8.0 if e.back else 0.0
    bulge = 16.0 * m + (22.0 if back and len(its) == 2 else 0.0)
    x0, y0 = (its[0].left if back else its[0].right), its[0].port + dy
    d, mid = f"M {num(x0)} {num(y0)}", None
    for b in its[1:]:
        x1 = b.right if back else b.left
        y1 = b.port + (dy if b is its[-1] else 0.0)
        c = (x1 - x0) / 2
        d += f" C {num(x0 + c)} {num(y0 + bulge)} {num(x1 - c)} {num(y1 + bulge)} {num(x1)} {num(y1)}"
        mid = mid or ((x0 + x1) / 2, (y0 + y1) / 2 + 0.75 * bulge)
        x0, y0 = x1, y1
        if b.kind == "dummy":
            x0 = b.left if back else b.right
            d += f" L {num(x0)} {num(y0)}"
    return d, mid or (x0, y0)


def _draw_item(it: Item, signals: Signals | None = None) -> list[str]:
    if it.kind == "dummy":
        return []
    if it.kind in ("start", "end"):
        inner = (
            ""
            if it.kind == "start"
            else f'<circle cx="{num(it.cx)}" cy="{num(it.port)}" r="5" fill="{INK}"/>'
        )
        fill = INK if it.kind == "start" else "#ffffff"
        return [
            f'<g class="{it.kind}"><title>{it.kind}</title><circle cx="{num(it.cx)}" cy="{num(it.port)}"'
            f' r="{num(MARK_R)}" fill="{fill}" stroke="{INK}" stroke-width="1.5"/>{inner}</g>'
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
            value = f" data-value={quoted(shown)}"
    out = [
        f'<g class="node" data-name={quoted(it.key)} data-kind="{it.kind}" data-role={quoted(it.role)}{value}>'
        f"<title>{escape(tip)}</title>"
        f'<rect x="{num(it.left)}" y="{num(top)}" width="{num(it.box_w)}" height="{num(it.box_h)}" rx="6"'
        f' fill="{fill}" stroke="{stroke}" stroke-width="1.4"/>',
        svg_text(it.cx, top + 17, it.key, 13, True),
        svg_text(it.cx, top + 32, line2, 11, fill=stroke) + "</g>",
    ]
    for name, detail, x, y, w in it.tool_boxes():
        sx = min(max(x + w / 2, it.left + 10), it.right - 10)
        out.append(
            f'<path class="tool-edge" d="M {num(sx)} {num(top + it.box_h)} L {num(x + w / 2)} {num(y)}"'
            f' fill="none" stroke="{TOOL}" stroke-width="1.2" stroke-dasharray="4 3"/>'
            f'<g class="tool" data-name={quoted(name)}><title>{escape(name + ": " + detail)}</title>'
            f'<rect x="{num(x)}" y="{num(y)}" width="{num(w)}" height="{num(TOOL_H)}" rx="4" fill="#f4f6f7"'
            f' stroke="{TOOL}" stroke-width="1.1"/>'
            + svg_text(x + w / 2, y + 13.5, name, 11, True)
            + svg_text(x + w / 2, y + 26, detail, 10, fill="#566573")
            + "</g>"
        )
    return out
