"""Saving a report's figures and tables: images for people, the plotted data for tests.

``save_figure`` writes ``<name>.png``, ``<name>.svg`` and ``<name>.json``; the JSON lists every
panel (title, axis labels) with its series (label, x, y; horizontal bars also their length) as
matplotlib holds them, so a test can
check that a figure has the panels and series the paper's figure has. ``save_table`` writes a
table as CSV and HTML.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pandas as pd


def _number(value: Any) -> float | str | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return str(value)
    return None if math.isnan(number) else number


def figure_data(fig: Any) -> dict[str, Any]:
    """The panels of a matplotlib figure with their line and bar series."""
    panels = []
    for axes in fig.axes:
        series = []
        for line in axes.get_lines():
            label = line.get_label()
            if label.startswith("_"):  # matplotlib's unlabeled helper lines
                continue
            series.append(
                {
                    "label": label,
                    "kind": "line",
                    "x": [_number(v) for v in line.get_xdata()],
                    "y": [_number(v) for v in line.get_ydata()],
                }
            )
        for container in axes.containers:
            label = "" if container.get_label().startswith("_") else container.get_label()
            patches = list(container)
            if getattr(container, "orientation", "vertical") == "horizontal":  # barh: spans along x
                series.append(
                    {
                        "label": label,
                        "kind": "hbar",
                        "x": [_number(p.get_x()) for p in patches],
                        "length": [_number(p.get_width()) for p in patches],
                        "y": [_number(p.get_y() + p.get_height() / 2) for p in patches],
                    }
                )
                continue
            series.append(
                {
                    "label": label,
                    "kind": "bar",
                    "x": [_number(p.get_x() + p.get_width() / 2) for p in patches],
                    "y": [_number(p.get_height()) for p in patches],
                }
            )
        panels.append(
            {
                "title": axes.get_title(),
                "xlabel": axes.get_xlabel(),
                "ylabel": axes.get_ylabel(),
                "series": series,
            }
        )
    return {"title": fig._suptitle.get_text() if fig._suptitle else "", "panels": panels}


def save_figure(fig: Any, out_dir: str | Path, name: str) -> dict[str, Path]:
    """Write ``name`` as PNG, SVG and JSON (the plotted data) under ``out_dir``; returns the paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {ext: out / f"{name}.{ext}" for ext in ("png", "svg", "json")}
    fig.savefig(paths["png"], dpi=120, bbox_inches="tight")
    fig.savefig(paths["svg"], bbox_inches="tight", metadata={"Date": None})
    paths["json"].write_text(json.dumps(figure_data(fig), indent=1))
    return paths


def save_table(table: pd.DataFrame, out_dir: str | Path, name: str) -> dict[str, Path]:
    """Write a table as ``name.csv`` and ``name.html`` under ``out_dir``; returns the paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"csv": out / f"{name}.csv", "html": out / f"{name}.html"}
    table.to_csv(paths["csv"], index=False)
    paths["html"].write_text(table.to_html(index=False, na_rep="–", float_format=lambda v: f"{v:.2f}"))
    return paths


def save_svg(svg: str, out_dir: str | Path, name: str) -> Path:
    """Write an SVG drawn elsewhere (a topology diagram) as ``name.svg``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.svg"
    path.write_text(svg)
    return path
