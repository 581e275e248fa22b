"""Fixtures of the browser tests: a real headless Chromium (Debian's) driven by Playwright, and a served dashboard.

The dashboard runs as ``workbench serve`` in a subprocess on a free port, exactly as a team would start it.
Screenshots go to ``tests/artifacts/`` (kept by CI as artifacts).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

CHROMIUM = os.environ.get("WORKBENCH_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until_up(url: str, process: subprocess.Popen, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the server exited with {process.returncode}: {process.stdout.read()}")
        try:
            urllib.request.urlopen(url, timeout=2)
            return
        except urllib.error.HTTPError:
            return  # it answers (a 401/403 is an answer)
        except OSError:
            time.sleep(0.3)
    raise TimeoutError(f"{url} did not answer within {timeout} s")


class Served:
    """A `workbench serve` subprocess."""

    def __init__(self, runs_dir: Path, *extra: str, env: dict | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process = subprocess.Popen(
            [sys.executable, "-m", "workbench.cli", "serve", str(runs_dir), "--port", str(self.port), *extra],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, **(env or {})},
        )
        wait_until_up(self.url + "/login" if "--users" in extra else self.url, self.process)

    def close(self) -> str:
        self.process.terminate()
        try:
            out, _ = self.process.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            out, _ = self.process.communicate()
        return out


@pytest.fixture(scope="module")
def browser() -> Iterator:
    """One Chromium per test module.

    Playwright's sync API keeps an asyncio loop marked as running in this thread while it is
    open, so ``asyncio.run`` fails in any later test of the same worker: the browser must close
    when its module ends, not when the session does.
    """
    from playwright.sync_api import sync_playwright

    if not Path(CHROMIUM).exists():
        pytest.fail(f"Chromium not found at {CHROMIUM}: run `make chromium` (apt-get install chromium)")
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser, request):
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    yield page
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{request.node.name}.png"), full_page=True)
    context.close()


def screenshot(page, name: str) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)
