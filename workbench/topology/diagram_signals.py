"""Numbers drawn on a topology diagram: a run's per-role and per-edge measures and their colour scale."""

from __future__ import annotations

from dataclasses import dataclass, field


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
