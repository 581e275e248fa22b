"""The widgets in a real JupyterLab: a notebook run in the browser renders them, and they answer clicks and data.

A JupyterLab server starts in a subprocess over a temporary directory holding a run (of the marsrl topology,
two steps) and a notebook that shows the RewardMonitor of that run, an ipywidgets slider, a Panel button
wired to a Python callback and the run's RunGraph. Chromium opens the notebook and runs every cell through
JupyterLab's own command; the test then checks what the browser shows: the monitor's plots and current
step, the slider, the button's round trip through the kernel (the pane's text changes after a click), the
graph's nodes filled by the Solver's reward with the number on hover, and the fill following the graph's
step slider, and its play toggle to the next step; the TopologyEditor's canvas nodes with their own look; a
comparison of three seeds of one config and a run of another (``widgets.Compare``) as a band and a line.
Then it writes a new step to the run and the monitor in the page shows it. With the four widgets (editor,
launcher, trajectory browser, monitor) and the comparison shown, the page requests nothing from any other
machine: scripts and stylesheets all come from the Jupyter server.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys

import nbformat
import pytest

from tests.browser.conftest import free_port, screenshot, wait_until_up
from tests.browser.test_compare import RENDERERS
from tests.compare_runs import seeded_runs
from workbench.store import RunStore
from workbench.topology.diagram import Signals
from workbench.topology.diagram_svg import COLORS

CELLS = [
    "import panel as pn\nimport ipywidgets as w\nimport widgets\nwidgets.extension()\n"
    "from widgets.reward_monitor import RewardMonitor\nfrom widgets.run_launcher import RunLauncher",
    "monitor = RewardMonitor(RUN_DIR, interval_ms=500)\nmonitor",
    "w.IntSlider(value=3, min=0, max=10, description='group size')",
    "button = pn.widgets.Button(name='Count', css_classes=['nb-count'])\n"
    "shown = pn.pane.HTML('<span class=\"nb-text\">clicks 0</span>', css_classes=['nb-out'])\n"
    "def count(event):\n"
    "    shown.object = f'<span class=\"nb-text\">clicks {button.clicks}</span>'\n"
    "button.on_click(count)\npn.Row(button, shown)",
    "RunLauncher(RUNS_DIR, mode='rollout', model='tiny')",
    "from widgets.run_graph import RunGraph\npn.Column(RunGraph(RUN_DIR), css_classes=['nb-graph'])",
    "from widgets import TopologyEditor, TrajectoryBrowser\n"
    "pn.Column(TopologyEditor('marsrl'), TrajectoryBrowser(RUN_DIR), css_classes=['nb-editor'])",
    "from widgets import Compare\npn.Column(Compare(COMPARED), css_classes=['nb-compare'])",
]
SOLVE = ".nb-graph svg.topology-diagram g.node[data-name='solve']"


def _fill(solver_reward: float) -> str:
    """The Solver's node fill for its reward, as the diagram computes it."""
    return Signals("", {"solver": {"reward/mean": solver_reward}}, "reward/mean").fill("solver")


def _step(store: RunStore, index: int) -> None:
    with store.step(index) as step:
        step.log_metrics({"reward/mean": 0.1 * index}, role="solver")


@pytest.fixture
def lab(tmp_path):
    runs = tmp_path / "runs"
    store = RunStore.create(runs, config={"kind": "train", "topology": "marsrl"}, name="notebook run")
    _step(store, 0)
    _step(store, 1)
    notebook = nbformat.v4.new_notebook()
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    compared = [str(run) for run in seeded_runs(tmp_path / "compared")]
    setup = f"RUNS_DIR = {str(runs)!r}\nRUN_DIR = {str(store.run_dir)!r}\nCOMPARED = {compared!r}"
    notebook.cells = [nbformat.v4.new_code_cell(setup), *(nbformat.v4.new_code_cell(c) for c in CELLS)]
    nbformat.write(notebook, tmp_path / "widgets.ipynb")
    port, token = free_port(), secrets.token_hex(16)
    env = {
        **os.environ,
        "JUPYTERLAB_SETTINGS_DIR": str(tmp_path / "lab-settings"),
        "JUPYTERLAB_WORKSPACES_DIR": str(tmp_path / "lab-workspaces"),
        "PYTHONPATH": os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")]),
    }
    process = subprocess.Popen(
        [
            sys.executable, "-m", "jupyterlab", "--no-browser", f"--port={port}", "--ip=127.0.0.1",
            f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={tmp_path}",
            "--LabApp.expose_app_in_browser=True", "--ServerApp.open_browser=False", "--allow-root",
        ],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
    )  # fmt: skip
    try:
        wait_until_up(f"http://127.0.0.1:{port}/api?token={token}", process, timeout=120)
        yield f"http://127.0.0.1:{port}/lab/tree/widgets.ipynb?token={token}", store
    finally:
        process.terminate()
        process.communicate(timeout=30)
        store.close()


def _accept_dialogs(page) -> None:
    """JupyterLab may ask which kernel to start (once per fresh settings directory): take the default."""
    page.wait_for_timeout(1000)
    while page.locator(".jp-Dialog .jp-mod-accept").count():
        page.locator(".jp-Dialog .jp-mod-accept").first.click()
        page.wait_for_timeout(500)


def test_widgets_render_and_respond_in_jupyterlab(lab, page):
    url, store = lab
    failed_loads, requested = [], []
    page.on("requestfailed", lambda request: failed_loads.append(request.url))
    page.on("request", lambda request: requested.append(request.url))
    loaded_scripts = []  # answered with 200 by the Jupyter server
    page.on("response", lambda response: response.ok and loaded_scripts.append(response.url))
    page.goto(url, wait_until="domcontentloaded")
    page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=120_000)
    page.wait_for_function(
        "window.jupyterapp && window.jupyterapp.commands.hasCommand('notebook:run-all-cells')"
    )
    page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=120_000)
    for _ in range(6):  # the kernel can report idle before its session is ready: ask again until cells run
        _accept_dialogs(page)
        page.evaluate("() => { window.jupyterapp.commands.execute('notebook:run-all-cells'); }")
        try:
            page.wait_for_selector(".jp-InputPrompt:has-text('[1]')", timeout=10_000)
            break
        except Exception:  # noqa: BLE001 - playwright's TimeoutError: not started yet
            continue
    # the RewardMonitor rendered its plots and the run's step
    page.wait_for_selector('.wb-step[data-step="1"]', timeout=30_000)
    assert page.locator(".wb-monitor-plot").count() >= 4
    # the ipywidgets slider rendered
    page.wait_for_selector(".widget-slider", timeout=60_000)
    assert "group size" in page.locator(".widget-slider").first.inner_text()
    # the Panel button answers through the kernel
    page.wait_for_selector(".nb-count button", timeout=60_000)
    _accept_dialogs(page)
    page.locator(".nb-count button").click()
    page.locator(".nb-text", has_text="clicks 1").first.wait_for(timeout=30_000)
    assert page.locator(".nb-text").first.inner_text() == "clicks 1"
    # the launcher form rendered with its buttons
    assert page.locator(".wb-launch button").count() == 1
    # the run's graph: the Solver's node filled by its reward at the last step, the number on hover
    page.wait_for_selector(SOLVE, timeout=60_000)
    assert page.locator(f"{SOLVE} rect").get_attribute("fill") == _fill(0.1) != COLORS["call"][0]
    assert "reward/mean: 0.1" in page.locator(f"{SOLVE} title").text_content()
    # the graph's step slider back to step 0 redraws it with that step's reward
    handle = page.locator(".nb-graph .noUi-handle").first
    for attempt in range(3):  # under load a key can arrive before the slider listens to its keys
        handle.focus()
        handle.press("Home")
        try:
            page.wait_for_selector(f"{SOLVE}[data-value='0.0']", timeout=15_000)
            break
        except Exception:  # noqa: BLE001 - playwright's TimeoutError
            if attempt == 2:
                raise
    assert page.locator(f"{SOLVE} rect").get_attribute("fill") == _fill(0.0) != _fill(0.1)
    # its play toggle moves on to the next step through the kernel's periodic callback
    page.locator(".nb-graph .wb-graph-play button").first.click()
    page.wait_for_selector(f"{SOLVE}[data-value='0.1']", timeout=30_000)
    # the editor's canvas has its look (its stylesheet, and Panel's theme, served by the Jupyter server)
    call = page.locator('.nb-editor .react-flow__node[data-id="step:solve"]')
    call.wait_for(timeout=60_000)
    assert call.evaluate("(n) => getComputedStyle(n).backgroundColor") == "rgb(232, 240, 254)"
    assert call.evaluate("(n) => getComputedStyle(n).borderLeftWidth") == "6px", (
        "the start step's thick border"
    )
    # the comparison of three seeds of one config and a run of another: a band and a line, drawn by BokehJS
    page.wait_for_selector(".nb-compare .wb-compare-group[data-kind='band'][data-runs='3']", timeout=60_000)
    assert page.locator(".nb-compare .wb-compare-group[data-kind='line']").count() == 1
    page.wait_for_function(f"({RENDERERS})('band').length > 0", timeout=30_000)
    assert page.locator(".nb-compare .wb-compare-outcomes tr[data-kind='group']").count() == 3
    # a step written now appears in the live monitor
    _step(store, 2)
    page.wait_for_selector('.wb-step[data-step="2"]', timeout=30_000)
    screenshot(page, "jupyterlab-widgets")
    # widgets.extension() loads every script from the Jupyter server, none from a CDN; the notebook's loader
    # names the server's copies
    assert not [u for u in failed_loads if u.split("?")[0].endswith(".js")], failed_loads
    assert any("/panel-preview/static/js/bokeh" in u for u in loaded_scripts), loaded_scripts
    # and every stylesheet too: with the four widgets shown, nothing is requested from another machine
    assert any("/panel-preview/static/extensions/panel/css/" in u for u in loaded_scripts), loaded_scripts
    outside = [
        u for u in requested if not u.startswith(("http://127.0.0.1", "ws://127.0.0.1", "data:", "blob:"))
    ]
    assert outside == [], outside
