"""The engine on a real (tiny) model: exact tokens, honest log-probs, format failures recorded, stored calls."""

import asyncio

import pytest
import torch

import workbench as wb
from workbench.backends.base import GenerationRequest
from workbench.backends.hf import HFBackend
from workbench.engine import Rollout


@pytest.fixture(scope="module")
def tiny_backend():
    return HFBackend("tiny")


def test_logprobs_match_a_teacher_forced_forward_pass_under_left_padding(tiny_backend):
    tok = tiny_backend.tokenizer
    prompts = [
        tok("1 + 2 =")["input_ids"],
        tok("What is the capital of a country with a long name?")["input_ids"],
    ]

    async def both():
        return await asyncio.gather(
            *(tiny_backend.generate(GenerationRequest(p, max_tokens=6, temperature=1.0)) for p in prompts)
        )

    generations = [g for (g,) in asyncio.run(both())]
    assert generations[0].timings["batch_size"] == 2.0, "concurrent requests should share one batch"
    for prompt, gen in zip(prompts, generations, strict=True):
        assert len(gen.completion_ids) == len(gen.logprobs) > 0
        ids = torch.tensor([prompt + gen.completion_ids])
        with torch.no_grad():
            logits = tiny_backend.model(ids).logits[0].float().log_softmax(-1)
        expected = [logits[len(prompt) - 1 + i, t].item() for i, t in enumerate(gen.completion_ids)]
        assert gen.logprobs == pytest.approx(expected, abs=1e-3)


def test_rollout_records_every_call_and_survives_malformed_outputs(tiny_backend, tmp_path):
    topology = wb.load_topology("marsrl")
    tasks = wb.generate_tasks("arithmetic", n=2, seed=1, level=1)
    result = wb.rollout(topology, tasks, backend=tiny_backend, max_tokens=8, runs_dir=tmp_path, group_size=2)
    assert len(result.episodes) == 4
    for episode in result.episodes:
        assert episode.status in {"complete", "call_limit"}, episode.error
        roles = [c.role for c in episode.calls]
        # grouped rollout (G = 2): both Solver samples are judged twice each
        assert roles[:3] == ["solver", "verifier1", "verifier1"]
        # a random model never writes a verdict: it reads as not-correct and the Corrector runs
        verifier = episode.calls[1]
        assert verifier.format_error is not None
        for call in episode.calls:
            assert len(call.logprobs) == len(call.completion_ids) <= 8
            assert all(lp <= 0 for lp in call.logprobs)
    # ... so, per task, Corrector1 samples twice on each of the 2 flagged reports it picks
    assert sum(c.role == "corrector1" for e in result.episodes for c in e.calls) == 2 * 4
    solver = result.episodes[0].calls[0]
    expected = tiny_backend.tokenizer.apply_chat_template(
        [{"role": "user", "content": tasks[0].question}], add_generation_prompt=True, tokenize=True
    )
    expected = expected["input_ids"] if hasattr(expected, "keys") else expected
    assert solver.prompt_ids == list(expected)

    reader = wb.RunReader(result.run_dir)
    calls = reader.calls()
    assert len(calls) == sum(len(e.calls) for e in result.episodes)
    assert set(calls["role"]) >= {"solver", "verifier1", "corrector1"}


def test_an_exception_inside_one_episode_is_recorded_and_the_others_finish(tiny_backend):
    topology = wb.load_topology("marsrl")
    tasks = wb.generate_tasks("arithmetic", n=2, seed=2, level=1)
    engine = Rollout(topology, tiny_backend, max_tokens=4)
    original = engine._call
    failed = []

    async def flaky(*args, **kwargs):
        if args[0] == "verify1" and not failed:
            failed.append(args)
            raise RuntimeError("backend went away")
        return await original(*args, **kwargs)

    engine._call = flaky
    episodes = asyncio.run(engine.run(tasks))
    statuses = sorted(e.status for e in episodes)
    assert "error" in statuses and any(s != "error" for s in statuses)
    broken = next(e for e in episodes if e.status == "error")
    assert "backend went away" in broken.error


class Unprintable(RuntimeError):
    def __str__(self) -> str:
        raise ValueError("no message for you")


def test_an_exception_whose_message_cannot_be_read_is_still_recorded(tiny_backend):
    topology = wb.load_topology("marsrl")
    tasks = wb.generate_tasks("arithmetic", n=2, seed=2, level=1)
    engine = Rollout(topology, tiny_backend, max_tokens=4)
    original = engine._call

    async def hostile(*args, **kwargs):
        if args[0] == "verify1":
            raise Unprintable()
        return await original(*args, **kwargs)

    engine._call = hostile
    episodes = asyncio.run(engine.run(tasks))
    assert [e.status for e in episodes] == ["error", "error"]
    assert all(e.error == "Unprintable: (its message could not be read)" for e in episodes)


def test_cancelling_ends_episodes_as_cancelled_and_keeps_what_finished(tiny_backend):
    topology = wb.load_topology("marsrl")
    tasks = wb.generate_tasks("arithmetic", n=3, seed=4, level=1)
    engine = None

    class CancelAfterFirstBatch:
        name, tokenizer, policy_version = "hf", tiny_backend.tokenizer, 0

        async def generate(self, request):
            out = await tiny_backend.generate(request)
            engine.cancel()  # as the notebook's stop button would, once the Solver calls are back
            return out

    engine = Rollout(topology, CancelAfterFirstBatch(), max_tokens=4)
    episodes = asyncio.run(engine.run(tasks))
    assert [e.status for e in episodes] == ["cancelled"] * 3
    assert all([c.role for c in e.calls] == ["solver"] for e in episodes), "finished calls are kept"


def test_each_roles_sampling_reaches_the_backend_request(tiny_backend):
    from workbench.backends.wrapper import BackendWrapper
    from workbench.topology import from_dict, to_dict

    spec = to_dict(wb.load_topology("marsrl"))
    spec["roles"]["solver"]["sampling"].update(temperature=0.7, top_p=0.95, top_k=20, max_tokens=5)
    seen = []

    class Recording(BackendWrapper):
        async def generate(self, request):
            seen.append(request)
            return await self.inner.generate(request)

    engine = Rollout(from_dict(spec), Recording(tiny_backend), max_tokens=4)
    asyncio.run(engine.run(wb.generate_tasks("arithmetic", n=1, seed=5, level=1)))
    solver = seen[0]
    assert (solver.temperature, solver.top_p, solver.top_k, solver.max_tokens) == (0.7, 0.95, 20, 4)
    assert all(r.top_k is None for r in seen[1:]), "roles without top_k sample from the whole vocabulary"
