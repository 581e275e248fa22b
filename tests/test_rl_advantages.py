"""Group keys, GRPO advantages, zero-variance groups, MATPO's broadcast and MARS's balancing."""

import pickle
import random

import numpy as np
import pytest

import workbench as wb
from workbench.engine.records import CallRecord, EpisodeRecord
from workbench.rl.advantages import balance, compute_advantages
from workbench.rl.samples import from_episodes
from workbench.store import TokenOwner


def _call(role, position, reward, source=None, parent=None, trainable=True, mask=None):
    return CallRecord(
        role=role,
        node=role,
        position=position,
        prompt_ids=[1, 2],
        completion_ids=[3, 4, 5],
        logprobs=[-0.1] * 3,
        prompt_text="",
        completion_text="",
        finish_reason="stop",
        policy="base",
        policy_version=0,
        trainable=trainable,
        mask=mask,
        source=source,
        parent=parent,
        rewards={} if reward is None else {"reward": reward},
    )


def test_task_groups_normalise_by_the_sample_std_and_flag_zero_variance():
    topology = wb.load_topology("mars")
    episodes = [
        EpisodeRecord("q1", "q1", i, calls=[_call("system2", 0, r)])
        for i, r in enumerate([1.0, 0.0, 1.0, 0.0])
    ] + [EpisodeRecord("q2", "q2", i, calls=[_call("system2", 0, 1.0)]) for i in range(4)]
    samples = from_episodes(episodes)
    stats = compute_advantages(samples, episodes, topology, eps=0.0)
    expected = (np.array([1, 0, 1, 0]) - 0.5) / np.std([1, 0, 1, 0], ddof=1)
    assert [s.advantage for s in samples[:4]] == pytest.approx(expected)
    assert [s.advantage for s in samples[4:]] == [0.0] * 4
    assert (stats.groups, stats.zero_variance_groups, stats.zero_variance_fraction) == (2, 1, 0.5)


def test_input_groups_split_a_role_by_the_upstream_output_it_consumed():
    topology = wb.load_topology("marsrl")
    calls = [_call("solver", 0, 0.0), _call("solver", 1, 1.0)]
    calls += [_call("verifier1", 2 + i, float(i % 2), source=0) for i in range(2)]
    calls += [_call("verifier1", 4 + i, 1.0, source=1) for i in range(2)]
    episodes = [EpisodeRecord("q", "q", 0, calls=calls)]
    samples = from_episodes(episodes)
    stats = compute_advantages(samples, episodes, topology)
    groups = {s.group for s in samples if s.role == "verifier1"}
    assert len(groups) == 2 and stats.per_role_groups == {"solver": 1, "verifier1": 2}
    by_source = [s.advantage for s in samples if s.role == "verifier1"]
    assert by_source[0] < 0 < by_source[1] and by_source[2:] == [0.0, 0.0]


def test_matpo_workers_take_their_planners_advantage():
    topology = wb.load_topology("matpo")
    episodes = [
        EpisodeRecord(
            "q",
            "q",
            i,
            calls=[_call("planner", 0, r), _call("worker", 1, r, parent=0), _call("worker", 2, r, parent=0)],
        )
        for i, r in enumerate([1.0, 0.0])
    ]
    samples = from_episodes(episodes)
    compute_advantages(samples, episodes, topology)
    for e in range(2):
        planner, *workers = [s for s in samples if s.episode == e]
        assert planner.advantage != 0 and all(w.advantage == planner.advantage for w in workers)


@pytest.mark.parametrize("mode", ["random", "advantage_weighted"])
@pytest.mark.parametrize("count", [0, 3, 8, 20])
def test_mars_balancing_gives_exactly_g_system1_samples_per_question(mode, count):
    topology = wb.load_topology("mars")
    roles = dict(topology.roles)
    roles["system1"] = roles["system1"].model_copy(
        update={"reward": roles["system1"].reward.model_copy(update={"balance": mode})}
    )
    topology = topology.model_copy(update={"roles": roles})
    rng = random.Random(count)
    episodes = [
        EpisodeRecord(
            "q",
            "q",
            i,
            calls=[_call("system2", 0, float(i % 2))]
            + [_call("system1", 1 + j, float(i % 2)) for j in range(k)],
        )
        for i, k in enumerate(_split(count, 4, rng))
    ]
    samples = from_episodes(episodes)
    stats = compute_advantages(samples, episodes, topology)
    out = balance(samples, topology, group_size=4, rng=rng, stats=stats)
    system1 = [s for s in out if s.role == "system1"]
    assert len(system1) == (4 if count else 0)
    assert sum(s.role == "system2" for s in out) == 4, "System 2 is never resampled"
    if count:
        assert stats.balanced["system1"] == (count, 4)
        assert {id(s) for s in system1} <= {id(s) for s in samples}


def _split(total: int, parts: int, rng: random.Random) -> list[int]:
    cuts = sorted(rng.randint(0, total) for _ in range(parts - 1))
    return [b - a for a, b in zip([0, *cuts], [*cuts, total], strict=True)]


def test_verdict_balancing_keeps_as_many_groups_judging_right_solutions_as_wrong_ones():
    topology = wb.load_topology("marsrl")
    roles = dict(topology.roles)
    reward = roles["verifier1"].reward.model_copy(update={"balance": "verdicts"})
    roles["verifier1"] = roles["verifier1"].model_copy(update={"reward": reward})
    topology = topology.model_copy(update={"roles": roles})
    solutions_right = [True, True, True, True, True, False, False, True]  # 6 right, 2 wrong
    episodes = []
    for i, right in enumerate(solutions_right):  # a Verifier group of 4 forks per solution
        calls = [_call("solver", 0, float(right))]
        for j in range(4):  # the last solution's Verifiers all agree: no gradient
            call = _call("verifier1", 1 + j, float(j % 2 == 0 if i < 7 else True), source=0)
            call.rewards["judged_correct"] = float(right)
            calls.append(call)
        episodes.append(EpisodeRecord("q", "q", i, calls=calls))
    samples = from_episodes(episodes)
    stats = compute_advantages(samples, episodes, topology)
    out = balance(samples, topology, group_size=4, rng=random.Random(0), stats=stats)
    kept = [s for s in out if s.role == "verifier1"]
    with_gradient = {s.group for s in kept if s.advantage != 0}
    judged = [next(s for s in kept if s.group == g).rewards["judged_correct"] for g in with_gradient]
    assert sorted(judged) == [0.0, 0.0, 1.0, 1.0], (
        "2 groups judging wrong solutions, 2 of the 5 judging right"
    )
    assert all(sum(s.group == g for s in kept) == 4 for g in with_gradient), "groups are kept whole"
    assert sum(s.advantage == 0 for s in kept) == 4, "the group without a gradient stays"
    assert stats.balanced["verifier1"] == (32, 20)
    assert sum(s.role == "solver" for s in out) == 8, "other roles are untouched"


def _trained_verdict_groups(groups: list[tuple[bool, list[float]]]) -> list:
    """The Verifier samples verdict balancing keeps with a gradient, from one group per (solution right?,
    the group's verdict rewards)."""
    topology = wb.load_topology("marsrl_cpu")
    episodes = []
    for i, (right, rewards) in enumerate(groups):
        calls = [_call("solver", 0, float(right))]
        for j, reward in enumerate(rewards):
            call = _call("verifier1", 1 + j, reward, source=0)
            call.rewards["judged_correct"] = float(right)
            calls.append(call)
        episodes.append(EpisodeRecord("q", "q", i, calls=calls))
    samples = from_episodes(episodes)
    compute_advantages(samples, episodes, topology)
    out = balance(samples, topology, group_size=4, rng=random.Random(0))
    return [s for s in out if s.role == "verifier1" and s.advantage != 0]


def test_verdict_balancing_trains_wrong_solutions_once_right_ones_are_settled():
    """Every verdict on the 3 right solutions was right (no gradient): the 2 groups on wrong ones train."""
    settled, learning = [1.0] * 4, [1.0, 0.0, 0.0, 1.0]
    trained = _trained_verdict_groups([(True, settled)] * 3 + [(False, learning)] * 2)
    assert len({s.group for s in trained}) == 2
    assert all(s.rewards["judged_correct"] == 0.0 for s in trained)


def test_verdict_balancing_does_not_train_one_side_while_the_other_is_stuck():
    """Every verdict on the 2 wrong solutions was wrong ("always Correct"): the right ones do not train it
    further toward "Correct"."""
    stuck, learning = [0.0] * 4, [1.0, 0.0, 1.0, 1.0]
    trained = _trained_verdict_groups([(True, learning)] * 3 + [(False, stuck)] * 2)
    assert trained == []


def test_verdict_balancing_is_refused_for_a_role_without_verdicts():
    spec = wb.topology.to_dict(wb.load_topology("marsrl"))
    spec["roles"]["solver"]["reward"]["balance"] = "verdicts"
    with pytest.raises(
        wb.topology.TopologyError, match=r"roles\.solver\.reward\.balance.*needs kind verdict"
    ):
        wb.topology.from_dict(spec)


def test_a_sample_trains_its_roles_own_tokens_and_keeps_its_call():
    tool = [TokenOwner.TRAINABLE, TokenOwner.TOOL, TokenOwner.OTHER_ROLE]
    calls = [
        _call("solver", 0, 1.0),
        _call("solver", 1, 1.0, mask=tool),
        _call("solver", 2, 1.0, trainable=False, mask=tool),
        _call("solver", 3, None),
    ]
    samples = from_episodes([EpisodeRecord("q", "q", 0, calls=calls)])
    assert [s.mask for s in samples] == [[1, 1, 1], [1, 0, 0], [0, 0, 0]], "the unrewarded call is left out"
    assert all(s.call is c for s, c in zip(samples, calls[:3], strict=True))
    shipped = pickle.loads(pickle.dumps(samples[1]))
    assert shipped.call is None and shipped.mask == [1, 0, 0] and shipped.completion_ids == [3, 4, 5]
    assert samples[1].call is calls[1], "pickling leaves the sample itself untouched"
