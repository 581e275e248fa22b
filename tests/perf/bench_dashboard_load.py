"""Dashboard load benchmark: what N browser-like viewers of the dashboard get while a real training run writes.

    python -m tests.perf.bench_dashboard_load --quick     # 3 viewers, 6 s unwatched + 12 s watched, twice
    python -m tests.perf.bench_dashboard_load             # 20 viewers, 20 s + 45 s, twice (the issue's figure)
    python -m tests.perf.bench_dashboard_load --browsers 2   # and 2 real Chromium pages alongside

``workbench serve`` (sign-in on, a users file of viewers) and ``workbench train`` (the tiny model, steps as
fast as it goes) run in two subprocesses on this machine. Once the run has stored a few steps, its trainer
runs for a while with nobody watching; then N viewers arrive at once, each a browser-like client
(``tests.perf.dashboard_client.Tab``) from its own address (127.0.0.10, .11, ...): it signs in, asks for the
run's page (``/?run=<id>``, the Curves tab), opens the websocket, pulls the document, sends the
``document_ready`` event a browser sends once it has drawn it, and then takes the server's patches, following
the ``data-step`` of the monitor header, until the end. ``--browsers K`` also opens K pages in a real headless
Chromium (Debian's, driven by Playwright), signed in the same way, whose header steps are read in the page.
Then, in the same run, N viewers arrive again, a share of them (``--compare-share``, half by default) on the
comparison of the run with the gallery's MarsRL run (``/?compare=<id>,summary:marsrl``: its curves follow the
run, drawn once for all its sessions), the others on the run's page again; a comparison's step is the
last x of its plots' new data (``dashboard_client.Tab``).

Reported: per viewer, the seconds from asking for the page to having the document (``first_doc_s``, target
<= 5 s) and the sign-in before it (``sign_in_s``); over all viewers and steps committed after a viewer had its
document, the update lag (the step's ``finished_at`` in the store to the viewer's document showing it or a
later step) at p50 and p95 (target p95 <= 5 s), and the steps a viewer never showed by the end
(``updates_missed``); sessions that failed; tracebacks in the server's log; the server's CPU seconds while
watched, and whether it ever loaded torch (it must not); the clients' own CPU seconds and the longest
their event loop was late (their times are only as good as that); the trainer's steps/s unwatched and
watched, and their ratio (target >= 0.8); the machine's load average before and after; whether the trainer
trained to the end (``trainer``: still running when the measuring ended, and its last step's distance from
that end; the run's 100,000 steps outlast any mode). The JSON's top level is the first phase (every viewer on
the run's page); ``compare`` holds the second: the figures of the run's pages and of the comparisons, the trainer's ratio, and
the ratios of the second phase to the first (first document p95, update lag p95, server CPU, trainer steps/s),
measured side by side on the same run and machine. ``--server-path DIR`` puts DIR first on the server's
``PYTHONPATH`` (to measure other widgets, e.g. an older checkout's, side by side).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from tests.browser.conftest import free_port, wait_until_up
from tests.perf.dashboard_client import Tab
from tests.perf.runner import REPO, machine, now, write_json

DEFAULT_OUT = Path(__file__).parent / "results" / "dashboard_load.json"
TARGET_S = 5.0
#: The committed summary a comparison puts beside the training run (``reports/runs/marsrl``, 25 steps: the run
#: has more by the time it is compared, so the largest x a comparison shows is the run's).
COMPARED = "summary:marsrl"
PASSWORD = "load-benchmark-password"
TRAIN = {
    "model": "tiny", "steps": 100_000, "batch_size": 2, "group_size": 2, "max_tokens": 4,
    "topology": "marsrl_cpu", "checkpoint_every": 100_000,
}  # fmt: skip
#: Records when the page's monitor header first showed each step (a real browser's copy of ``Tab.seen``);
#: Panel draws into shadow roots, which ``querySelector`` and observers of the body do not enter.
_WATCH_STEPS = """() => {
  window.__wbSeen = {};
  const find = (root) => {
    const el = root.querySelector('.wb-step[data-step]');
    if (el) { return el; }
    for (const host of root.querySelectorAll('*')) {
      if (host.shadowRoot) { const found = find(host.shadowRoot); if (found) { return found; } }
    }
    return null;
  };
  let el = null;
  setInterval(() => {
    if (el == null || !el.isConnected) { el = find(document); }
    if (el != null) {
      const step = el.getAttribute('data-step');
      if (!(step in window.__wbSeen)) { window.__wbSeen[step] = Date.now(); }
    }
  }, 100);
}"""


def write_users(path: Path, names: list[str]) -> None:
    """A users file of viewers sharing one password (hashed once: the server checks each sign-in in full)."""
    from widgets.server.access import hash_password

    stored = hash_password(PASSWORD)
    users = {name: {"role": "viewer", "password": stored} for name in names}
    path.write_text(json.dumps({"users": users}))


class Viewer:
    """A viewer's figures, from a browser-like ``Tab`` or a Chromium page."""

    def __init__(self, kind: str, address: str, path: str = "") -> None:
        self.kind, self.address, self.path = kind, address, path
        self.sign_in_s: float | None = None
        self.asked: float | None = None
        self.first_doc: float | None = None
        self.seen: dict[int, float] = {}
        self.error: str | None = None


async def _tab(url: str, name: str, address: str, path: str, stop: asyncio.Event) -> Viewer:
    tab = Tab(url, address)
    await tab.visit(name, PASSWORD, path, stop)
    viewer = Viewer("client", address, path)
    viewer.sign_in_s, viewer.asked, viewer.first_doc = tab.sign_in_s, tab.asked, tab.first_doc
    viewer.seen, viewer.error = tab.seen, tab.error
    return viewer


async def _chromium(url: str, names: list[str], path: str, stop: asyncio.Event) -> list[Viewer]:
    """``len(names)`` pages of one headless Chromium, each in its own context (its own cookies)."""
    from playwright.async_api import async_playwright

    from tests.browser.conftest import CHROMIUM, CHROMIUM_ARGS

    async def page_of(browser: Any, name: str) -> Viewer:
        viewer = Viewer("chromium", "127.0.0.1", path)
        context = await browser.new_context(viewport={"width": 1400, "height": 1000})
        try:
            page = await context.new_page()
            page.set_default_timeout(120_000)  # a sign-in waits its turn behind the others' password checks
            start = time.time()
            await page.goto(f"{url}/login?next={path.replace('?', '%3F').replace('=', '%3D')}")
            await page.fill("input[name=username]", name)
            await page.fill("input[name=password]", PASSWORD)
            await page.click("button[type=submit]")
            await page.wait_for_url(f"**{path}")
            viewer.sign_in_s = time.time() - start
            viewer.asked = time.time()
            await page.goto(url + path)
            await page.wait_for_selector(".wb-last-step [data-step]", timeout=120_000)
            viewer.first_doc = time.time()
            await page.evaluate(_WATCH_STEPS)
            await stop.wait()
            seen = await page.evaluate("() => window.__wbSeen")
            viewer.seen = {int(step): ms / 1000 for step, ms in seen.items()}
        except Exception as error:  # noqa: BLE001 - counted and reported
            viewer.error = repr(error)
        finally:
            await context.close()
        return viewer

    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS
        )
        try:
            return list(await asyncio.gather(*(page_of(browser, name) for name in names)))
        finally:
            await browser.close()


async def watch(
    url: str, run_id: str, paths: list[str], browsers: int, seconds: float
) -> tuple[list[Viewer], float]:
    """Browser-like viewers of ``paths`` (one each) and ``browsers`` Chromium pages of the run arriving at once,
    held ``seconds``; also the longest the clients' own event loop was late (their times are only as good as
    that)."""
    stop = asyncio.Event()
    late = [0.0]

    async def lateness() -> None:
        while not stop.is_set():
            before = time.monotonic()
            await asyncio.sleep(0.1)
            late[0] = max(late[0], time.monotonic() - before - 0.1)

    ticker = asyncio.ensure_future(lateness())
    path = f"/?run={run_id}"
    tasks = [
        asyncio.ensure_future(_tab(url, f"viewer{i}", f"127.0.0.{10 + i}", page, stop))
        for i, page in enumerate(paths)
    ]
    if browsers:
        names = [f"browser{i}" for i in range(browsers)]
        chromium = asyncio.ensure_future(_chromium(url, names, path, stop))
    await asyncio.sleep(seconds)
    stop.set()
    viewers = list(await asyncio.gather(*tasks))
    if browsers:
        viewers += await chromium
    await ticker
    return viewers, late[0]


def lags(viewer: Viewer, finished: dict[int, float], until: float) -> tuple[list[float], int]:
    """(update lags, steps never shown) of the steps committed after the viewer had its document."""
    out, missed = [], 0
    shown = sorted(viewer.seen.items())
    for step, committed in finished.items():
        if viewer.first_doc is None or committed <= viewer.first_doc or committed > until:
            continue
        later = [t for s, t in shown if s >= step]
        if later:
            out.append(max(0.0, min(later) - committed))
        else:
            missed += 1
    return out, missed


def _quantile(values: list[float], q: float) -> float | None:
    return float(np.quantile(values, q)) if values else None


def _finished(db: Path) -> dict[int, float]:
    from workbench.store import RunReader

    with RunReader(db.parent) as reader:
        frame = reader.sql("SELECT step, finished_at FROM steps WHERE status = 'complete' ORDER BY step")
    return {int(s): float(t) for s, t in zip(frame["step"], frame["finished_at"], strict=True)}


def _wait_for_run(runs: Path, trainer: subprocess.Popen, steps: int, timeout: float = 240.0) -> Path:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if trainer.poll() is not None:
            raise RuntimeError(f"workbench train exited with {trainer.returncode}: {Path(trainer.log_path).read_text()}")
        dbs = list(runs.glob("*/run.db"))
        if dbs:
            try:
                if len(_finished(dbs[0])) >= steps:
                    return dbs[0]
            except Exception:  # noqa: BLE001 - the run is being created: try again
                pass
        time.sleep(0.3)
    raise TimeoutError(f"the training run stored no {steps} steps within {timeout} s")


def _rate(finished: dict[int, float], start: float, end: float) -> float:
    return sum(start < t <= end for t in finished.values()) / max(end - start, 1e-9)


def cpu_seconds(pid: int) -> float:
    """CPU seconds (user + system) process ``pid`` has used so far (Linux ``/proc``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def imported_torch(pid: int) -> bool:
    """Whether process ``pid`` has torch loaded (its shared library mapped): a dashboard server never needs
    it, and importing it holds the event loop for seconds."""
    return "libtorch" in Path(f"/proc/{pid}/maps").read_text()


def _figures(viewers: list[Viewer], finished: dict[int, float], until: float) -> dict[str, Any]:
    all_lags: list[float] = []
    missed = 0
    per_viewer = []
    for viewer in viewers:
        viewer_lags, viewer_missed = lags(viewer, finished, until)
        all_lags += viewer_lags
        missed += viewer_missed
        per_viewer.append(
            {
                "kind": viewer.kind,
                "address": viewer.address,
                "path": viewer.path,
                "sign_in_s": viewer.sign_in_s,
                "first_doc_s": None if viewer.first_doc is None else viewer.first_doc - viewer.asked,
                "updates": len(viewer_lags),
                "updates_missed": viewer_missed,
                "lag_p95_s": _quantile(viewer_lags, 0.95),
                "error": viewer.error,
            }
        )
    first_docs = [v["first_doc_s"] for v in per_viewer if v["first_doc_s"] is not None]
    sign_ins = [v["sign_in_s"] for v in per_viewer if v["sign_in_s"] is not None]
    return {
        "sessions_connected": len(first_docs),
        "session_failures": [v["error"] for v in per_viewer if v["error"]],
        "sign_in_s": {"p50": _quantile(sign_ins, 0.5), "p95": _quantile(sign_ins, 0.95)},
        "first_doc_s": {
            "p50": _quantile(first_docs, 0.5),
            "p95": _quantile(first_docs, 0.95),
            "max": max(first_docs) if first_docs else None,
            "within_target": sum(d <= TARGET_S for d in first_docs),
        },
        "update_lag_s": {
            "p50": _quantile(all_lags, 0.5),
            "p95": _quantile(all_lags, 0.95),
            "max": max(all_lags) if all_lags else None,
            "updates": len(all_lags),
            "missed": missed,
        },
        "per_viewer": per_viewer,
    }


def _ratio(value: float | None, base: float | None) -> float | None:
    return value / base if value is not None and base else None


def _compared(
    first: dict[str, Any],
    first_rate: float,
    viewers: list[Viewer],
    finished: dict[int, float],
    start: float,
    seconds: float,
    server_cpu: dict[str, float],
    late: float,
) -> dict[str, Any]:
    """The second phase's figures (its viewers arrived at ``start``, held ``seconds``), the comparisons' and the
    run pages' apart, and its ratios to the first phase's (``first``: its figures, ``first_rate``: the trainer's
    steps/s then; ``server_cpu``: the server's CPU seconds in each)."""
    until = start + seconds
    comparisons = [v for v in viewers if "compare=" in v.path]
    both = _figures(viewers, finished, until)
    rate = _rate(finished, start, until)
    found = {
        "path": comparisons[0].path if comparisons else None,
        "viewers_on_comparison": len(comparisons),
        **{k: both[k] for k in ("sessions_connected", "session_failures", "first_doc_s", "update_lag_s")},
        "comparison": _figures(comparisons, finished, until),
        "run_page": _figures([v for v in viewers if v not in comparisons], finished, until),
        "train_steps_per_s_watched": rate,
        "server_cpu_s_watched": server_cpu["second"],
        "client_loop_late_max_s": late,
    }
    found["ratios"] = {  # the second phase over the first (every viewer on the run's page)
        "first_doc_p95": _ratio(both["first_doc_s"]["p95"], first["first_doc_s"]["p95"]),
        "comparison_first_doc_p95": _ratio(
            found["comparison"]["first_doc_s"]["p95"], first["first_doc_s"]["p95"]
        ),
        "update_lag_p95": _ratio(both["update_lag_s"]["p95"], first["update_lag_s"]["p95"]),
        "comparison_update_lag_p95": _ratio(
            found["comparison"]["update_lag_s"]["p95"], first["update_lag_s"]["p95"]
        ),
        "server_cpu": _ratio(server_cpu["second"], server_cpu["first"]),
        "train_steps_per_s": _ratio(rate, first_rate),
    }
    return found


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--viewers", type=int, help="browser-like viewers (20; --quick: 3)")
    parser.add_argument("--browsers", type=int, default=0, help="real Chromium pages alongside them")
    parser.add_argument("--seconds", type=float, help="seconds watched (unwatched: less than half)")
    parser.add_argument(
        "--compare-share", type=float, default=0.5,
        help="share of the viewers on a comparison in the second phase (0: no second phase)",
    )  # fmt: skip
    parser.add_argument("--server-path", type=Path)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    viewers_n = args.viewers if args.viewers is not None else (3 if args.quick else 20)
    watched_s = args.seconds or (12.0 if args.quick else 45.0)
    unwatched_s = min(20.0, watched_s / 2)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    env["PYTHONPATH"] = os.pathsep.join(
        [*([str(args.server_path)] if args.server_path else []), str(REPO), env.get("PYTHONPATH", "")]
    )
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        runs = Path(tmp) / "runs"
        runs.mkdir()
        users = Path(tmp) / "users.json"
        write_users(
            users, [f"viewer{i}" for i in range(viewers_n)] + [f"browser{i}" for i in range(args.browsers)]
        )
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        # both run from tmp: ``python -m`` puts its working directory before PYTHONPATH (and --server-path)
        # their output goes to files: a pipe nobody reads until the end fills (64 KB, some 550 steps' lines)
        # and blocks the trainer's next print, which stopped it mid-benchmark
        server_out = open(Path(tmp) / "server.log", "w")  # noqa: SIM115 - closed after the processes end
        train_out = open(Path(tmp) / "train.log", "w")  # noqa: SIM115
        server = subprocess.Popen(
            [sys.executable, "-m", "workbench.cli", "serve", str(runs), "--port", str(port), "--users", str(users)],
            stdout=server_out, stderr=subprocess.STDOUT, text=True, env=env, cwd=tmp,
        )  # fmt: skip
        settings = [a for k, v in {**TRAIN, "runs_dir": str(runs)}.items() for a in ("--set", f"{k}={v}")]
        trainer = subprocess.Popen(
            [sys.executable, "-m", "workbench.cli", "train", *settings],
            stdout=train_out, stderr=subprocess.STDOUT, text=True, env=env, cwd=tmp,
        )  # fmt: skip
        trainer.log_path = train_out.name  # type: ignore[attr-defined]
        viewers: list[Viewer] = []
        try:
            wait_until_up(f"{url}/login", server)
            db = _wait_for_run(runs, trainer, steps=2)
            run_id = db.parent.name
            unwatched_from = time.time()
            server_cpu = cpu_seconds(server.pid)
            time.sleep(unwatched_s)
            unwatched_to = time.time()
            server_cpu_unwatched = cpu_seconds(server.pid) - server_cpu
            server_cpu, client_cpu = cpu_seconds(server.pid), time.process_time()
            # steps committed near the end get the target's time to be shown
            run_page = f"/?run={run_id}"
            viewers, client_late = asyncio.run(
                watch(url, run_id, [run_page] * viewers_n, args.browsers, watched_s + TARGET_S)
            )
            client_cpu = time.process_time() - client_cpu
            watched_to = unwatched_to + watched_s
            server_cpu_watched = cpu_seconds(server.pid) - server_cpu
            compared_n = round(viewers_n * args.compare_share)
            if compared_n:  # the second phase: as many viewers, some of them on the comparison
                compare_page = f"/?compare={run_id},{COMPARED}"
                paths = [compare_page] * compared_n + [run_page] * (viewers_n - compared_n)
                second_from, server_cpu = time.time(), cpu_seconds(server.pid)
                second, second_late = asyncio.run(watch(url, run_id, paths, 0, watched_s + TARGET_S))
                second_cpu = {"first": server_cpu_watched, "second": cpu_seconds(server.pid) - server_cpu}
            server_torch = imported_torch(server.pid)
            # the trainer must have trained through every phase: a run that ended early (it exits on its own
            # only by failing) leaves phases without steps, and their rates mean nothing
            measured_to, trainer_code = time.time(), trainer.poll()
            finished = _finished(db)
        finally:
            for process in (trainer, server):
                process.terminate()
            trainer.wait(timeout=60)
            server.wait(timeout=30)
            server_out.close()
            train_out.close()
            train_log = (Path(tmp) / "train.log").read_text()
            log = (Path(tmp) / "server.log").read_text()
    unwatched_rate = _rate(finished, unwatched_from, unwatched_to)
    watched_rate = _rate(finished, unwatched_to, watched_to)
    clients = [v for v in viewers if v.kind == "client"]
    first_figures = _figures(clients, finished, watched_to)
    compared = (
        _compared(
            first_figures, watched_rate, second, finished, second_from, watched_s, second_cpu, second_late
        )
        if compared_n
        else None
    )
    figures = {
        "mode": "quick" if args.quick else "full",
        "client": "browser-like: own address, sign-in, page, websocket, PULL-DOC-REQ, document_ready",
        "viewers": viewers_n,
        "browsers": args.browsers,
        "seconds_unwatched": unwatched_s,
        "seconds_watched": watched_s,
        "target_s": TARGET_S,
        **first_figures,
        "chromium": _figures([v for v in viewers if v.kind == "chromium"], finished, watched_to)
        if args.browsers
        else None,
        "train_steps_per_s_unwatched": unwatched_rate,
        "train_steps_per_s_watched": watched_rate,
        "train_ratio": watched_rate / unwatched_rate if unwatched_rate else None,
        # steps/s in each 5 s from the start of the unwatched phase: where the watched phase lost speed
        "train_steps_per_s_by_5s": [
            round(_rate(finished, t, t + 5.0), 2) for t in np.arange(unwatched_from, watched_to, 5.0)
        ],
        "steps_stored": len(finished),
        "trainer": {
            "running_at_end": trainer_code is None,
            "exit_code": trainer_code,
            "last_step_before_end_s": measured_to - max(finished.values()) if finished else None,
        },
        "server_cpu_s": {"unwatched": server_cpu_unwatched, "watched": server_cpu_watched},
        "server_imported_torch": server_torch,
        "client_cpu_s": client_cpu,
        "client_loop_late_max_s": client_late,
        "server_tracebacks": log.count("Traceback"),
        "trainer_tracebacks": train_log.count("Traceback"),
        "compare": compared,
        "load_average": {"before": load_before[0], "after": os.getloadavg()[0]},
        "machine": machine(),
        "finished": now(),
    }
    write_json(args.out, figures)
    first, lag = figures["first_doc_s"], figures["update_lag_s"]
    print(
        f"{viewers_n} viewers of a training run ({watched_s:.0f} s): first document p50 {_s(first['p50'])}, "
        f"p95 {_s(first['p95'])}, max {_s(first['max'])} ({first['within_target']} within {TARGET_S:.0f} s); "
        f"update lag p50 {_s(lag['p50'])}, p95 {_s(lag['p95'])} over {lag['updates']} updates, "
        f"{lag['missed']} missed; trainer {unwatched_rate:.2f} steps/s unwatched, {watched_rate:.2f} watched; "
        f"server CPU {server_cpu_unwatched:.1f} s unwatched ({unwatched_s:.0f} s), "
        f"{server_cpu_watched:.1f} s watched ({watched_s + TARGET_S:.0f} s); "
        f"clients {client_cpu:.1f} s CPU, loop late <= {client_late:.2f} s; "
        f"{len(figures['session_failures'])} sessions failed, {figures['server_tracebacks']} server tracebacks; "
        f"load average {load_before[0]:.2f} before"
    )
    if compared:
        c, r = compared, compared["ratios"]
        print(
            f"then {viewers_n} viewers again, {compared_n} on {c['path']}: first document p95 "
            f"{_s(c['first_doc_s']['p95'])} (comparisons {_s(c['comparison']['first_doc_s']['p95'])}), update lag "
            f"p95 {_s(c['update_lag_s']['p95'])} (comparisons {_s(c['comparison']['update_lag_s']['p95'])}); "
            f"trainer {c['train_steps_per_s_watched']:.2f} steps/s; against every viewer on the run's page: first "
            f"document p95 x{_x(r['first_doc_p95'])}, update lag p95 x{_x(r['update_lag_p95'])}, server CPU "
            f"x{_x(r['server_cpu'])}, trainer steps/s x{_x(r['train_steps_per_s'])}"
        )
    if figures["chromium"]:
        c = figures["chromium"]
        print(
            f"{args.browsers} Chromium pages: first document p95 {_s(c['first_doc_s']['p95'])}, update lag p95 "
            f"{_s(c['update_lag_s']['p95'])} over {c['update_lag_s']['updates']} updates; "
            f"{len(c['session_failures'])} failed"
        )
    trained = figures["trainer"]
    if not trained["running_at_end"] or (trained["last_step_before_end_s"] or math.inf) > TARGET_S:
        print(
            f"WARNING: the trainer did not train to the end (exit code {trained['exit_code']}, its last step "
            f"{_s(trained['last_step_before_end_s'])} before the end): the rates of the phases after it are void"
        )
    print(f"written to {args.out}")
    return figures


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} s"


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


if __name__ == "__main__":
    main()
