"""Dashboard load benchmark: what N viewers of the dashboard receive while a real training run writes.

    python -m tests.perf.bench_dashboard_load --quick     # 3 viewers, 4 s unwatched + 8 s watched
    python -m tests.perf.bench_dashboard_load             # 20 viewers, 20 s + 45 s (the issue's figure)

``workbench serve`` and ``workbench train`` (the tiny model, steps as fast as it goes) run in two
subprocesses on this machine. Once the run has stored a few steps, its trainer runs for a while with
nobody watching; then N viewers connect at once, each a real Bokeh client session of the dashboard
opened on the run (``/?run=<id>``), so the server does for it what it does for a browser tab: the runs
list every second, the run's monitor every half second. Each viewer follows the ``data-step`` of its
document's monitor header as the server's patches arrive.

Reported: per viewer, the seconds from asking for a page to having the document (``first_doc_s``,
target <= 5 s); over all viewers and steps committed after a viewer had its document, the update lag
(the step's ``finished_at`` in the store to the viewer's document showing it or a later step) at p50 and
p95 (target p95 <= 5 s), and the steps a viewer never showed by the end (``updates_missed``); sessions
that failed; tracebacks in the server's log; the trainer's steps/s unwatched and watched, and their
ratio. ``--server-path DIR`` puts DIR first on the server's ``PYTHONPATH`` (to measure other widgets).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from tests.browser.conftest import free_port, wait_until_up
from tests.perf.runner import REPO, machine, now, write_json

DEFAULT_OUT = Path(__file__).parent / "results" / "dashboard_load.json"
TARGET_S = 5.0
_STEP = re.compile(r"data-step=(?:&quot;|\"|')(-?\d+)")
TRAIN = {
    "model": "tiny", "steps": 100_000, "batch_size": 2, "group_size": 2, "max_tokens": 4,
    "topology": "marsrl_cpu", "checkpoint_every": 100_000,
}  # fmt: skip


def _find_header(node: Any) -> dict | None:
    """The monitor header's model (``wb-last-step``) in a document's JSON."""
    if isinstance(node, dict):
        if "wb-last-step" in (node.get("attributes", {}).get("css_classes") or []):
            return node
        children = node.values()
    elif isinstance(node, list):
        children = node
    else:
        return None
    for child in children:
        found = _find_header(child)
        if found is not None:
            return found
    return None


class Viewer:
    """One Bokeh-protocol client session: the time it got its document and when it first showed each step.

    It speaks the protocol as a browser tab does (pull the document, then take the server's patches) but
    keeps the document as JSON: building Bokeh's Python models of 20 documents would take this process
    seconds of CPU each, on the cores the server and the trainer run on, which a browser does not.
    """

    def __init__(self, url: str, run_id: str, stop: threading.Event) -> None:
        self.url, self.run_id, self.stop = url, run_id, stop
        self.asked = self.first_doc = None
        self.seen: dict[int, float] = {}  # step -> wall time (time.time()) the document first showed it
        self.error: str | None = None
        self._header_id: str | None = None

    def _show(self, text: Any) -> None:
        found = _STEP.search(str(text))
        if found:
            self.seen.setdefault(int(found.group(1)), time.time())

    def run(self) -> None:
        from bokeh.client.session import ClientSession
        from bokeh.client.util import websocket_url_for_server_url
        from tornado.ioloop import IOLoop, PeriodicCallback

        viewer = self

        class JsonSession(ClientSession):
            def _handle_patch(self, message: Any) -> None:
                for event in message.content.get("events", []):
                    model = event.get("model") or {}
                    if model.get("id") == viewer._header_id and event.get("attr") == "text":
                        viewer._show(event.get("new"))

        asyncio.set_event_loop(asyncio.new_event_loop())
        loop = IOLoop.current()
        try:
            self.asked = time.time()
            session = JsonSession(
                websocket_url=websocket_url_for_server_url(self.url),
                io_loop=loop,
                arguments={"run": self.run_id},
            )
            connection = session._connection  # the protocol's plumbing; ClientSession has no public way
            connection.connect()
            reply = connection._send_message_wait_for_reply(connection._protocol.create("PULL-DOC-REQ"))
            if reply is None or reply.header["msgtype"] == "ERROR":
                raise RuntimeError(f"no document: {reply and reply.content}")
            self.first_doc = time.time()
            header = _find_header(reply.content["doc"])
            if header is None:
                raise RuntimeError("no monitor header (wb-last-step) in the document")
            self._header_id = header["id"]
            self._show(header["attributes"].get("text", ""))

            def check() -> None:
                if self.stop.is_set():
                    session.close()

            PeriodicCallback(check, 50).start()
            connection.loop_until_closed()
        except Exception as error:  # noqa: BLE001 - counted and reported
            self.error = repr(error)
        finally:
            loop.close(all_fds=True)


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
            raise RuntimeError(f"workbench train exited with {trainer.returncode}: {trainer.stdout.read()}")
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


def main(argv: list[str] | None = None) -> dict:
    import panel.models  # noqa: F401 - the dashboard's model classes, for the client sessions to load
    import panel.models.tabulator  # noqa: F401
    import panel_reactflow  # noqa: F401

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--viewers", type=int)
    parser.add_argument("--seconds", type=float, help="seconds watched (unwatched: less than half)")
    parser.add_argument("--server-path", type=Path)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    viewers_n = args.viewers or (3 if args.quick else 20)
    watched_s = args.seconds or (8.0 if args.quick else 45.0)
    unwatched_s = min(20.0, watched_s / 2)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    env["PYTHONPATH"] = os.pathsep.join(
        [*([str(args.server_path)] if args.server_path else []), str(REPO), env.get("PYTHONPATH", "")]
    )
    with tempfile.TemporaryDirectory() as tmp:
        runs = Path(tmp) / "runs"
        runs.mkdir()
        port = free_port()
        server = subprocess.Popen(
            [sys.executable, "-m", "workbench.cli", "serve", str(runs), "--port", str(port)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
        )  # fmt: skip
        settings = [a for k, v in {**TRAIN, "runs_dir": str(runs)}.items() for a in ("--set", f"{k}={v}")]
        trainer = subprocess.Popen(
            [sys.executable, "-m", "workbench.cli", "train", *settings],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
        )  # fmt: skip
        viewers: list[Viewer] = []
        try:
            wait_until_up(f"http://127.0.0.1:{port}/", server)
            db = _wait_for_run(runs, trainer, steps=2)
            run_id = db.parent.name
            unwatched_from = time.time()
            time.sleep(unwatched_s)
            unwatched_to = time.time()
            stop = threading.Event()
            viewers = [Viewer(f"http://127.0.0.1:{port}/", run_id, stop) for _ in range(viewers_n)]
            threads = [threading.Thread(target=v.run, daemon=True) for v in viewers]
            for t in threads:
                t.start()
            time.sleep(watched_s)
            watched_to = time.time()
            time.sleep(TARGET_S)  # steps committed near the end get the target's time to be shown
            stop.set()
            for t in threads:
                t.join(60)
            finished = _finished(db)
        finally:
            for process in (trainer, server):
                process.terminate()
            train_log, _ = trainer.communicate(timeout=60)
            log, _ = server.communicate(timeout=30)
    all_lags: list[float] = []
    missed = 0
    per_viewer = []
    for viewer in viewers:
        viewer_lags, viewer_missed = lags(viewer, finished, watched_to)
        all_lags += viewer_lags
        missed += viewer_missed
        per_viewer.append(
            {
                "first_doc_s": None if viewer.first_doc is None else viewer.first_doc - viewer.asked,
                "updates": len(viewer_lags),
                "updates_missed": viewer_missed,
                "lag_p95_s": _quantile(viewer_lags, 0.95),
                "error": viewer.error,
            }
        )
    first_docs = [v["first_doc_s"] for v in per_viewer if v["first_doc_s"] is not None]
    unwatched_rate = _rate(finished, unwatched_from, unwatched_to)
    watched_rate = _rate(finished, unwatched_to, watched_to)
    figures = {
        "mode": "quick" if args.quick else "full",
        "viewers": viewers_n,
        "seconds_unwatched": unwatched_s,
        "seconds_watched": watched_s,
        "target_s": TARGET_S,
        "sessions_connected": len(first_docs),
        "session_failures": [v["error"] for v in per_viewer if v["error"]],
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
        "train_steps_per_s_unwatched": unwatched_rate,
        "train_steps_per_s_watched": watched_rate,
        "train_ratio": watched_rate / unwatched_rate if unwatched_rate else None,
        "steps_stored": len(finished),
        "server_tracebacks": log.count("Traceback"),
        "trainer_tracebacks": train_log.count("Traceback"),
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
        f"{len(figures['session_failures'])} sessions failed, {figures['server_tracebacks']} server tracebacks"
    )
    print(f"written to {args.out}")
    return figures


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} s"


if __name__ == "__main__":
    main()
