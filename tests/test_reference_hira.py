"""HiRA's reference tables against numbers typed from the paper (shared/papers/hira.txt).

Also recomputes each arithmetic inconsistency in ``inconsistencies.csv`` from the CSV files, so a
test fails if someone "fixes" a printed number, and checks that the side files name known items.
"""

from __future__ import annotations

import math

import pandas as pd
import pytest

from workbench.reference import REFERENCE_DIR, load_reference, load_side, reference_items

NAN = math.nan
GAIA = "General AI Assistant"
WEB = "WebWalkerQA"
HLE = "Humanity's Last Exam"
TABLE1_COLUMNS = [
    f"{GAIA} / Level 1",
    f"{GAIA} / Level 2",
    f"{GAIA} / Level 3",
    f"{GAIA} / Avg.",
    f"{WEB} / Easy",
    f"{WEB} / Med.",
    f"{WEB} / Hard",
    f"{WEB} / Avg.",
    f"{HLE} / NS",
    f"{HLE} / CE",
    f"{HLE} / SF",
    f"{HLE} / Avg.",
    "SimpleQA / Acc",
]
TABLE2_COLUMNS = ["GAIA-B", "GAIA-F", "Web.", "HLE", "Simp.", "Avg."]

# Typed from Table 1 of hira.txt: {group: {method: 13 cells}}; "-" is NaN.
TABLE1 = {
    "Direct Reasoning": {
        "Qwen3-32B-no-thinking": (14.3, 6.1, 10.5, 9.5, 4.4, 2.1, 0.8, 2.8, 7.1, 6.0, 3.1, 6.2, 6.5),
        "Qwen3-32B-thinking": (26.2, 12.1, 0, 14.9, 6.9, 1.1, 2.9, 3.1, 14.6, 9.8, 8.4, 12.6, 10.5),
        "DeepSeek-R1-32B": (21.5, 13.6, 0.0, 14.2, 7.5, 1.4, 4.2, 3.8, 6.6, 5.1, 6.5, 6.4, 5.5),
        "QwQ-32B": (30.9, 6.5, 5.2, 18.9, 7.5, 2.1, 4.6, 4.3, 11.5, 7.3, 5.2, 9.6, 6.5),
        "GPT-4o": (23.1, 15.4, 8.3, 17.5, 6.7, 6.0, 4.2, 5.5, 2.7, 1.2, 3.2, 2.6, 39.0),
        "DeepSeek-R1-671B": (40.5, 21.2, 5.2, 25.2, 5.0, 11.8, 11.3, 10.0, 8.5, 8.1, 9.3, 8.6, 42.4),
        "o1-preview†": (NAN, NAN, NAN, NAN, 11.9, 10.4, 7.9, 9.9, 12.9, 8.1, 6.6, 11.1, 42.7),
    },
    "Single-Capability Enhanced": {
        "Vanilla RAG": (40.5, 21.2, 5.2, 25.2, 57.4, 44.6, 40.0, 46.0, 10.6, 3.7, 11.6, 9.6, 72.5),
        "Search-o1": (45.3, 25.8, 5.3, 29.1, 70.2, 44.6, 40.0, 49.0, 13.0, 8.5, 12.6, 12.2, 74.0),
        "WebThinker": (50.0, 34.9, 10.5, 36.2, 55.3, 53.0, 50.0, 52.5, 13.9, 9.7, 12.6, 13.0, 78.0),
        "CodeAct": (26.2, 15.1, 0.0, 16.5, 6.4, 4.8, 4.3, 5.0, 9.9, 6.1, 10.5, 9.4, 7.5),
        "Multimodal Enhanced": (23.8, 9.1, 0.0, 12.6, 4.3, 0, 4.3, 4.0, 9.3, 9.8, 8.4, 9.2, 10.5),
    },
    "Multi-Capability Enhanced": {
        "Plan-and-Solve": (28.6, 18.2, 0.0, 18.9, 44.7, 33.7, 24.3, 33.0, 10.2, 4.9, 7.3, 8.8, 57.5),
        "ReAct": (45.3, 28.8, 5.2, 30.7, 46.8, 31.3, 31.4, 35.0, 12.7, 11.0, 20.0, 13.8, 73.5),
        "HiRA (ours)": (61.9, 37.9, 15.8, 42.5, 59.6, 54.2, 51.4, 54.5, 15.2, 11.0, 13.7, 14.2, 81.5),
    },
}

# Typed from Table 2 of hira.txt; the HiRA row sits under no heading (group None).
TABLE2 = {
    None: {"HiRA": (42.5, 42.1, 54.5, 14.2, 81.5, 44.9)},
    "Coordinator Layer": {
        "w/o Reasoning Transfer": (33.9, 36.8, 44.5, 10.4, 76.5, 40.4),
        "w/o Memory": (37.8, 31.6, 52.0, 11.8, 79.0, 42.4),
    },
    "Executor Layer": {
        "w/o Search": (15.7, 31.6, 4.0, 12.4, 9.5, 14.6),
        "w/o Code": (33.9, 28.9, 51.5, 12.8, 76.5, 40.7),
        "w/o Multimodal": (36.2, 36.8, 55.0, 13.6, 81.0, 44.5),
    },
}

PRINTED = {"table1": (TABLE1_COLUMNS, TABLE1), "table2": (TABLE2_COLUMNS, TABLE2)}

# Stratum sizes from the notes (repo data / inferred HLE grouping).
GAIA_LEVELS = (42, 66, 19)
WEB_LEVELS = (47, 83, 70)
HLE_GROUPS = (323, 82, 95)
FIG4_SUBSETS = {"Reasoning & Web browsing": 103, "Multi-modality": 24, "File Understanding": 38}
FIG4_SERIES = ("Direct (QwQ-32B)", "RAG", "WebThinker", "ReAct", "Ours")


def _same(expected, got):
    if math.isnan(expected):
        return math.isnan(got)
    return got == pytest.approx(expected)


@pytest.mark.parametrize("item", sorted(PRINTED))
def test_each_table_matches_the_paper_cell_for_cell(item):
    columns, groups = PRINTED[item]
    rows = [(group, method, cells) for group, block in groups.items() for method, cells in block.items()]
    table = load_reference("hira", item)
    assert list(table.columns) == ["group", "Method", *columns]
    assert table["Method"].tolist() == [method for _, method, _ in rows]
    for (group, method, cells), (_, row) in zip(rows, table.iterrows(), strict=True):
        assert row["group"] == group if group else pd.isna(row["group"]), method
        for column, expected in zip(columns, cells, strict=True):
            assert _same(float(expected), float(row[column])), (method, column)


def test_zeros_are_kept_as_printed():
    raw = pd.read_csv(REFERENCE_DIR / "hira" / "table1.csv", dtype=str, keep_default_na=False).set_index(
        "Method"
    )
    assert raw.loc["Qwen3-32B-thinking", f"{GAIA} / Level 3"] == "0"
    assert raw.loc["DeepSeek-R1-32B", f"{GAIA} / Level 3"] == "0.0"
    assert raw.loc["Multimodal Enhanced", f"{WEB} / Med."] == "0"
    assert raw.loc["o1-preview†", f"{GAIA} / Avg."] == ""


def test_hira_row_of_table2_repeats_table1():
    t1 = load_reference("hira", "table1").set_index("Method").loc["HiRA (ours)"]
    t2 = load_reference("hira", "table2").set_index("Method").loc["HiRA"]
    assert t2["GAIA-B"] == t1[f"{GAIA} / Avg."]
    assert t2["Web."] == t1[f"{WEB} / Avg."]
    assert t2["HLE"] == t1[f"{HLE} / Avg."]
    assert t2["Simp."] == t1["SimpleQA / Acc"]


# --- inconsistencies, recomputed from the CSV files --------------------------------------------


def _weighted(row, columns, weights):
    return sum(row[c] * w for c, w in zip(columns, weights, strict=True)) / sum(weights)


def _table1():
    return load_reference("hira", "table1").set_index("Method")


def _fig4():
    claims = load_side("hira", "claims")
    fig4 = claims[claims["item"] == "fig4"].set_index("claim")["value"].astype(float)
    return {(s, sub): fig4[f"{s} on {sub}"] for s in FIG4_SERIES for sub in FIG4_SUBSETS}


def test_table2_hira_avg_is_not_the_mean_of_its_row():
    table = load_reference("hira", "table2").set_index("Method")
    means = table[TABLE2_COLUMNS[:-1]].mean(axis=1)
    assert means["HiRA"] == pytest.approx(46.96)
    assert table.loc["HiRA", "Avg."] == 44.9
    for method in table.index.drop("HiRA"):
        assert abs(means[method] - table.loc[method, "Avg."]) <= 0.05, method


@pytest.mark.parametrize(
    ("method", "block", "weights", "expected"),
    [
        ("QwQ-32B", GAIA, GAIA_LEVELS, 14.4),
        ("GPT-4o", GAIA, GAIA_LEVELS, 16.9),
        ("Qwen3-32B-no-thinking", WEB, WEB_LEVELS, 2.2),
        ("Multimodal Enhanced", WEB, WEB_LEVELS, 2.5),
        ("o1-preview†", HLE, HLE_GROUPS, 10.9),
    ],
)
def test_table1_averages_that_are_not_weighted_means(method, block, weights, expected):
    columns = [c for c in TABLE1_COLUMNS if c.startswith(block) and not c.endswith("Avg.")]
    row = _table1().loc[method]
    computed = _weighted(row, columns, weights)
    assert round(computed, 1) == expected
    assert abs(computed - row[f"{block} / Avg."]) > 0.1


def test_table1_other_averages_are_weighted_means():
    table = _table1()
    known = {("QwQ-32B", GAIA), ("GPT-4o", GAIA), ("Qwen3-32B-no-thinking", WEB)}
    known |= {("Multimodal Enhanced", WEB), ("o1-preview†", HLE)}
    for block, weights in ((GAIA, GAIA_LEVELS), (WEB, WEB_LEVELS), (HLE, HLE_GROUPS)):
        columns = [c for c in TABLE1_COLUMNS if c.startswith(block) and not c.endswith("Avg.")]
        for method, row in table.iterrows():
            if (method, block) in known or math.isnan(row[f"{block} / Avg."]):
                continue
            assert abs(_weighted(row, columns, weights) - row[f"{block} / Avg."]) <= 0.1, (method, block)


def test_deepseek_r1_32b_hle_avg_rounds_differently_but_within_rounding():
    row = _table1().loc["DeepSeek-R1-32B"]
    computed = _weighted(row, [f"{HLE} / NS", f"{HLE} / CE", f"{HLE} / SF"], HLE_GROUPS)
    assert computed == pytest.approx(6.335, abs=1e-3)
    assert round(computed, 1) != row[f"{HLE} / Avg."] == 6.4
    assert abs(computed - row[f"{HLE} / Avg."]) < 0.1


def test_vanilla_rag_gaia_cells_copy_deepseek_r1_671b():
    table = _table1()
    gaia = [c for c in TABLE1_COLUMNS if c.startswith(GAIA)]
    assert table.loc["Vanilla RAG", gaia].tolist() == table.loc["DeepSeek-R1-671B", gaia].tolist()
    assert table.loc["Vanilla RAG", gaia].tolist() == [40.5, 21.2, 5.2, 25.2]


def test_fig4_bars_give_table1_gaia_avg_except_for_rag():
    fig4, table = _fig4(), _table1()
    text, mm = FIG4_SUBSETS["Reasoning & Web browsing"], FIG4_SUBSETS["Multi-modality"]

    def implied(series):
        return (text * fig4[series, "Reasoning & Web browsing"] + mm * fig4[series, "Multi-modality"]) / (
            text + mm
        )

    matching = {
        "Direct (QwQ-32B)": "QwQ-32B",
        "WebThinker": "WebThinker",
        "ReAct": "ReAct",
        "Ours": "HiRA (ours)",
    }
    for series, method in matching.items():
        assert abs(implied(series) - table.loc[method, f"{GAIA} / Avg."]) <= 0.1, series
    assert round(implied("RAG"), 1) == 28.3
    assert table.loc["Vanilla RAG", f"{GAIA} / Avg."] == 25.2


def test_fig4_rag_file_bar_is_not_a_count_of_38():
    fig4 = _fig4()

    def is_count(value, n):
        return any(round(100 * k / n, 1) == value for k in range(n + 1))

    assert not is_count(fig4["RAG", "File Understanding"], 38)
    for (series, subset), value in fig4.items():
        if (series, subset) != ("RAG", "File Understanding"):
            assert is_count(value, FIG4_SUBSETS[subset]), (series, subset)
    assert (
        fig4["Ours", "File Understanding"]
        == load_reference("hira", "table2").set_index("Method").loc["HiRA", "GAIA-F"]
    )


def test_removing_search_is_not_the_worst_ablation_everywhere():
    table = load_reference("hira", "table2").set_index("Method")
    ablations = table.drop(index="HiRA")
    assert table.loc["w/o Search", "HLE"] > table.loc["w/o Reasoning Transfer", "HLE"]
    assert table.loc["w/o Search", "HLE"] > table.loc["w/o Memory", "HLE"]
    assert table.loc["w/o Code", "GAIA-F"] < table.loc["w/o Search", "GAIA-F"]
    for column in ("GAIA-B", "Web.", "Simp.", "Avg."):
        assert ablations[column].idxmin() == "w/o Search", column


def test_hira_is_not_best_in_every_table1_cell():
    table = _table1()
    hira = table.loc["HiRA (ours)"]
    assert table.loc["Search-o1", f"{WEB} / Easy"] > hira[f"{WEB} / Easy"]
    assert table.loc["ReAct", f"{HLE} / SF"] > hira[f"{HLE} / SF"]
    assert table.loc["ReAct", f"{HLE} / CE"] == hira[f"{HLE} / CE"]
    peers = table[~table.index.isin(["GPT-4o", "DeepSeek-R1-671B", "o1-preview†"])]
    for column in (f"{GAIA} / Avg.", f"{WEB} / Avg.", f"{HLE} / Avg.", "SimpleQA / Acc"):
        assert peers[column].idxmax() == "HiRA (ours)", column


def test_ablation_percentages_use_different_bases():
    table = load_reference("hira", "table2").set_index("Method")
    hira = table.loc["HiRA"]
    transfer = hira - table.loc["w/o Reasoning Transfer"]
    memory = hira - table.loc["w/o Memory"]
    assert transfer["HLE"] / hira["HLE"] == pytest.approx(0.268, abs=1e-3)
    assert transfer[TABLE2_COLUMNS[:-1]].max() == pytest.approx(10.0)
    assert memory["GAIA-F"] == pytest.approx(10.5)
    assert memory["GAIA-F"] / hira["GAIA-F"] == pytest.approx(0.249, abs=1e-3)


# --- side files ---------------------------------------------------------------------------------


def test_every_item_has_a_source_and_side_rows_name_known_items():
    items = set(reference_items("hira"))
    assert items == set(PRINTED)
    sources = load_side("hira", "sources")
    assert list(sources.columns) == ["item", "caption", "source", "notes"]
    assert items <= set(sources["item"])
    known = items | {"text", "fig3", "fig4", "fig5"}
    claims = load_side("hira", "claims")
    assert list(claims.columns) == ["item", "claim", "value", "qualifier", "source"]
    assert set(claims["qualifier"]) <= {"exact", "approx", "at least", "at most"}
    assert not claims.duplicated(["item", "claim", "qualifier"]).any()
    inconsistencies = load_side("hira", "inconsistencies")
    assert list(inconsistencies.columns) == ["item", "what", "check", "note"]
    for side in (claims, inconsistencies):
        assert set(side["item"]) <= known


def test_claims_quoted_in_the_text_match_the_tables():
    claims = load_side("hira", "claims")
    table1 = claims[claims["item"] == "table1"].set_index("claim")["value"]
    t1 = _table1()
    assert table1["Plan-and-Solve GAIA score (performs poorly)"] == t1.loc["Plan-and-Solve", f"{GAIA} / Avg."]
    assert t1.loc["WebThinker", f"{GAIA} / Avg."] == 36.2
    fig4 = _fig4()
    assert (fig4["ReAct", "Multi-modality"], fig4["RAG", "Multi-modality"]) == (8.3, 12.5)
    for subset in FIG4_SUBSETS:
        assert max(FIG4_SERIES, key=lambda s: fig4[s, subset]) == "Ours", subset
