"""Comparing runs on the served dashboard in a real headless Chromium: three seeds of one config and one run of
another, selected in the runs table, side by side as a band and a line, with the config diff, the outcomes
table with paired SEs and its CSV, and a link that reopens the comparison; a seed still running, whose new step
reaches the page as the points that changed (the group's mean from the step the seed changed, the seed's new
point).

The runs are real SQLite run stores written through the store's writer (``tests.compare_runs``), not trained.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from playwright.sync_api import expect

from tests.browser.conftest import Served, screenshot
from tests.compare_runs import BASE_LR, reward, seeded_runs, write_run, write_step

#: The names of the drawn renderers of each kind (``widgets.compare``), read from BokehJS's documents.
RENDERERS = """(kind) => Bokeh.documents.flatMap((doc) => Array.from(doc.all_models))
  .filter((m) => typeof m.name === "string" && m.name.startsWith(kind + ":")).map((m) => m.name)"""
#: A source's data by its name (its line's key as JSON, ``widgets.compare_plots``), as plain arrays.
SOURCE = """(name) => {
  const source = Bokeh.documents.flatMap((doc) => Array.from(doc.all_models)).find((m) => m.name === name)
  return source == null ? null : Object.fromEntries(Object.entries(source.data).map(([k, v]) => [k, Array.from(v)]))
}"""


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    runs_dir = tmp_path_factory.mktemp("compare") / "runs"
    runs = seeded_runs(runs_dir)
    served = Served(runs_dir)
    yield served, [run.name for run in runs], runs_dir
    served.close()


def _shows_the_comparison(page, ids: list[str]) -> None:
    page.wait_for_selector(".wb-compare-group", timeout=20_000)
    band = page.locator('.wb-compare-group[data-kind="band"]')
    line = page.locator('.wb-compare-group[data-kind="line"]')
    assert band.count() == 1 and band.get_attribute("data-runs") == "3"
    assert line.count() == 1 and line.get_attribute("data-runs") == "1"
    groups = [band.get_attribute("data-group"), line.get_attribute("data-group")]
    assert groups == ["learning_rate=1e-05", "learning_rate=0.0001"], (
        "the group key is the diff without the seed"
    )
    fields = page.locator(".wb-compare-diff tr[data-field]").evaluate_all(
        "rows => rows.map(r => r.dataset.field)"
    )
    assert fields == ["learning_rate", "seed"]
    system = page.locator('.wb-compare-outcomes tr[data-kind="group"][data-score="system"]')
    assert "±" in system.inner_text() and "SE" in system.inner_text()
    assert page.locator('.wb-compare-outcomes tr[data-kind="run"][data-score="system"]').count() == 4
    page.wait_for_function(f"({RENDERERS})('band').length > 0", timeout=10_000)
    bands = page.evaluate(f"({RENDERERS})('band')")
    lines = page.evaluate(f"({RENDERERS})('line')")
    assert all(name.startswith("band:learning_rate=1e-05:") for name in bands)
    assert {name.split(":")[1] for name in lines} == {"learning_rate=1e-05", "learning_rate=0.0001"}


def test_three_seeds_and_another_config_side_by_side_and_the_link_reopens_them(site, page, browser):
    served, ids, _ = site
    page.goto(served.url + "/")
    page.wait_for_selector(".wb-runs", timeout=30_000)
    page.get_by_text(ids[0]).first.click()
    for run_id in ids[1:]:
        page.get_by_text(run_id).first.click(modifiers=["Control"])
    button = page.locator(".wb-compare-button button")
    expect(button).to_be_enabled(timeout=10_000)
    expect(button).to_contain_text("Compare 4 runs")
    button.click()
    _shows_the_comparison(page, ids)
    page.wait_for_function("() => window.location.search.includes('compare=')", timeout=10_000)
    link = page.url
    assert all(run_id in link for run_id in ids), link
    with page.expect_download() as download:
        page.locator(".wb-compare-csv button, .wb-compare-csv a").first.click()
    csv = Path(download.value.path()).read_text()
    assert (
        csv.startswith("name,kind,runs,score,tasks,before,after,rise,se,z,vs,diff,diff_se")
        and "system" in csv
    )
    screenshot(page, "compare-runs")
    other = browser.new_context(viewport={"width": 1400, "height": 1000}).new_page()
    try:
        other.goto(link)
        _shows_the_comparison(other, ids)
    finally:
        other.context.close()


def test_a_running_seed_updates_the_band_and_its_line_in_the_page(site, page):
    served, ids, runs_dir = site
    store = write_run(runs_dir, BASE_LR, 5, steps=1, finished=False)  # behind seeds 0 and 1
    try:
        page.goto(f"{served.url}/?compare={ids[0]},{ids[1]},{store.run_dir.name}")
        band, seed = (
            '["band", "all runs", "reward", "solver"]',
            f'["seed", "{store.run_dir.name}", "reward", "solver"]',
        )
        page.wait_for_function(f"({SOURCE})({band!r}) != null", timeout=20_000)
        assert page.evaluate(f"({SOURCE})({seed!r})")["x"] == [0]
        write_step(store, BASE_LR, 5, 1)
        page.wait_for_function(f"({SOURCE})({seed!r}).x.length == 2", timeout=20_000)
        assert page.evaluate(f"({SOURCE})({seed!r})")["value"] == pytest.approx(
            [reward(BASE_LR, 5, s) for s in range(2)]
        )
        data = page.evaluate(f"({SOURCE})({band!r})")
        assert data["x"] == [0, 1, 2] and data["n"] == [3, 3, 2]
        means = [
            sum(reward(BASE_LR, k, s) for k in seeds) / len(seeds)
            for s, seeds in enumerate([(0, 1, 5)] * 2 + [(0, 1)])
        ]
        assert data["value"] == pytest.approx(means)
    finally:
        store.close()
