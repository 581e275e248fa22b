"""A warm engine (``wb.start_engine``): made once, reused by rollout after rollout, closed with its processes reaped.

The transformers test runs in the normal phase on ``tiny``; the vLLM one starts one engine of its own (about
30 s on 2 cores) in the vLLM phase and checks what a re-run notebook cell needs: no vLLM INFO line in the
output, no process of the engine's left (running or ``<defunct>``) after ``close()``, and this process's memory
back to what it was before the engine.
"""

from __future__ import annotations

import asyncio
import re

import pytest

import workbench as wb
from workbench import runs
from workbench.backends import BackendError
from workbench.backends.base import GenerationRequest

TOPOLOGY = "debate"


def no_new_engines(*args, **kwargs):
    raise AssertionError("a rollout given an engine started a backend of its own")


def test_two_rollouts_reuse_one_hf_engine_and_a_closed_one_refuses(tmp_path, monkeypatch):
    tasks = wb.generate_tasks("arithmetic", n=2, seed=0, level=1)
    engine = wb.start_engine("tiny", backend="hf", device="cpu")
    model = engine.model
    monkeypatch.setattr(runs, "make_backend", no_new_engines)
    first = wb.rollout(TOPOLOGY, tasks, backend=engine, max_tokens=4, runs_dir=tmp_path)
    second = wb.rollout(TOPOLOGY, tasks, backend=engine, max_tokens=4, runs_dir=tmp_path)
    assert len(first.episodes) == len(second.episodes) == 2
    assert engine.model is model and not engine.closed, "the rollouts should leave the engine loaded and open"
    with wb.RunReader(second.run_dir) as reader:
        assert reader.config["model"] == "tiny", (
            "the run should record the engine's model (a replay serves it)"
        )
    with pytest.raises(ValueError, match="serves 'tiny'"):
        wb.rollout(TOPOLOGY, tasks, model="smollm2-135m", backend=engine, runs_dir=tmp_path)

    engine.close()
    engine.close()  # again: nothing happens
    assert engine.closed and engine.model is None
    with pytest.raises(BackendError, match="closed: start one with wb.start_engine"):
        wb.rollout(TOPOLOGY, tasks, backend=engine, runs_dir=tmp_path)
    with pytest.raises(BackendError, match="this hf backend is closed"):
        asyncio.run(engine.generate(GenerationRequest([1, 2, 3], max_tokens=2)))


def test_an_engine_is_a_context_manager_and_training_refuses_one(tmp_path):
    refused = pytest.raises(TypeError, match="training runs in a process of its own")
    with wb.start_engine("tiny", backend="hf") as engine, refused:
        wb.train(TOPOLOGY, backend=engine, runs_dir=str(tmp_path))
    assert engine.closed
    assert not list(tmp_path.iterdir()), "a refused training run should leave no run directory"
    with pytest.raises(ValueError, match="vLLM places its engine itself"):
        wb.start_engine("tiny", backend="vllm", device="cpu")


def family() -> dict[int, str]:
    """This process's descendants and their states (``zombie`` for one nobody waited for), less Python's
    multiprocessing resource tracker, which lives as long as this process."""
    import psutil

    found = {}
    for child in psutil.Process().children(recursive=True):
        try:
            if "resource_tracker" not in " ".join(child.cmdline()):
                found[child.pid] = child.status()
        except psutil.ZombieProcess:
            found[child.pid] = psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            pass
    return found


def rss_mib() -> float:
    import psutil

    return psutil.Process().memory_info().rss / 2**20


# vLLM's parent side after close: the tokenizer, the engine's config and client objects that Python keeps in its
# heaps (measured here on tiny: +1 to +3 MiB over the value before the engine). The engine's weights and KV cache
# live in the engine-core and worker processes, which must be gone. 300 MiB still catches a model or a KV cache
# kept in this process, and leaves room for allocator noise on a machine shared with other tests.
RSS_MARGIN_MIB = 300


@pytest.mark.vllm
@pytest.mark.slow
def test_a_warm_vllm_engine_serves_two_rollouts_quietly_and_leaves_nothing_behind(tmp_path, capfd):
    import vllm.v1.engine.async_llm  # noqa: F401 - what importing vLLM costs is not the engine's

    import workbench.backends.vllm  # noqa: F401

    tasks = wb.generate_tasks("arithmetic", n=2, seed=0, level=1)
    before, rss_before = family(), rss_mib()
    engine = wb.start_engine("tiny", backend="vllm", max_model_len=256)
    spawned = set(family()) - set(before)
    assert spawned, "vLLM should run its engine core in a child process"
    first = wb.rollout(TOPOLOGY, tasks, backend=engine, max_tokens=4, runs_dir=tmp_path)
    second = wb.rollout(TOPOLOGY, tasks, backend=engine, max_tokens=4, runs_dir=tmp_path)
    assert len(first.episodes) == len(second.episodes) == 2 and not engine.closed
    engine.close()
    engine.close()
    rss_after = rss_mib()

    left = {pid: state for pid, state in family().items() if pid not in before}
    assert not left, f"close() left the engine's processes behind (pid: state): {left}"
    out, err = capfd.readouterr()
    info = [line for line in (out + err).splitlines() if re.search(r"\bINFO\b", line)]
    assert not info, "vLLM's INFO lines reached the output:\n" + "\n".join(info[:10])
    print(f"RSS before the engine {rss_before:.0f} MiB, after close {rss_after:.0f} MiB")
    assert rss_after <= rss_before + RSS_MARGIN_MIB
    with pytest.raises(BackendError, match="closed"):
        wb.rollout(TOPOLOGY, tasks, backend=engine, runs_dir=tmp_path)
