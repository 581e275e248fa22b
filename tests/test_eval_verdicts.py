"""The held-out evaluation scores every Verifier on its verdicts, whatever its reward, and the comparison shows it."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from workbench.analysis.compare import VERDICTS, outcomes, verdicts_score
from workbench.rl.evaluation import OUTCOME, evaluate, paired_rise, verdicts_key
from workbench.store.records import CallRecord, EpisodeRecord

ROLES = {"solver": SimpleNamespace(parser="last_number"), "verifier1": SimpleNamespace(parser="yes_no")}


def _call(role: str, position: int, **fields) -> CallRecord:
    return CallRecord(
        role=role,
        position=position,
        policy_version=0,
        node=role,
        finish_reason="stop",
        trainable=True,
        **fields,
    )


def _episode(task: str, solver_right: bool, verdicts: list[str | None], shared: bool) -> EpisodeRecord:
    """A Solver's answer and Verifiers judging it: rewarded by their verdict (``judged_correct``) or, ``shared``,
    by the outcome (the truth then comes from the Solver's accuracy, through ``source``)."""
    right = float(solver_right)
    calls = [_call("solver", 0, rewards={"reward": right, "accuracy": right}, completion_text="7")]
    for i, verdict in enumerate(verdicts, start=1):
        said = verdict is not None and (verdict == "correct") == solver_right
        rewards = (
            {"reward": right, "accuracy": right}
            if shared
            else {"reward": float(said), "accuracy": float(said), "judged_correct": right}
        )
        parsed = {"verdict": verdict} if verdict is not None else None
        calls.append(_call("verifier1", i, source=0, parsed=parsed, rewards=rewards))
    return EpisodeRecord(task_id=task, group=task, sample=0, reward=right, calls=calls)


def _evaluate(episodes: list[EpisodeRecord], roles=ROLES) -> tuple[dict, dict]:
    engine = SimpleNamespace(topology=SimpleNamespace(roles=roles), run=lambda tasks, group_size: episodes)
    return evaluate(engine, [], lambda run: run())


@pytest.mark.parametrize("shared", [False, True])
def test_each_verifier_is_scored_on_its_verdicts_whatever_its_reward(shared):
    episodes = [
        _episode("a", True, ["correct", "correct"], shared),  # tp tp
        _episode("b", False, ["correct", "wrong"], shared),  # fp tn
        _episode("c", True, ["wrong", None], shared),  # fn, no verdict
        _episode("d", False, ["wrong", "wrong"], shared),  # tn tn
    ]
    metrics, payload = _evaluate(episodes)
    tasks = payload["tasks"]
    assert [tasks[t][verdicts_key("verifier1")] for t in "abcd"] == [1.0, 0.5, 0.0, 1.0]
    assert "verdicts:solver" not in tasks["a"], "only a role whose parser reads a verdict is a Verifier"
    assert payload["verdicts"]["c"]["verifier1"] == {"tp": 0, "fp": 0, "tn": 0, "fn": 1, "no_verdict": 1}
    assert metrics["eval/verifier1/verdict_accuracy"] == pytest.approx(5 / 8)
    # recall on right solutions 2/4 (the one with no verdict is not right), on wrong ones 3/4
    assert metrics["eval/verifier1/verdict_balanced_accuracy"] == pytest.approx((2 / 4 + 3 / 4) / 2)
    cells = {c: metrics[f"eval/verifier1/verdicts/{c}"] for c in ("tp", "fp", "tn", "fn", "no_verdict")}
    assert cells == {"tp": 2.0, "fp": 1.0, "tn": 3.0, "fn": 1.0, "no_verdict": 1.0}
    # the role's reward stays what it was: the outcome under a shared reward, the verdicts' under its own
    assert metrics["eval/verifier1/reward"] == pytest.approx(0.5 if shared else 5 / 8)
    assert "eval/verdicts:verifier1/reward" not in metrics and metrics["eval/accuracy"] == 0.5


def test_balanced_accuracy_is_absent_where_one_kind_of_solution_was_never_judged():
    metrics, payload = _evaluate(
        [_episode("a", True, ["correct"], True), _episode("b", True, ["wrong"], True)]
    )
    assert metrics["eval/verifier1/verdict_accuracy"] == 0.5
    assert "eval/verifier1/verdict_balanced_accuracy" not in metrics
    # no Verifier in the topology: no verdict scores at all, the payload as before
    metrics, payload = _evaluate([_episode("a", True, ["correct"], True)], roles={"solver": ROLES["solver"]})
    assert set(payload) == {"tasks"} and not any("verdict" in k for k in metrics)


def test_the_outcomes_table_has_a_held_out_verdicts_row_per_verifier_with_its_paired_se():
    def scores(verdicts: list[float]) -> dict[str, dict[str, float]]:
        return {
            str(i): {OUTCOME: 1.0, "verifier1": 1.0, verdicts_key("verifier1"): v}
            for i, v in enumerate(verdicts)
        }

    own = (scores([0.5, 0.5, 0.0, 1.0]), scores([1.0, 1.0, 0.5, 1.0]))
    shared = (scores([0.5, 0.5, 0.0, 1.0]), scores([0.0, 0.5, 0.0, 0.0]))
    old = ({"0": {OUTCOME: 0.0}, "1": {OUTCOME: 1.0}}, {"0": {OUTCOME: 1.0}, "1": {OUTCOME: 1.0}})
    table = outcomes(
        {"own": own, "shared": shared, "old": old}, {"own": ["own"], "shared": ["shared"], "old": ["old"]}
    )
    label = verdicts_score("verifier1")
    assert label.endswith(VERDICTS) and "verifier1" in label
    rows = table[table["score"] == label].set_index("name")
    assert list(rows.index) == ["own", "shared"], "a summary without held-out verdicts has no such row"
    rise, se, _ = paired_rise(*shared, verdicts_key("verifier1"))
    assert rows.loc["shared", ["before", "after", "rise", "se"]].tolist() == pytest.approx(
        [0.5, 0.125, rise, se]
    )
    diff, diff_se, _ = paired_rise(own[1], shared[1], verdicts_key("verifier1"))
    assert rows.loc["shared", "vs"] == "own"
    assert rows.loc["shared", ["diff", "diff_se"]].tolist() == pytest.approx([diff, diff_se])
    assert not math.isnan(rows.loc["own", "z"])
    # the rows per run: the roles, then each Verifier's verdicts, then the system's final answer
    assert table[table["name"] == "own"]["score"].tolist() == ["verifier1", label, "system"]
    assert table[table["name"] == "old"]["score"].tolist() == ["system"]


def test_a_run_with_a_shared_reward_stores_its_verifiers_verdicts_and_the_comparison_shows_them(tmp_path):
    """marsrl_cpu on the tiny model, one step, its Verifier rewarded with the shared outcome."""
    from workbench import topology
    from workbench.analysis.compare import Comparison
    from workbench.rl.config import TrainConfig
    from workbench.rl.loop import run_training
    from workbench.store import RunReader
    from workbench.tasks import generate
    from workbench.training import create

    spec = topology.to_dict(topology.load("marsrl_cpu"))
    spec["roles"]["verifier1"]["reward"] = {"kind": "outcome"}
    config = TrainConfig(
        model="tiny", steps=1, batch_size=1, group_size=2, max_tokens=4, runs_dir=str(tmp_path),
        checkpoint_every=100, eval_tasks=3, eval_every=0, n_tasks=4, task_options={"level": 1},
    )  # fmt: skip
    run_dir = create(config)
    tasks = generate("arithmetic", n=4, seed=0, level=1)
    run_training(
        config,
        run_dir,
        topology=topology.from_dict(spec),
        tasks=tasks[3:],
        eval_tasks=tasks[:3],
        log=lambda m: None,
    )
    with RunReader(run_dir) as reader:
        events = reader.events(kind="eval")
        wide = reader.metrics_wide()
    assert len(events) == 2
    for payload in events["payload"]:
        judged = {t: s[verdicts_key("verifier1")] for t, s in payload["tasks"].items()}
        assert len(judged) == 3 and all(0.0 <= v <= 1.0 for v in judged.values())
        assert set(payload["verdicts"]) == set(judged)
        # its reward is the outcome; its verdicts are scored apart
        assert all(s["verifier1"] == s[OUTCOME] for s in payload["tasks"].values())
    assert wide["eval/verifier1/verdict_accuracy"].notna().sum() == 2
    table = Comparison([run_dir]).outcomes()
    assert verdicts_score("verifier1") in table["score"].tolist()
