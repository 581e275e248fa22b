"""Comparing a reference CSV with a table typed from a paper, cell by cell (the reference tests share it)."""

from __future__ import annotations

import math

import pandas as pd
import pytest


def assert_cells(frame: pd.DataFrame, columns: list[str], rows: list[tuple], item: str = "") -> None:
    """``rows`` equal ``frame`` cell for cell: text exactly, numbers approximately, None or NaN empty."""
    assert list(frame.columns) == columns
    assert len(frame) == len(rows)
    for index, expected in enumerate(rows):
        for column, want in zip(columns, expected, strict=True):
            got = frame.iloc[index][column]
            where = f"{item} row {index} ({expected[0]!r}), column {column!r}"
            if isinstance(want, str):
                assert got == want, where
            elif want is None or math.isnan(want):
                assert pd.isna(got), where
            else:
                assert got == pytest.approx(want, abs=1e-9), where
