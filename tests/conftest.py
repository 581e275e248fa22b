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
