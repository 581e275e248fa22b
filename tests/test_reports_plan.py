"""The report plan (``workbench.reports.plan``, what ``workbench reproduce all --train`` trains): each paper's runs
in folders of their own, a finished run kept, an interrupted one resumed; a comparison's variant differs from its
system in what the plan changes and nothing else. ``tests/test_reports.py`` draws every notebook from the plan's
runs at the sample scale."""

from __future__ import annotations

import pytest

import workbench as wb
from workbench.cli import main
from workbench.reference import PAPERS
from workbench.reports.plan import PLAN, export_summaries, make_runs, planned, runs_argument, scaled
from workbench.reports.series import resolve_runs, run_spec
from workbench.store import RunReader
from workbench.store.summary import read_summary
from workbench.topology import to_dict


def test_every_paper_has_runs_and_the_scales_shorten_them():
    assert {run.paper for run in PLAN} == set(PAPERS)
    assert len({run.name for run in PLAN}) == len(PLAN)
    for run in PLAN:
        wb.load_topology(run.topology)  # a name the library knows
    marsrl = next(run for run in PLAN if run.name == "marsrl")
    assert scaled(marsrl, "full") == dict(marsrl.fields)
    quick = scaled(marsrl, "quick")
    assert (quick["steps"], quick["eval_tasks"]) == (5, 16)  # a fifth of 25 steps, at most 16 held out
    assert scaled(marsrl, "sample")["steps"] == 3
    by_name = {run.name: run for run in PLAN}
    for scale in (
        "full",
        "quick",
        "sample",
    ):  # the tool ablation rolls out over its trained run's held-out tasks
        assert (
            scaled(by_name["mars_without_search"], scale)["n_tasks"]
            == scaled(by_name["mars"], scale)["eval_tasks"]
        )
    with pytest.raises(ValueError, match="unknown scale 'huge'; choose from full, quick, sample"):
        scaled(marsrl, "huge")
    with pytest.raises(ValueError, match="unknown paper.*nope"):
        planned("nope")


def test_an_interrupted_run_resumes_a_finished_one_is_kept_and_the_variant_changes_one_reward(tmp_path):
    lines: list[str] = []

    def interrupted_after_step_1(line: str) -> None:
        lines.append(line)
        if line.startswith("step 1:"):
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        make_runs(tmp_path, "marsrl", scale="sample", log=interrupted_after_step_1)
    first = next((tmp_path / "marsrl").iterdir())
    assert RunReader(first).info()["status"] != "finished"

    lines.clear()
    made = make_runs(tmp_path, "marsrl", scale="sample", log=lines.append)
    assert list(made) == ["marsrl", "marsrl_shared_reward"] and made["marsrl"] == first
    assert any(line.startswith("marsrl: resuming") for line in lines)
    for run_dir in made.values():
        with RunReader(run_dir) as reader:
            assert reader.info()["status"] == "finished"
            assert reader.steps()["step"].tolist() == [0, 1, 2, 3]  # each once; 3: the final held-out scores
            assert sorted(reader.episodes()["step"].unique()) == [0, 1, 2]
            assert reader.config["keep_checkpoints"] == 1  # 1.5 GB each at 135M: one is enough to resume
        assert [p.name for p in (run_dir / "checkpoints").iterdir()] == ["step-000002"]

    lines.clear()
    assert make_runs(tmp_path, "marsrl", scale="sample", log=lines.append) == made
    assert sum("finished before, kept" in line for line in lines) == 2

    system, variant = (to_dict(run_spec(made[name])) for name in ("marsrl", "marsrl_shared_reward"))
    assert variant["roles"]["verifier1"]["reward"]["kind"] == "outcome"
    variant["roles"]["verifier1"]["reward"] = system["roles"]["verifier1"]["reward"]
    assert variant == system
    # the notebooks find the runs by the plan's names, given one by one or as the folder
    assert resolve_runs(runs_argument(made)) == made == resolve_runs(str(tmp_path))

    # and their summaries (what reports/runs/ holds) the same way, with what made them
    summaries = export_summaries(made, tmp_path / "summaries", "workbench reproduce marsrl --train", "sample")
    assert summaries == {name: tmp_path / "summaries" / name for name in made}
    about = read_summary(summaries["marsrl_shared_reward"])
    assert (about["command"], about["scale"], about["seed"]) == (
        "workbench reproduce marsrl --train",
        "sample",
        0,
    )
    assert about["changes"] == {"roles.verifier1.reward": {"kind": "outcome"}} and about["model"] == "tiny"
    drawn = resolve_runs(str(tmp_path / "summaries"))
    assert list(drawn) == list(made)
    for name, run_dir in made.items():
        with RunReader(run_dir) as run, RunReader(drawn[name]) as summary:
            assert summary.metrics()["value"].tolist() == run.metrics()["value"].tolist()
            # the variant's spec came along
            assert to_dict(run_spec(drawn[name])) == to_dict(run_spec(run_dir))


def test_train_and_runs_together_are_refused(tmp_path, capsys):
    assert main(["reproduce", "hira", "--train", "--runs", str(tmp_path)]) == 2
    assert "--train makes the runs" in capsys.readouterr().err
