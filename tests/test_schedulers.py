"""Schedulers end to end on the tiny model: async's staleness bound, MarsRL's agent-level pipeline,
segment rollout, the bubble gauge, and the importance-ratio treatment of stale samples."""

from __future__ import annotations

import asyncio
import copy

import pytest

import workbench as wb
from tests.test_training import SOLO, _config
from workbench.backends.base import GenerationRequest, cut_at_stop
from workbench.backends.hf import HFBackend
from workbench.backends.segmented import SegmentedBackend
from workbench.backends.wrapper import BackendWrapper
from workbench.models import load
from workbench.rl import loop
from workbench.rl.loop import run_training
from workbench.rl.loss import LossConfig
from workbench.rl.samples import Sample
from workbench.rl.trainer import OptimConfig, PolicyTrainer
from workbench.tasks import generate
from workbench.training import create, run_here


def _staleness(reader: wb.RunReader):
    """Per stored call: the trainer's version at the step that trained it minus the call's own version."""
    calls = reader.calls()
    steps = reader.steps().set_index("step")["policy_version"]
    return calls["step"].map(steps) - calls["policy_version"], calls


@pytest.mark.parametrize(("bound", "policies"), [(0, "shared"), (1, "shared"), (1, "lora")])
def test_async_never_trains_a_sample_older_than_max_staleness(bound, policies, tmp_path):
    config = _config(
        tmp_path,
        scheduler="async",
        max_staleness=bound,
        steps=4,
        topology="marsrl",
        policies=policies,
        eval_tasks=2,
    )
    run_dir = create(config)
    assert run_here(run_dir) == "finished"
    reader = wb.RunReader(run_dir)
    # the final evaluation scores the trained weights, not those the last batch rolled out with (held back)
    assert reader.metrics_wide()["eval/policy_version"].dropna().tolist()[-1] == 4.0
    lag, calls = _staleness(reader)
    assert len(calls) and (lag >= 0).all()
    assert lag.max() <= bound, lag.value_counts().to_dict()
    if bound:
        # the next batch really was rolled out beside the update on this one
        assert lag.max() == 1
    wide = reader.metrics_wide()
    assert (wide["policy_lag/max"].dropna() <= bound).all()
    assert list(reader.steps()["step"]) == [0, 1, 2, 3, 4]  # and the final evaluation's
    assert reader.episodes().groupby("step").size().tolist() == [4, 4, 4, 4], "no batch lost or repeated"
    for name in ("bubble/rollout", "bubble/trainer", "time/rollout_idle_s", "time/trainer_idle_s"):
        assert name in wide.columns and (wide[name].dropna() >= 0).all(), name


def _pipeline_run(tmp_path, steps: int, **options) -> wb.RunReader:
    """A finished pipeline run of ``steps`` steps x 2 problems x 2 samples, no checkpoint drain before the end."""
    config = _config(
        tmp_path,
        scheduler="pipeline",
        steps=steps,
        batch_size=2,
        group_size=2,
        checkpoint_every=10,
        **options,
    )
    run_dir = create(config)
    assert run_here(run_dir) == "finished"
    reader = wb.RunReader(run_dir)
    assert len(reader.episodes()) == steps * 2 * 2, (
        "the last step drains the pipeline: every problem's episodes are stored"
    )
    return reader


@pytest.mark.parametrize("bound", [0, 1])
def test_pipeline_batches_new_solvers_with_earlier_verifiers_and_trains_every_scored_call_once(
    bound, tmp_path
):
    reader = _pipeline_run(tmp_path, steps=3, max_staleness=bound)
    calls = reader.calls()
    rewarded = calls[calls["rewards"].notna()]
    assert rewarded["advantage"].notna().all(), "every scored call trained and kept its advantage"
    wide = reader.metrics_wide()
    assert wide["samples"].sum() == len(rewarded), "each scored call trained exactly once"
    trained_at = rewarded["timings"].map(lambda t: t["trained_step"])
    versions = reader.steps().set_index("step")["policy_version"]
    assert (trained_at <= rewarded["step"]).all(), "a call trains at the latest when its episode is stored"
    assert (trained_at < rewarded["step"]).any(), "some calls trained before their episode finished"
    staleness = trained_at.map(versions) - rewarded["policy_version"]
    assert staleness.between(0, bound).all() and (wide["policy_lag/max"] <= bound).all()
    if bound == 0:
        assert (staleness == 0).all(), "each level trains on the policy that generated it"
    assert {"pipeline/input_lag_max", "bubble/rollout"} <= set(wide.columns)
    # a verifier's input lag is its own policy version minus that of the solution it judged
    sources = calls.set_index("id")["policy_version"]
    judged = calls[calls["source_id"].notna()]
    input_lag = judged["policy_version"] - judged["source_id"].map(sources)
    assert (input_lag >= 0).all() and input_lag.max() == wide["pipeline/input_lag_max"].max()
    if bound == 0:
        assert input_lag.max() == 1, "a Verifier judged the Solver of the policy before the last update"
    # one step's rollout batch: new problems' Solvers beside the last step's problems' Verifiers
    step1 = rewarded[rewarded["timings"].map(lambda t: t["trained_step"]) == 1]
    assert {"solver", "verifier1"} <= set(step1["role"])


def test_the_pipeline_forgets_the_calls_of_finished_groups_so_a_reused_id_still_trains(tmp_path, monkeypatch):
    """Stored episodes are freed and Python reuses their ids: a new call whose id was still marked
    "handed to training" would never train (the benchmark lost 4 to 13 of 480 samples that way)."""
    checked = []
    original = loop.make_scheduler

    def watched(*args, **kwargs):
        scheduler = original(*args, **kwargs)
        rollout = scheduler.rollout

        def checked_rollout(step):
            got = rollout(step)
            stored = [id(c) for e in got.episodes for c in e.calls]
            checked.append((len(stored), not set(stored) & scheduler.taken))
            return got

        scheduler.rollout = checked_rollout
        return scheduler

    monkeypatch.setattr(loop, "make_scheduler", watched)
    config = _config(tmp_path, scheduler="pipeline", steps=3, batch_size=2, group_size=2, checkpoint_every=10)
    run_dir = create(config)
    assert run_here(run_dir) == "finished"
    assert sum(n for n, _ in checked) > 0 and all(forgotten for _, forgotten in checked)
    calls = wb.RunReader(run_dir).calls()
    assert calls[calls["rewards"].notna()]["advantage"].notna().all()


def test_a_pipeline_with_segments_carries_long_calls_over_steps_within_the_bound(tmp_path):
    """MarsRL's segment rollout in the pipeline: a step decodes one segment of a call, and the call goes
    on in the next step's batch (newer policy) instead of holding the step."""
    bound = 2
    reader = _pipeline_run(tmp_path, steps=4, max_staleness=bound, segment_len=2, max_tokens=8)
    calls = reader.calls()
    rewarded = calls[calls["rewards"].notna()]
    assert rewarded["advantage"].notna().all()
    assert reader.metrics_wide()["samples"].sum() == len(rewarded), "each scored call trained exactly once"
    versions = reader.steps().set_index("step")["policy_version"]
    trained = rewarded["timings"].map(lambda t: versions[t["trained_step"]])
    segments = rewarded["timings"].map(lambda t: t["segment_versions"])
    spans = segments.map(lambda v: len(set(v)))
    assert (spans > 1).any(), "some call was carried over to a later step's policy"
    assert (segments.map(lambda v: v == sorted(v))).all(), (
        "a carried call's later segments use newer policies"
    )
    lag = trained - rewarded["policy_version"]
    assert lag.between(0, bound).all() and lag.max() > 0, lag.value_counts().to_dict()
    assert (trained >= segments.map(max)).all(), "no segment decoded beside the update that trained it"
    assert (reader.metrics_wide()["policy_lag/max"] <= bound).all()


def test_the_pipeline_carries_only_single_generation_nodes():
    """A node that generates several times (an agent's turns) looks settled between two of them."""
    from types import SimpleNamespace

    from workbench.rl.scheduling import PipelineScheduler

    engine = SimpleNamespace(grouped_mode=True, topology=wb.load_topology("mars"))
    with pytest.raises(ValueError, match="research may generate several times a step"):
        PipelineScheduler(engine, lambda step: [], 2, 4, max_staleness=2, carry=True)


def test_a_resumed_pipeline_loses_and_repeats_no_group(tmp_path):
    """Checkpoint steps drain the pipeline, so a run resumed from one has no group left half done."""
    config = _config(tmp_path, scheduler="pipeline", steps=2, checkpoint_every=2, batch_size=2, group_size=2)
    run_dir = create(config)
    assert run_here(run_dir) == "finished"
    config.steps = 4
    (run_dir / "train_config.yaml").write_text(config.to_yaml())
    assert run_here(run_dir) == "finished"
    reader = wb.RunReader(run_dir)
    episodes = reader.episodes()
    assert len(episodes) == 4 * 2 * 2, "every problem of the 4 steps stored once"
    calls = reader.calls()
    rewarded = calls[calls["rewards"].notna()]
    assert rewarded["advantage"].notna().all()
    assert reader.metrics_wide()["samples"].sum() == len(rewarded)


def test_an_async_run_with_segments_keeps_every_segments_version_within_the_bound(tmp_path):
    config = _config(
        tmp_path, scheduler="async", max_staleness=1, segment_len=2, steps=3, stale_ratio="behaviour"
    )
    run_dir = create(config)
    assert run_here(run_dir) == "finished"
    reader = wb.RunReader(run_dir)
    lag, calls = _staleness(reader)
    timings = calls["timings"]
    segments = timings.map(lambda t: t["segment_versions"])
    assert (segments.map(len) == (calls["n_completion"] + 1) // 2).all(), "2 tokens a segment"
    assert (calls["policy_version"] == segments.map(min)).all(), "a call is as old as its oldest segment"
    assert (lag <= 1).all() and (lag >= 0).all()
    assert (
        timings.map(lambda t: t["segment_starts"]) == segments.map(lambda v: list(range(0, 2 * len(v), 2)))
    ).all()


def test_pipeline_needs_a_grouped_flow_and_config_names_bad_scheduler_fields(tmp_path):
    config = _config(tmp_path, scheduler="pipeline")
    with pytest.raises(ValueError, match="grouped flows"):
        run_training(
            config, create(config), topology=SOLO, tasks=generate("arithmetic", n=4, seed=0, level=1)
        )
    with pytest.raises(ValueError, match="max_staleness of the pipeline is 0 or 1 without segment_len"):
        _config(tmp_path, scheduler="pipeline", max_staleness=2)
    with pytest.raises(ValueError) as error:
        _config(tmp_path, scheduler="overlap", max_staleness=-1, segment_len=0, stale_ratio="ignore")
    for field in ("scheduler", "max_staleness", "segment_len", "stale_ratio"):
        assert field in str(error.value)


@pytest.fixture(scope="module")
def tiny():
    return load("tiny")


class _Bumping(BackendWrapper):
    """Publishes a new policy version after every generation, as a trainer would between segments."""

    async def generate(self, request):
        out = await self.inner.generate(request)
        self.inner.policy_version += 1
        return out


def test_segments_continue_the_exact_completion_and_keep_every_segments_version(tiny):
    model, tokenizer = tiny
    prompt = tokenizer("12 + 7 =")["input_ids"]
    whole = HFBackend(model, tokenizer)
    segmented = SegmentedBackend(_Bumping(HFBackend(model, tokenizer)), segment_len=4)
    request = GenerationRequest(prompt_ids=prompt, max_tokens=13, temperature=0.0)
    ((expected,),) = asyncio.run(_all(whole, [request]))
    ((got,),) = asyncio.run(_all(segmented, [request]))
    assert got.completion_ids == expected.completion_ids
    assert got.logprobs == pytest.approx(expected.logprobs, abs=1e-4)
    n = len(expected.completion_ids)
    assert got.timings["segments"] == -(-n // 4) and got.timings["segment_starts"] == list(range(0, n, 4))
    assert got.timings["segment_versions"] == list(range(got.timings["segments"]))
    assert got.policy_version == 0, "staleness counts from the oldest segment"
    # a stop string straddling two segments ends the completion where the unsegmented rule would
    stop = tokenizer.decode(expected.completion_ids[3:5], skip_special_tokens=False)
    cut, _ = cut_at_stop(tokenizer, expected.completion_ids, (stop,))
    stopped = GenerationRequest(prompt_ids=prompt, max_tokens=13, temperature=0.0, stop=(stop,))
    ((got,),) = asyncio.run(_all(SegmentedBackend(HFBackend(model, tokenizer), 4), [stopped]))
    assert got.completion_ids == expected.completion_ids[:cut] and got.finish_reason == "stop"


async def _all(backend, requests):
    return await asyncio.gather(*(backend.generate(r) for r in requests))


@pytest.mark.parametrize("treatment", ["recompute", "behaviour"])
def test_stale_samples_use_the_chosen_old_policy(treatment, tiny):
    """behaviour: the ratio is against the engine's log-probs (a stale policy's), so it is not 1."""
    model = copy.deepcopy(tiny[0])
    samples = [Sample([5, 6, 7], [8, 9, 10], [1, 1, 1], [-9.0, -9.0, -9.0], advantage=a) for a in (1.0, -1.0)]
    loss = LossConfig(clip_low=10.0, clip_high=10.0, old_from_engine=treatment == "behaviour")
    trainer = PolicyTrainer({"base": model}, OptimConfig(learning_rate=1e-9, loss=loss))
    ratio = trainer.step(samples)["ratio/mean"]
    if treatment == "behaviour":
        assert ratio > 10, "pi / pi_engine with the engine's stale log-probs far below the trainer's"
    else:
        assert ratio == pytest.approx(1.0, abs=1e-4)


@pytest.mark.parametrize("mode", ["shared", "lora"])
def test_an_async_rollout_copy_gets_the_trained_tensors_at_each_sync(mode, tiny, tmp_path):
    import torch

    from workbench.rl.policies import PolicySet
    from workbench.topology import load as load_topology

    policies = PolicySet(load_topology("marsrl"), copy.deepcopy(tiny[0]), tiny[1], mode)
    backends = policies.backends("hf", "tiny", own_weights=True)
    (backend,) = {id(b): b for b in backends.values()}.values()
    trained = next(iter(policies.unique_models().values()))
    assert backend.model is not trained
    with torch.no_grad():
        for p in trained.parameters():
            if p.requires_grad:
                p.add_(0.25)
    served = backend.model.state_dict()
    changed = [k for k, v in trained.state_dict().items() if not torch.equal(v, served[k])]
    assert changed, "the update has not reached the copy yet"
    policies.sync(backends, tmp_path, 3, timeout=30)
    served = backend.model.state_dict()
    assert all(torch.equal(trained.state_dict()[k], served[k]) for k in changed)
    assert backend.policy_version == 3
