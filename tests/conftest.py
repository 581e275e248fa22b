"""Shared pytest fixtures."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest

# --- models fixtures ---
# Built-in models are built once into the workbench cache ($WORKBENCH_CACHE, else the user cache),
# which pytest-xdist workers and later runs share safely through the cache's per-entry lock.


@pytest.fixture(scope="session")
def tiny_model_path() -> Path:
    """The ``tiny`` checkpoint (random-init Qwen2, built in about a second)."""
    from workbench.models import resolve

    return resolve("tiny")


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    """The fp32 SmolLM2-135M-Instruct checkpoint (converted once per cache: about 30 s, 517 MiB)."""
    from workbench.models import resolve

    return resolve("smollm2-135m")


# --- end models fixtures ---


# --- vLLM phase ---
# vLLM's CPU engine keeps its OpenMP threads busy; a torch process beside it on the same two cores slows
# down many times over. `make test` therefore runs these tests in a phase of their own (-m vllm) after
# the parallel phase (-m "not vllm").
VLLM_MODULES = {
    "test_backend_vllm.py",
    "test_training_vllm.py",
    "test_learning_tools.py",
}
VLLM_PARAMS = {"vllm", "openai"}


# The parallel phase hands whole files to its two workers in collection order (--dist loadfile with
# --no-loadscope-reorder; xdist would otherwise order files by their number of tests). The longest files go
# first, longest first (`make test PYTEST_ARGS=--durations=60`), so that the phase ends on short files on both
# workers instead of one worker running a long one alone at the end.
LONGEST_FIRST = (
    "test_learning.py",  # one 25-step training run, about 600 s
    "test_cluster.py",
    "test_suite.py",  # the quick benchmark suite
    "test_reports.py",  # `workbench reproduce all`
    "test_gpu_check.py",  # the GPU script's CPU rehearsal
    "test_editor.py",
    "test_crash_safety.py",
    "test_readme_commands.py",
    "training.ipynb",
)


def uses_the_shared_engine(item) -> bool:
    """Whether a test runs on the shared tiny vLLM engine (``shared_vllm``, directly or through a fixture, or a
    parameter marked ``shared_vllm``)."""
    return (
        "shared_vllm" in getattr(item, "fixturenames", ())
        or item.get_closest_marker("shared_vllm") is not None
    )


@pytest.hookimpl(wrapper=True)  # marks before -m selects, sorts after pytest's reordering by fixtures
def pytest_collection_modifyitems(config, items):
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        if item.path.name in VLLM_MODULES or VLLM_PARAMS & {v for v in params.values() if isinstance(v, str)}:
            item.add_marker(pytest.mark.vllm)
    yield
    first = {name: i for i, name in enumerate(LONGEST_FIRST)}
    # stable: the shared engine's tests one after another, then the longest files first, the rest in order
    items.sort(key=lambda item: (not uses_the_shared_engine(item), first.get(item.path.name, len(first))))


class SharedEngine:
    """One vLLM engine on ``tiny`` for the tests of the engine, the backend conformance suite and the bad-inputs
    test: starting one on a CPU costs about 30 s (vLLM spawns its engine core and its worker, and each imports
    vLLM anew). LoRA on, 512 tokens of context, float32 (its log-probs are compared with transformers'). It
    starts for the first test that asks for it and stops after the last one (``pytest_runtest_teardown``):
    left idle, its worker would take a share of a core from the tests after it."""

    def __init__(self) -> None:
        self.engine = None
        self.spawned: set[int] = set()

    def get(self):
        if self.engine is None:
            from workbench.backends.vllm import VLLMBackend
            from workbench.models import resolve

            before = children()
            self.engine = VLLMBackend(
                resolve("tiny"),
                max_model_len=512,
                dtype="float32",
                enable_lora=True,
                max_loras=2,
                max_lora_rank=8,
            )
            self.spawned = children() - before  # the engine core and its worker
        return self.engine

    def close(self) -> None:
        """Stop the engine; its processes must be gone within 30 s."""
        engine, self.engine = self.engine, None
        if engine is not None:
            engine.close()
            alive = still_running(self.spawned)
            assert not alive, f"close() left engine processes running: {alive}"


_SHARED = SharedEngine()


@pytest.fixture(scope="session")
def shared_vllm() -> SharedEngine:
    """The shared tiny vLLM engine's holder: ``shared_vllm.get()`` is the engine (started on first use)."""
    yield _SHARED
    _SHARED.close()


@pytest.hookimpl(trylast=True)  # after pytest has torn down the fixtures of the test
def pytest_runtest_teardown(item, nextitem):
    if _SHARED.engine is not None and (nextitem is None or not uses_the_shared_engine(nextitem)):
        _SHARED.close()


def children() -> set[int]:
    """This process's descendants, less Python's multiprocessing resource tracker (it lives as long as this
    process)."""
    import psutil

    pids = set()
    for p in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if "resource_tracker" not in " ".join(p.cmdline()):
                pids.add(p.pid)
    return pids


def still_running(pids: set[int], timeout: float = 30) -> list[int]:
    """Those of ``pids`` still running after ``timeout`` seconds."""
    import psutil

    procs = []
    for pid in pids:
        with contextlib.suppress(psutil.NoSuchProcess):
            procs.append(psutil.Process(pid))
    _, alive = psutil.wait_procs(procs, timeout=timeout)
    return [p.pid for p in alive]


# --- end vLLM phase ---
