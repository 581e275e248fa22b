"""Runs the trainer benchmark in quick mode (tiny model) against a real trl.GRPOTrainer, as users run it."""

import json

import pytest

from tests.perf.runner import run_bench


@pytest.mark.perf
def test_bench_trainer_quick(tmp_path):
    out = tmp_path / "trainer.json"
    result = run_bench("bench_trainer", "--quick", "--out", str(out))
    figures = json.loads(out.read_text())
    assert figures["workbench_step_s"] > 0 and figures["trl_step_s"] > 0
    assert figures["ratio"] == pytest.approx(
        figures["workbench_step_s"] / figures["trl_step_s"], rel=0.05
    )  # both rounded
    assert figures["padded_tokens_trl"] >= figures["tokens"], "TRL pads; the workbench packs"
    assert "ratio" in result.stdout
