"""The MARS paper's published numbers under reports/reference/mars/.

Every cell of Tables 1-4 is typed here by hand from /work/shared/papers/mars.txt and compared with the
CSV files, so a slip in either shows up. The arithmetic inconsistencies listed in inconsistencies.csv
are recomputed from the CSV files: those tests fail if someone "fixes" a number the paper printed.
"""

from __future__ import annotations

import math
import re

import pandas as pd
import pytest

from tests.reference_cells import assert_cells
from workbench.reference import REFERENCE_DIR, load_reference, load_side, reference_items

PAPER = "mars"
NAN = float("nan")
HLE_COLUMNS = ["Bio/Med", "Chem.", "CS/AI", "Engineering", "Humanities", "Math", "Physics", "Other", "Avg."]
HLE_CATEGORIES = HLE_COLUMNS[:-1]
HLE_QUESTIONS = 2154
# Questions per HLE category, inferred from the printed percentages (see inconsistencies.csv); they sum
# to the 2,154 text-only questions the paper states.
HLE_CATEGORY_SIZES = {
    "Bio/Med": 221,
    "Chem.": 100,
    "CS/AI": 226,
    "Engineering": 62,
    "Humanities": 193,
    "Math": 975,
    "Physics": 202,
    "Other": 175,
}

PROPRIETARY = "Proprietary Models (For Reference)"
OPEN_SOURCE = "Open-Source Models"
R1_LIKE = "R1-like Reasoning with Search"

# Table 1: (group, Method, Bio/Med, Chem., CS/AI, Engineering, Humanities, Math, Physics, Other, Avg.)
TABLE1 = [
    (PROPRIETARY, "OpenAI Deep Research", NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN, 26.60),
    (PROPRIETARY, "o3 (high)", NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN, 20.57),
    (PROPRIETARY, "o4-mini (high)", NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN, 18.90),
    (PROPRIETARY, "Gemini 2.5 Pro", NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN, 18.38),
    (PROPRIETARY, "Deepseek R1", NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN, 8.54),
    (PROPRIETARY, "Claude 3.7 Sonnet", NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN, 7.89),
    (PROPRIETARY, "o1", NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN, 7.75),
    (PROPRIETARY, "GPT-4.1", NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN, 4.91),
    (PROPRIETARY, "GPT-4o", NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN, 2.32),
    (OPEN_SOURCE, "QwQ-32B", 9.05, 6.00, 4.86, 1.61, 6.21, 4.92, 4.95, 3.42, 5.28),
    (OPEN_SOURCE, "Qwen2.5-72B", 11.31, 6.00, 1.76, 1.61, 7.25, 3.07, 3.96, 2.28, 4.27),
    (OPEN_SOURCE, "Qwen2.5-7B", 5.42, 3.00, 1.76, 3.22, 4.66, 3.58, 1.98, 4.00, 3.52),
    (OPEN_SOURCE, "Qwen3-8B", 6.78, 4.00, 3.53, 3.22, 5.69, 4.21, 3.46, 2.85, 4.31),
    (R1_LIKE, "WebThinker (QwQ-32B)", 14.47, 8.00, 4.42, 6.45, 10.88, 4.51, 1.98, 14.28, 6.87),
    (R1_LIKE, "C-3PO (Qwen2.5-72B)", 9.95, 7.00, 4.86, 9.67, 4.66, 5.43, 3.46, 5.71, 5.79),
    (R1_LIKE, "Search-o1 (Qwen2.5-7B)", 9.95, 2.00, 2.67, 1.61, 4.14, 4.41, 3.98, 7.42, 4.79),
    (R1_LIKE, "Search-R1 (Qwen2.5-7B)", 6.33, 6.00, 4.42, 6.45, 3.62, 3.59, 1.48, 4.00, 3.99),
    (R1_LIKE, "MARS (Qwen2.5-7B)", 12.66, 3.00, 5.75, 4.83, 11.92, 6.46, 6.43, 7.42, 7.38),
    (R1_LIKE, "MARS (Qwen3-8B)", 13.12, 6.00, 8.84, 6.45, 8.29, 7.17, 7.92, 8.57, 8.17),
]

TABLE2_COLUMNS = [
    "Method",
    "Single-Hop QA / NQ",
    "Single-Hop QA / TriviaQA",
    "Single-Hop QA / PopQA",
    "Multi-Hop QA / HotpotQA",
    "Multi-Hop QA / 2Wiki",
    "Multi-Hop QA / Musique",
    "Multi-Hop QA / Bamboogle",
    "Avg.",
]
SINGLE_HOP = TABLE2_COLUMNS[1:4]
MULTI_HOP = TABLE2_COLUMNS[4:8]
# Table 2: (Method, NQ, TriviaQA, PopQA, HotpotQA, 2Wiki, Musique, Bamboogle, Avg.)
TABLE2 = [
    ("Direct Answer", 29.6, 50.0, 30.8, 30.6, 28.4, 13.4, 30.4, 30.45),
    ("Standard RAG", 45.6, 72.0, 46.2, 43.4, 29.4, 25.6, 41.6, 43.40),
    ("Self-RAG", 49.4, 66.2, 38.6, NAN, NAN, NAN, NAN, 51.40),
    ("InstructRAG", 47.8, 66.6, 39.6, NAN, 35.8, NAN, NAN, 47.45),
    ("Auto-RAG", 52.4, 62.2, 36.8, 44.4, 46.8, NAN, NAN, 48.52),
    ("Search-o1", 42.4, 64.6, 38.2, 46.8, 52.8, 26.2, 56.0, 46.71),
    ("Search-R1", 51.6, 72.6, 56.8, 46.6, 50.4, 28.4, 57.4, 51.97),
    ("C-3PO", 47.4, 75.0, 56.8, 48.2, 52.6, 33.2, 60.8, 53.42),
    ("MARS (Qwen2.5-7B)", 60.6, 76.4, 64.4, 60.4, 66.4, 39.6, 68.8, 62.37),
    ("MARS (Qwen3-8B)", 63.2, 78.6, 66.8, 63.6, 69.2, 42.4, 71.2, 65.00),
]

YES, NO = "✓", "✗"
TOOLS = ["Tools / Python", "Tools / G Search", "Tools / Scholar"]
# Table 3: (Python, G Search, Scholar, Bio/Med, Chem., CS/AI, Engineering, Humanities, Math, Physics, Other, Avg.)
TABLE3 = [
    (YES, YES, YES, 12.66, 3.00, 5.75, 4.83, 11.92, 6.46, 6.43, 7.42, 7.38),
    (NO, YES, YES, 13.12, 5.00, 5.31, 4.83, 8.29, 4.92, 5.45, 5.14, 6.21),
    (YES, NO, YES, 11.31, 6.00, 7.07, 3.22, 6.73, 4.92, 3.47, 6.85, 5.99),
    (YES, YES, NO, 11.76, 7.00, 4.42, 4.83, 8.81, 6.05, 4.45, 8.00, 6.72),
    (YES, NO, NO, 4.54, 4.00, 3.98, 6.45, 4.14, 5.02, 3.96, 4.57, 4.64),
    (NO, YES, NO, 12.66, 6.00, 5.31, 3.22, 7.77, 4.41, 5.94, 8.00, 6.12),
    (NO, NO, YES, 12.21, 7.00, 4.42, 4.83, 5.69, 4.51, 5.44, 4.57, 5.61),
]

# Table 4: (Dataset, G Web Pages, Papers, Python)
TABLE4 = [
    ("PopQA", 18.81, 0.04, 0.0),
    ("hotpotqa", 17.38, 0.12, 0.002),
    ("HLE", 22.31, 0.17, 0.05),
]


def _row(frame: pd.DataFrame, column: str, label: str) -> pd.Series:
    picked = frame[frame[column] == label]
    assert len(picked) == 1, label
    return picked.iloc[0]


def _tools_row(table3: pd.DataFrame, python: str, search: str, scholar: str) -> pd.Series:
    flags = (table3[TOOLS[0]] == python) & (table3[TOOLS[1]] == search) & (table3[TOOLS[2]] == scholar)
    assert flags.sum() == 1
    return table3[flags].iloc[0]


def _attainable(value: float, n: int) -> bool:
    """Whether ``value`` is 100*k/n for a whole k, rounded or truncated to two decimals."""
    for k in range(n + 1):
        exact = 100 * k / n
        if math.isclose(round(exact, 2), value, abs_tol=1e-9):
            return True
        if math.isclose(math.floor(exact * 100 + 1e-9) / 100, value, abs_tol=1e-9):
            return True
    return False


def _claim(item: str, starts_with: str) -> float:
    claims = load_side(PAPER, "claims")
    picked = claims[(claims["item"] == item) & claims["claim"].str.startswith(starts_with)]
    assert len(picked) == 1, starts_with
    return float(picked.iloc[0]["value"])


# --- the printed tables, cell by cell -------------------------------------------------------------


def test_table1_hle_main_results():
    assert_cells(load_reference(PAPER, "table1"), ["group", "Method", *HLE_COLUMNS], TABLE1)


def test_table2_knowledge_intensive_tasks():
    assert_cells(load_reference(PAPER, "table2"), TABLE2_COLUMNS, TABLE2)


def test_table3_tool_ablation():
    assert_cells(load_reference(PAPER, "table3"), [*TOOLS, *HLE_COLUMNS], TABLE3)


def test_table4_information_volume():
    assert_cells(load_reference(PAPER, "table4"), ["Dataset", "G Web Pages", "Papers", "Python"], TABLE4)


def test_numbers_keep_their_printed_digits():
    text = {
        item: (REFERENCE_DIR / PAPER / f"{item}.csv").read_text(encoding="utf-8")
        for item in ("table1", "table2", "table4")
    }
    assert "Proprietary Models (For Reference),OpenAI Deep Research,,,,,,,,,26.60" in text["table1"]
    assert "Open-Source Models,Qwen2.5-72B,11.31,6.00," in text["table1"]
    assert "C-3PO,47.4,75.0,56.8,48.2,52.6,33.2,60.8,53.42" in text["table2"]
    assert "MARS (Qwen3-8B),63.2,78.6,66.8,63.6,69.2,42.4,71.2,65.00" in text["table2"]
    assert "PopQA,18.81,0.04,0.0" in text["table4"]


def test_table3_full_tool_row_is_the_table1_mars_row():
    table1 = load_reference(PAPER, "table1")
    full = _tools_row(load_reference(PAPER, "table3"), YES, YES, YES)
    mars = _row(table1, "Method", "MARS (Qwen2.5-7B)")
    assert [full[c] for c in HLE_COLUMNS] == pytest.approx([mars[c] for c in HLE_COLUMNS])


def test_consistent_headline_numbers():
    table1 = load_reference(PAPER, "table1")
    table2 = load_reference(PAPER, "table2")
    gain_hle = (
        _row(table1, "Method", "MARS (Qwen2.5-7B)")["Avg."] - _row(table1, "Method", "Qwen2.5-7B")["Avg."]
    )
    assert gain_hle == pytest.approx(
        _claim("table1", "Gain of MARS (Qwen2.5-7B) over its base model"), abs=1e-9
    )
    gain_qa = _row(table2, "Method", "MARS (Qwen2.5-7B)")["Avg."] - _row(table2, "Method", "C-3PO")["Avg."]
    assert gain_qa == pytest.approx(_claim("table2", "Gain of MARS (Qwen2.5-7B) over C-3PO"), abs=1e-9)
    self_rag = _row(table2, "Method", "Self-RAG")
    assert self_rag[SINGLE_HOP].mean() == pytest.approx(self_rag["Avg."], abs=1e-9)


# --- the paper's own inconsistencies, recomputed from the CSV files -------------------------------


def test_multi_hop_gain_is_not_the_claimed_12_2():
    table2 = load_reference(PAPER, "table2")
    mars, c3po = _row(table2, "Method", "MARS (Qwen2.5-7B)"), _row(table2, "Method", "C-3PO")
    gain = mars[MULTI_HOP].mean() - c3po[MULTI_HOP].mean()
    assert gain == pytest.approx(10.10, abs=1e-9)
    assert abs(gain - _claim("table2", "Average gain of MARS over C-3PO on the four multi-hop")) > 1.0


def test_single_hop_gain_is_not_the_claimed_7_5():
    table2 = load_reference(PAPER, "table2")
    mars, c3po = _row(table2, "Method", "MARS (Qwen2.5-7B)"), _row(table2, "Method", "C-3PO")
    gain = mars[SINGLE_HOP].mean() - c3po[SINGLE_HOP].mean()
    assert gain == pytest.approx(7.40, abs=1e-9)
    best_baselines = table2[~table2["Method"].str.startswith("MARS")][SINGLE_HOP].max()
    assert mars[SINGLE_HOP].mean() - best_baselines.mean() == pytest.approx(5.7333, abs=1e-3)
    assert gain != pytest.approx(_claim("table2", "Average gain of MARS over the previous best"), abs=0.05)


@pytest.mark.parametrize(("method", "rounded"), [("Direct Answer", 30.46), ("C-3PO", 53.43)])
def test_table2_averages_are_truncated_not_rounded(method, rounded):
    row = _row(load_reference(PAPER, "table2"), "Method", method)
    mean = row[TABLE2_COLUMNS[1:8]].mean()
    assert round(mean, 2) == pytest.approx(rounded, abs=1e-9)
    assert row["Avg."] != pytest.approx(rounded, abs=1e-9)
    assert math.floor(mean * 100) / 100 == pytest.approx(row["Avg."], abs=1e-9)


def test_search_removal_drops_differ_from_the_text_by_a_hundredth():
    table3 = load_reference(PAPER, "table3")
    full, no_search = _tools_row(table3, YES, YES, YES), _tools_row(table3, YES, NO, YES)
    assert no_search["Avg."] - full["Avg."] == pytest.approx(-1.39, abs=1e-9)
    assert _claim("table3", "Change in Avg. when Google Search is removed") == pytest.approx(-1.38)
    assert no_search["Physics"] - full["Physics"] == pytest.approx(-2.96, abs=1e-9)
    assert _claim("table3", "Change in Physics when Google Search is removed") == pytest.approx(-2.95)


def test_python_removal_hurts_humanities_and_other_more_than_math_and_physics():
    table3 = load_reference(PAPER, "table3")
    full, no_python = _tools_row(table3, YES, YES, YES), _tools_row(table3, NO, YES, YES)
    change = {c: no_python[c] - full[c] for c in HLE_CATEGORIES}
    assert change["Math"] == pytest.approx(_claim("table3", "Change in Math when Python"), abs=1e-9)
    assert change["Physics"] == pytest.approx(_claim("table3", "Change in Physics when Python"), abs=1e-9)
    assert min(change, key=change.get) == "Humanities"
    assert change["Humanities"] == pytest.approx(-3.63, abs=1e-9)
    assert change["Other"] < change["Math"] < change["Physics"]


def test_removing_scholar_raises_other():
    table3 = load_reference(PAPER, "table3")
    full, no_scholar = _tools_row(table3, YES, YES, YES), _tools_row(table3, YES, YES, NO)
    assert no_scholar["Other"] > full["Other"]
    change = {c: no_scholar[c] - full[c] for c in HLE_CATEGORIES}
    assert min(change, key=change.get) == "Humanities"


def test_inferred_category_sizes_sum_to_the_hle_subset_and_fit_the_averages():
    assert sum(HLE_CATEGORY_SIZES.values()) == HLE_QUESTIONS
    rows = [r for _, r in load_reference(PAPER, "table1").dropna(subset=["Math"]).iterrows()]
    rows += [r for _, r in load_reference(PAPER, "table3").iterrows()]
    off = []
    for row in rows:
        weighted = sum(row[c] * n for c, n in HLE_CATEGORY_SIZES.items()) / HLE_QUESTIONS
        if abs(weighted - row["Avg."]) > 0.01:
            off.append(round(row["Avg."], 2))
    assert off == [6.21]


def test_no_python_average_does_not_match_its_categories():
    row = _tools_row(load_reference(PAPER, "table3"), NO, YES, YES)
    weighted = sum(row[c] * n for c, n in HLE_CATEGORY_SIZES.items()) / HLE_QUESTIONS
    assert round(weighted, 2) == pytest.approx(6.17, abs=1e-9)
    assert row["Avg."] == pytest.approx(6.21, abs=1e-9)


def test_some_averages_are_no_accuracy_over_2154_questions():
    table1 = load_reference(PAPER, "table1").dropna(subset=["Math"])
    bad1 = [
        m
        for m, avg in zip(table1["Method"], table1["Avg."], strict=True)
        if not _attainable(avg, HLE_QUESTIONS)
    ]
    assert bad1 == ["QwQ-32B", "C-3PO (Qwen2.5-72B)", "Search-o1 (Qwen2.5-7B)"]
    table3 = load_reference(PAPER, "table3")
    bad3 = [avg for avg in table3["Avg."] if not _attainable(avg, HLE_QUESTIONS)]
    assert bad3 == pytest.approx([6.21, 6.72])


def test_some_cells_are_no_whole_number_of_questions():
    table1 = load_reference(PAPER, "table1").dropna(subset=["Math"])
    table3 = load_reference(PAPER, "table3")
    bad = []
    for name, frame, labels in (
        ("table1", table1, table1["Method"]),
        ("table3", table3, table3[TOOLS].agg("".join, axis=1)),
    ):
        for label, (_, row) in zip(labels, frame.iterrows(), strict=True):
            for column, n in HLE_CATEGORY_SIZES.items():
                if not _attainable(row[column], n):
                    bad.append((name, label, column, row[column]))
    assert bad == [
        ("table1", "Search-o1 (Qwen2.5-7B)", "CS/AI", 2.67),
        ("table1", "Search-o1 (Qwen2.5-7B)", "Physics", 3.98),
        ("table3", YES + NO + NO, "Bio/Med", 4.54),
    ]


def test_underlined_second_best_cs_ai_is_third():
    table1 = load_reference(PAPER, "table1").dropna(subset=["CS/AI"])
    c3po = _row(table1, "Method", "C-3PO (Qwen2.5-72B)")["CS/AI"]
    assert c3po == pytest.approx(4.86)
    assert (table1["CS/AI"] > c3po).sum() == 2


def test_training_curve_ends_above_the_final_hle_score():
    table1 = load_reference(PAPER, "table1")
    assert _claim("fig3", "HLE-320 score at the end") > _row(table1, "Method", "MARS (Qwen2.5-7B)")["Avg."]


# --- the side files ------------------------------------------------------------------------------


def test_side_files_have_their_columns():
    assert list(load_side(PAPER, "sources").columns) == ["item", "caption", "source", "notes"]
    assert list(load_side(PAPER, "claims").columns) == ["item", "claim", "value", "qualifier", "source"]
    assert list(load_side(PAPER, "inconsistencies").columns) == ["item", "what", "check", "note"]
    assert set(load_side(PAPER, "claims")["qualifier"]) <= {"exact", "approx", "at least", "at most"}


def test_every_table_has_a_source_and_every_item_is_known():
    items = reference_items(PAPER)
    assert items == ["table1", "table2", "table3", "table4"]
    sources = load_side(PAPER, "sources")
    assert sorted(sources["item"]) == items
    assert sources["caption"].notna().all() and sources["source"].notna().all()
    for kind in ("claims", "inconsistencies"):
        for item in load_side(PAPER, kind)["item"]:
            assert item in items or re.fullmatch(r"fig\d+|text", item), (kind, item)
