"""The TopologyEditor's look: the canvas stylesheet, and the palette with its legend, as inline HTML and CSS.

Everything here is inline (no file or URL to fetch), so the canvas looks the same under ``workbench serve``, in
JupyterLab and offline; node sizes match ``widgets.topology_layout.SIZES`` exactly, so the automatic layout's
promise of no overlaps holds on screen. Each kind of node has its own fill, border and shape
(``widgets.topology_canvas.KINDS``), a small caption above its name (the node's ``data-caption``), and the
legend under the palette says what each shape and each edge colour means.
"""

from __future__ import annotations

import html

from widgets.topology_canvas import EDGE_KINDS, KINDS
from widgets.topology_layout import GROUP_TITLE, SIZES

#: The drag-and-drop type of the palette's items (the canvas accepts drops of this type).
PALETTE_TYPE = "application/x-workbench-palette"
#: The palette's items: (entry kind, what it shows), in the order shown.
PALETTE = [
    ("call", "call step"),
    ("agent", "agent step"),
    ("map", "map step"),
    ("dag", "dag step"),
    ("router", "router"),
    ("end", "end"),
    ("role", "role"),
    ("tool", "tool"),
    ("policy", "policy"),
    ("subflow", "subflow"),
]
_SHAPES = {  # kind -> extra CSS for its shape
    "call": "border-radius: 4px;",
    "router": "border-radius: 4px; border-style: double; border-width: 4px;",
    "agent": "border-radius: 16px; border-width: 2.5px;",
    "map": "border-radius: 4px; box-shadow: 4px 4px 0 -1px #fff3e0, 4px 4px 0 0 #d9822b, 8px 8px 0 -1px #fff3e0, 8px 8px 0 0 #d9822b;",
    "dag": "border-radius: 4px; border-style: dashed;",
    "end": "border-radius: 50%;",
    "role": "border-radius: 23px;",
    "tool": "border-radius: 0; border-style: dotted; border-width: 2.5px;",
    "policy": "border-radius: 50% / 50%;",
    "subflow": "border-radius: 10px; border-style: dashed;",
}


def _size(kind: str) -> tuple[float, float]:
    return SIZES.get(kind, SIZES["step"])


def canvas_css() -> str:
    """The canvas's stylesheet: every node kind's size, colours and shape; captions; edge labels."""
    rules = [
        """
.react-flow { height: 100%; }  /* the canvas fills its host, whose height the editor sets */
.react-flow__node.wb-node {
  padding: 0 !important; min-width: 0 !important; box-sizing: border-box; text-align: left;
  border: 2px solid #888; color: #1f2933; font-family: Helvetica, Arial, 'DejaVu Sans', sans-serif;
  font-size: 16px; box-shadow: none;
}
.react-flow__node.wb-node .rf-node-content { padding: 0; min-width: 0; height: 100%; box-sizing: border-box; }
.react-flow__node.wb-node .rf-node-label {
  margin: 0 !important; padding: 16px 10px 0 10px; white-space: nowrap; overflow: hidden;
  text-overflow: ellipsis; font-weight: 600; line-height: 22px; box-sizing: border-box;
}
.react-flow__node.wb-node::before {
  content: attr(data-caption); position: absolute; left: 10px; right: 8px; top: 3px; font-size: 11px;
  line-height: 13px; color: #52606d; white-space: nowrap; overflow: hidden; text-overflow: ellipsis;
  pointer-events: none;
}
.react-flow__node.wb-node.selected { outline: 3px solid #2684ff; outline-offset: 2px; }
.react-flow__node.wb-node.wb-error { border-color: #c62828 !important; background: #ffebee !important; }
.react-flow__node.wb-node .react-flow__handle { width: 10px; height: 10px; border: 2px solid #fff; background: #52606d; }
.react-flow__node.wb-kind-end .rf-node-label { padding: 0; line-height: 52px; text-align: center; color: #fff; }
.react-flow__node.wb-kind-end::before { content: none; }
.react-flow__node.wb-kind-subflow { border-width: 2px; }
.react-flow__node.wb-kind-subflow .rf-node-label { padding-top: 13px; font-size: 14px; }
.react-flow__node.wb-kind-subflow::before { top: 1px; }
.react-flow__node.wb-start { border-left-width: 6px; }
.react-flow__edge-text { font-family: 'DejaVu Sans Mono', 'Liberation Mono', monospace; font-size: 11px; }
.react-flow__edge.selected .react-flow__edge-path { stroke-width: 3px !important; }
"""
    ]
    for kind, (fill, border, _) in KINDS.items():
        size = (
            "" if kind == "subflow" else "width: {:.0f}px; height: {:.0f}px;".format(*_size(_size_kind(kind)))
        )
        rules.append(
            f".react-flow__node.wb-kind-{kind} {{ {size} background: {fill}; border-color: {border}; "
            f"{_SHAPES[kind]} }}"
        )
    rules.append(f".react-flow__node.wb-kind-subflow .rf-node-label {{ height: {GROUP_TITLE:.0f}px; }}")
    return "\n".join(rules)


def _size_kind(kind: str) -> str:
    return kind if kind in SIZES else "step"


PALETTE_CSS = """
.wb-palette { display: flex; flex-direction: column; gap: 6px; font: 12px Helvetica, Arial, sans-serif; }
.wb-palette-item { padding: 6px 8px; border: 2px solid #888; cursor: grab; user-select: none; color: #1f2933; }
.wb-palette-item:active { cursor: grabbing; }
.wb-legend { margin-top: 10px; font-size: 11px; color: #3e4c59; }
.wb-legend div { display: flex; align-items: center; gap: 6px; margin: 3px 0; }
.wb-swatch { display: inline-block; width: 18px; height: 12px; border: 2px solid #888; box-sizing: border-box; }
.wb-line { display: inline-block; width: 24px; height: 0; border-top: 2px solid #888; }
"""


def palette_html() -> str:
    """The palette (items dragged onto the canvas add that entry where they land) and the legend."""
    start = f"event.dataTransfer.setData('{PALETTE_TYPE}', this.dataset.kind); event.dataTransfer.effectAllowed = 'copy';"
    items = []
    for kind, text in PALETTE:
        fill, border, _ = KINDS.get(kind if kind != "subflow" else "subflow", KINDS["call"])
        shape = _SHAPES.get(kind, "") if kind != "map" else "border-radius: 4px;"
        style = f"background: {fill}; border-color: {border}; {shape}"
        if kind == "end":
            style += " color: #fff; border-radius: 14px; text-align: center;"
        items.append(
            f'<div class="wb-palette-item wb-palette-{kind}" draggable="true" data-kind="{kind}" '
            f'style="{html.escape(style)}" ondragstart="{html.escape(start)}" '
            f'title="drag onto the canvas (into a subflow to add it there)">{html.escape(text)}</div>'
        )
    legend = []
    for kind, (fill, border, meaning) in KINDS.items():
        legend.append(
            f'<div class="wb-legend-node wb-legend-{kind}"><span class="wb-swatch" '
            f'style="background: {fill}; border-color: {border}; {html.escape(_SHAPES[kind])}"></span>'
            f"{html.escape(meaning)}</div>"
        )
    for kind, (colour, dash, meaning) in EDGE_KINDS.items():
        style = f"border-top-color: {colour}; border-top-style: {'dashed' if dash else 'solid'};"
        legend.append(
            f'<div class="wb-legend-edge wb-legend-edge-{kind}"><span class="wb-line" style="{style}"></span>'
            f"<b>{kind}</b>&nbsp;{html.escape(meaning)}</div>"
        )
    return (
        f"<style>{PALETTE_CSS}</style><div class='wb-palette'><b>Palette</b>{''.join(items)}</div>"
        f"<div class='wb-legend'><b>Legend</b>{''.join(legend)}</div>"
    )
