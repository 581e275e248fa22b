"""Same seed, same run: a training run repeats itself call for call on every scheduler and place (issue 49).

Every generation request of a training step is seeded from the run's seed, the step, the task, the sample and
the call's position and turn (``workbench.engine.Rollout``), and the hf backend draws a seeded row from a
generator of its own: what a call draws no longer depends on which requests share its decode batch, how fast
a tool in another process answered, or which thread or worker ran it. Each test trains the tiny model twice
with one seed (2 steps) and compares the stores: every call's prompt and completion token ids and every
metric but the timings; a run with another seed differs. ``tests/test_same_seed_ray.py`` does the same with the
rollout on Ray workers; the vLLM tests here (in make test's vLLM phase) draw a training step's calls on vLLM's
CPU build in batches of other sizes.
"""

from __future__ import annotations

import pytest

import workbench as wb
from tests.same_seed_parts import CHAIN, SANDBOXED, _same, _stored, _train
from workbench.tasks import generate


@pytest.mark.parametrize(
    ("scheduler", "topology", "overrides"),
    [
        ("sync", CHAIN, {}),
        ("async", CHAIN, {"max_staleness": 1}),
        ("pipeline", "marsrl", {"max_staleness": 1, "max_tokens": 4}),
        ("async", SANDBOXED, {"max_staleness": 1, "max_tokens": 10}),
    ],
    ids=["sync", "async", "pipeline", "async-sandbox"],
)
def test_two_runs_of_one_seed_store_the_same_calls_and_metrics(scheduler, topology, overrides, tmp_path):
    runs = [_train(tmp_path, f"run{i}", topology, scheduler=scheduler, **overrides) for i in range(2)]
    calls, _ = _same(*runs)
    steps = {key[0] for key in calls}
    # the pipeline stores an episode at the step it ends (here: the last, which drains it)
    assert steps == {0, 1} or (scheduler == "pipeline" and steps), steps
    if topology is SANDBOXED:
        tools = wb.RunReader(runs[0]).calls()["tool_results"].dropna()
        assert sum(len(results) for results in tools) >= 4, "the sandbox answered tool calls"


def test_another_seed_draws_other_calls_and_a_task_seen_again_draws_anew(tmp_path):
    """The seed reaches the draws; and the step is part of it: a task drawn at two steps samples anew."""
    first = _train(tmp_path, "seed0", CHAIN, batch_size=8, steps=2, learning_rate=1e-9)
    other = _train(tmp_path, "seed1", CHAIN, seed=1, batch_size=8, steps=2, learning_rate=1e-9)
    calls, _ = _stored(first)
    other_calls, _ = _stored(other)
    completions = [c[2] for c in calls.values()]
    assert completions != [c[2] for c in other_calls.values()]
    # all 8 tasks at both steps (one epoch a step) and the weights barely move (a learning rate of 1e-9): only the
    # step's seed can make a call of step 1 draw other tokens than the same call of step 0
    by_step = {step: {k[1:]: v for k, v in calls.items() if k[0] == step} for step in (0, 1)}
    assert by_step[0].keys() == by_step[1].keys()
    firsts = [key for key, call in by_step[0].items() if call[0] == "first"]
    redrawn = [key for key in firsts if by_step[0][key][2] != by_step[1][key][2]]
    assert len(redrawn) > len(firsts) // 2, f"{len(redrawn)} of {len(firsts)} first calls drew anew at step 1"


@pytest.mark.vllm
def test_vllm_serves_seeded_requests_whose_prompts_fill_more_than_one_engine_step(shared_vllm):
    """Training seeds every request. On vLLM's CPU build a seeded request whose prefill was split over two
    engine steps killed the engine ("CPU Generator does not use offset"); the backend keeps prompts whole."""
    import asyncio

    from workbench.backends.base import GenerationRequest

    engine = shared_vllm.get()
    prompts = [[(7 * i + k) % 500 + 10 for k in range(400)] for i in range(8)]  # 3,200 prompt tokens at once
    requests = [GenerationRequest(p, max_tokens=4, temperature=1.0, seed=i) for i, p in enumerate(prompts)]

    async def both() -> list:
        return [await asyncio.gather(*(engine.generate(r) for r in requests)) for _ in range(2)]

    first, again = asyncio.run(both())
    assert [g[0].completion_ids for g in first] == [g[0].completion_ids for g in again]


@pytest.mark.vllm
def test_vllm_draws_a_training_call_the_same_whichever_requests_share_its_batch(shared_vllm):
    """A training step's rollout on vLLM's CPU build (MarsRL, its requests seeded as training seeds them), three
    times: 16 episodes decoding side by side, the same again, and each task's group of 4 alone. Other batches
    would give other logits where the kernels are not batch-invariant, and a token drawn near a boundary would
    flip; on the CPU build (float32, as training runs it) none does: every call draws the same tokens."""
    import asyncio

    from workbench.engine import Rollout

    engine = Rollout(wb.load_topology("marsrl"), shared_vllm.get(), max_tokens=8, seed=0)
    tasks = generate("arithmetic", n=4, seed=0, level=1)

    async def three() -> list[list]:
        together = await engine.run(tasks, group_size=4, step=0)
        again = await engine.run(tasks, group_size=4, step=0)
        apart = [episode for task in tasks for episode in await engine.run([task], group_size=4, step=0)]
        return [together, again, apart]

    def calls(episodes: list) -> dict[tuple, tuple]:
        return {
            (e.task_id, e.sample, c.position): (list(c.prompt_ids), list(c.completion_ids))
            for e in episodes
            for c in e.calls
        }

    together, again, apart = (calls(run) for run in asyncio.run(three()))
    assert len(together) >= 16 * 3, len(together)
    assert together == again
    differ = [key for key in together if apart.get(key) != together[key]]
    assert together.keys() == apart.keys() and not differ, f"{len(differ)} of {len(together)} calls differ"
