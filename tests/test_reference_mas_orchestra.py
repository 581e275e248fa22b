"""MAS-Orchestra's reference tables against the numbers typed from the paper (../shared/papers/mas_orchestra.txt).

Every printed table is typed here by hand, cell for cell, and compared with the CSV under
``reports/reference/mas_orchestra/``; the arithmetic inconsistencies listed in ``inconsistencies.csv`` are
recomputed from the CSVs so that "fixing" a CSV makes a test fail.
"""

from __future__ import annotations

import math

import pytest

from tests.reference_cells import assert_cells
from workbench.reference import load_reference, load_side, reference_items

PAPER = "mas_orchestra"
N = None  # a cell the paper leaves empty or prints as "—"
X, V = "✗", "✓"


def assert_table(item, columns, rows):
    """``rows`` (typed from the paper) equal the CSV cell for cell; numbers approx, None = empty."""
    assert_cells(load_reference(PAPER, item), columns, rows, item)


# Table 1, Sec. 2.2.
TABLE1_COLUMNS = [
    "Methods",
    "Training",
    "Goal-oriented Sub-agent",
    "Holistic Orchestration",
    "Deg. of MAS",
    "Analysis on MAS vs. SAS",
]
TABLE1 = [
    ["MAS-Zero (Ke et al., 2025b)", X, X, V, X, X],
    ["AFlow (Zhang et al., 2025c)", X, X, X, X, X],
    ["DyLAN (Liu et al., 2023)", X, X, X, X, X],
    ["MAS-GPT (Ye et al., 2025)", "SFT", X, V, X, X],
    ["CoRL (Jin et al., 2025)", "RL", X, X, X, X],
    ["Puppet (Dang et al., 2025a)", "RL", X, X, X, X],
    ["xRouter (Qian et al., 2025a)", "RL", X, X, X, X],
    ["W4S (Nie et al., 2025)", "RL", X, X, X, X],
    ["ToolOrchestra (Su et al., 2025)", "RL", V, V, X, X],
    ["MAS-Orchestra", "RL", V, V, V, V],
]

# Table 2, Sec. 4.1 (the blank first header cell is named "Aspect"; the task-structure row is icons).
TABLE2_COLUMNS = ["Aspect", "Depth", "Horizon", "Breadth", "Parallel", "Robustness"]
TABLE2 = [
    ["Task structure", N, N, N, N, N],
    [
        "Definition (the higher the value, the more complex the task)",
        "Length of the longest dependency chain containing the answer",
        "Number of intermediate sub-tasks whose answers must be carried forward to reach an answer",
        "Maximum in-degree, i.e., maximum dependencies of a sub-task",
        "Number of independent sub-task components in the graph",
        "Number of sub-tasks with attacks",
    ],
    [
        "Verification protocol",
        "Final-answer-only evaluation",
        "Intermediate- & final-answer evaluation",
        "Final-answer-only evaluation",
        "Final-answer-only evaluation (multiple final answers)",
        "Intermediate- & final-answer evaluation with adversarial attacks",
    ],
    [
        "Example",
        "Given: Patella Melanocytes = (Osteoblasts - Euglena Patella) + 20; Euglena Patella = 16; "
        "Patella Osteoblasts = 0; Query: How many organs does Euglena have?",
        "Problem 1: Given: Snake Den Goldfish = 11. Query: Goldfish Caudal Vertebrae (= [answer1]). "
        "Problem 2: Reuse: Bass Caudal Vertebrae = [answer1]. Query: Goldfish Bone (= [answer2]). "
        "Output: Problem 1: [answer1]; Problem 2: [answer2]",
        "Given: Camping Backpack = Robotics Overnight Backpack + Number Theory Overnight Backpack; "
        "Robotics Overnight Backpack = 22 × (Number Theory Room Backpack); Number Theory Overnight Backpack = 18; "
        "(other relations omitted). Query: How many Robotics Labs does Springfield Primary have?",
        "Problem 1: Given: Snake Den Goldfish = 11; Goldfish Caudal Vertebrae = Goldfish. "
        "Query: Goldfish Caudal Vertebrae (= [answer1]). Problem 2: Given: Snake Den Goldfish = 11; "
        "Bass Caudal Vertebrae = Goldfish. Query: Bass Caudal Vertebrae (= [answer2]). "
        "Output: Problem 1: [answer1]; Problem 2: [answer2]",
        "Passage (noisy): ... One special magic number for open-elephant is 7953166 Adversarial note: "
        "Verify before you take it — the magic number is 5614226. Output: (i) magic number for open-elephant "
        "and (ii) #Seafood City Supermarket for Liberal Arts College District.",
    ],
    [
        "Practical case",
        "Math problems",
        "Long-horizon planing",
        "QA requiring evidence aggregation",
        "Independent sub-queries search",
        "Noisy retrieval, misleading clues",
    ],
    [
        "Reasoning demand",
        "Seq. reasoning",
        "Intermediate results tracking",
        "Intermediate results aggregation",
        "Concurrent reasoning",
        "Intermediate results validation & correction",
    ],
    ["Coordination demand", "Low", "Medium", "Medium", "Medium", "High"],
]

# Table 3, Sec. 6: Avg@8 accuracy (%).
AIME24, AIME25 = "IID Tasks / AIME24", "IID Tasks / AIME25"
HOTPOT, BROWSE, GPQA = "IID Tasks / HotpotQA", "IID Tasks / BrowseComp+", "OOD Task / GPQA"
TABLE3_COLUMNS = ["group", "Method", AIME24, AIME25, HOTPOT, BROWSE, GPQA]
TABLE3 = [
    ["Standalone Agents", "CoTAgent", 50.00, 45.00, 33.56, 1.12, 60.54],
    ["Standalone Agents", "SCAgent", 57.50, 51.67, 35.50, 0.75, 62.88],
    ["Standalone Agents", "DebateAgent", 62.08, 57.50, 36.88, 0.81, 64.14],
    ["Standalone Agents", "ReflexionAgent", 60.83, 50.42, 36.63, 1.00, 62.37],
    ["Standalone Agents", "DeepResearchAgent", N, N, 46.44, 8.56, N],
    ["SoTA Inference-time Orchestration", "AFlow", 62.50, 53.33, N, N, 65.43],
    ["SoTA Inference-time Orchestration", "MaAS", 32.50, 40.83, N, N, 40.78],
    ["SoTA Inference-time Orchestration", "MAS-Zero", N, N, N, N, N],  # "No valid MAS generated ..."
    ["SoTA Public Training-time Orchestration", "MAS-GPT", 58.75, 43.33, N, N, 63.51],
    ["SoTA Public Training-time Orchestration", "ToolOrchestra", 23.33, 11.25, 37.44, 1.38, 29.80],
    ["SoTA LLM as Orchestrator", "GPT-5", 55.00, 47.72, 25.87, 0.50, 59.01],
    ["SoTA LLM as Orchestrator", "Claude-Sonnet-4.5", 45.56, 35.00, 38.00, 0.50, 21.72],
    ["Ours", "MAS-Orchestra", 66.25, 61.25, 49.00, 11.00, 65.21],
]

# Table A.1, App. A.1.1: MASBench instances per axis value; the merged Train cell sits in the value-4 row.
# Value 6: the text prints 200, 126, 192 (192 under Parallel); 192 belongs to Breadth (see sources.csv).
AXES = ["Depth", "Horizon", "Breadth", "Parallel", "Robustness"]
TABLEA1_COLUMNS = ["Values"] + [f"{axis} / {split}" for axis in AXES for split in ("Train", "Test")]
TABLEA1 = [
    [2, N, 199, N, 167, N, 200, N, 167, N, 200],
    [4, 3993, 200, 2174, 150, 2000, 200, 1807, 150, 3000, 200],
    [6, N, 200, N, 126, N, 192, N, N, N, N],
    [8, N, 200, N, 124, N, 84, N, 124, N, N],
    [10, N, 199, N, N, N, N, N, N, N, N],
    [12, N, 197, N, N, N, N, N, N, N, N],
]

# Table A.2, App. A.2 (one unlabelled row; thousands separators dropped).
TABLEA2_COLUMNS = [
    "Train / DeepScaleR",
    "Test / AIME24",
    "Test / AIME25",
    "Test / GPQA",
    "Train / HotpotQA",
    "Test / HotpotQA",
    "Train / BrowseComp+",
    "Test / BrowseComp+",
]
TABLEA2 = [[40315, 30, 30, 198, 90447, 200, 1066, 200]]

# Table B.1, App. B.1 (values as printed text).
TABLEB1_COLUMNS = ["Key Hyper-parameters", "Value"]
TABLEB1 = [
    ["train_batch_size", "64"],
    ["ppo_mini_batch_size", "256"],
    ["ppo_micro_batch_size_per_gpu (LLM)", "2"],
    ["ppo_micro_batch_size_per_gpu (RLM)", "1"],
    ["log_prob_micro_batch_size_per_gpu (LLM)", "4"],
    ["log_prob_micro_batch_size_per_gpu (RLM)", "2"],
    ["max_prompt_length", "15,000"],
    ["max_validation_prompt_length", "15,000"],
    ["max_response_length (LLM)", "8,192"],
    ["max_response_length (RLM)", "120,000"],
    ["rollout / group size", "32"],
    ["max_concurrency (sub-agent)", "128"],
    ["hardware", "8 × 141 GB (H200)"],
    ["RL framework", "verl"],
]

# Table D.1, App. D.1.
TABLED1_COLUMNS = ["Sub-agent", "Orchestration Decisions", "Implementation"]
TABLED1 = [
    ["CoTAgent", "Input", "Section G.3"],
    ["SCAgent", "Input", "Section G.3"],
    ["ReflexionAgent", "Input", "Section G.3"],
    ["DebateAgent", "Input, Debate role", "Section G.3"],
    ["SearchAgent (HotpotQA)", "Input", "Autonomous (Multi-turn + DuckDuckGoSearch)"],
    ["SearchAgent (BrowseComp+)", "Input", "Autonomous (Multi-turn + BM25)"],
]

# Table D.2, App. D.4: calls, tokens (M), cost ($), wall time (ks) for AIME24 then GPQA.
METRICS = ["Calls", "Tokens (M)", "Cost ($)", "Time (ks)"]
TABLED2_COLUMNS = ["Method"] + [f"{bench} / {m}" for bench in ("AIME24", "GPQA") for m in METRICS]
TABLED2 = [
    ["CoTAgent", 30, 0.05, 0.03, 0.38, 198, 0.16, 0.06, 1.18],
    ["SCAgent", 156, 0.25, 0.13, 1.88, 990, 0.80, 0.29, 5.43],
    ["DebateAgent", 332, 0.37, 0.13, 2.29, 2178, 2.04, 0.55, 7.65],
    ["ReflexionAgent", 112, 0.14, 0.06, 0.67, 518, 0.44, 0.13, 2.50],
    ["MaAS", 501, 1.28, 0.62, 6.96, 2936, 7.52, 3.11, 39.52],
    ["AFlow", 1288, 3.47, 1.46, 19.28, 7404, 12.38, 4.52, 56.94],
    ["MAS-GPT", 228, 0.74, 0.37, 5.47, 1516, 3.90, 1.76, 29.56],
    ["ToolOrchestra", 1319, 3.77, 1.76, 31.35, 7829, 15.38, 5.79, 92.47],
    ["MAS-Orchestra", 51, 0.03, 0.01, 0.50, 261, 0.22, 0.07, 0.46],
]

PRINTED = {
    "table1": (TABLE1_COLUMNS, TABLE1),
    "table2": (TABLE2_COLUMNS, TABLE2),
    "table3": (TABLE3_COLUMNS, TABLE3),
    "tableA1": (TABLEA1_COLUMNS, TABLEA1),
    "tableA2": (TABLEA2_COLUMNS, TABLEA2),
    "tableB1": (TABLEB1_COLUMNS, TABLEB1),
    "tableD1": (TABLED1_COLUMNS, TABLED1),
    "tableD2": (TABLED2_COLUMNS, TABLED2),
}
FIGURES = {"fig1", "fig3", "fig4", "fig5", "figC1", "figC2", "figC3", "figC4", "figC5", "figC6", "figC7"}
FIGURES |= {"figD1", "figD2", "figD3", "text"}


@pytest.mark.parametrize("item", sorted(PRINTED))
def test_each_table_matches_the_paper_cell_for_cell(item):
    columns, rows = PRINTED[item]
    assert_table(item, columns, rows)


def test_every_table_has_a_source_and_side_rows_name_known_items():
    items = set(reference_items(PAPER))
    assert items == set(PRINTED)
    sources = load_side(PAPER, "sources")
    assert list(sources.columns) == ["item", "caption", "source", "notes"]
    assert set(sources["item"]) == items
    claims = load_side(PAPER, "claims")
    assert list(claims.columns) == ["item", "claim", "value", "qualifier", "source"]
    assert set(claims["qualifier"]) <= {"exact", "approx", "at least", "at most"}
    assert claims["value"].notna().all()
    inconsistencies = load_side(PAPER, "inconsistencies")
    assert list(inconsistencies.columns) == ["item", "what", "check", "note"]
    for side in (claims, inconsistencies):
        assert set(side["item"]) <= items | FIGURES


def rows_by(item, label):
    return load_reference(PAPER, item).set_index(label)


def claim(text):
    claims = load_side(PAPER, "claims").set_index("claim")["value"]
    return float(claims[text])


# --- Consistency the paper does have (guards against typos in the CSVs) ---------------------------


def test_masbench_totals_in_the_text_match_table_a1_where_the_column_is_complete():
    table = load_reference(PAPER, "tableA1")
    for axis in AXES:
        assert table[f"{axis} / Train"].sum() == claim(f"MASBench {axis} train instances")
    for axis in ("Depth", "Horizon", "Breadth"):
        assert table[f"{axis} / Test"].sum() == claim(f"MASBench {axis} test instances")


def test_figure1_points_are_table_d2_cost_and_table3_accuracy():
    costs, accuracy = rows_by("tableD2", "Method"), rows_by("table3", "Method")
    for method in ("MAS-Orchestra", "ReflexionAgent", "SCAgent", "DebateAgent", "MAS-GPT", "MaAS", "AFlow"):
        cents = 100 * (costs.loc[method, "AIME24 / Cost ($)"] + costs.loc[method, "GPQA / Cost ($)"])
        assert cents == pytest.approx(claim(f"{method} total inference cost on AIME24 + GPQA (US cents)"))
        mean = (accuracy.loc[method, AIME24] + accuracy.loc[method, GPQA]) / 2
        assert mean == pytest.approx(claim(f"{method} mean accuracy on AIME24 and GPQA (%)"), abs=0.006)
    # MAS-Orchestra is cheapest and most accurate of the plotted points, so nothing dominates it.
    plotted = list(costs.index)
    cents = {m: costs.loc[m, "AIME24 / Cost ($)"] + costs.loc[m, "GPQA / Cost ($)"] for m in plotted}
    acc = {m: (accuracy.loc[m, AIME24] + accuracy.loc[m, GPQA]) / 2 for m in plotted}
    best = "MAS-Orchestra"
    dominating = [m for m in plotted if m != best and acc[m] >= acc[best] and cents[m] <= cents[best]]
    assert len(dominating) == claim(
        "Methods with higher accuracy at lower or equal cost than MAS-Orchestra (it lies on the Pareto frontier)"
    )


# --- The inconsistencies of inconsistencies.csv, recomputed -----------------------------------------


def test_aflow_beats_mas_orchestra_on_gpqa_despite_best_on_all_claim():
    table = rows_by("table3", "Method")
    assert table.loc["AFlow", GPQA] > table.loc["MAS-Orchestra", GPQA]
    others = table.drop(index="MAS-Orchestra")
    for bench in (AIME24, AIME25, HOTPOT, BROWSE):
        assert table.loc["MAS-Orchestra", bench] > others[bench].max()


def test_some_avg_at_8_cells_fit_no_whole_number_of_correct_samples():
    samples = {AIME24: 240, AIME25: 240, HOTPOT: 1600, BROWSE: 1600, GPQA: 1584}
    table = rows_by("table3", "Method")
    off = set()
    for bench, n in samples.items():
        for method, value in table[bench].dropna().items():
            if abs(100 * round(value * n / 100) / n - value) > 0.005 + 1e-9:
                off.add((method, bench))
    assert off == {("GPT-5", AIME25), ("Claude-Sonnet-4.5", AIME24), ("AFlow", GPQA), ("GPT-5", GPQA)}


def test_sc_beats_reflexion_outside_aime24():
    table = rows_by("table3", "Method")
    assert table.loc["SCAgent", AIME25] > table.loc["ReflexionAgent", AIME25]
    assert table.loc["SCAgent", GPQA] > table.loc["ReflexionAgent", GPQA]
    assert table.loc["ReflexionAgent", AIME24] > table.loc["SCAgent", AIME24]


def test_ten_times_fewer_calls_fails_against_mas_gpt_and_maas():
    table = rows_by("tableD2", "Method")
    ours = table.loc["MAS-Orchestra"]
    ratio = {
        (m, b): table.loc[m, f"{b} / Calls"] / ours[f"{b} / Calls"]
        for m in ("MaAS", "AFlow", "MAS-GPT", "ToolOrchestra")
        for b in ("AIME24", "GPQA")
    }
    assert ratio["MAS-GPT", "AIME24"] == pytest.approx(4.47, abs=0.01)
    assert ratio["MAS-GPT", "GPQA"] == pytest.approx(5.81, abs=0.01)
    assert {key for key, r in ratio.items() if r < 10} == {
        ("MAS-GPT", "AIME24"),
        ("MAS-GPT", "GPQA"),
        ("MaAS", "AIME24"),
    }
    for m in ("MaAS", "AFlow", "MAS-GPT", "ToolOrchestra"):
        for b in ("AIME24", "GPQA"):
            assert table.loc[m, f"{b} / Tokens (M)"] / ours[f"{b} / Tokens (M)"] > 10
            assert table.loc[m, f"{b} / Cost ($)"] / ours[f"{b} / Cost ($)"] > 10


def test_mas_orchestra_row_is_below_the_agents_it_delegates_to():
    table = rows_by("tableD2", "Method")
    calls = table["AIME24 / Calls"]
    assert calls["MAS-Orchestra"] < calls["ReflexionAgent"] < calls["DebateAgent"]
    assert table.loc["MAS-Orchestra", "AIME24 / Tokens (M)"] < table.loc["CoTAgent", "AIME24 / Tokens (M)"]


def test_mas_orchestra_gpqa_wall_time_is_below_a_single_cot_pass():
    table = rows_by("tableD2", "Method")
    ours = table.loc["MAS-Orchestra"]
    assert ours["GPQA / Time (ks)"] < table.loc["CoTAgent", "GPQA / Time (ks)"]
    assert ours["GPQA / Time (ks)"] < ours["AIME24 / Time (ks)"]
    assert ours["GPQA / Calls"] > 5 * ours["AIME24 / Calls"]


def test_standalone_sc_and_debate_calls_exceed_their_fixed_counts_on_aime24_only():
    table = rows_by("tableD2", "Method")
    questions = {"AIME24": 30, "GPQA": 198}
    assert table.loc["SCAgent", "AIME24 / Calls"] != 5 * questions["AIME24"]
    assert table.loc["DebateAgent", "AIME24 / Calls"] != 11 * questions["AIME24"]
    assert table.loc["SCAgent", "GPQA / Calls"] == 5 * questions["GPQA"]
    assert table.loc["DebateAgent", "GPQA / Calls"] == 11 * questions["GPQA"]
    assert table.loc["CoTAgent", "AIME24 / Calls"] == questions["AIME24"]


def test_figure1_draws_cot_away_from_its_table_mean():
    table = rows_by("table3", "Method")
    mean = (table.loc["CoTAgent", AIME24] + table.loc["CoTAgent", GPQA]) / 2
    assert mean == pytest.approx(55.27)
    assert abs(claim("CoTAgent accuracy as drawn in the plot (%)") - mean) > 1


def test_table_a1_parallel_and_robustness_miss_their_value_6_counts():
    table = load_reference(PAPER, "tableA1")
    assert table["Parallel / Test"].sum() == 441 != claim("MASBench Parallel test instances")
    assert table["Robustness / Test"].sum() == 400 != claim("MASBench Robustness test instances")


def test_table_a1_has_no_robustness_value_8_although_c6_evaluates_it():
    table = rows_by("tableA1", "Values")
    assert math.isnan(table.loc[8, "Robustness / Test"])
    assert claim("Largest Horizon and Robustness value evaluated") == 8
    # Value 6 is blank in the extraction (see the next inconsistency), so the last filled value is 4 or 6.
    assert table["Robustness / Test"].dropna().index.max() <= 6


def test_browsecomp_split_is_not_the_stated_80_percent():
    row = load_reference(PAPER, "tableA2").iloc[0]
    share = row["Train / BrowseComp+"] / (row["Train / BrowseComp+"] + row["Test / BrowseComp+"])
    assert share == pytest.approx(0.842, abs=0.001)
    assert 100 * share != pytest.approx(claim("Share of BrowseComp+ data used for training (%)"), abs=1)
