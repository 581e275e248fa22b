"""MarsRL's reference tables against the numbers typed from the paper (../shared/papers/marsrl.txt)."""

from __future__ import annotations

import pytest

from workbench.reference import load_reference, load_side, reference_items

COLUMNS = [
    "AIME-2025 / Solver",
    "AIME-2025 / Reasoning System",
    "BeyondAIME / Solver",
    "BeyondAIME / Reasoning System",
]

# Typed from the paper's Tables 1-3 (Sec. 4.2-4.4).
PRINTED = {
    "table1": {
        "Qwen3-A3B": (73.5, 69.7, 50.7, 47.6),
        "Qwen3-A3B-Thinking-2507": (86.5, 85.6, 64.9, 63.3),
        "Qwen3-A22B-Thinking-2507": (92.3, 91.2, 70.6, 70.3),
        "Deepsek V3.1-Think": (86.2, 88.3, 71.3, 72.0),
        "MarsRL-A3B-Thinking-2507": (91.1, 93.3, 70.2, 73.8),
    },
    "table2": {
        "Qwen3-A3B-Thinking-2507": (86.5, 85.6, 64.9, 63.3),
        "MarsRL-S": (89.5, 90.8, 67.3, 66.0),
        "MarsRL-VC": (90.4, 91.7, 69.0, 71.1),
    },
    "table3": {
        "Qwen3-A3B-Thinking-2507": (86.5, 91.7, 64.9, 71.6),
        "Qwen3-A22B-Thinking-2507": (92.3, 93.3, 70.6, 73.3),
        "DeepSeek V3.1-Think": (86.2, 91.2, 71.3, 74.1),
    },
}
LABEL = {"table1": "Model", "table2": "Approach", "table3": "Solver"}


@pytest.mark.parametrize("item", sorted(PRINTED))
def test_each_table_matches_the_paper_cell_for_cell(item):
    table = load_reference("marsrl", item)
    assert [c for c in table.columns if c != "group"] == [LABEL[item], *COLUMNS]
    assert table[LABEL[item]].tolist() == list(PRINTED[item])
    for _, row in table.iterrows():
        assert tuple(row[COLUMNS]) == pytest.approx(PRINTED[item][row[LABEL[item]]])


def test_table1_groups_the_open_models_apart_from_the_trained_one():
    groups = load_reference("marsrl", "table1").groupby("group")["Model"].apply(list).to_dict()
    assert groups == {"MarsRL": ["MarsRL-A3B-Thinking-2507"], "open-source": list(PRINTED["table1"])[:4]}


def test_the_abstracts_headline_mixes_solver_and_system():
    table = load_reference("marsrl", "table1").set_index("Model")
    claims = load_side("marsrl", "claims").set_index("claim")["value"]
    base, trained = table.loc["Qwen3-A3B-Thinking-2507"], table.loc["MarsRL-A3B-Thinking-2507"]
    assert float(claims["AIME-2025 accuracy before MarsRL (base Solver)"]) == base["AIME-2025 / Solver"]
    assert (
        float(claims["AIME-2025 accuracy after MarsRL (trained reasoning system)"])
        == (trained["AIME-2025 / Reasoning System"])
    )
    # Like for like the base system starts lower than the base Solver the abstract quotes.
    assert base["AIME-2025 / Reasoning System"] < base["AIME-2025 / Solver"]


def test_the_system_trails_the_solver_for_most_untrained_models():
    table = load_reference("marsrl", "table1")
    open_models = table[table["group"] == "open-source"]
    for bench in ("AIME-2025", "BeyondAIME"):
        behind = open_models[f"{bench} / Reasoning System"] < open_models[f"{bench} / Solver"]
        assert behind.sum() == 3
        assert not behind[open_models["Model"] == "Deepsek V3.1-Think"].any()


def test_every_item_has_a_source_and_side_rows_name_known_items():
    items = set(reference_items("marsrl"))
    assert items == set(PRINTED)
    assert items <= set(load_side("marsrl", "sources")["item"])
    figures = {"text", "fig4", "fig5", "fig6a", "fig6b"}
    for kind in ("claims", "inconsistencies"):
        assert set(load_side("marsrl", kind)["item"]) <= items | figures
