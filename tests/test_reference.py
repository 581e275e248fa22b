"""The reference-number loader: the layout under reports/reference/ and its errors."""

from __future__ import annotations

import math

import pytest

from workbench.reference import PAPERS, load_reference, load_side, reference_items


def test_a_table_reads_dashes_and_blanks_as_missing(tmp_path):
    folder = tmp_path / "mars"
    folder.mkdir()
    (folder / "table2.csv").write_text("Method,NQ,Avg.\nSelf-RAG,49.4,-\nC-3PO,,53.42\n")
    (folder / "sources.csv").write_text("item,caption,source,notes\ntable2,Main results,p. 7,\n")
    table = load_reference("mars", "table2", root=tmp_path)
    assert list(table.columns) == ["Method", "NQ", "Avg."]
    assert math.isnan(table.loc[0, "Avg."]) and math.isnan(table.loc[1, "NQ"])
    assert table.loc[1, "Avg."] == pytest.approx(53.42)
    assert reference_items("mars", root=tmp_path) == ["table2"]
    assert load_side("mars", "sources", root=tmp_path)["caption"].tolist() == ["Main results"]
    assert load_side("mars", "claims", root=tmp_path).empty


def test_unknown_papers_items_and_side_files_are_named(tmp_path):
    (tmp_path / "hira").mkdir()
    (tmp_path / "hira" / "table1.csv").write_text("a\n1\n")
    with pytest.raises(KeyError, match="unknown paper 'hirra'"):
        load_reference("hirra", "table1", root=tmp_path)
    with pytest.raises(FileNotFoundError, match="no reference item 'table9'.*it has: table1"):
        load_reference("hira", "table9", root=tmp_path)
    with pytest.raises(KeyError, match="unknown side file"):
        load_side("hira", "notes", root=tmp_path)


def test_every_paper_has_its_reference_tables():
    for paper in PAPERS:
        items = reference_items(paper)
        assert items, f"reports/reference/{paper}/ holds no table"
        sources = load_side(paper, "sources")
        assert set(items) <= set(sources["item"]), f"{paper}: tables without a source row"
