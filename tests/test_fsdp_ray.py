"""FSDP trainer ranks and a rollout worker on Ray learn what one process learns from the same seed (issue 48).

The tiny model trains three steps of ``tests/test_same_seed.py``'s two-role chain, each role rewarded for the
share of vowels in what it writes (random text to the random model, so the reward moves from the first step),
twice: in this process, and with ``cluster: local`` (one rollout worker, two FSDP trainer ranks over gloo).
Every call is seeded by its place, not by where it runs (``tests/test_same_seed_ray.py``), and the ranks' update
is the lone trainer's within float rounding (``tests/test_fsdp.py``), so the two runs draw the same calls, end
with the same weights within that rounding and score alike on the held-out tasks. One Ray cluster serves the
module (``tests/test_cluster.py``'s fixture).
"""

from __future__ import annotations

from pathlib import Path

import pytest

import workbench as wb
from tests.same_seed_parts import CHAIN, _stored, _train
from tests.test_cluster import ray_cluster  # noqa: F401 (the module's cluster)
from workbench.models import load as load_model
from workbench.rewards import register
from workbench.rl import checkpoint
from workbench.rl.evaluation import paired_rise
from workbench.topology import to_yaml

STEPS = 3


def _held_out(run_dir: Path) -> tuple[dict, dict]:
    """Per held-out task, the greedy scores before the first update and after the last."""
    events = wb.RunReader(run_dir).events(kind="eval")
    assert events["step"].tolist() == [0, STEPS]
    return events["payload"].iloc[0]["tasks"], events["payload"].iloc[-1]["tasks"]


@pytest.mark.slow
def test_fsdp_trainer_ranks_and_a_rollout_worker_on_ray_learn_what_one_process_learns(
    ray_cluster,  # noqa: F811
    tmp_path,
):
    # registered here, so that it reaches the Ray worker by value: pytest imports this file under a module name
    # that the worker cannot import
    @register("fsdp_ray_vowels")
    def vowels(prediction: str, reference: str) -> float:
        return sum(ch in "aeiou" for ch in prediction) / max(len(prediction), 1)

    topology = tmp_path / "chain.yaml"  # a file, so that the run draws its held-out tasks from the config
    topology.write_text(to_yaml(CHAIN).replace("same_seed_digit", "fsdp_ray_vowels"))
    common = dict(steps=STEPS, batch_size=4, group_size=4, eval_tasks=32)
    runs = {
        "here": _train(tmp_path, "here", str(topology), **common),
        "there": _train(
            tmp_path, "there", str(topology), cluster="local", cluster_workers=1, cluster_trainers=2, **common
        ),
    }

    # every step the ranks' weights reach the driver, and the worker rolls out with that step's policy
    trained = {name: checkpoint.trained_weights(checkpoint.latest(run)) for name, run in runs.items()}
    size = sum(v.numel() * v.element_size() for v in trained["there"].values())
    wide = wb.RunReader(runs["there"]).metrics_wide()
    assert wide["cluster/trainers"].dropna().tolist() == [2.0] * STEPS
    assert wide["sync/bytes"].dropna().tolist() == [float(size)] * STEPS
    versions = wb.RunReader(runs["there"]).calls().groupby("step")["policy_version"].agg(["min", "max"])
    assert versions["min"].tolist() == versions["max"].tolist() == list(range(STEPS))

    # the same calls: at step 0 from the same weights, then from the ranks' update as from the lone trainer's
    calls, calls_there = _stored(runs["here"])[0], _stored(runs["there"])[0]
    assert calls.keys() == calls_there.keys()
    differ = [key for key in calls if calls[key] != calls_there[key]]
    assert not differ, f"{len(differ)} of {len(calls)} calls drew other tokens, the first {differ[0]}"

    # the weights apart by a small share of how far the three updates moved them. The ranks sum the gradients
    # in another order, and AdamW divides each by its running size: a coordinate whose gradient is mostly
    # rounding moves by rounding (a key projection's bias: attention is blind to it). Measured: at most 3.4e-5
    # of a tensor's move (3e-5 absolute); the bound is 30 times that.
    initial = {f"base/{k}": v for k, v in load_model("tiny")[0].state_dict().items()}
    here, there = trained["here"], trained["there"]
    assert here.keys() == there.keys()
    for key, value in here.items():
        assert (there[key] - value).norm() <= 1e-3 * (value - initial[key]).norm(), key

    # the greedy held-out scores: each role's rise in one process, matched on Ray within two paired standard errors
    # (measured: the same score on every task)
    before, after = _held_out(runs["here"])
    before_there, after_there = _held_out(runs["there"])
    assert before == before_there, "one model, one greedy evaluation"
    for role in ("first", "second"):
        rise, se, _ = paired_rise(before, after, role)
        gap, gap_se, _ = paired_rise(after, after_there, role)
        print(f"held out, {role}: rise {rise:+.3f} ± {se:.3f}; on Ray {gap:+.3f} ± {gap_se:.3f} from it")
        assert rise > 2 * se, f"{role}: the run learns nothing, so the comparison would mean nothing"
        assert abs(gap) <= 2 * gap_se, role
