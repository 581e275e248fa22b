"""Step metrics: the Verifier's confusion counts against the truth of what it judged, and the step's
``time/*`` metrics from its phase timer."""

from __future__ import annotations

import pytest

from tests.test_rl_advantages import _call
from workbench.engine.records import CallRecord, EpisodeRecord
from workbench.rl.metrics import rollout_metrics
from workbench.rl.phases import StepTimer


def verifier_call(verdict: str | None, judged_correct: bool) -> CallRecord:
    accuracy = float(verdict is not None and (verdict == "correct") == judged_correct)
    call = _call("verifier1", 1, accuracy, source=0)
    call.parsed = None if verdict is None else {"verdict": verdict, "report": ""}
    call.format_error = "no verdict" if verdict is None else None
    call.rewards.update(accuracy=accuracy, judged_correct=float(judged_correct))
    return call


def test_a_verifier_that_writes_no_verdict_is_counted_apart_not_as_saying_wrong():
    verdicts = [
        ("correct", True),
        ("correct", False),
        ("wrong", False),
        ("wrong", True),
        (None, False),
        (None, True),
    ]
    episode = EpisodeRecord("t", "g", 0, calls=[verifier_call(v, c) for v, c in verdicts])
    _, roles = rollout_metrics([episode])
    got = {k: roles["verifier1"][f"verifier/{k}"] for k in ("tp", "fp", "tn", "fn", "no_verdict")}
    assert got == {"tp": 1.0, "fp": 1.0, "tn": 1.0, "fn": 1.0, "no_verdict": 2.0}
    assert roles["verifier1"]["verifier/verdict_accuracy"] == pytest.approx(2 / 6)
    assert roles["verifier1"]["verifier/verdict_accuracy"] == pytest.approx(roles["verifier1"]["reward/mean"])


def test_the_step_timer_gives_each_phase_its_time_metric_and_the_step_its_wall_time():
    timer = StepTimer()
    for phase in ("rollout", "score", "advantages", "update", "sync", "record"):
        with timer.phase(phase):
            pass
    metrics = timer.metrics()
    assert set(metrics) == {
        "time/rollout_s",
        "time/score_s",
        "time/advantages_s",
        "time/train_s",
        "time/weight_sync_s",
        "time/step_s",
    }, "record (and checkpoint) end after the step's metrics are stored: no metric"
    assert metrics["time/step_s"] >= sum(v for k, v in metrics.items() if k != "time/step_s")
    with pytest.raises(ValueError, match="a step's phase is one of"), timer.phase("generate"):
        pass


def test_the_progress_line_shows_the_numbers_that_move():
    from workbench.rl.display import progress_line

    roles = {"solver": {"reward/mean": 0.875}, "checker": {"samples": 4.0}}
    metrics = {"reward/mean": 0.875, "loss": -2.3e-6, "grad_norm": 0.41, "clip_fraction": 0.0, "kl": 0.0}
    metrics.update({"entropy": 1.234, "time/step_s": 16.74})
    line = progress_line(11, metrics, roles)
    assert line == (
        "step 11: reward 0.875, loss -2.30e-06, grad norm 0.410, entropy 1.23, 16.7 s (role rewards: solver 0.88)"
    )
    several = progress_line(3, {**metrics, "clip_fraction": 0.031, "kl": 1.5e-4, "entropy": float("nan")}, {})
    assert ", clipped 3.1%, kl 1.50e-04, 16.7 s" in several and "entropy" not in several
    assert (
        progress_line(0, {"reward/mean": 0.0, "time/step_s": 1.0}, {})
        == "step 0: reward 0.000, no update, 1.0 s"
    )
