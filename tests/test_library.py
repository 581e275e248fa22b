"""Every built-in topology runs end to end on a real model, and its stored masks match what each role generated."""

import asyncio

import pytest

import workbench as wb
import workbench.topology as topo
from workbench.backends.base import GenerationRequest
from workbench.backends.hf import HFBackend
from workbench.engine import Rollout
from workbench.store.codec import TokenOwner

TASKS = {
    "marsrl": ("arithmetic", {"level": 1}),
    "marsrl_inference": ("arithmetic", {"level": 1}),
    "marsrl_cpu": ("arithmetic", {"level": 1, "format": "plain"}),
    "mars": ("multihop", {"hops": 1}),
    "mars_cpu": ("multihop", {"hops": 1}),
    "matpo": ("multihop", {"hops": 2}),
    "matpo_cpu": ("multihop", {"hops": 1}),
    "hira": ("multihop", {"hops": 2}),
    "mas_orchestra": ("masbench", {"axis": "depth", "values": 2}),
    "mas_orchestra_cpu": ("masbench_small", {"values": [1, 2, 3]}),
    "debate": ("arithmetic", {"level": 2}),
}


class RecordingBackend:
    """Wraps a real backend and keeps every (prompt, completion) it served."""

    def __init__(self, inner):
        self.inner, self.name, self.tokenizer = inner, inner.name, inner.tokenizer
        self.served: dict[tuple[int, ...], list[tuple[int, ...]]] = {}

    @property
    def policy_version(self):
        return self.inner.policy_version

    async def generate(self, request: GenerationRequest):
        generations = await self.inner.generate(request)
        for g in generations:
            self.served.setdefault(tuple(request.prompt_ids), []).append(tuple(g.completion_ids))
        return generations

    def close(self):
        self.inner.close()


@pytest.fixture(scope="module")
def tiny():
    return HFBackend("tiny")


def test_the_library_has_the_five_papers_marsrls_inference_loop_four_at_cpu_scale_and_a_debate():
    assert set(TASKS) == set(topo.library())


def _check_masks(calls, served):
    """Each trainable span of a stored call is exactly one completion the backend served for that prefix."""
    for call in calls.itertuples():
        prompt, completion, mask = list(call.prompt_ids), list(call.completion_ids), list(call.mask)
        assert len(mask) == len(completion) == len(call.logprobs)
        i = 0
        while i < len(mask):
            if mask[i] != TokenOwner.TRAINABLE:
                i += 1
                continue
            j = i
            while j < len(mask) and mask[j] == TokenOwner.TRAINABLE:
                j += 1
            prefix = tuple(prompt + completion[:i])
            assert prefix in served, f"{call.role}: a trainable span does not follow a prompt the backend saw"
            assert any(tuple(completion[i:j]) == s[: j - i] and len(s) == j - i for s in served[prefix]), (
                call.role
            )
            i = j


@pytest.mark.parametrize("name", sorted(TASKS))
def test_topology_runs_on_the_tiny_model_and_masks_match(name, tiny, tmp_path):
    generator, options = TASKS[name]
    tasks = wb.generate_tasks(generator, n=2, seed=0, **options)
    backend = RecordingBackend(tiny)
    result = wb.rollout(name, tasks, backend=backend, max_tokens=12, runs_dir=tmp_path)
    assert [e.status for e in result.episodes] != ["error"] * 2
    for episode in result.episodes:
        assert episode.status in {"complete", "call_limit"}, episode.error
        assert episode.calls, "every episode calls at least one role"
    calls = wb.RunReader(result.run_dir).calls()
    assert len(calls) == sum(len(e.calls) for e in result.episodes)
    _check_masks(calls, backend.served)
    roles = set(calls["role"])
    assert roles <= set(wb.load_topology(name).roles)


def test_the_debate_is_written_with_the_public_api_alone():
    """The non-paper topology, built in Python, equals the library file: the mechanism is general."""
    say = "{{ question }}\nGive your answer and a short argument. End with \\boxed{answer}."
    sampling = topo.Sampling(max_tokens=192, temperature=1.0)
    debater = topo.Role(
        messages=[topo.Message(role="user", content=say)], sampling=sampling, postprocess=["strip_think"]
    )
    rebuttal = topo.Role(
        messages=[
            topo.Message(
                role="user",
                content="{{ question }}\nYour answer was:\n{{ side.mine }}\nYour opponent answered:\n{{ side.theirs }}"
                "\nDefend or revise your answer. End with \\boxed{answer}.",
            )
        ],
        sampling=sampling,
        postprocess=["strip_think"],
    )
    judge = topo.Role(
        messages=[
            topo.Message(
                role="user",
                content="{{ question }}\nDebater A:\n{{ rebuttals[0] }}\nDebater B:\n{{ rebuttals[1] }}"
                "\nWhich answer is right? End with \\boxed{answer}.",
            )
        ],
        parser="boxed",
        sampling=topo.Sampling(max_tokens=128, temperature=1.0),
    )
    spec = topo.Topology(
        name="debate",
        description="Two debaters answer, read each other's answer and rebut, then a judge picks the final answer.",
        roles={"debater_a": debater, "debater_b": debater, "rebuttal": rebuttal, "judge": judge},
        flow=topo.Flow(
            start="open_a",
            max_calls=5,
            answer="{{ verdict }}",
            nodes={
                "open_a": topo.CallNode(
                    call="debater_a", bind={"a": "text"}, next=[topo.Branch(goto="open_b")]
                ),
                "open_b": topo.CallNode(
                    call="debater_b", bind={"b": "text"}, next=[topo.Branch(goto="rebut")]
                ),
                "rebut": topo.MapNode(
                    map="rebuttal",
                    over="[{'mine': a, 'theirs': b}, {'mine': b, 'theirs': a}]",
                    item="side",
                    into="rebuttals",
                    next=[topo.Branch(goto="judge")],
                ),
                "judge": topo.CallNode(call="judge", bind={"verdict": "parsed.answer if parsed else text"}),
            },
        ),
    )
    assert topo.validate(spec) == wb.load_topology("debate")


def test_a_rollout_batches_the_agents_of_concurrent_episodes(tiny):
    backend = RecordingBackend(tiny)
    tasks = wb.generate_tasks("arithmetic", n=4, seed=3, level=1)
    engine = Rollout(wb.load_topology("marsrl"), backend, max_tokens=4)
    episodes = asyncio.run(engine.run(tasks))
    sizes = {c.timings["batch_size"] for e in episodes for c in e.calls}
    assert max(sizes) >= 4.0, sizes
