"""The TopologyEditor canvas's helper on the page: its real size reported to Python, and edge titles on hover.

The canvas fills the space it is given (the row's width less the palette and the inspector, the window's height
less what sits above it), so its size in pixels is known only in the browser. ``CanvasPage`` is an invisible
component placed right after the canvas in the same column: its script finds the canvas's element (its own
host's previous sibling), watches it with a ``ResizeObserver`` and sets ``size`` to ``[width, height]`` whenever it
changes (the window or the notebook's panel resized). The editor fits its view to that size
(``fitted_viewport``, from ``TopologyEditor.fit_view``); until the page has reported one (or with no page at
all, in a test or a script) ``DEFAULT`` stands in.

SVG shows no tooltip for a ``title`` attribute, only for a ``<title>`` child: the script gives every edge that
carries a ``data-title`` (a branch's whole condition, a run's measures) such a child, so a label cut short
shows whole on hover.
"""

from __future__ import annotations

import param
from panel.custom import JSComponent

#: The size assumed until the page reports one: (width, height) in pixels.
DEFAULT = (720, 640)
FIT_PADDING = 16  # pixels kept free around the graph when it is fitted to the view
LABEL_ROOM = 20  # canvas pixels above the first row, where a branch label may sit


def fitted_viewport(
    boxes: dict[str, tuple[float, float, float, float]], size: tuple[int, int], min_zoom: float = 0.2
) -> dict[str, float]:
    """React Flow's viewport (x, y, zoom) showing every box (x, y, width, height in canvas pixels) whole and
    centred in a canvas of ``size`` pixels, at most at full size and at least at ``min_zoom``."""
    left = min(b[0] for b in boxes.values())
    top = min(b[1] for b in boxes.values()) - LABEL_ROOM
    width = max(max(b[0] + b[2] for b in boxes.values()) - left, 1)
    height = max(max(b[1] + b[3] for b in boxes.values()) - top, 1)
    shown_w, shown_h = size
    zoom = min(1.0, (shown_w - 2 * FIT_PADDING) / width, (shown_h - 2 * FIT_PADDING) / height)
    zoom = max(zoom, min_zoom)
    x = max(FIT_PADDING, (shown_w - width * zoom) / 2) - left * zoom
    y = max(FIT_PADDING, (shown_h - height * zoom) / 2) - top * zoom
    return {"x": round(x, 1), "y": round(y, 1), "zoom": round(zoom, 4)}


class CanvasPage(JSComponent):
    """Reports the size of the element drawn just before it (the canvas) as ``size``; titles its edges."""

    size = param.List(default=list(DEFAULT), item_type=int, doc="The canvas's [width, height] on the page.")

    _esm = """
export function render({ model, el }) {
  el.style.display = "none";
  const host = el.getRootNode().host;
  const canvas = () => (host ? host.previousElementSibling : null);
  const report = () => {
    const target = canvas();
    if (!target) return;
    const size = [Math.round(target.clientWidth), Math.round(target.clientHeight)];
    const [w, h] = model.size || [];
    if (size[0] > 0 && size[1] > 0 && (size[0] !== w || size[1] !== h)) model.size = size;
  };
  const title = (root) => {
    for (const edge of root.querySelectorAll(".react-flow__edge[data-title]")) {
      const text = edge.getAttribute("data-title");
      let child = edge.querySelector(":scope > title");
      if (!child) {
        child = document.createElementNS("http://www.w3.org/2000/svg", "title");
        edge.prepend(child);
      }
      if (child.textContent !== text) child.textContent = text;
    }
  };
  const observer = new ResizeObserver(report);
  let mutations = null;
  const attach = () => {
    const target = canvas();
    if (!target) return false;
    observer.observe(target);
    const root = target.shadowRoot || target;
    mutations = new MutationObserver(() => title(root));
    mutations.observe(root, { childList: true, subtree: true, attributes: true, attributeFilter: ["data-title"] });
    title(root);
    return true;
  };
  if (!attach()) requestAnimationFrame(attach);
  requestAnimationFrame(report);
  model.on("remove", () => { observer.disconnect(); if (mutations) mutations.disconnect(); });
}
"""

    def __init__(self, **params: object) -> None:
        super().__init__(height=0, margin=0, sizing_mode="stretch_width", **params)

    @property
    def width_height(self) -> tuple[int, int]:
        """The canvas's (width, height) in pixels."""
        width, height = self.size
        return int(width), int(height)
