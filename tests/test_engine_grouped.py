"""MarsRL's grouped agentic rollouts: G Solver samples, select-k fan-out, Correctors only on flagged outputs.

The outputs are scripted (a 135M model will not grade on demand) through the real Backend interface,
so which solution is wrong, and which verdict is right, is known to the test.
"""

import asyncio
import itertools
import random
import re

import pytest

import workbench as wb
from tests.scripted import ScriptedBackend
from workbench.engine import Rollout
from workbench.engine.selectors import SELECTORS
from workbench.models import resolve
from workbench.tasks import Task
from workbench.topology import from_dict, to_dict

TASK = Task("t0", "What is 2 + 3? Put your final answer in \\boxed{}.", "5", "boxed_math")


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(resolve("tiny"))


def _script(solutions, verdicts):
    """Solver answers cycle through ``solutions``; a Verifier's verdict is ``verdicts(solution)``."""
    solver = itertools.cycle(solutions)

    def script(prompt: str) -> str:
        if "meticulous grader" in prompt:
            judged = re.findall(r"\\boxed\{(\d+)\}", prompt.split("### Solution ###")[-1])
            return f"Final Verdict: checked. **Correctness**: {verdicts(judged[-1] if judged else '')}"
        if "bug report" in prompt:
            return "I fixed it: \\boxed{5}"
        return f"The answer is \\boxed{{{next(solver)}}}"

    return script


def _run(tokenizer, script, group_size=4, topology=None):
    backend = ScriptedBackend(tokenizer, script)
    engine = Rollout(topology or wb.load_topology("marsrl"), backend)
    return asyncio.run(engine.run([TASK], group_size=group_size)), backend


def test_verifiers_get_the_wrong_solutions_and_correctors_only_the_correctly_flagged_reports(tokenizer):
    # Solutions alternate right/wrong; the Verifier calls every solution Wrong (right on wrong ones only).
    episodes, _ = _run(tokenizer, _script(["5", "7"], lambda s: "Wrong"))
    calls = [c for e in episodes for c in e.calls]
    by_role = {
        r: [c for c in calls if c.role == r] for r in ("solver", "verifier1", "corrector1", "verifier2")
    }
    assert len(episodes) == 4 and len(by_role["solver"]) == 4
    # Verifier1: 2 chosen solutions x 4 samples, and adaptive selection prefers the wrong ones (reward 0)
    assert len(by_role["verifier1"]) == 8
    positions = {(id(e), c.position): c for e in episodes for c in e.calls}
    episode_of = {id(c): e for e in episodes for c in e.calls}

    def source(call):
        return positions[(id(episode_of[id(call)]), call.source)]

    judged = [source(v) for v in by_role["verifier1"]]
    assert all(s.role == "solver" and s.rewards["reward"] == 0.0 for s in judged)
    assert len({id(s) for s in judged}) == 2, "two upstream outputs, a group of 4 on each"
    # every Verifier1 verdict was Wrong about a wrong solution: reward 1, provenance recorded
    assert all(
        v.rewards == {"reward": 1.0, "accuracy": 1.0, "format": 1.0, "judged_correct": 0.0}
        for v in by_role["verifier1"]
    )
    # Corrector1 samples 2 of the flagged reports, 4 times each, and fixes the answer
    assert len(by_role["corrector1"]) == 8
    assert all(source(c).role == "verifier1" for c in by_role["corrector1"])
    assert all(c.rewards["reward"] == 1.0 for c in by_role["corrector1"])
    # Verifier2 judges corrected (right) solutions and calls them Wrong: reward 0, so Corrector2 still runs
    assert len(by_role["verifier2"]) == 8 and all(v.rewards["reward"] == 0.0 for v in by_role["verifier2"])
    assert sum(c.role == "corrector2" for c in calls) == 8
    # the Solver's reward is its own answer; the episode's answer is the Solver's solution
    assert [e.reward for e in episodes] == [1.0, 0.0, 1.0, 0.0]
    assert all(c.source is None for c in by_role["solver"])


def test_no_flagged_output_ends_the_task_early(tokenizer):
    # All solutions right and every Verifier says Correct: no Corrector runs at all.
    episodes, backend = _run(tokenizer, _script(["5"], lambda s: "Correct"))
    roles = [c.role for e in episodes for c in e.calls]
    assert roles.count("solver") == 4 and roles.count("verifier1") == 8
    assert "corrector1" not in roles and len(backend.prompts) == 12
    assert all(c.rewards["reward"] == 1.0 for e in episodes for c in e.calls)


def test_a_group_of_one_is_the_plain_chain(tokenizer):
    episodes, _ = _run(tokenizer, _script(["7"], lambda s: "Wrong"), group_size=1)
    (episode,) = episodes
    assert [c.role for c in episode.calls] == ["solver", "verifier1", "corrector1", "verifier2", "corrector2"]
    assert [c.source for c in episode.calls] == [None, 0, 1, 2, 3]


def test_select_samples_and_k_come_from_the_spec(tokenizer):
    topology = wb.load_topology("marsrl")
    nodes = dict(topology.flow.nodes)
    nodes["verify1"] = nodes["verify1"].model_copy(
        update={"select": nodes["verify1"].select.model_copy(update={"k": 3, "samples": 2})}
    )
    topology = topology.model_copy(update={"flow": topology.flow.model_copy(update={"nodes": nodes})})
    episodes, _ = _run(tokenizer, _script(["5", "7"], lambda s: "Correct"), topology=topology)
    assert sum(c.role == "verifier1" for e in episodes for c in e.calls) == 6


def test_grouped_calls_are_stored_with_their_source_and_rewards(tokenizer, tmp_path):
    backend = ScriptedBackend(tokenizer, _script(["5", "7"], lambda s: "Wrong"))
    result = wb.rollout("marsrl", [TASK], backend=backend, group_size=2, runs_dir=tmp_path)
    calls = wb.RunReader(result.run_dir).calls()
    by_id = calls.set_index("id")
    verifiers = calls[calls.role == "verifier1"]
    assert len(verifiers) == 4
    for row in verifiers.itertuples():
        assert by_id.loc[row.source_id, "role"] == "solver"
        assert row.rewards["reward"] == 1.0 - by_id.loc[row.source_id, "rewards"]["reward"]
    assert calls[calls.role == "solver"]["source_id"].isna().all()


def _with_a_check_before_the_verdict() -> wb.Topology:
    """MarsRL's first round with an unrewarded check call between the Solver and Verifier1."""
    spec = to_dict(wb.load_topology("marsrl"))
    spec["roles"]["checker"] = {
        "messages": [{"role": "user", "content": "Check this solution: {{ solution }}"}],
        "reward": {"kind": "none"},
    }
    nodes = spec["flow"]["nodes"]
    nodes["solve"]["next"] = [{"goto": "check"}]
    nodes["check"] = {
        "select": {"k": 2, "strategy": "adaptive", "prefer": 0, "samples": 1},
        "call": "checker",
        "bind": {"check": "text"},
        "next": [{"goto": "verify1"}],
    }
    nodes["verify1"]["select"] = {"k": 2, "strategy": "adaptive", "prefer": 0}
    nodes["verify1"]["next"] = [{"goto": "end"}]
    for node in ("correct1", "verify2", "correct2"):
        del nodes[node]
    return from_dict(spec)


def test_an_unrewarded_call_passes_on_what_the_next_call_judges(tokenizer):
    """A check call (reward none) between Solver and Verifier: the verdict is scored against the solution."""

    marsrl = _script(["5", "7"], lambda s: "Wrong")

    def script(prompt: str) -> str:
        return "I checked it." if "Check this solution" in prompt else marsrl(prompt)

    episodes, _ = _run(tokenizer, script, topology=_with_a_check_before_the_verdict())
    calls = [c for e in episodes for c in e.calls]
    checks = [c for c in calls if c.role == "checker"]
    verdicts = [c for c in calls if c.role == "verifier1"]
    assert len(checks) == 2 and len(verdicts) == 8, "2 checks (1 sample each), 4 verdicts on each"
    assert all(c.rewards == {} for c in checks)
    positions = {(id(e), c.position): c for e in episodes for c in e.calls}
    episode_of = {id(c): e for e in episodes for c in e.calls}
    judged = [positions[(id(episode_of[id(v)]), v.source)] for v in verdicts]
    assert {j.role for j in judged} == {"solver"} and all(j.rewards["reward"] == 0.0 for j in judged)
    # "Wrong" about the wrong solution each check was about: reward 1, with the solution's provenance
    assert all(v.rewards["reward"] == 1.0 and v.rewards["judged_correct"] == 0.0 for v in verdicts)


@pytest.mark.parametrize("seed", range(20))
def test_selectors_pick_k_distinct_items_by_their_strategy(seed):
    rng = random.Random(seed)
    n = rng.randint(1, 10)
    items = [f"x{i}" for i in range(n)]
    rewards = [rng.choice([0.0, 1.0, None]) for _ in items]
    positives = {x for x, r in zip(items, rewards, strict=True) if r == 1.0}
    k = rng.randint(1, 4)
    for name, selector in SELECTORS.items():
        chosen = selector(items, rewards, k, 1, random.Random(seed))
        assert len(chosen) == len(set(chosen)) == min(k, n), name
        assert set(chosen) <= set(items)
    adaptive = SELECTORS["adaptive"](items, rewards, k, 1, random.Random(seed))
    assert sum(x in positives for x in adaptive) == min(k, len(positives))
    balanced = SELECTORS["balanced"](items, rewards, 2, 1, random.Random(seed))
    if positives and len(positives) < n:
        assert sum(x in positives for x in balanced) == 1, "one positive and one negative"


def test_select_on_the_start_node_is_an_error():
    spec = wb.load_topology("marsrl").model_dump(mode="json", exclude_none=True)
    spec["flow"]["nodes"]["solve"]["select"] = {"k": 2}
    with pytest.raises(ValueError, match=r"flow\.nodes\.solve\.select: .*start node"):
        wb.topology.from_dict(spec)
