"""What a dashboard session costs the server, against a real served dashboard and real websocket clients.

The server runs in this process (``widgets.server.serve.serve`` on its own IOLoop thread), so that its Bokeh
sessions can be counted and the CPU of its event loop read (``/proc/self/task/<tid>/stat``); the clients
are ``tests.perf.dashboard_client.Tab``: each signs in from its own loopback address, asks for a run's page,
opens the websocket and pulls the document, as a browser does, then either sends ``document_ready`` or not.

Checked: a session that never becomes ready costs the server nothing periodic (once a client held one open
without ``document_ready``, HoloViews' ``Plot.refresh`` and Panel's deferred periodic callbacks
rescheduled themselves on every tick and pinned a core for minutes, even after it left); a session whose
websocket closed, ready or not, is discarded within 10 s; and the server's CPU is under 5% of a core
within 20 s of the clients leaving, while the run they watched goes on writing steps.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.browser.conftest import free_port
from tests.perf.dashboard_client import Tab
from widgets.server.access import add_user
from workbench.store import RunStore

VIEWER = ("ada", "a-viewer-password-5")
DISCARD_S, IDLE_S, IDLE_CORE = 10.0, 20.0, 0.05


def _thread_cpu(tid: int) -> float:
    """CPU seconds thread ``tid`` of this process has used (user + system)."""
    fields = Path(f"/proc/self/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Server:
    """``widgets.server.serve.serve`` on its own thread and IOLoop, signed-in viewers only."""

    def __init__(self, runs: Path, users: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server: Any = None
        self.tid = 0
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(runs, users), daemon=True)
        self._thread.start()
        assert self._ready.wait(60), "the server did not start within 60 s"

    def _run(self, runs: Path, users: Path) -> None:
        from widgets.server.serve import serve

        asyncio.set_event_loop(asyncio.new_event_loop())
        self.tid = threading.get_native_id()
        self.server = serve(runs, port=self.port, users_file=users, start=False)
        self.server.start()
        self.server.io_loop.add_callback(self._ready.set)
        self.server.io_loop.start()

    def sessions(self) -> int:
        """The Bokeh sessions the server holds."""
        return len(self.server._tornado.get_sessions("/"))

    def cpu(self) -> float:
        return _thread_cpu(self.tid)

    def close(self) -> None:
        def stop() -> None:
            self.server.stop()
            self.server.io_loop.stop()

        self.server.io_loop.add_callback(stop)
        self._thread.join(30)


@pytest.fixture
def served(tmp_path) -> Iterator[tuple[Server, RunStore]]:
    runs, users = tmp_path / "runs", tmp_path / "users.json"
    add_user(users, *VIEWER, role="viewer")
    store = RunStore.create(runs, {"kind": "train", "model": "tiny"}, run_id="live", topology="marsrl_cpu")
    store.set_status("running")
    server = Server(runs, users)
    yield server, store
    server.close()
    store.close()


class Writer:
    """Writes a step of metrics every ``period`` seconds until stopped: a run being trained."""

    def __init__(self, store: RunStore, period: float = 0.3) -> None:
        self.store, self.period, self.step = store, period, store.last_complete_step() + 1
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._write, daemon=True)
        self._thread.start()

    def _write(self) -> None:
        while not self._stop.wait(self.period):
            with self.store.step(self.step) as step:
                step.log_metrics({"reward/mean": 0.01 * self.step}, role="solver")
                step.log_metrics({"length/mean": 3.0}, role="solver")
            self.step += 1

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)


def _until(condition: Any, timeout: float, every: float = 0.25) -> float | None:
    """Seconds until ``condition()`` held (polled every ``every`` s), or None after ``timeout``."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if condition():
            return time.monotonic() - start
        time.sleep(every)
    return None


def _idle(server: Server, window: float = 2.0) -> bool:
    """Whether the server's event loop used under IDLE_CORE of a core over the next ``window`` seconds."""
    used = server.cpu()
    time.sleep(window)
    return server.cpu() - used < IDLE_CORE * window


def test_sessions_that_never_become_ready_or_whose_socket_closed_cost_nothing_and_are_discarded(served):
    server, store = served
    with store.step(0) as step:
        step.log_metrics({"reward/mean": 0.0}, role="solver")
    writer = Writer(store)
    holder: list[Tab] = []

    async def visit() -> None:
        stop = asyncio.Event()
        stop.set()  # each leaves as soon as it has its document (and, for the last, sent document_ready)
        path = "/?run=live"
        leavers = [Tab(server.url, f"127.0.0.{20 + i}") for i in range(3)]
        await asyncio.gather(*(tab.visit(*VIEWER, path, stop, ready=i == 2) for i, tab in enumerate(leavers)))
        assert [tab.error for tab in leavers] == [None] * 3 and all(tab.first_doc for tab in leavers)
        lingerer = Tab(server.url, "127.0.0.30")  # stays connected, never ready
        await lingerer.sign_in(*VIEWER)
        await lingerer.open(path, ready=False)
        holder.append(lingerer)

    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(visit())
        left = _until(lambda: server.sessions() == 1, DISCARD_S + 5)
        assert left is not None and left <= DISCARD_S, (
            f"sessions left after {DISCARD_S + 5} s: {server.sessions()}"
        )
        # the one still connected without document_ready runs nothing periodic
        assert _until(lambda: _idle(server), IDLE_S, every=0) is not None, "the server kept busy"

        async def leave() -> None:
            holder[0].close()
            await asyncio.sleep(0.1)  # the close goes out

        loop.run_until_complete(leave())
        gone = _until(lambda: server.sessions() == 0, DISCARD_S + 5)
        assert gone is not None and gone <= DISCARD_S, "the last session outlived its socket"
        assert _idle(server), "the server kept busy with nobody connected"
    finally:
        writer.stop()
        loop.close()


def test_pages_are_built_one_at_a_time_in_order_with_the_loop_left_to_earlier_sessions_between():
    from widgets.server.serve import PacedPages

    pacer, events = PacedPages(), []

    async def page(i: int) -> None:
        await pacer.on_session_created(None)
        events.append(f"build {i}")  # a page is built synchronously on the loop...
        asyncio.get_running_loop().call_soon(events.append, f"websocket {i}")  # ...while its websocket waits
        time.sleep(0.01)
        pacer.modify_document(None)

    async def burst() -> None:
        await asyncio.gather(*(page(i) for i in range(3)))
        await asyncio.sleep(0)

    asyncio.run(burst())
    assert events == ["build 0", "websocket 0", "build 1", "websocket 1", "build 2", "websocket 2"]
