"""Three seeds behind every claim (issue 49): the report plan makes each run once per seed (``--seeds 0,1,2``: seed k
> 0 in ``<name>-seed<k>/``), resumably, with summaries per seed; the notebooks keep drawing seed 0's runs by the
plan's names; the gallery's claims table gives every seed's value, the mean with its standard error across seeds
and a verdict judged across seeds (``workbench.reports.seeds``). End to end at the sample scale (tiny model) on a
plan of MarsRL's two runs and a rollout of the trained model."""

from __future__ import annotations

import math

import pytest

import workbench.reports.plan as plan
import workbench.reports.reproduce as reproduce_module
from workbench.cli import main
from workbench.reports.plan import PlannedRun, parse_seeds, seed_folder, seed_runs, split_seed
from workbench.reports.reproduce import drawn_runs
from workbench.reports.seeds import (
    BEGIN,
    CLAIMS,
    END,
    Claim,
    ClaimRow,
    Measured,
    claims_table,
    markdown,
    mean_se,
    runs_by_seed,
    verdict,
    write_between_markers,
)
from workbench.reports.series import newest_run, resolve_runs
from workbench.store import RunReader
from workbench.store.summary import read_summary


def test_the_verdict_rule_on_hand_made_numbers():
    mean, se = mean_se([0.1, 0.2, 0.3])
    assert math.isclose(mean, 0.2) and math.isclose(se, 0.1 / math.sqrt(3))  # sd with n - 1: 0.1
    assert verdict([0.1, 0.2, 0.3]) == "holds"  # 0.2 > 2 x 0.058, every seed above zero
    assert verdict([0.2, 0.2]) == "holds"  # no spread at all
    assert verdict([0.3, 0.01, 0.02]) == "not shown"  # every seed up, but the mean 0.11 within 2 SE (0.19)
    assert verdict([1.0, 1.0, 1.0, 1.0, 0.0]) == "not shown"  # mean 0.8 > 2 SE (0.4), but one seed not up
    assert verdict([-0.1, -0.2, -0.3]) == "reversed"
    assert verdict([0.2]) == "one seed" and verdict([math.nan, 0.2]) == "one seed"
    assert verdict([]) == "no runs" and math.isnan(mean_se([0.2])[1])

    claim = Claim("marsrl", "a claim", "a measure", ("marsrl",), lambda runs: Measured(0.0))
    rows = [
        ClaimRow(claim, {0: Measured(0.1, 0.05, 64), 1: Measured(0.2, 0.1, 64), 2: Measured(0.3)}),
        ClaimRow(claim, {0: Measured(0.219, 0.073, 64)}),
        ClaimRow(claim, {}),
    ]
    table = markdown(rows, "reports/runs").splitlines()
    assert table[0] == "| claim | measure | seed 0 | seed 1 | seed 2 | mean ± SE across seeds | verdict |"
    assert table[2] == (
        "| MarsRL: a claim | a measure | +0.100 (+2.0 SE) | +0.200 (+2.0 SE) | +0.300 | +0.200 ± 0.058 (n = 3) "
        "| **holds** |"
    )
    assert (
        table[3] == "| MarsRL: a claim | a measure | +0.219 (+3.0 SE) | – | – | +0.219 (n = 1) | one seed |"
    )
    assert table[4] == "| MarsRL: a claim | a measure | – | – | – | – | no runs |"
    assert table[-1] == "Seeds found: 0, 1, 2, in `reports/runs`."


def test_seed_folders_and_the_table_between_its_markers(tmp_path):
    assert (seed_folder("marsrl"), seed_folder("marsrl", 0), seed_folder("marsrl", 2)) == (
        "marsrl",
        "marsrl",
        "marsrl-seed2",
    )
    assert split_seed("marsrl_shared_reward-seed12") == ("marsrl_shared_reward", 12)
    assert split_seed("marsrl_shared_reward") == ("marsrl_shared_reward", 0)
    assert parse_seeds("0,1,2") == [0, 1, 2]
    for bad in ("0,0", "-1", "a", ""):
        with pytest.raises(ValueError, match="seeds are"):
            parse_seeds(bad)
    assert seed_runs({"a": tmp_path, "a-seed1": tmp_path / "x"}, 1) == {"a": tmp_path / "x"}

    doc = tmp_path / "gallery.md"
    doc.write_text(f"# Gallery\n\nbefore\n\n{BEGIN}\nold table\n{END}\n\nafter\n")
    write_between_markers(doc, "| new | table |")
    assert doc.read_text() == f"# Gallery\n\nbefore\n\n{BEGIN}\n| new | table |\n{END}\n\nafter\n"
    (tmp_path / "plain.md").write_text("no markers\n")
    with pytest.raises(ValueError, match="no <!-- seeds:begin -->"):
        write_between_markers(tmp_path / "plain.md", "x")
    for claim in CLAIMS:  # every claim reads runs the plan makes
        assert set(claim.runs) <= {run.name for run in plan.PLAN}


#: MarsRL's two runs and a greedy rollout of the model the first one trained (a run that follows another's seed).
TINY_PLAN = (
    *(run for run in plan.PLAN if run.paper == "marsrl"),
    PlannedRun(
        "marsrl_held_out",
        "marsrl",
        "marsrl_cpu",
        "the trained system, greedy, on the run's held-out problems",
        plan._held_out_rollout(plan._MARSRL),
        rollout=True,
        model_of="marsrl",
    ),
)


def _eval_tasks(run_dir) -> list[str]:
    with RunReader(run_dir) as reader:
        return sorted(reader.events(kind="eval")["payload"].iloc[0]["tasks"])


def test_two_seeds_made_resumed_summarised_drawn_and_judged(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(plan, "PLAN", TINY_PLAN)
    runs, summaries, out = tmp_path / "runs", tmp_path / "summaries", tmp_path / "out"
    names = ["marsrl", "marsrl_shared_reward", "marsrl_held_out"]

    # a first pass stopped in seed 1's first run: seed 0's three runs made, seed 1's marsrl left unfinished
    seen: list[str] = []

    def interrupted_in_seed_1(line: str) -> None:
        seen.append(line)
        if line.startswith("step 1:") and any(s.startswith("marsrl-seed1: training") for s in seen):
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        plan.make_runs(runs, "marsrl", "sample", log=interrupted_in_seed_1, seeds=[0, 1])
    assert sorted(p.name for p in runs.iterdir()) == sorted([*names, "marsrl-seed1"])

    # the command again (at the sample scale, the notebooks left out): seed 0 kept, seed 1 resumed and finished
    real_make_runs = plan.make_runs
    monkeypatch.setattr(
        plan,
        "make_runs",
        lambda d, papers, scale, model, **kw: real_make_runs(d, papers, "sample", model, **kw),
    )
    drawn: dict = {}
    monkeypatch.setattr(
        reproduce_module, "reproduce", lambda papers, runs, out, **kw: drawn.update(runs=runs, **kw)
    )
    monkeypatch.setattr(reproduce_module, "summarise", lambda results, out: 0)
    capsys.readouterr()
    command = ["reproduce", "marsrl", "--train", "--seeds", "0,1", "--runs-dir", str(runs)]
    assert main([*command, "--summaries", str(summaries), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert all(f"{name}: finished before, kept" in printed for name in names)
    assert "marsrl-seed1: resuming" in printed
    assert "marsrl_held_out-seed1: rolling out the model marsrl-seed1 trained" in printed  # its seed's model
    made = {f"{n}{suffix}": newest_run(runs / f"{n}{suffix}") for n in names for suffix in ("", "-seed1")}

    # summaries per seed, each with its seed and the command; the seeds drew other tasks
    assert sorted(p.name for p in summaries.iterdir()) == sorted(made)
    for folder, run_dir in made.items():
        about = read_summary(summaries / folder)
        assert about["seed"] == split_seed(folder)[1] and "--seeds 0,1" in about["command"]
        with RunReader(run_dir) as reader:
            assert reader.info()["status"] == "finished" and reader.config["seed"] == split_seed(folder)[1]
    assert _eval_tasks(made["marsrl"])[0].startswith("arithmetic-10000-")
    assert _eval_tasks(made["marsrl-seed1"])[0].startswith("arithmetic-10001-")
    with RunReader(made["marsrl_held_out-seed1"]) as reader:  # the rollout: the held-out tasks of its seed
        assert sorted(reader.episodes()["task_id"]) == _eval_tasks(made["marsrl-seed1"])

    # the notebooks were given seed 0's runs, by the plan's names
    assert resolve_runs(drawn["runs"]) == {name: made[name] for name in names} and drawn["seed"] == 0

    # a third pass retrains nothing
    lines: list[str] = []
    again = real_make_runs(runs, "marsrl", "sample", log=lines.append, seeds=[0, 1])
    assert again == made and sum("finished before, kept" in line for line in lines) == 6

    # drawing from the summaries: seed 0's by default, another seed's under the same names when asked
    by_name = resolve_runs(drawn_runs(str(summaries)))
    assert sorted(by_name) == sorted(names)
    assert drawn_runs(str(summaries), 1) == ",".join(f"{n}={summaries / n}-seed1" for n in sorted(names))
    with pytest.raises(ValueError, match="no runs of seed 2"):
        drawn_runs(str(summaries), 2)
    assert drawn_runs(str(runs / "marsrl")) == str(runs / "marsrl")  # anything else as it was

    # the claims table across the two seeds, from the summaries as from the runs themselves
    assert {seed: sorted(found) for seed, found in runs_by_seed(summaries).items()} == {
        0: ["marsrl", "marsrl_shared_reward"],
        1: ["marsrl", "marsrl_shared_reward"],
    }  # the tiny plan's rollout is no run of the gallery's claims
    rows = claims_table(summaries)
    assert [row.by_seed for row in rows] == [row.by_seed for row in claims_table(runs)]
    for row in rows:
        if row.claim.paper == "marsrl":
            assert sorted(row.by_seed) == [0, 1]
            # the Verifier's measure needs verdicts, which 8 tokens may not hold
            assert len(row.values) in (0, 2)
            assert row.verdict == verdict(row.values) and row.mean_se == mean_se(row.values)
        else:
            assert row.by_seed == {} and row.verdict == "no runs"
    gain = rows[0]
    assert gain.claim.claim == "training the Solver and Verifier raises the system's accuracy"
    before_after = [
        (_scores(made[f"marsrl{s}"], 0), _scores(made[f"marsrl{s}"], -1)) for s in ("", "-seed1")
    ]  # the measure by hand: held-out exact accuracy after - before
    assert gain.values == pytest.approx([after - before for before, after in before_after])

    doc = tmp_path / "gallery.md"
    doc.write_text(f"# Gallery\n\n## Across seeds\n\n{BEGIN}\n{END}\n")
    table_command = [
        "reproduce",
        "all",
        "--seeds-table",
        "--summaries",
        str(summaries),
        "--gallery",
        str(doc),
    ]
    assert main(table_command) == 0
    written = doc.read_text()
    assert markdown(rows, str(summaries)) in written and "Seeds found: 0, 1" in written
    assert written.startswith("# Gallery\n\n## Across seeds\n\n" + BEGIN) and written.endswith(END + "\n")


def _scores(run_dir, index: int) -> float:
    with RunReader(run_dir) as reader:
        events = reader.events(kind="eval").sort_values("step")
    tasks = events["payload"].iloc[index]["tasks"]
    return sum(scores["outcome"] >= 1.0 for scores in tasks.values()) / len(tasks)


def test_the_gallerys_table_across_seeds_is_that_of_the_committed_summaries():
    from workbench.reports.seeds import GALLERY
    from workbench.reports.series import COMMITTED_RUNS

    page = GALLERY.read_text()
    written = page[page.index(BEGIN) + len(BEGIN) : page.index(END)].strip()
    assert written == markdown(claims_table(COMMITTED_RUNS), "reports/runs"), (
        "docs/gallery.md's claims across seeds are not those of reports/runs: workbench reproduce all --seeds-table"
    )
