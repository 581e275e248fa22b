"""MATPO's published numbers under reports/reference/matpo/, checked against the paper text.

MATPO (arXiv 2510.04678) has no numbered table: ``headline`` is the main result its text states
(Sec. Results, Abstract), laid out as the authors' README table. The expected values below are typed by
hand from ``shared/papers/matpo.txt`` and from the data labels printed on Fig. 5, not read from the CSV
files. The inconsistency tests recompute each arithmetic check from the CSV files and assert that the
inconsistency is really there, so they fail if someone "fixes" a number.
"""

import math
import re

import pytest

from workbench.reference import load_reference, load_side, reference_items

PAPER = "matpo"
NAN = float("nan")

# Sec. Results: "MATPO achieves 42.60%, 33.00%, and 63.64% on GAIA-text, WebWalkerQA, and FRAMES,
# respectively, compared to 32.16%, 30.14%, and 56.22% for single-agent GRPO, leading to an average
# relative improvement of 18.38%." The baseline has no improvement of its own (README prints "-").
HEADLINE_COLUMNS = ["Method", "GAIA-text", "WebWalkerQA", "FRAMES", "Relative Average Improvement"]
HEADLINE = {
    "Single-agent GRPO": {
        "GAIA-text": 32.16,
        "WebWalkerQA": 30.14,
        "FRAMES": 56.22,
        "Relative Average Improvement": NAN,
    },
    "MATPO": {
        "GAIA-text": 42.60,
        "WebWalkerQA": 33.00,
        "FRAMES": 63.64,
        "Relative Average Improvement": 18.38,
    },
}

# The data labels printed on Fig. 5(a-c): (panel, benchmark, method, step) -> value.
FIG5_LABELS = {
    ("a", "GAIA-text", "MATPO", 120): 41.5,
    ("a", "GAIA-text", "MATPO", 180): 42.6,
    ("a", "GAIA-text", "single-agent GRPO", 120): 34.22,
    ("a", "GAIA-text", "single-agent GRPO", 180): 32.16,
    ("b", "WebWalkerQA", "MATPO", 180): 33.0,
    ("b", "WebWalkerQA", "single-agent GRPO", 180): 30.14,
    ("c", "FRAMES", "MATPO", 180): 63.64,
    ("c", "FRAMES", "single-agent GRPO", 180): 56.22,
}
FIG5_PANELS = {"a": "GAIA-text", "b": "WebWalkerQA", "c": "FRAMES"}
FIG5_STEPS = (0, 30, 60, 90, 120, 150, 180)
FIG5_METHODS = {"MATPO": "MATPO", "single-agent GRPO": "Single-agent GRPO"}

# The Fig. 6 legend as the prose gives it (Sec. Ablation Studies); HuggingFace blocking is on "by
# default, unless noted" (Sec. Setups, footnote 3) and the final summary is on unless noted; query
# recapping does not apply to a single-agent run (None).
LEGEND = {
    "green": {"multi_agent": True, "final_summary": True, "query_recap": True, "hf_block": True},
    "red": {"multi_agent": True, "final_summary": True, "query_recap": False, "hf_block": False},
    "black": {"multi_agent": True, "final_summary": False, "query_recap": False, "hf_block": True},
    "yellow": {"multi_agent": False, "final_summary": True, "query_recap": None, "hf_block": True},
    "blue": {"multi_agent": False, "final_summary": False, "query_recap": None, "hf_block": False},
}
# The pairs the prose compares, and the one setting it credits for their difference.
PROSE_COMPARISONS = {
    ("red", "blue"): "hf_block",
    ("yellow", "blue"): "hf_block",
    ("green", "blue"): "query_recap",
    ("red", "black"): "final_summary",
}

QUALIFIERS = {"exact", "approx", "at least", "at most"}


def fig5_claim(panel, method, step):
    return f"Fig. 5({panel}) {FIG5_PANELS[panel]}: {method} test accuracy (%) at step {step}"


def claim_value(claim):
    claims = load_side(PAPER, "claims")
    rows = claims[claims["claim"] == claim]
    assert len(rows) == 1, f"claims.csv has {len(rows)} rows for {claim!r}"
    return float(rows["value"].iloc[0])


def legend_diff(a, b):
    fa, fb = LEGEND[a], LEGEND[b]
    return {k for k in fa if fa[k] is not None and fb[k] is not None and fa[k] != fb[k]}


def inconsistency(item, starts):
    table = load_side(PAPER, "inconsistencies")
    rows = table[(table["item"] == item) & table["what"].str.startswith(starts)]
    assert len(rows) == 1, f"inconsistencies.csv has {len(rows)} {item} rows starting {starts!r}"
    return rows.iloc[0]


def test_headline_matches_the_paper_text():
    table = load_reference(PAPER, "headline")
    assert list(table.columns) == HEADLINE_COLUMNS
    assert table["Method"].tolist() == list(HEADLINE)
    for _, row in table.iterrows():
        for column, expected in HEADLINE[row["Method"]].items():
            if math.isnan(expected):
                assert math.isnan(row[column]), (row["Method"], column)
            else:
                assert row[column] == pytest.approx(expected), (row["Method"], column)


def test_headline_improvement_is_the_mean_of_the_relative_gains():
    table = load_reference(PAPER, "headline").set_index("Method")
    benches = ["GAIA-text", "WebWalkerQA", "FRAMES"]
    ours, base = table.loc["MATPO", benches], table.loc["Single-agent GRPO", benches]
    printed = table.loc["MATPO", "Relative Average Improvement"]
    assert (100 * (ours - base) / base).mean() == pytest.approx(printed, abs=0.005)
    # ... and not the gain of the mean accuracy (about 17.48).
    assert 100 * (ours.mean() / base.mean() - 1) != pytest.approx(printed, abs=0.5)


def test_headline_numbers_are_also_stated_as_text_claims():
    for method, cells in HEADLINE.items():
        for bench in ("GAIA-text", "WebWalkerQA", "FRAMES"):
            assert claim_value(f"{method} {bench} test accuracy (%)") == pytest.approx(cells[bench])
    claim = "Average relative improvement of MATPO over single-agent GRPO (%)"
    assert claim_value(claim) == pytest.approx(18.38)


def test_fig5_has_every_point_and_its_printed_labels():
    claims = load_side(PAPER, "claims")
    for panel in FIG5_PANELS:
        for method in FIG5_METHODS:
            for step in FIG5_STEPS:
                key = (panel, FIG5_PANELS[panel], method, step)
                row = claims[claims["claim"] == fig5_claim(panel, method, step)]
                assert len(row) == 1, key
                assert row["item"].iloc[0] == "fig5"
                if key in FIG5_LABELS:
                    assert row["qualifier"].iloc[0] == "exact", key
                    assert float(row["value"].iloc[0]) == pytest.approx(FIG5_LABELS[key]), key
                else:
                    assert row["qualifier"].iloc[0] == "approx", key


def test_fig5_last_points_are_the_headline_numbers():
    table = load_reference(PAPER, "headline").set_index("Method")
    for panel, bench in FIG5_PANELS.items():
        for method, row_label in FIG5_METHODS.items():
            last = claim_value(fig5_claim(panel, method, 180))
            assert last == pytest.approx(table.loc[row_label, bench], abs=0.005), (bench, method)


def test_inconsistency_gaia_text_accuracies_are_not_counts_over_103_queries():
    assert "k/103" in inconsistency("headline", "The GAIA-text accuracies")["what"]
    assert claim_value("Number of text-only GAIA queries in GAIA-text") == 103
    for value in load_reference(PAPER, "headline")["GAIA-text"]:
        assert all(round(100 * k / 103, 2) != pytest.approx(value) for k in range(104)), value
        # They are counts over 8 x 103 = 824 samples.
        assert round(100 * round(value * 8.24) / 824, 2) == pytest.approx(value), value


def test_inconsistency_single_agent_beats_matpo_on_webwalkerqa_at_step_30():
    assert "step 30" in inconsistency("fig5", "'MATPO consistently surpasses")["check"]
    single = claim_value(fig5_claim("b", "single-agent GRPO", 30))
    matpo = claim_value(fig5_claim("b", "MATPO", 30))
    assert single > matpo + 0.5


def test_inconsistency_matpo_also_drops_after_step_120_on_gaia_text():
    assert "step 150" in inconsistency("fig5", "'While single-agent GRPO drops")["check"]
    assert (
        claim_value(
            "Training step after which single-agent GRPO accuracy drops on GAIA-text and FRAMES (MATPO keeps improving)"
        )
        == 120
    )
    assert claim_value(fig5_claim("a", "MATPO", 150)) < claim_value(fig5_claim("a", "MATPO", 120)) - 1


def test_inconsistency_fig6_comparisons_do_not_isolate_the_setting_they_credit():
    table = load_side(PAPER, "inconsistencies")
    checks = " ".join(table.loc[table["item"] == "fig6", "check"].dropna())
    stated = {
        (a, b): {flag.strip() for flag in flags.split(",")}
        for a, b, flags in re.findall(r"(\w+) vs (\w+) differ in \{([^}]*)\}", checks)
    }
    assert set(PROSE_COMPARISONS) <= set(stated)
    for pair, flags in stated.items():
        assert flags == legend_diff(*pair), pair
    for pair, credited in PROSE_COMPARISONS.items():
        assert legend_diff(*pair) != {credited}, pair
    # Red and blue both run without HuggingFace blocking, so they cannot show its effect at all.
    assert "hf_block" not in legend_diff("red", "blue")
    # The prose says red stays above blue and also that blue nearly overlaps red.
    assert claim_value("Fig. 6: |blue - red|") == 0
    assert inconsistency("fig6", "The prose says red 'stays consistently above'") is not None


def test_fig5_check_strings_name_existing_claims():
    claims = set(load_side(PAPER, "claims")["claim"])
    table = load_side(PAPER, "inconsistencies")
    for check in table.loc[table["item"] == "fig5", "check"]:
        named = re.findall(r"'([^']+)'", check)
        assert named, check
        assert set(named) <= claims, check


def test_side_files_are_complete_and_name_known_items():
    tables = reference_items(PAPER)
    assert tables == ["headline"]
    sources = load_side(PAPER, "sources")
    claims = load_side(PAPER, "claims")
    problems = load_side(PAPER, "inconsistencies")
    assert list(sources.columns) == ["item", "caption", "source", "notes"]
    assert list(claims.columns) == ["item", "claim", "value", "qualifier", "source"]
    assert list(problems.columns) == ["item", "what", "check", "note"]
    assert set(tables) <= set(sources["item"])
    assert sources["caption"].notna().all() and sources["source"].notna().all()

    def known(item):
        return item in tables or re.fullmatch(r"fig\d+|text", item) is not None

    for side in (claims, problems):
        unknown = sorted({item for item in side["item"] if not known(item)})
        assert not unknown, unknown
    assert set(claims["qualifier"]) <= QUALIFIERS
    assert claims["value"].notna().all() and claims["source"].notna().all()
    assert not claims["claim"].duplicated().any()
    assert {"fig5", "fig6", "text"} <= set(claims["item"])
    assert {"headline", "fig5", "fig6", "text"} <= set(problems["item"])
