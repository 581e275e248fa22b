"""vLLM's engine processes and logs: a quiet start, and a shutdown that reaps every process the engine started.

Logs: vLLM writes INFO lines (its whole engine config among them) from this process and from the engine-core
and worker processes it spawns, and a notebook shows them all in the cell. :func:`logging_level` sets vLLM's
level here (the ``vllm`` logger and its handlers) and, through ``VLLM_LOGGING_LEVEL``, in the processes
spawned while the engine starts (each reads the variable when it imports vLLM); the variable is restored
afterwards. The default, :data:`QUIET`, keeps vLLM's warnings and errors and drops its INFO lines.

Processes: vLLM's ``shutdown`` gives its engine-core process 5 s after SIGTERM, then SIGKILLs it and never
waits for it. On 2 busy cores the engine core takes about 6 s (it first waits for its model worker), so every
engine closed left a ``<defunct>`` EngineCore in the notebook's kernel. :func:`shutdown_engine` gives it
:data:`GRACE_S`, then waits for (reaps) each of the engine's processes, killing any that is still alive.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Iterator
from typing import Any

#: vLLM's log level unless asked otherwise (``log_level=``, or ``VLLM_LOGGING_LEVEL`` set by the user).
QUIET = "WARNING"

#: Seconds vLLM's engine core gets to stop its worker and exit after SIGTERM (measured here: about 6 s).
GRACE_S = 30.0


def chosen_level(log_level: str | None) -> str:
    """The level asked for: ``log_level``, else the user's ``VLLM_LOGGING_LEVEL``, else :data:`QUIET`."""
    return (log_level or os.environ.get("VLLM_LOGGING_LEVEL") or QUIET).upper()


@contextlib.contextmanager
def logging_level(level: str) -> Iterator[None]:
    """vLLM logs at ``level`` here from now on, and in the processes spawned inside this block."""
    previous = os.environ.get("VLLM_LOGGING_LEVEL")
    os.environ["VLLM_LOGGING_LEVEL"] = level
    try:
        import vllm.logger  # noqa: F401 - configures the ``vllm`` logger from the variable on first import

        logger = logging.getLogger("vllm")
        logger.setLevel(level)
        for handler in logger.handlers:  # an earlier engine's level, if vLLM was imported before
            handler.setLevel(level)
        yield
    finally:
        if previous is None:
            os.environ.pop("VLLM_LOGGING_LEVEL", None)
        else:
            os.environ["VLLM_LOGGING_LEVEL"] = previous


def engine_processes(engine: Any) -> list[Any]:
    """The ``multiprocessing`` processes an ``AsyncLLM`` started (its engine cores); empty if none are known."""
    resources = getattr(getattr(engine, "engine_core", None), "resources", None)
    return list(getattr(getattr(resources, "engine_manager", None), "processes", None) or [])


def reap(processes: list[Any], timeout: float = 10.0) -> None:
    """Wait for each process to end, killing it after ``timeout`` s: none is left running or ``<defunct>``."""
    for process in processes:
        with contextlib.suppress(Exception):  # a process never started, or already waited for
            process.join(timeout)
            if process.is_alive():
                process.kill()
                process.join(timeout)


async def shutdown_engine(engine: Any, grace: float = GRACE_S) -> None:
    """Stop vLLM's engine and reap its processes (runs on the engine's loop)."""
    handler = getattr(engine, "output_handler", None)
    if handler is not None:  # stop reading from the engine core before it goes away (no error logs)
        handler.cancel()
        await asyncio.gather(handler, return_exceptions=True)
        engine.output_handler = None
    processes = engine_processes(engine)
    engine.shutdown(timeout=grace)
    # AsyncLLM.__del__ shuts down again; at interpreter exit that runs after vLLM's module globals
    # are gone and prints a TypeError. It is shut down already: make the second call a no-op.
    engine.shutdown = lambda *args, **kwargs: None
    reap(processes)
