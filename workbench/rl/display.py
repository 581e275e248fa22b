"""How a training run shows itself: its progress line per step, and its rich display in a notebook.

``progress_line`` is the line the training loop logs for each step (the terminal of ``workbench train``
and the demo, and the run's ``run.log``). ``run_html`` is the handle's display: status, progress and
per-role curves as inline SVG (no JS needed); displaying the handle again (or re-running the cell) shows
the latest state; the live, streaming view is the RewardMonitor widget.
"""

from __future__ import annotations

import html
import math
from collections.abc import Mapping
from typing import Any

CURVES = ("reward/mean", "accuracy", "length/mean")
COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#17becf")


def progress_line(step: int, metrics: Mapping[str, float], roles: Mapping[str, Mapping[str, float]]) -> str:
    """One step as the training loop logs it: the reward, then the update's numbers that move.

    The loss of an on-policy GRPO step is a mean of advantages near zero (``0.0000`` to four decimals
    whatever the model learns), so it is printed in scientific notation, beside the gradient norm and the
    entropy; the clipped fraction and the KL to the reference appear where they are not zero (several
    updates per step, ``kl_coef`` > 0). A step without an update says so.
    """
    parts = [f"reward {metrics.get('reward/mean', 0.0):.3f}"]
    if "loss" in metrics:
        parts.append(f"loss {metrics['loss']:.2e}")
        if "grad_norm" in metrics:
            parts.append(f"grad norm {metrics['grad_norm']:#.3g}")
        if metrics.get("clip_fraction"):
            parts.append(f"clipped {metrics['clip_fraction']:.1%}")
        if metrics.get("kl"):
            parts.append(f"kl {metrics['kl']:.2e}")
        if not math.isnan(metrics.get("entropy", math.nan)):
            parts.append(f"entropy {metrics['entropy']:#.3g}")
    else:
        parts.append("no update")
    if "time/step_s" in metrics:
        parts.append(f"{metrics['time/step_s']:.1f} s")
    per_role = ", ".join(f"{r} {v['reward/mean']:.2f}" for r, v in roles.items() if "reward/mean" in v)
    return f"step {step}: {', '.join(parts)}" + (f" (role rewards: {per_role})" if per_role else "")


def run_html(run: Any) -> str:
    from workbench.store import RunReader

    with RunReader(run.run_dir) as reader:
        info = reader.info()
        wide = reader.metrics_wide()
    steps = info["config"].get("steps", "?")
    done = 0 if wide.empty else int(wide.index.max()) + 1
    head = (
        f"<b>{html.escape(str(info['name']))}</b> &middot; {html.escape(info['status'])} &middot; "
        f"step {done}/{steps} &middot; <code>{html.escape(str(run.run_dir))}</code>"
    )
    if wide.empty:
        return f"<div>{head}<br><i>no step finished yet</i></div>"
    roles = sorted({c.split("/", 1)[0] for c in wide.columns if c.endswith("/reward/mean")})
    charts = []
    for metric in CURVES:
        series = {r: wide[f"{r}/{metric}"] for r in roles if f"{r}/{metric}" in wide}
        if series:
            charts.append(_svg(metric, series))
    return f"<div>{head}<div style='display:flex;gap:12px'>{''.join(charts)}</div></div>"


def _svg(title: str, series: dict[str, Any], width: int = 260, height: int = 150) -> str:
    values = [v for s in series.values() for v in s.dropna().tolist()]
    steps = [i for s in series.values() for i in s.dropna().index.tolist()]
    if not values:
        return ""
    lo, hi = min(values), max(values)
    hi = hi if hi > lo else lo + 1.0
    x0, x1 = min(steps), max(max(steps), min(steps) + 1)
    pad = 28

    def point(step: float, value: float) -> str:
        x = pad + (step - x0) / (x1 - x0) * (width - pad - 8)
        y = height - pad - (value - lo) / (hi - lo) * (height - pad - 14)
        return f"{x:.1f},{y:.1f}"

    lines, legend = [], []
    for k, (role, s) in enumerate(series.items()):
        colour = COLOURS[k % len(COLOURS)]
        pts = " ".join(point(i, v) for i, v in s.dropna().items() if not math.isnan(v))
        lines.append(f"<polyline fill='none' stroke='{colour}' stroke-width='1.5' points='{pts}'/>")
        legend.append(f"<tspan fill='{colour}'>{html.escape(role)} </tspan>")
    return (
        f"<svg width='{width}' height='{height}' style='font:10px sans-serif'>"
        f"<text x='{pad}' y='10'>{html.escape(title)}</text>"
        f"<text x='2' y='{height - pad}'>{lo:.2g}</text><text x='2' y='22'>{hi:.2g}</text>"
        f"<line x1='{pad}' y1='{height - pad}' x2='{width - 8}' y2='{height - pad}' stroke='#999'/>"
        f"{''.join(lines)}<text x='{pad}' y='{height - 8}'>{''.join(legend)}</text></svg>"
    )
