"""The papers' published numbers, read from the CSV files under ``reports/reference/``.

Layout, one folder per paper (``mars``, ``marsrl``, ``matpo``, ``hira``, ``mas_orchestra``):

- ``<paper>/<item>.csv``: one printed table (``table1``, ``table2`` ...), its rows and columns as the
  paper prints them; an optional ``group`` column holds the section a row sits under; a cell the paper
  leaves empty or prints as "-" is empty here (read as NaN); numbers are kept as printed (percent
  stays percent).
- ``<paper>/sources.csv``: ``item,caption,source,notes``, one row per item file: the paper's caption and
  where in the paper the numbers come from.
- ``<paper>/claims.csv``: ``item,claim,value,qualifier,source``: numbers the paper states in its text or
  reads off a figure (``qualifier``: exact, approx, at least, at most).
- ``<paper>/inconsistencies.csv``: ``item,what,check,note``: where the paper's own numbers do not add
  up, so that the report notebooks show it instead of hiding it.

The report notebooks put these beside a run's numbers.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

REFERENCE_DIR = Path(__file__).resolve().parents[1] / "reports" / "reference"
PAPERS = ("mars", "marsrl", "matpo", "hira", "mas_orchestra")
SIDE_FILES = ("sources", "claims", "inconsistencies")


def _paper_dir(paper: str, root: Path | None) -> Path:
    if paper not in PAPERS:
        raise KeyError(f"unknown paper {paper!r}; the papers are {', '.join(PAPERS)}")
    return (root or REFERENCE_DIR) / paper


def reference_items(paper: str, root: Path | None = None) -> list[str]:
    """The printed tables stored for ``paper`` (file stems such as ``table1``), sorted."""
    folder = _paper_dir(paper, root)
    return sorted(p.stem for p in folder.glob("*.csv") if p.stem not in SIDE_FILES)


def load_reference(paper: str, item: str, root: Path | None = None) -> pd.DataFrame:
    """One printed table of ``paper``; "-" and empty cells read as NaN."""
    path = _paper_dir(paper, root) / f"{item}.csv"
    if not path.exists():
        known = ", ".join(reference_items(paper, root)) or "none"
        raise FileNotFoundError(f"{paper} has no reference item {item!r} ({path}); it has: {known}")
    return pd.read_csv(path, na_values=["-"], keep_default_na=True)


def load_side(paper: str, kind: str, root: Path | None = None) -> pd.DataFrame:
    """``sources``, ``claims`` or ``inconsistencies`` of ``paper`` (empty when the paper has none)."""
    if kind not in SIDE_FILES:
        raise KeyError(f"unknown side file {kind!r}; it is one of {', '.join(SIDE_FILES)}")
    path = _paper_dir(paper, root) / f"{kind}.csv"
    return pd.read_csv(path) if path.exists() else pd.DataFrame()


def for_item(paper: str, item: str, root: Path | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The paper's stated numbers about ``item`` (``fig5``, ``table2``) and its inconsistencies there."""
    picked = []
    for kind in ("claims", "inconsistencies"):
        side = load_side(paper, kind, root)
        picked.append(side[side["item"] == item].drop(columns="item") if "item" in side else side)
    return picked[0], picked[1]
