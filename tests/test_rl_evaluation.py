"""Held-out evaluation: per-task scores and the paired rise between two evaluations."""

from __future__ import annotations

import math

import pytest

from workbench.rl.evaluation import OUTCOME, paired_rise


def test_paired_rise_pairs_the_same_tasks():
    before = {"a": {OUTCOME: 0.0}, "b": {OUTCOME: 1.0}, "c": {OUTCOME: 0.0}, "d": {OUTCOME: 0.0}}
    after = {"a": {OUTCOME: 1.0}, "b": {OUTCOME: 1.0}, "c": {OUTCOME: 1.0}, "e": {OUTCOME: 1.0}}
    mean, se, n = paired_rise(before, after)
    diffs = [1.0, 0.0, 1.0]  # a, b, c: d and e are scored only once
    expected_sd = math.sqrt(sum((d - 2 / 3) ** 2 for d in diffs) / 2)
    assert n == 3 and mean == pytest.approx(2 / 3) and se == pytest.approx(expected_sd / math.sqrt(3))
    # an unchanged evaluation has no rise and no spread
    assert paired_rise(before, before)[:2] == (0.0, 0.0)
    exact = paired_rise(
        {"a": {OUTCOME: 0.5}, "b": {OUTCOME: 1.0}},
        {"a": {OUTCOME: 1.0}, "b": {OUTCOME: 1.0}},
        transform=lambda r: r >= 1.0,
    )
    assert exact[0] == pytest.approx(0.5)
    with pytest.raises(ValueError, match="at least two tasks"):
        paired_rise(before, {"a": {OUTCOME: 1.0}})
