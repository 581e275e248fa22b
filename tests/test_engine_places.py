"""A call's seed and position come from its place in the episode's structure, not from timing (issue 49).

Parallel branches (a map's items, the agents of one level of an emitted graph) start and finish in whatever
order the backend answers them. Each call is seeded from its place (``workbench.engine.episode_state``) and
the episode's calls are numbered by place, so one seed stores the same episode whichever branch goes first.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from workbench.backends.base import Generation, GenerationRequest
from workbench.backends.hf import HFBackend
from workbench.engine import Rollout
from workbench.engine.episode_state import EpisodeState, place_key
from workbench.engine.forcing import Forcing, request_seed
from workbench.engine.records import EpisodeRecord
from workbench.tasks import generate
from workbench.topology import from_dict

#: A map of two items, then one level of an emitted graph with two agents, each a subflow of two calls (the
#: second reads the first): which agent's second call starts first depends on which first call ends first.
#: Both agents get the same prompts: only their seeds tell them apart.
PARALLEL = from_dict(
    {
        "name": "parallel",
        "params": {
            "graph": {
                "agents": [
                    {"id": "alpha", "name": "Pair", "input": "", "roles": []},
                    {"id": "beta", "name": "Pair", "input": "", "roles": []},
                ],
                "order": [["alpha", "beta"]],
                "sink": "beta",
            }
        },
        "roles": {
            "side": {"messages": [{"role": "user", "content": "{{ question }} side {{ item }}"}]},
            "draft": {"messages": [{"role": "user", "content": "Draft: {{ question }}"}]},
            "revise": {"messages": [{"role": "user", "content": "Revise: {{ first }}"}]},
        },
        "flow": {
            "start": "fan",
            "answer": "{{ result }}",
            "nodes": {
                "fan": {
                    "map": "side",
                    "over": "2",
                    "item": "item",
                    "into": "sides",
                    "next": [{"goto": "run"}],
                },
                "run": {"dag": "graph", "agents": {"Pair": "pair"}, "into": "result"},
            },
        },
        "subflows": {
            "pair": {
                "start": "a",
                "answer": "{{ second }}",
                "nodes": {
                    "a": {"call": "draft", "bind": {"first": "text"}, "next": [{"goto": "b"}]},
                    "b": {"call": "revise", "bind": {"second": "text"}},
                },
            }
        },
    }
)


class Delaying:
    """The hf backend with the ``late``-th draft request held back: that branch finishes its first call last."""

    def __init__(self, backend: HFBackend, late: int):
        self.backend, self.late = backend, late
        self.drafts = 0
        self.revised: list[tuple[int, ...]] = []  # the prompts of the revise requests, in the order they came

    def __getattr__(self, name: str) -> Any:
        return getattr(self.backend, name)

    async def generate(self, request: GenerationRequest) -> list[Generation]:
        prompt = self.backend.tokenizer.decode(request.prompt_ids)
        if "Draft:" in prompt:
            self.drafts += 1
            if self.drafts - 1 == self.late:
                await asyncio.sleep(0.5)
        if "Revise:" in prompt:
            self.revised.append(tuple(request.prompt_ids))
        return await self.backend.generate(request)


@pytest.fixture(scope="module")
def tiny():
    backend = HFBackend("tiny")
    yield backend
    backend.close()


def _run(backend: Any) -> list[EpisodeRecord]:
    tasks = generate("arithmetic", n=2, seed=0, level=1)
    return asyncio.run(Rollout(PARALLEL, backend, max_tokens=6, seed=3).run(tasks))


def _stored(records: list[EpisodeRecord]) -> list[list[tuple]]:
    return [
        [(c.position, c.timings["place"], c.parent, c.role, c.prompt_ids, c.completion_ids) for c in r.calls]
        for r in records
    ]


def test_parallel_branches_draw_the_same_whichever_starts_first(tiny):
    first, second = Delaying(tiny, late=0), Delaying(tiny, late=1)
    episodes = _run(first)
    assert all(e.status == "complete" for e in episodes), [e.error for e in episodes]
    again = _run(second)
    # the timing differed: the branches' second calls came in the other order
    assert first.revised and first.revised != second.revised
    assert sorted(first.revised) == sorted(second.revised)
    assert _stored(episodes) == _stored(again)
    calls = episodes[0].calls
    assert [c.timings["place"] for c in calls] == ["0.0.0", "0.1.0", "1.0.0", "1.0.1", "1.1.0", "1.1.1"]
    assert [c.role for c in calls] == ["side", "side", "draft", "revise", "draft", "revise"]
    drafts = [c for c in calls if c.role == "draft"]
    assert drafts[0].prompt_ids == drafts[1].prompt_ids
    assert drafts[0].completion_ids != drafts[1].completion_ids, (
        "one prompt on two branches: their seeds differ"
    )


def test_a_replay_finds_and_seeds_each_stored_call_by_its_place_whatever_the_timing(tiny):
    """Replayed from alpha's draft with the other branch held back this time, the episode comes out again."""
    source = _run(Delaying(tiny, late=1))[0]
    forcing = Forcing(source.calls, point=2)
    task = generate("arithmetic", n=2, seed=0, level=1)[0]
    rollout = Rollout(PARALLEL, Delaying(tiny, late=0), max_tokens=6, seed=3, forcing=forcing)
    replayed = asyncio.run(rollout.episode(task))
    assert forcing.by_place and forcing.forced == {0, 1}
    assert _stored([replayed]) == _stored([source])


def test_a_place_names_the_line_and_the_index_on_it():
    state = EpisodeState(EpisodeRecord(task_id="t", group="t", sample=0))
    # on the episode's own line a call's place is its position
    assert [state.take(), state.take()] == ["0", "1"]
    items = state.fork(2)
    assert [line.take() for line in items] == ["2.0.0", "2.1.0"]
    assert items[0].take() == "2.0.1" and state.take() == "3"  # a branch's next call; the line's next slot
    state.places[7] = "3"
    assert state.under(7, 1).take() == "3.1.0"  # the subflow of the agent call at "3"'s second tool call
    places = ["3", "2.1.0", "3.1.0", "10", "2.0.1", "2.0.0"]
    assert sorted(places, key=place_key) == ["2.0.0", "2.0.1", "2.1.0", "3", "3.1.0", "10"]


def test_a_request_seed_is_its_place_and_turn():
    # on the episode's own line a call is seeded as it was by its position (runs stored before places replay)
    assert request_seed(5, "t", 0, "3", 1) == request_seed(5, "t", 0, 3, 1)
    seeds = {
        request_seed(5, "t", 0, place, turn) for place in ("2.0.0", "2.1.0", "2.0.1", "3") for turn in (0, 1)
    }
    assert len(seeds) == 8
    assert request_seed(5, "t", 0, "2.0.0", 0) != request_seed(5, "t", 1, "2.0.0", 0)  # another sample
