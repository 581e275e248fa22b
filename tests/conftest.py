"""Shared pytest fixtures."""

from __future__ import annotations

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


def pytest_collection_modifyitems(config, items):
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        if item.path.name in VLLM_MODULES or VLLM_PARAMS & {v for v in params.values() if isinstance(v, str)}:
            item.add_marker(pytest.mark.vllm)
    first = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: first.get(item.path.name, len(first)))  # stable: the rest keep their order


# --- end vLLM phase ---
