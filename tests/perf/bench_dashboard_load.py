"""Dashboard load benchmark: a run's writer, unwatched and then watched by concurrent viewers of the dashboard.

    python -m tests.perf.bench_dashboard_load --quick     # 5 viewers, 15 s per phase
    python -m tests.perf.bench_dashboard_load             # 20 viewers, 60 s per phase (the issue's figure)

``workbench serve`` runs in a subprocess; each viewer is a real Bokeh client session of the dashboard
opened on the run being written (``/?run=<id>``), so the server does for it what it does for a
browser tab: refresh the runs list every second and poll the run's metrics every half second. The
writer (this process) stores steps of 20 episodes x 5 calls as fast as it can, first with nobody
watching, then with the viewers connected. Reported: calls/s of each phase, their ratio (target >= 0.9),
sessions that failed, and tracebacks in the server's log (target: none).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from tests.browser.conftest import free_port, wait_until_up
from tests.perf.runner import machine, now, write_json
from workbench.store import RunStore

DEFAULT_OUT = Path(__file__).parent / "results" / "dashboard_load.json"


def write_for(store: RunStore, first_step: int, seconds: float) -> tuple[int, int]:
    """Write steps for ``seconds``; returns (calls written, next step index)."""
    rng = np.random.default_rng(first_step)
    ids = rng.integers(0, 49_000, 64).astype(np.int32)
    calls, step_index, deadline = 0, first_step, time.monotonic() + seconds
    while time.monotonic() < deadline:
        with store.step(step_index) as step:
            for e in range(20):
                episode = step.add_episode(task_id=f"{step_index}-{e}", reward=float(e % 2))
                step.add_calls([{"episode_id": episode, "role": f"role{c}", "completion_ids": ids,
                                 "mask": [1] * 64, "logprobs": -rng.random(64)} for c in range(5)])  # fmt: skip
                calls += 5
            step.log_metrics({"reward/mean": float(rng.random())})
            step.log_metrics({"reward/mean": float(rng.random()), "length/mean": 64.0}, role="role0")
        step_index += 1
    return calls, step_index


def main(argv: list[str] | None = None) -> dict:
    import panel.models  # noqa: F401 - the dashboard's model classes, for the client sessions to load
    import panel.models.tabulator  # noqa: F401
    import panel_reactflow  # noqa: F401
    from bokeh.client import pull_session

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--viewers", type=int)
    parser.add_argument("--seconds", type=float)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    viewers = args.viewers or (5 if args.quick else 20)
    seconds = args.seconds or (15.0 if args.quick else 60.0)
    with tempfile.TemporaryDirectory() as tmp:
        runs = Path(tmp) / "runs"
        store = RunStore.create(runs, config={"kind": "train"}, name="load")
        store.set_status("running")
        port = free_port()
        server = subprocess.Popen(
            [sys.executable, "-m", "workbench.cli", "serve", str(runs), "--port", str(port)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        try:
            wait_until_up(f"http://127.0.0.1:{port}/", server)
            alone, next_step = write_for(store, 0, seconds)
            sessions, failures = [], []

            def connect() -> None:
                try:
                    sessions.append(
                        pull_session(url=f"http://127.0.0.1:{port}/", arguments={"run": store.run_id})
                    )
                except Exception as error:  # noqa: BLE001 - counted and reported
                    failures.append(repr(error))

            threads = [threading.Thread(target=connect) for _ in range(viewers)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(120)
            watched, _ = write_for(store, next_step, seconds)
            for session in sessions:
                session.close()
        finally:
            server.terminate()
            log, _ = server.communicate(timeout=30)
            store.close()
    figures = {
        "mode": "quick" if args.quick else "full",
        "viewers": viewers,
        "seconds_per_phase": seconds,
        "calls_per_s_unwatched": alone / seconds,
        "calls_per_s_watched": watched / seconds,
        "throughput_ratio": watched / max(alone, 1),
        "sessions_connected": len(sessions),
        "session_failures": failures,
        "server_tracebacks": log.count("Traceback"),
        "machine": machine(),
        "finished": now(),
    }
    write_json(args.out, figures)
    print(
        f"{viewers} viewers, {seconds:.0f} s per phase: writer {figures['calls_per_s_unwatched']:.0f} calls/s "
        f"alone, {figures['calls_per_s_watched']:.0f} watched (ratio {figures['throughput_ratio']:.2f}); "
        f"{len(sessions)} sessions, {len(failures)} failed, {figures['server_tracebacks']} server tracebacks"
    )
    print(f"written to {args.out}")
    return figures


if __name__ == "__main__":
    main()
