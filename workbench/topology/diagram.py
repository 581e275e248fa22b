"""Topology diagrams: a spec drawn as a self-contained SVG (or offline HTML page) in pure Python.

The main flow and every subflow become framed clusters, stacked top to bottom. Inside one, nodes
are laid out left to right in layers (longest path from the start marker, back edges reversed,
long edges routed through dummy points, barycenter sweeps against crossings, then an isotonic
placement that keeps edges straight). Back edges and self-loops are drawn as red curves; agent
nodes carry their tools underneath (dashed); agent tools and DAG nodes link to the subflows they
run through a gutter on the right. Same spec, byte-identical output.

This module stacks the clusters into a page and writes it; laying out one flow is
:mod:`workbench.topology.diagram_layout`'s, drawing it :mod:`workbench.topology.diagram_svg`'s, and the
run measures a diagram can show are :mod:`workbench.topology.diagram_signals`' :class:`Signals`.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import textwrap
from pathlib import Path
from xml.sax.saxutils import escape

from workbench.topology.diagram_layout import LANE, Cluster, text_width
from workbench.topology.diagram_signals import Signals, measures_text
from workbench.topology.diagram_svg import (
    BACK,
    EDGE,
    FONT,
    LINK,
    draw_cluster,
    num,
    quoted,
    svg_marker,
    svg_text,
)
from workbench.topology.spec import Topology

__all__ = ["DiagramError", "Signals", "measures_text", "save", "to_html", "to_svg"]


class DiagramError(ValueError):
    """A diagram could not be drawn or written (the message says what to change)."""


def to_svg(topology: Topology, signals: Signals | None = None) -> str:
    """The topology as a standalone SVG document (a string; no XML declaration, so it can be inlined), its
    nodes and edges coloured and labelled by ``signals`` where given."""
    if not isinstance(topology, Topology):
        raise DiagramError(
            f"cannot draw a {type(topology).__name__}: pass a Topology (workbench.topology.load(name))"
        )
    uid = "wb" + hashlib.sha1(topology.model_dump_json().encode()).hexdigest()[:8]
    clusters = [Cluster(topology, "main", topology.flow, "main flow")]
    clusters += [Cluster(topology, n, f, f"subflow {n}") for n, f in topology.subflows.items()]
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
    total_w = max(
        [gutter + (len(links) * LANE + 8 if links else 0)] + [text_width(s, 11.5) + 32 for s in lines]
    )
    total_h = y - 22 + 16
    body = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{num(total_w)}" height="{num(total_h)}"'
        f' viewBox="0 0 {num(total_w)} {num(total_h)}" font-family={quoted(FONT)} class="topology-diagram"'
        f" data-topology={quoted(topology.name)}>",
        f"<title>{escape(topology.name)} topology</title>",
        f"<defs>{svg_marker(uid, 'fwd', EDGE)}{svg_marker(uid, 'back', BACK)}{svg_marker(uid, 'link', LINK)}</defs>",
        f'<rect width="{num(total_w)}" height="{num(total_h)}" fill="#ffffff"/>',
        svg_text(16, 26, topology.name, 16, True, anchor="start"),
    ]
    body += [
        svg_text(16, 44 + 15 * i, line, 11.5, fill="#52606d", anchor="start") for i, line in enumerate(lines)
    ]
    if signals is not None:
        body.append(
            svg_text(
                16 + text_width(topology.name, 16, True) + 14,
                26,
                signals.title,
                11.5,
                fill="#52606d",
                anchor="start",
            )
        )
    for c in clusters:
        body += draw_cluster(c, width, uid, signals)
    incoming: dict[int, int] = {}
    for g, (_, ci, key, tool, ti) in enumerate(links):
        src, dst = clusters[ci], clusters[ti]
        mine = [link for link in links if link[1] == ci]
        lane = src.oy + src.content_h + (len(mine) - 1 - mine.index(links[g])) * LANE
        sx, sy = src.source_point(key, tool, dst.name)
        gx, ty = gutter + g * LANE, dst.oy + 16 + 6 * incoming.get(ti, 0)
        incoming[ti] = incoming.get(ti, 0) + 1
        body.append(
            f'<path class="link" data-from={quoted(key)} data-to={quoted(dst.name)}'
            f' d="M {num(sx)} {num(sy)} V {num(lane)} H {num(gx)} V {num(ty)} H {num(16 + width)}" fill="none"'
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
