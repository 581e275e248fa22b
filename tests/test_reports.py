"""Paper reports: run data behind the figures, saved figure data, and `workbench reproduce` end to end."""

from __future__ import annotations

import copy
import json
from collections import defaultdict
from pathlib import Path

import matplotlib
import nbformat
import pandas as pd
import pytest
from nbval.plugin import coalesce_streams, transform_streams_for_comparison

from tests.notebook_outputs import is_checked
from workbench.cli import main
from workbench.reports import series
from workbench.reports.figures import figure_data
from workbench.reports.reproduce import REPORTS_DIR, absolute_runs, report_notebooks, reproduce
from workbench.reports.sample import train_sample_runs
from workbench.reports.series import RUNS_ENV, resolve_runs, run_spec, select_runs
from workbench.store import RunReader
from workbench.store.summary import is_summary
from workbench.tools import make_tool

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


@pytest.fixture(scope="module")
def sample_runs(tmp_path_factory) -> dict[str, Path]:
    """The report plan's runs at its sample scale (each paper's, on the tiny model), by the plan's names."""
    return train_sample_runs(tmp_path_factory.mktemp("report-runs"))


@pytest.fixture(scope="module")
def run_dir(sample_runs) -> Path:
    """The MarsRL sample run."""
    return sample_runs["marsrl"]


def test_runs_are_named_by_label_id_or_folder(run_dir, tmp_path, monkeypatch):
    assert resolve_runs(f"random={run_dir},adaptive={run_dir}") == {"random": run_dir, "adaptive": run_dir}
    assert resolve_runs(str(run_dir)) == {run_dir.name: run_dir}
    assert resolve_runs(str(run_dir.parent))[run_dir.name] == run_dir
    monkeypatch.setenv(RUNS_ENV, f"only={run_dir}")
    assert resolve_runs("") == {"only": run_dir}
    with pytest.raises(FileNotFoundError, match=r"not a run directory \(no run.db\): gone="):
        resolve_runs(f"gone={tmp_path / 'missing'}")
    monkeypatch.delenv(RUNS_ENV)
    committed = resolve_runs("")  # the summaries in reports/runs/, each a run built from its summary
    assert list(committed) == sorted(p.name for p in series.COMMITTED_RUNS.iterdir() if is_summary(p))
    with RunReader(committed["marsrl"]) as reader:
        assert reader.info()["status"] == "finished" and reader.config["topology"] == "marsrl_cpu"
    monkeypatch.setattr(series, "COMMITTED_RUNS", tmp_path / "none")
    with pytest.raises(ValueError, match=f"pass runs=.* or set {RUNS_ENV}"):
        resolve_runs("")


def test_run_paths_given_relative_to_the_shell_reach_the_notebooks_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert absolute_runs("a=runs/x, runs/y") == f"a={tmp_path}/runs/x,{tmp_path}/runs/y"
    assert absolute_runs("") == ""


def test_a_report_draws_only_its_papers_runs(sample_runs):
    both = {"a": sample_runs["marsrl"], "b": sample_runs["mars"]}
    assert select_runs(both, ["mars", "mars_cpu"], "MARS") == {"b": sample_runs["mars"]}
    with pytest.raises(
        ValueError, match=r"no HiRA run \(topology hira\) among: a \(marsrl_cpu\), b \(mars_cpu\)"
    ):
        select_runs(both, ["hira"], "HiRA")


def test_a_runs_saved_topology_wins_over_the_name_in_its_config(sample_runs, tmp_path):
    """wb.train(<Topology>) saves the spec it ran beside the run; its config holds only the name."""
    import shutil

    from workbench.topology import load, to_yaml
    from workbench.training import TOPOLOGY_FILE

    run = Path(shutil.copytree(sample_runs["marsrl"], tmp_path / "run"))
    assert run_spec(run).name == "marsrl_cpu"
    (run / TOPOLOGY_FILE).write_text(to_yaml(load("mars_cpu")))
    assert run_spec(run).name == "mars_cpu" and list(run_spec(run).tools) == ["search"]


def test_figure_data_lists_panels_with_labelled_series():
    fig, (left, right) = plt.subplots(1, 2)
    left.plot([0, 1, 2], [0.1, float("nan"), 0.3], label="adaptive")
    left.axhline(0.5)  # unlabelled helper line: not a series
    left.set(title="accuracy", xlabel="step")
    right.bar(["a", "b"], [3, 4], label="calls")
    data = figure_data(fig)
    plt.close(fig)
    assert [p["title"] for p in data["panels"]] == ["accuracy", ""]
    (line,) = data["panels"][0]["series"]
    assert line == {"label": "adaptive", "kind": "line", "x": [0.0, 1.0, 2.0], "y": [0.1, None, 0.3]}
    (bars,) = data["panels"][1]["series"]
    assert bars["kind"] == "bar" and bars["y"] == [3.0, 4.0] and bars["label"] == "calls"


def _figure(out: Path, paper: str, notebook: str, name: str | None = None) -> list[dict]:
    return json.loads((out / paper / notebook / f"{name or notebook}.json").read_text())["panels"]


def test_marsrl_figures_draw_both_runs_of_the_reward_comparison(run_dir, reproduced):
    out = reproduced
    with RunReader(run_dir) as reader:
        wide = reader.metrics_wide()
        evals = reader.events(kind="eval")
    (fig4,) = _figure(out, "marsrl", "fig4_sampling", "fig4_sampling")
    assert [s["label"] for s in fig4["series"]] == ["marsrl", "marsrl_shared_reward"]
    assert fig4["series"][0]["y"] == pytest.approx(wide["eval/accuracy"].dropna().tolist())

    accuracy, recall = _figure(out, "marsrl", "fig5_verifier", "fig5_verifier")
    assert (accuracy["ylabel"], recall["ylabel"]) == ("accuracy", "recall")
    confusion = {
        k: wide[[c for c in wide if c.endswith(f"verifier/{k}")]].sum(axis=1)
        for k in ("tp", "tn", "fp", "fn", "no_verdict")
    }
    total = sum(confusion.values())
    expected = ((confusion["tp"] + confusion["tn"]) / total).dropna()
    # read from the calls, the same as the counts the agent-specific reward logged; the shared one logs none
    assert accuracy["series"][0]["y"] == pytest.approx(expected[total > 0].tolist())

    lengths, solver = _figure(out, "marsrl", "fig6_lengths", "fig6_lengths")
    assert len(lengths["series"]) == len(solver["series"]) == 2
    assert solver["series"][0]["y"] == pytest.approx(wide["solver/length/mean"].dropna().tolist())

    table = pd.read_csv(out / "marsrl" / "tables" / "table1_run.csv")
    trained = table[(table["run"] == "marsrl") & (table["model"] == "trained")].iloc[0]
    last = evals.iloc[-1]
    scores = last["payload"]["tasks"].values()
    assert trained["step"] == last["step"] and trained["tasks"] == len(scores)
    assert trained["Solver"] == pytest.approx(100 * sum(s["solver"] >= 1 for s in scores) / len(scores))
    assert trained["Reasoning System"] == pytest.approx(
        100 * sum(s["outcome"] >= 1 for s in scores) / len(scores)
    )
    for item in ("table1", "table2", "table3"):
        assert (out / "marsrl" / "tables" / f"{item}_paper.csv").is_file()

    for paper in ("mars", "marsrl", "matpo", "hira"):
        assert report_notebooks(paper), f"{paper} has no report notebook"
    svgs = list((out / "marsrl" / "diagrams").glob("*.svg"))
    assert {p.stem for p in svgs} == {"fig1_marsrl", "fig2_marsrl_inference", "fig3_marsrl_pipeline"}
    pipeline, grouped = _figure(out, "marsrl", "diagrams", "fig3_marsrl_pipeline")
    agents = ["solver", "verifier1", "corrector1", "verifier2", "corrector2"]
    assert [s["label"] for s in pipeline["series"]] == agents  # the flow's order
    assert [len(s["x"]) for s in pipeline["series"]] == [7, 6, 5, 4, 3]  # agent k starts at step k + 1
    assert grouped["series"][0]["y"] == [4.0, 8.0, 8.0, 8.0, 8.0]  # G, then k=2 inputs x G each


@pytest.fixture(scope="module")
def reproduced(sample_runs, tmp_path_factory) -> Path:
    """`workbench reproduce all` over the folder of the plan's runs (a folder per run, named after it)."""
    out = tmp_path_factory.mktemp("reproduced")
    folder = next(iter(sample_runs.values())).parents[1]
    assert main(["reproduce", "all", "--runs", str(folder), "--out", str(out), "--workers", "2"]) == 0
    return out


def test_reproduce_all_runs_every_notebook_of_every_paper(reproduced):
    notebooks = report_notebooks("all")
    assert {nb.parent.name for nb in notebooks} == {"mars", "marsrl", "matpo", "hira", "mas_orchestra"}
    index = (reproduced / "index.html").read_text()
    assert f"{len(notebooks)} of {len(notebooks)} notebooks ran" in index
    for nb in notebooks:
        assert (reproduced / nb.parent.name / nb.stem / f"{nb.stem}.ipynb").is_file(), (
            f"{nb} was not executed"
        )


# What nbval leaves out when it compares a cell's outputs (nbval/plugin.py, IPyNbFile.skip_compare, run
# as `make test` runs it: without --nbdime, so images too, and without a sanitize file).
NBVAL_SKIPPED = frozenset(
    {"metadata", "traceback", "prompt_number", "output_type", "name", "execution_count"}
    | {"application/vnd.jupyter.widget-view+json", "image/png", "image/jpeg"}
)


def _as_nbval_compares(outputs: list) -> dict[str, list]:
    """A cell's outputs the way nbval compares them: the streams of one name joined (with their \\r and
    \\b applied) under that name, every MIME type of display_data and execute_result (text/plain,
    text/html ...) and every other field (an error's ename and evalue) but the skipped ones, each with
    its values in order."""
    values: dict[str, list] = defaultdict(list)
    for output in transform_streams_for_comparison(coalesce_streams(copy.deepcopy(outputs))):
        for key, value in output.items():
            if key == "data":
                for mime, text in value.items():
                    if mime not in NBVAL_SKIPPED:
                        values[mime].append(text)
            elif key not in NBVAL_SKIPPED:
                values[key].append(value)
    return dict(values)


def test_reproduced_notebooks_print_the_stored_outputs_of_their_checked_cells(reproduced):
    """What nbval --nbval-lax checked in the report notebooks, on the notebooks `reproduce all` ran.

    A cell marked ``# NBVAL_CHECK_OUTPUT`` (the paper's numbers: the same on every run) must show the
    outputs stored in ``reports/<paper>/<name>.ipynb``; the other cells only have to run (the test
    above). Store them again with ``python -m tests.notebook_outputs`` (docs/notebooks.md).
    """
    checked = 0
    for path in report_notebooks("all"):
        name = path.relative_to(REPORTS_DIR.parent)
        stored = nbformat.read(path, as_version=4).cells
        ran = nbformat.read(reproduced / path.parent.name / path.stem / f"{path.stem}.ipynb", as_version=4)
        # papermill adds a cell with the parameters it was given after the `parameters` cell
        ran = [c for c in ran.cells if "injected-parameters" not in c.metadata.get("tags", [])]
        assert [c.source for c in ran] == [c.source for c in stored], f"{name}: the executed cells differ"
        for index, (cell, executed) in enumerate(zip(stored, ran, strict=True)):
            if not is_checked(cell):
                continue
            checked += 1
            assert cell.outputs, f"{name} cell {index} is marked NBVAL_CHECK_OUTPUT but stores no output"
            reproduced_outputs = _as_nbval_compares(executed.outputs)
            assert reproduced_outputs == _as_nbval_compares(cell.outputs), (
                f"{name} cell {index}: outputs differ"
            )
    assert checked, "no report notebook cell is marked NBVAL_CHECK_OUTPUT: nothing was compared"


def test_mars_figures_draw_every_panel_from_the_mars_run(sample_runs, reproduced):
    run, label = sample_runs["mars"], "mars"  # labelled by their folders' names
    with RunReader(run) as reader:
        wide = reader.metrics_wide()
        episodes = reader.episodes(step=0)
    panels = _figure(reproduced, "mars", "fig3_training")
    assert [p["title"] for p in panels] == [
        "(a) held-out accuracy",
        "(b) training reward",
        "(c) tool calls per question",
        "(d) search: share of tool calls",  # mars_cpu has one tool; mars has three: nine panels
        "(e) min response length",
        "(f) mean response length",
        "(g) max response length",
    ]
    for panel, name in zip(panels, ["eval/accuracy", "reward/mean", "tool_calls/per_question"], strict=False):
        (line,) = panel["series"]  # the folder's other runs are not MARS runs: not drawn
        assert line["label"] == label and line["y"] == pytest.approx(wide[name].dropna().tolist())
    (longest,) = panels[-1]["series"]
    assert longest["y"] == pytest.approx(wide["length/max"].dropna().tolist())

    (histogram,) = _figure(reproduced, "mars", "fig5_best_of_n")
    (bars,) = histogram["series"]
    right = (episodes["reward"].fillna(0) >= 1).groupby(episodes["task_id"]).sum()
    expected = [float((right == k).sum()) for k in range(len(bars["y"]))]
    assert bars["y"] == expected and sum(expected) == episodes["task_id"].nunique()

    (pipeline,) = _figure(reproduced, "mars", "diagrams", "fig2_mars_training")
    assert pipeline["title"] == "MARS: GRPO with multi-agent RL"
    assert (reproduced / "mars" / "diagrams" / "fig1_mars.svg").is_file()

    tables = reproduced / "mars" / "tables"
    table4 = pd.read_csv(tables / "table4_run.csv")
    assert list(table4.columns) == ["run", "hops", "calls / search", "results / search"]
    runs_table = pd.read_csv(tables / "tables1_3_run.csv").set_index("run")
    assert runs_table["tools"].to_dict() == {"mars": "search", "mars_without_search": "none"}  # the ablation
    assert set(runs_table["topology"]) == {"mars_cpu"}
    ablation = runs_table.loc["mars_without_search"]
    with RunReader(sample_runs["mars_without_search"]) as reader:
        rolled = reader.episodes()
    assert ablation["trained accuracy"] == pytest.approx(100 * (rolled["reward"].fillna(0) >= 1).mean())
    for item in ("table1", "table2", "table3", "table4"):
        assert (tables / f"{item}_paper.csv").is_file()


def _heldout_accuracy(run: Path) -> list[float]:
    with RunReader(run) as reader:
        evals = reader.events(kind="eval")
    return [
        100 * sum(s["outcome"] >= 1 for s in e["tasks"].values()) / len(e["tasks"]) for e in evals["payload"]
    ]


def test_matpo_figures_and_headline_come_from_the_matpo_run(sample_runs, reproduced):
    run, label = sample_runs["matpo"], "matpo"
    (fig5,) = _figure(reproduced, "matpo", "fig5_accuracy")
    assert fig5["title"] == "test accuracy on multihop"
    curves = {s["label"]: s for s in fig5["series"]}  # MATPO and its single-agent baseline
    assert set(curves) == {label, "matpo_single_agent"}
    assert curves[label]["y"] == pytest.approx(_heldout_accuracy(run))
    single = sample_runs["matpo_single_agent"]
    assert curves["matpo_single_agent"]["y"] == pytest.approx(_heldout_accuracy(single))

    test, training = _figure(reproduced, "matpo", "fig6_ablations")
    assert test["title"] == "(a) test accuracy (running average@5)"
    entry = {
        s["label"]: s for s in training["series"]
    }  # each run's entry role: the single agent's is the worker
    assert set(entry) == {f"{label} (planner)", "matpo_single_agent (worker)"}
    planner = entry[f"{label} (planner)"]
    with RunReader(run) as reader:
        accuracy = reader.metrics(name="accuracy", role="planner")["value"]
    assert planner["label"] == f"{label} (planner)"
    assert planner["y"] == pytest.approx((100 * accuracy.rolling(15, min_periods=1).mean()).tolist())

    with RunReader(run) as reader:
        first = reader.calls(step=0, columns=["episode_id", "role", "n_completion", "advantage"])
    (tokens,) = _figure(reproduced, "matpo", "fig2_4_rollouts", "fig2_3_rollout")
    owned = {s["label"]: s for s in tokens["series"]}
    shown = first[first["episode_id"] == first.groupby("episode_id").size().idxmax()]
    assert sum(sum(s["length"]) for s in owned.values()) == shown["n_completion"].sum()
    assert "own tokens (trained)" in owned
    (batch,) = _figure(reproduced, "matpo", "fig2_4_rollouts", "fig4_batch")
    assert sum(len(s["y"]) for s in batch["series"]) == len(first)
    assert {s["label"] for s in batch["series"]} == set(first["role"])

    headline = pd.read_csv(reproduced / "matpo" / "headline" / "headline_run.csv").set_index("Method")
    assert headline.loc[label, "accuracy"] == pytest.approx(_heldout_accuracy(run)[-1])
    assert headline.loc["matpo_single_agent", "accuracy"] == pytest.approx(_heldout_accuracy(single)[-1])
    paper = pd.read_csv(reproduced / "matpo" / "headline" / "headline_paper.csv")
    assert paper["Method"].tolist() == ["Single-agent GRPO", "MATPO"]


def test_hira_figures_and_tables_come_from_the_hira_rollout(sample_runs, reproduced):
    run, label = sample_runs["hira"], "hira"
    with RunReader(run) as reader:
        episodes = reader.episodes()
        calls = reader.calls(columns=["episode_id", "role", "n_completion", "tool_calls"])
    hops = episodes["task_meta"].map(lambda m: m["hops"])
    right = episodes["reward"].fillna(0) >= 1

    (fig4,) = _figure(reproduced, "hira", "fig4_subsets")
    bars, flat = fig4["series"]  # the hierarchical system and its flat ablation
    assert (bars["label"], flat["label"]) == (label, "hira_flat")
    assert bars["y"] == pytest.approx((100 * right.groupby(hops).mean()).tolist())

    length, interactions = _figure(reproduced, "hira", "fig5_efficiency")
    assert (length["title"], interactions["title"]) == ("Reasoning Length", "Interaction Times")
    planner = calls[calls["role"] == "meta_planner"]
    per_episode = planner.groupby("episode_id")["n_completion"].sum().reindex(episodes["id"], fill_value=0)
    assert length["series"][0]["y"] == pytest.approx([per_episode.mean()])

    (fig3,) = _figure(reproduced, "hira", "fig3_subtasks")
    assert [line["x"] for line in fig3["series"]] == [[10.0], [10.0]]  # hira.yaml's max_subtasks, both runs

    tables = reproduced / "hira"
    run_table = pd.read_csv(tables / "tables" / "tables1_2_run.csv")
    assert list(run_table.columns) == ["Method", "multihop / 1", "multihop / 2", "multihop / Avg."]
    assert run_table["Method"].tolist() == [label, "hira_flat"]
    assert run_table.loc[0, "multihop / Avg."] == pytest.approx(100 * right.mean())
    episode = pd.read_csv(tables / "table3_episode" / "table3_episode.csv")
    shown = episodes[right]["id"].iloc[0] if right.any() else episodes["id"].iloc[0]
    assert len(episode) == (calls["episode_id"] == shown).sum()
    assert (tables / "tables" / "table2_paper.csv").is_file()
    diagrams = {p.stem for p in (tables / "diagrams").glob("*.svg")}
    assert diagrams == {"fig1a_direct_reasoning", "fig1b_search_augmented_reasoning", "fig2_hira"}


def test_each_comparison_run_differs_from_its_system_as_the_plan_says(sample_runs):
    """MATPO's single agent is the worker alone; MARS's tool ablation rolls the trained model out over the
    trained run's own held-out questions with a search that finds nothing; HiRA's flat ablation searches
    from the meta planner, with no coordinator or experts."""
    with RunReader(sample_runs["matpo_single_agent"]) as reader:
        roles = set(reader.calls(columns=["role"])["role"])
    assert roles == {"worker"}

    with RunReader(sample_runs["mars"]) as trained, RunReader(sample_runs["mars_without_search"]) as ablation:
        held_out = set(trained.events(kind="eval")["payload"].iloc[-1]["tasks"])
        episodes, config = ablation.episodes(), ablation.config
        meta = episodes["task_meta"].iloc[
            0
        ]  # the entity a held-out question asks about, and its knowledge base
    assert set(episodes["task_id"]) == held_out  # paired with the trained run's last evaluation
    # the weights mars trained, exported beside the rollout
    assert Path(config["model"]) == sample_runs["mars_without_search"].parent / "trained-model"
    found = {}
    for name in ("mars", "mars_without_search"):
        search = run_spec(sample_runs[name]).tools["search"]
        kb = {"kb_seed": meta["kb_seed"], "n_entities": meta["n_entities"]}
        found[name] = make_tool(search.kind, **search.options, **kb).search([meta["start"]])
    assert len(found["mars"]) == 1 and found["mars_without_search"] == []

    with RunReader(sample_runs["hira_flat"]) as reader:
        calls = reader.calls(columns=["role", "tool_calls"])
    assert set(calls["role"]) == {"meta_planner"}
    assert {t["name"] for ts in calls["tool_calls"] for t in ts or []} <= {"search"}


def test_mas_orchestra_figures_come_from_the_orchestrator_run(sample_runs, reproduced):
    run, label = sample_runs["mas_orchestra"], "mas_orchestra"
    with RunReader(run) as reader:
        trained = reader.episodes()["step"]  # the final evaluation's step stores no episodes
        last = int(trained.max())
        episodes = reader.episodes(step=last)
        calls = reader.calls(step=last, columns=["episode_id", "n_prompt", "n_completion"])
    right = (episodes["reward"].fillna(0) >= 1).mean() * 100
    used = calls["n_prompt"].fillna(0).astype(float) + calls["n_completion"].fillna(0).astype(float)
    tokens = used.groupby(calls["episode_id"]).sum().mean()

    (pareto,) = _figure(reproduced, "mas_orchestra", "pareto", "fig1_pareto")
    point, front = pareto["series"]
    assert point["label"] == label and front["label"] == "Pareto front"
    assert point["x"] == pytest.approx([tokens]) and point["y"] == pytest.approx([right])

    (depth,) = _figure(reproduced, "mas_orchestra", "masbench_axes")
    depths = sorted({float(m["axis_value"]) for m in episodes["task_meta"]})
    assert depth["title"] == "depth" and depth["series"][0]["x"] == depths

    types, degree, over_steps = _figure(reproduced, "mas_orchestra", "distributions")
    assert sum(degree["series"][0]["y"]) == len(episodes)
    assert [s["label"] for s in over_steps["series"]] == [
        f"{label}: delegating",
        f"{label}: mean degree",
    ]
    assert over_steps["series"][0]["x"] == sorted(float(x) for x in trained.unique())

    (by_depth,) = _figure(reproduced, "mas_orchestra", "distributions", "degree_by_depth")
    drawn = series.orchestration({label: run})
    assert [s["label"] for s in by_depth["series"]] == [
        f"{label}: depth {v}" for v in sorted(drawn["value"].unique())
    ]
    for line, (_, curve) in zip(by_depth["series"], drawn.groupby("value"), strict=True):
        assert line["y"] == pytest.approx(curve.groupby("step")["degree"].mean().tolist())


def test_a_failing_notebook_is_named_and_the_others_still_run(tmp_path):
    reports = tmp_path / "reports" / "hira"
    reports.mkdir(parents=True)
    good = {"cells": [{"cell_type": "code", "metadata": {"tags": ["parameters"]}, "outputs": [],
                       "execution_count": None, "source": "runs = ''\nout_dir = ''\nbenchmark = ''"},
                      {"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None,
                       "source": "open(out_dir + '/t.csv', 'w').write('a\\n1\\n')"}],
            "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
            "nbformat": 4, "nbformat_minor": 5}  # fmt: skip
    bad = json.loads(json.dumps(good))
    bad["cells"][1]["source"] = "raise RuntimeError('no such benchmark: ' + benchmark)"
    (reports / "good.ipynb").write_text(json.dumps(good))
    (reports / "bad.ipynb").write_text(json.dumps(bad))
    results = reproduce("hira", "", tmp_path / "out", benchmark="gaia", reports_dir=tmp_path / "reports")
    by_name = {r.name: r for r in results}
    assert by_name["good"].ok and [p.name for p in by_name["good"].outputs] == ["t.csv"]
    assert not by_name["bad"].ok and "no such benchmark: gaia" in by_name["bad"].error
    index = (tmp_path / "out" / "index.html").read_text()
    assert "1 of 2 notebooks ran" in index and index.index("bad") < index.index("good")
    with pytest.raises(ValueError, match="unknown paper"):
        reproduce("nips", "", tmp_path / "out")
