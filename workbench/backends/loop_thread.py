"""A private asyncio event loop on a daemon thread, for backends whose clients are tied to one loop.

vLLM's ``AsyncLLM`` and ``httpx.AsyncClient`` belong to the event loop that created them, while the
workbench awaits backends from many loops (``asyncio.run`` in scripts and tests, a notebook kernel's
loop). A backend keeps its client on one of these loops and hands every request over to it:

    loop = LoopThread("vllm")
    client = loop.run(make_client())                    # from synchronous code
    result = await loop.submit(client.call(...))        # from any other event loop
    loop.stop(cleanup())                                # run a last coroutine, then end the thread

:func:`run_sync` is the other way round: it runs a coroutine to its end from synchronous code, on a
thread of its own when the caller (a notebook cell) already has a running loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Coroutine
from typing import Any


class LoopThread:
    """An event loop running forever on its own daemon thread until ``stop``."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name=f"{name}-backend-loop", daemon=True)
        self.thread.start()

    @property
    def running(self) -> bool:
        return not self.loop.is_closed() and self.loop.is_running()

    def run(self, coro: Coroutine, timeout: float | None = None) -> Any:
        """Run ``coro`` on this loop and wait for its result (call from any thread but this loop's)."""
        if not self.running:
            coro.close()
            raise RuntimeError("the backend's event loop has stopped")
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    async def submit(self, coro: Coroutine) -> Any:
        """Await ``coro`` running on this loop from another event loop; cancelling the caller cancels it."""
        if not self.running:
            coro.close()
            raise RuntimeError("the backend's event loop has stopped")
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self.loop))

    def stop(self, cleanup: Coroutine | None = None, timeout: float = 120) -> None:
        """Run ``cleanup`` on the loop (errors ignored), then stop the loop and its thread; safe to repeat."""
        if cleanup is not None:
            if self.running:
                with contextlib.suppress(Exception):  # shutting down: nothing left to report to
                    self.run(cleanup, timeout)
            else:
                cleanup.close()
        if self.running:
            with contextlib.suppress(Exception):
                self.run(_cancel_other_tasks(), timeout=30)
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(timeout=30)
        if not self.loop.is_closed() and not self.loop.is_running():
            self.loop.close()


async def _cancel_other_tasks() -> None:
    tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def run_sync(coroutine_factory: Callable[[], Any], on_interrupt: Callable[[], None] | None = None) -> Any:
    """Run a coroutine from plain or notebook code (a running loop gets its own thread).

    An interrupt (Ctrl-C, or the notebook's stop button) calls ``on_interrupt`` and waits for the
    coroutine to wind down, so what finished is kept.
    """
    try:
        asyncio.get_running_loop()
        running = True
    except RuntimeError:
        running = False
    if not running and on_interrupt is None:  # outside the except: its error would be chained to each failure
        return asyncio.run(coroutine_factory())
    return _run_in_thread(coroutine_factory, on_interrupt)


def _run_in_thread(coroutine_factory: Callable[[], Any], on_interrupt: Callable[[], None] | None) -> Any:
    result: dict[str, Any] = {}

    def target() -> None:
        try:
            result["value"] = asyncio.run(coroutine_factory())
        except BaseException as error:  # noqa: BLE001 - re-raised in the caller's thread
            result["error"] = error

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    try:
        while thread.is_alive():
            thread.join(0.1)
    except KeyboardInterrupt:
        if on_interrupt is None:
            raise
        on_interrupt()
        thread.join()
    if "error" in result:
        raise result["error"]
    return result["value"]
