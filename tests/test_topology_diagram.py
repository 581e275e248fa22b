"""Topology diagrams: every built-in renders to readable, deterministic SVG; custom specs render too."""

from __future__ import annotations

import itertools
import os
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

import workbench.topology as topo
from workbench.topology.diagram import DiagramError, save, to_html, to_svg

NS = "{http://www.w3.org/2000/svg}"
LIBRARY = topo.library()


def _parse(svg: str) -> ET.Element:
    root = ET.fromstring(svg)
    assert root.tag == f"{NS}svg"
    return root


def _texts(root: ET.Element, cls: str | None = None) -> list[str]:
    """Visible text, optionally only inside groups of class ``cls``."""
    groups = [g for g in root.iter(f"{NS}g") if cls in g.get("class", "").split()] if cls else [root]
    return [t.text or "" for g in groups for t in g.iter(f"{NS}text")]


def _classed(root: ET.Element, cls: str) -> list[ET.Element]:
    return [e for e in root.iter() if cls in e.get("class", "").split()]


def _flows(t: topo.Topology) -> list[topo.Flow]:
    return [t.flow, *t.subflows.values()]


def _role(node: object) -> str | None:
    for attr in ("call", "agent", "map"):
        if hasattr(node, attr):
            return getattr(node, attr)
    return None


def _boxes(root: ET.Element, cls: str) -> list[tuple[float, float, float, float]]:
    out = []
    for g in _classed(root, cls):
        r = g.find(f"{NS}rect")
        out.append(tuple(float(r.get(k)) for k in ("x", "y", "width", "height")))
    return out


def _overlap(a: tuple[float, ...], b: tuple[float, ...]) -> bool:
    return a[0] < b[0] + b[2] and b[0] < a[0] + a[2] and a[1] < b[1] + b[3] and b[1] < a[1] + a[3]


@pytest.fixture(scope="module")
def rendered() -> dict[str, tuple[topo.Topology, str]]:
    return {name: (topo.load(name), to_svg(topo.load(name))) for name in LIBRARY}


def test_library_has_every_builtin() -> None:
    assert {
        "marsrl",
        "marsrl_inference",
        "marsrl_cpu",
        "mars",
        "mars_cpu",
        "matpo",
        "matpo_cpu",
        "hira",
        "mas_orchestra",
        "mas_orchestra_cpu",
        "debate",
    } == set(LIBRARY)


@pytest.mark.parametrize("name", LIBRARY)
def test_builtin_renders_every_part(name: str, rendered: dict) -> None:
    t, svg = rendered[name]
    root = _parse(svg)
    texts = _texts(root)
    node_texts = _texts(root, "node")
    tool_texts = _texts(root, "tool")
    for flow in _flows(t):
        for node_name, node in flow.nodes.items():
            assert node_name in node_texts, node_name
            if _role(node):
                assert any(s.endswith(f"· {_role(node)}") for s in node_texts), _role(node)
    assert sorted({g.get("data-name") for g in _classed(root, "node")}) == sorted(
        {n for f in _flows(t) for n in f.nodes}
    )
    for tool in t.tools:
        assert tool in tool_texts, tool
    for sub in t.subflows:
        assert f"subflow {sub}" in texts
    # one arrow per branch, each from its node to its target (the end marker is <end>)
    branches = sorted(
        (n, "<end>" if b.goto == topo.END else b.goto)
        for f in _flows(t)
        for n, node in f.nodes.items()
        for b in node.next
    )
    edges = _classed(root, "edge")
    assert sorted((e.get("data-from"), e.get("data-to")) for e in edges) == branches
    assert len(_classed(root, "start")) == len(_flows(t))
    # each condition appears as a label (shortened if long), the full text in the edge's tooltip
    labels = _texts(root, "label")
    tips = [e.find(f"{NS}title").text for e in edges]
    for f in _flows(t):
        for node in f.nodes.values():
            for b in node.next:
                if b.when:
                    assert any(
                        lab == b.when or (lab.endswith("…") and b.when.startswith(lab[:-1])) for lab in labels
                    )
                    assert any(tip.endswith(f"when {b.when}") for tip in tips)


@pytest.mark.parametrize("name", LIBRARY)
def test_builtin_boxes_do_not_overlap_and_fit(name: str, rendered: dict) -> None:
    _, svg = rendered[name]
    root = _parse(svg)
    width, height = float(root.get("width")), float(root.get("height"))
    boxes = _boxes(root, "node") + _boxes(root, "tool")
    for a, b in itertools.combinations(boxes, 2):
        assert not _overlap(a, b), (a, b)
    for x, y, w, h in boxes + _boxes(root, "cluster"):
        assert min(x, y) >= 0 and x + w <= width and y + h <= height
    # labels never hide a node or tool box
    for lab in _boxes(root, "label"):
        assert not any(_overlap(lab, b) for b in boxes), lab
    # clusters are stacked without overlapping
    for a, b in itertools.combinations(_boxes(root, "cluster"), 2):
        assert not _overlap(a, b)


def test_marsrl_conditions_are_escaped_labels(rendered: dict) -> None:
    _, svg = rendered["marsrl"]
    labels = _texts(_parse(svg), "label")
    assert labels.count("verdict != 'correct'") == 2
    assert labels.count("otherwise") == 2


def test_mas_orchestra_loops_and_links(rendered: dict) -> None:
    t, svg = rendered["mas_orchestra"]
    assert "rounds &lt; 5" in svg and "rounds < 5" not in svg
    root = _parse(svg)
    back = {(e.get("data-from"), e.get("data-to")) for e in _classed(root, "back")}
    assert back == {("argue", "argue"), ("revise", "critique")}
    for e in _classed(root, "back"):
        assert " C " in e.find(f"{NS}path").get("d")  # drawn curved
    # the DAG node links to each subflow it dispatches
    links = sorted((e.get("data-from"), e.get("data-to")) for e in _classed(root, "link"))
    assert links == sorted(("execute", s) for s in set(t.flow.nodes["execute"].agents.values()))
    assert "DAG agent DebateAgent of execute" in _texts(root)


@pytest.mark.parametrize(
    ("name", "tool", "sub"), [("hira", "subtask", "delegate"), ("matpo", "search_and_browse", "browse")]
)
def test_agent_tool_links_to_its_subflow(name: str, tool: str, sub: str, rendered: dict) -> None:
    _, svg = rendered[name]
    root = _parse(svg)
    assert [(e.get("data-to")) for e in _classed(root, "link")] == [sub]
    assert f"agent → {sub}" in _texts(root, "tool")
    assert f"agent tool {tool} of plan" in _texts(root)


def test_routed_tool_shows_its_distiller(rendered: dict) -> None:
    t, svg = rendered["mars"]
    details = _texts(_parse(svg), "tool")
    for name, tool in t.tools.items():
        if tool.route:
            assert f"{tool.kind} → {tool.route.via} distils" in details, name
    assert len(_classed(_parse(svg), "tool-edge")) == 3


@pytest.mark.parametrize("name", LIBRARY)
def test_deterministic(name: str, rendered: dict) -> None:
    t, svg = rendered[name]
    assert to_svg(topo.from_dict(topo.to_dict(t))) == svg
    assert to_svg(t) == svg


def _custom() -> topo.Topology:
    msg = [topo.Message(role="user", content="{{ question }}")]
    roles = {r: topo.Role(messages=msg) for r in ("solver", "verifier", "corrector", "a&b", "distil")}
    long_when = "verdict != 'correct' and attempts < 3 and not (score > 0.9)"
    return topo.Topology(
        name="custom <loop>",
        description="Solve & verify until correct.",
        roles=roles,
        tools={
            "web": topo.Tool(kind="bm25", route=topo.Route(via="distil")),
            "helper": topo.Tool(kind="agent", subflow="helper"),
        },
        flow=topo.Flow(
            start="solve",
            nodes={
                "solve": topo.CallNode(call="solver", next=[topo.Branch(goto="verify")]),
                "verify": topo.CallNode(
                    call="verifier",
                    next=[topo.Branch(goto="correct", when=long_when), topo.Branch(goto="end")],
                ),
                "correct": topo.AgentNode(
                    agent="corrector", tools=["web", "helper", "nowhere"], next=[topo.Branch(goto="verify")]
                ),
            },
        ),
        subflows={
            "helper": topo.Flow(
                start="x&y",
                nodes={
                    "x&y": topo.CallNode(
                        call="a&b", next=[topo.Branch(goto="x&y", when="n < 2"), topo.Branch(goto="gone")]
                    )
                },
            )
        },
    )


def test_custom_topology_with_loops_escaping_and_undefined_parts(tmp_path: Path) -> None:
    t = _custom()
    svg = to_svg(t)
    root = _parse(svg)
    assert root.get("data-topology") == "custom <loop>"
    assert "custom &lt;loop&gt;" in svg and "x&amp;y" in svg
    back = {(e.get("data-from"), e.get("data-to")) for e in _classed(root, "back")}
    assert back == {("correct", "verify"), ("x&y", "x&y")}
    labels = _texts(root, "label")
    shortened = [lab for lab in labels if lab.endswith("…")]
    assert len(shortened) == 1 and len(shortened[0]) <= 32
    assert "n < 2" in labels
    nodes = {g.get("data-name"): g.get("data-kind") for g in _classed(root, "node")}
    assert nodes["gone"] == "missing"  # an undefined goto is drawn, flagged, not dropped
    assert "undefined tool" in _texts(root, "tool")
    assert "web" in _texts(root, "tool") and "bm25 → distil distils" in _texts(root, "tool")
    assert [(e.get("data-from"), e.get("data-to")) for e in _classed(root, "link")] == [("correct", "helper")]
    assert len(_classed(root, "edge")) == 6  # the missing node has no branches of its own
    save(t, tmp_path / "custom.svg")
    assert (tmp_path / "custom.svg").read_text(encoding="utf-8") == svg


def test_html_is_self_contained(tmp_path: Path) -> None:
    t = topo.load("hira")
    page = to_html(t)
    assert page.startswith("<!DOCTYPE html>") and to_svg(t) in page
    assert "<script" not in page and "<link" not in page
    assert set(re.findall(r"https?://[^\"' ]+", page)) == {"http://www.w3.org/2000/svg"}
    fragment = to_html(t, standalone=False)
    assert fragment.startswith("<div") and "<html" not in fragment and to_svg(t) in fragment


def test_save_writes_artifacts_and_rejects_bad_paths(tmp_path: Path) -> None:
    out = Path(os.environ.get("WORKBENCH_DIAGRAM_DIR", tmp_path))
    for name in LIBRARY:
        for suffix in (".svg", ".html"):
            path = save(topo.load(name), out / f"{name}{suffix}")
            assert path.stat().st_size > 1000
        _parse((out / f"{name}.svg").read_text(encoding="utf-8"))
    with pytest.raises(DiagramError, match=r"\.svg or \.html"):
        save(topo.load("mars"), tmp_path / "mars.png")
    with pytest.raises(DiagramError, match="does not exist"):
        save(topo.load("mars"), tmp_path / "missing" / "mars.svg")
    assert not (tmp_path / "mars.png").exists()
    assert not list(tmp_path.glob(".*tmp"))
    with pytest.raises(DiagramError, match="pass a Topology"):
        to_svg({"name": "x"})  # type: ignore[arg-type]
