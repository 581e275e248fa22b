"""Runs the bin-packing benchmark (`python -m tests.perf.bench_binpack --quick`) as users run it."""

from __future__ import annotations

import json

import pytest

from tests.perf.runner import run_bench


@pytest.mark.perf
def test_bench_binpack_quick(tmp_path):
    out = tmp_path / "binpack.json"
    result = run_bench("bench_binpack", "--quick", "--out", str(out))
    figures = json.loads(out.read_text())
    assert figures["benchmark"] == "binpack" and figures["mode"] == "quick" and figures["items"] == 10_000
    runs = figures["distributions"]
    assert set(runs) == {"uniform", "pages", "snippets", "small", "thirds"}
    for name, r in runs.items():
        assert r["identical_to_naive"] and r["bins"] >= r["lower_bound"] > 0, name
        # the acceptance target: 10k items in under 50 ms (measured 4-14 ms on 2 shared cores)
        assert r["ffd_ms"] < 50, (name, r["ffd_ms"])
        assert r["naive_ms"] > r["ffd_ms"], name
    # within 1.1x of ceil(sum/capacity) where that bound can be met; for (C/3, C/2] the bound itself
    # is loose (no three items fit a bin) and FFD hits the known optimum of ceil(n/2) bins
    for name in ("uniform", "pages", "snippets", "small"):
        assert runs[name]["ratio_max"] <= 1.1, (name, runs[name])
    assert runs["thirds"]["ratio_to_optimum"] == 1.0 and runs["thirds"]["ratio_mean"] > 1.1
    assert "bins/bound" in result.stdout and str(out) in result.stdout
    assert list(tmp_path.iterdir()) == [out]
