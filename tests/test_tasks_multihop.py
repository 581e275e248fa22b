"""Multi-hop KB questions: every answer is reached by following the chain through the corpus text."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workbench.tasks import (
    Document,
    TaskFileNotFoundError,
    TaskGenerationError,
    TaskOptionError,
    build_knowledge_base,
    generate,
    load_corpus,
)

# How the corpus words each relation (the test's own reading of the documents).
CUES = {
    "born_in": "born",
    "works_for": "works for",
    "studied_at": "studied at",
    "located_in": "located in",
    "mayor": "mayor of",
    "capital": "capital of",
    "founded_by": "founded",
    "headquartered_in": "headquarter",
    "ceo": "CEO of",
    "based_in": "based in",
    "invented_by": "invented",
    "manufactured_by": "manufactur",
}


def sentences(docs):
    for doc in docs:
        yield from re.split(r"(?<=\.)\s+", doc.text)


def follow(corpus, names, start, relations):
    """Walk the relations from ``start`` using plain string search over the documents."""
    current = start
    for relation in relations:
        hits = [s for s in sentences(corpus) if current in s and CUES[relation] in s]
        candidates = {n for s in hits for n in names if n != current and n in s}
        assert len(candidates) == 1, (current, relation, hits)
        current = candidates.pop()
    return current


@pytest.fixture(scope="module")
def kb():
    return build_knowledge_base(seed=5, n_entities=80)


@pytest.fixture(scope="module")
def tasks(kb):
    return generate("multihop", 240, seed=5, n_entities=80)


def test_every_answer_is_reachable_through_the_corpus(kb, tasks):
    names = [e.name for e in kb.entities]
    for task in tasks:
        md = task.metadata
        assert kb.entity(md["start"]).name in task.question
        assert follow(kb.documents, names, md["start"], md["relations"]) == task.answer, task.question


def test_hops_and_chain_metadata(kb, tasks):
    assert {t.metadata["hops"] for t in tasks} == {1, 2, 3, 4}
    by_id = {d.id: d for d in kb.documents}
    for task in tasks:
        chain = task.metadata["chain"]
        assert len(chain) == task.metadata["hops"] == len(task.metadata["supporting_docs"])
        assert chain[-1][2] == task.answer
        for (subject, _, obj), docs in zip(chain, task.metadata["supporting_docs"], strict=True):
            assert docs, "every hop is stated in at least one document"
            assert all(subject in by_id[d].text and obj in by_id[d].text for d in docs)
        visited = [chain[0][0]] + [hop[2] for hop in chain]
        assert len(set(visited)) == len(visited), "chains never revisit an entity"
    assert len({t.question for t in tasks}) == len(tasks)


def test_corpus_shape(kb):
    assert len(kb.documents) >= 2 * len(kb.entities)
    for entity in kb.entities:
        assert len(kb.documents_with(entity.name)) >= 2
    lowered = [e.name.lower() for e in kb.entities]
    for i, a in enumerate(lowered):  # no name hides inside another
        assert not any(a in b for j, b in enumerate(lowered) if i != j)
    distractors = [s for s in sentences(kb.documents) if not any(cue in s for cue in CUES.values())]
    assert len(distractors) > len(kb.entities)


def test_save_and_load_corpus(tmp_path, kb):
    path = kb.save_corpus(tmp_path / "sub" / "corpus.jsonl")
    lines = path.read_text().splitlines()
    assert len(lines) == len(kb.documents)
    assert set(json.loads(lines[0])) == {"id", "title", "text"}
    assert load_corpus(path) == kb.documents
    assert all(isinstance(d, Document) for d in load_corpus(path))
    assert not list(tmp_path.glob("sub/.*.tmp"))
    with pytest.raises(TaskFileNotFoundError, match="corpus file not found"):
        load_corpus(tmp_path / "nope.jsonl")


def test_corpus_rebuilds_from_metadata(tasks, kb):
    md = tasks[0].metadata
    again = build_knowledge_base(md["kb_seed"], md["n_entities"])
    assert again.documents == kb.documents and again.facts == kb.facts


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 2**32))
def test_deterministic_and_answerable_for_any_seed(seed):
    a = generate("multihop", 12, seed=seed, n_entities=40)
    assert a == generate("multihop", 12, seed=seed, n_entities=40)
    kb = build_knowledge_base(seed, 40)
    names = [e.name for e in kb.entities]
    for task in a:
        assert follow(kb.documents, names, task.metadata["start"], task.metadata["relations"]) == task.answer


def test_different_seeds_differ():
    a = generate("multihop", 10, seed=1)
    b = generate("multihop", 10, seed=2)
    assert [t.question for t in a] != [t.question for t in b]
    assert build_knowledge_base(1).documents != build_knowledge_base(2).documents
    same_kb = generate("multihop", 10, seed=2, kb_seed=1)
    assert {t.metadata["kb_seed"] for t in same_kb} == {1}
    assert [t.question for t in same_kb] != [t.question for t in a]


def test_options_and_errors():
    assert {t.metadata["hops"] for t in generate("multihop", 8, seed=0, hops=3)} == {3}
    assert generate("multihop", 2, seed=0, verifier="f1")[0].verifier == "f1"
    assert generate("multihop", 2, seed=0)[0].verifier == "exact"
    with pytest.raises(TaskOptionError, match="hops must be in 1..4"):
        generate("multihop", 2, seed=0, hops=5)
    with pytest.raises(TaskOptionError, match="n_entities must be an int >= 12"):
        build_knowledge_base(0, 3)
    with pytest.raises(TaskGenerationError, match="raise n_entities"):
        generate("multihop", 500, seed=0, hops=1, n_entities=12)
