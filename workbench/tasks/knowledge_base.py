"""A generated knowledge base of fictional entities and the document corpus that describes it.

``build_knowledge_base(seed, n_entities)`` invents people, cities, countries, companies,
universities and inventions, links them with functional relations (``born_in``, ``works_for``,
``located_in``, ``capital``, ``founded_by``, ``invented_by``, ...) and writes several short documents
per entity: a profile with its own facts, notes with the facts that point at it, and sometimes a
news item, each padded with distractor facts (visits, rivalries, populations) that use none of
the relation wordings. Every fact appears as one sentence in at least one document, so multi-hop
questions over the KB are answerable by local search (BM25) over the corpus without a network.
No entity name is a substring of another, which keeps string matching over the corpus unambiguous.
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from workbench.tasks.errors import (
    EmptyTaskFileError,
    MalformedTaskFileError,
    MissingFieldError,
    TaskFileNotFoundError,
    TaskOptionError,
)
from workbench.tasks.task import write_jsonl

ENTITY_TYPES = ("person", "city", "country", "company", "university", "invention")

# relation -> (subject type, object type, sentence variants with {s} and {o}).
RELATIONS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "born_in": ("person", "city", ("{s} was born in {o}.", "{o} is the city where {s} was born.")),
    "works_for": ("person", "company", ("{s} works for {o}.", "These days {s} works for {o}.")),
    "studied_at": ("person", "university", ("{s} studied at {o}.", "As a young adult, {s} studied at {o}.")),
    "located_in": ("city", "country", ("{s} is located in {o}.", "The city of {s} is located in {o}.")),
    "mayor": ("city", "person", ("The mayor of {s} is {o}.", "{o} serves as the mayor of {s}.")),
    "capital": ("country", "city", ("The capital of {s} is {o}.", "{o} is the capital of {s}.")),
    "founded_by": ("company", "person", ("{s} was founded by {o}.", "{o} founded {s}.")),
    "headquartered_in": (
        "company",
        "city",
        ("{s} is headquartered in {o}.", "The headquarters of {s} are in {o}."),
    ),
    "ceo": ("company", "person", ("The CEO of {s} is {o}.", "{o} is the CEO of {s}.")),
    "based_in": ("university", "city", ("{s} is based in {o}.", "The campus of {s} is based in {o}.")),
    "invented_by": ("invention", "person", ("{s} was invented by {o}.", "{o} invented {s}.")),
    "manufactured_by": (
        "invention",
        "company",
        ("{s} is manufactured by {o}.", "{o} manufactures {s}."),
    ),
}

# Words a name may not contain, so relation cues in the corpus stay unambiguous.
RELATION_CUES = (
    "born",
    "work",
    "studied",
    "located",
    "mayor",
    "capital",
    "found",
    "headquarter",
    "ceo",
    "based",
    "invent",
    "manufactur",
)

_SHARE = {"person": 0.34, "city": 0.2, "country": 0.08, "company": 0.15, "university": 0.1, "invention": 0.13}
_MINIMUM = {"person": 3, "city": 2, "country": 1, "company": 2, "university": 1, "invention": 1}
MIN_ENTITIES = 12

_ONSETS = [
    "b",
    "d",
    "f",
    "g",
    "k",
    "l",
    "m",
    "n",
    "p",
    "r",
    "s",
    "t",
    "v",
    "z",
    "br",
    "dr",
    "gr",
    "kl",
    "pr",
    "st",
    "tr",
    "th",
    "sh",
    "qu",
    "h",
    "j",
    "y",
]
_VOWELS = ["a", "e", "i", "o", "u", "a", "e", "o", "ai", "ou"]
_CODAS = ["", "", "", "n", "l", "r", "s", "m", "th", "x", "nd", "rk", "sk"]
_CITY_SUFFIX = ["ford", "mere", "haven", "burg", "dale", "wick", "holm", "gate", "shire", "crest"]
_COUNTRY_SUFFIX = ["ia", "land", "ora", "avia", "esia", "mark"]
_COMPANY_SUFFIX = ["Dynamics", "Motors", "Labs", "Industries", "Systems", "Holdings", "Instruments"]
_UNIVERSITY_FORMS = ["{w} University", "{w} Institute", "{w} College", "{w} Polytechnic"]
_INVENTION_NOUNS = [
    "Engine",
    "Loom",
    "Lens",
    "Valve",
    "Compass",
    "Press",
    "Lantern",
    "Dynamo",
    "Sextant",
    "Kiln",
    "Telegraph",
    "Gyroscope",
]
_OCCUPATIONS = [
    "an engineer",
    "a chemist",
    "a novelist",
    "an architect",
    "an economist",
    "a painter",
    "a physician",
    "an astronomer",
    "a cartographer",
    "an entrepreneur",
]
_HOBBIES = ["sailing", "chess", "beekeeping", "pottery", "rock climbing", "birdwatching", "the violin"]
_TOPICS = ["tidal energy", "ancient maps", "glassmaking", "river ecology", "clockwork", "railway history"]
_FESTIVALS = ["lantern", "harvest", "kite", "jazz", "film", "winter"]
_PRODUCTS = ["saffron", "woollen textiles", "porcelain", "olive oil", "timber", "copper"]


@dataclass(frozen=True)
class Entity:
    """A fictional entity: ``name`` is unique in its KB and no other name contains it."""

    name: str
    type: str

    @property
    def mention(self) -> str:
        """How a sentence mentions it (inventions take an article: "the Quorvex Loom")."""
        return f"the {self.name}" if self.type == "invention" else self.name


@dataclass(frozen=True)
class Fact:
    """``subject --relation--> object``, by entity name."""

    subject: str
    relation: str
    object: str


@dataclass(frozen=True)
class Document:
    """One corpus document, the unit a search tool indexes."""

    id: str
    title: str
    text: str

    def to_dict(self) -> dict[str, str]:
        return {"id": self.id, "title": self.title, "text": self.text}


@dataclass
class KnowledgeBase:
    """Entities, facts and the document corpus built from one seed."""

    seed: int
    entities: list[Entity]
    facts: list[Fact]
    documents: list[Document]
    support: dict[Fact, list[str]] = field(default_factory=dict, repr=False)
    _by_name: dict[str, Entity] = field(default_factory=dict, repr=False)
    _facts_by_key: dict[tuple[str, str], str] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self._by_name = {e.name: e for e in self.entities}
        self._facts_by_key = {(f.subject, f.relation): f.object for f in self.facts}

    def entity(self, name: str) -> Entity:
        """The entity called ``name``."""
        try:
            return self._by_name[name]
        except KeyError:
            raise TaskOptionError(
                f"no entity named {name!r} in this knowledge base (seed {self.seed})"
            ) from None

    def follow(self, subject: str, relation: str) -> str | None:
        """The object of ``subject --relation-->``, or None when the subject has no such fact."""
        return self._facts_by_key.get((subject, relation))

    def relations_of(self, subject: str) -> list[str]:
        """Relations leaving ``subject``, in the fixed order of :data:`RELATIONS`."""
        return [r for r in RELATIONS if (subject, r) in self._facts_by_key]

    def of_type(self, entity_type: str) -> list[Entity]:
        return [e for e in self.entities if e.type == entity_type]

    def supporting_documents(self, subject: str, relation: str, obj: str) -> list[str]:
        """Ids of the documents whose text states the fact ``subject --relation--> obj``."""
        return list(self.support.get(Fact(subject, relation, obj), []))

    def documents_with(self, *names: str) -> list[Document]:
        """Documents whose text mentions all of ``names``."""
        return [d for d in self.documents if all(n in d.text for n in names)]

    def save_corpus(self, path: str | os.PathLike[str]) -> Path:
        """Write the corpus as JSONL (``{"id", "title", "text"}`` per line); see :func:`save_corpus`."""
        return save_corpus(self.documents, path)


def _word(rng: random.Random, syllables: int) -> str:
    parts = [rng.choice(_ONSETS) + rng.choice(_VOWELS) for _ in range(syllables)]
    return ("".join(parts) + rng.choice(_CODAS)).capitalize()


def _candidate_name(rng: random.Random, entity_type: str) -> str:
    if entity_type == "person":
        return f"{_word(rng, rng.randint(1, 2))} {_word(rng, rng.randint(2, 3))}"
    if entity_type == "city":
        return _word(rng, rng.randint(1, 2)) + rng.choice(_CITY_SUFFIX)
    if entity_type == "country":
        return _word(rng, 2).rstrip("aeiou") + rng.choice(_COUNTRY_SUFFIX)
    if entity_type == "company":
        return f"{_word(rng, 2)} {rng.choice(_COMPANY_SUFFIX)}"
    if entity_type == "university":
        return rng.choice(_UNIVERSITY_FORMS).format(w=_word(rng, 2))
    return f"{_word(rng, 2)} {rng.choice(_INVENTION_NOUNS)}"


def _unique_names(rng: random.Random, types: list[str]) -> list[str]:
    names: list[str] = []
    lowered: list[str] = []
    for entity_type in types:
        for _ in range(1000):
            name = _candidate_name(rng, entity_type)
            low = name.lower()
            if any(cue in low for cue in RELATION_CUES):
                continue
            if any(low in other or other in low for other in lowered):
                continue
            names.append(name)
            lowered.append(low)
            break
        else:  # pragma: no cover - the name space is far larger than any sensible KB
            raise TaskOptionError(f"could not invent {len(types)} distinct names; use fewer entities")
    return names


def _type_counts(n_entities: int) -> dict[str, int]:
    counts = {t: max(_MINIMUM[t], int(n_entities * _SHARE[t])) for t in ENTITY_TYPES}
    counts["person"] += n_entities - sum(counts.values())
    return counts


def _link(rng: random.Random, by_type: dict[str, list[Entity]]) -> list[Fact]:
    facts: list[Fact] = []
    people, cities, countries = by_type["person"], by_type["city"], by_type["country"]
    companies, universities = by_type["company"], by_type["university"]
    country_of: dict[str, str] = {}
    for i, city in enumerate(cities):
        country = countries[i] if i < len(countries) else rng.choice(countries)
        country_of[city.name] = country.name
        facts.append(Fact(city.name, "located_in", country.name))
        facts.append(Fact(city.name, "mayor", rng.choice(people).name))
    for country in countries:
        own = [c for c in cities if country_of[c.name] == country.name]
        facts.append(Fact(country.name, "capital", own[0].name))
    for person in people:
        facts.append(Fact(person.name, "born_in", rng.choice(cities).name))
        facts.append(Fact(person.name, "works_for", rng.choice(companies).name))
        facts.append(Fact(person.name, "studied_at", rng.choice(universities).name))
    for company in companies:
        founder, chief = rng.sample(people, 2)
        facts.append(Fact(company.name, "founded_by", founder.name))
        facts.append(Fact(company.name, "headquartered_in", rng.choice(cities).name))
        facts.append(Fact(company.name, "ceo", chief.name))
    for university in universities:
        facts.append(Fact(university.name, "based_in", rng.choice(cities).name))
    for invention in by_type["invention"]:
        facts.append(Fact(invention.name, "invented_by", rng.choice(people).name))
        facts.append(Fact(invention.name, "manufactured_by", rng.choice(companies).name))
    return facts


def _sentence(template: str, subject: Entity, obj: Entity) -> str:
    text = template.format(s=subject.mention, o=obj.mention)
    return text[0].upper() + text[1:]


def _distractor(rng: random.Random, entity: Entity, by_type: dict[str, list[Entity]]) -> str:
    def other(entity_type: str) -> str:
        pool = [e for e in by_type[entity_type] if e.name != entity.name] or by_type[entity_type]
        return rng.choice(pool).mention

    year = rng.randint(1850, 2020)
    m = entity.mention
    options = {
        "person": [
            f"{m} once visited {other('city')}.",
            f"{m} enjoys {rng.choice(_HOBBIES)}.",
            f"{m} met {other('person')} at a conference in {year}.",
            f"{m} wrote a book about {rng.choice(_TOPICS)}.",
        ],
        "city": [
            f"{m} has a population of about {rng.randint(20, 900) * 1000}.",
            f"{m} hosts an annual {rng.choice(_FESTIVALS)} festival.",
            f"{m} is twinned with {other('city')}.",
        ],
        "country": [
            f"{m} is known for its {rng.choice(_PRODUCTS)}.",
            f"{m} signed a trade agreement with {other('country')} in {year}.",
        ],
        "company": [
            f"{m} opened a branch office in {other('city')}.",
            f"{m} is a rival of {other('company')}.",
            f"{m} reported record sales in {year}.",
        ],
        "university": [
            f"{m} has about {rng.randint(2, 40) * 500} students.",
            f"{m} opened a new library in {year}.",
        ],
        "invention": [
            f"{m} was first demonstrated in {other('city')} in {year}.",
            f"{m} is often compared to {other('invention')}.",
        ],
    }[entity.type]
    text = rng.choice(options)
    return text[0].upper() + text[1:]


def _distractors(rng: random.Random, entity: Entity, by_type: dict[str, list[Entity]], k: int) -> list[str]:
    out: list[str] = []
    for _ in range(4 * k):
        text = _distractor(rng, entity, by_type)
        if text not in out:
            out.append(text)
        if len(out) == k:
            break
    return out


_INTROS = {
    "person": "{m} is {occupation}.",
    "city": "{m} is a city with a long history.",
    "country": "{m} is a country with a varied landscape.",
    "company": "{m} is a company.",
    "university": "{m} is a university.",
    "invention": "{m} is a device.",
}


def _documents(
    rng: random.Random, entities: list[Entity], facts: list[Fact], by_type: dict[str, list[Entity]]
) -> tuple[list[Document], dict[Fact, list[str]]]:
    by_name = {e.name: e for e in entities}
    outgoing: dict[str, list[Fact]] = {e.name: [] for e in entities}
    incoming: dict[str, list[Fact]] = {e.name: [] for e in entities}
    for fact in facts:
        outgoing[fact.subject].append(fact)
        incoming[fact.object].append(fact)

    def render(fact: Fact) -> tuple[str, Fact]:
        variants = RELATIONS[fact.relation][2]
        return _sentence(rng.choice(variants), by_name[fact.subject], by_name[fact.object]), fact

    documents: list[Document] = []
    support: dict[Fact, list[str]] = {f: [] for f in facts}
    for entity in entities:
        intro = _INTROS[entity.type].format(m=entity.mention, occupation=rng.choice(_OCCUPATIONS))
        intro = (intro[0].upper() + intro[1:], None)
        profile = [render(f) for f in outgoing[entity.name]]
        profile += [(t, None) for t in _distractors(rng, entity, by_type, rng.randint(1, 2))]
        rng.shuffle(profile)
        notes = [render(f) for f in incoming[entity.name]]
        notes += [(t, None) for t in _distractors(rng, entity, by_type, rng.randint(1, 2))]
        rng.shuffle(notes)
        bodies = [(entity.name, [intro, *profile]), (f"{entity.name}: notes", notes)]
        if rng.random() < 0.5:
            news = [(t, None) for t in _distractors(rng, entity, by_type, 2)]
            if outgoing[entity.name]:
                news.append(render(rng.choice(outgoing[entity.name])))
            rng.shuffle(news)
            bodies.append((f"{entity.name} in the news", news))
        for title, sentences in bodies:
            doc_id = f"doc-{len(documents):05d}"
            documents.append(Document(id=doc_id, title=title, text=" ".join(text for text, _ in sentences)))
            for _, fact in sentences:
                if fact is not None:
                    support[fact].append(doc_id)
    return documents, support


def build_knowledge_base(seed: int = 0, n_entities: int = 60) -> KnowledgeBase:
    """Build the KB and its corpus deterministically from ``seed`` (same arguments, equal result)."""
    if isinstance(n_entities, bool) or not isinstance(n_entities, int) or n_entities < MIN_ENTITIES:
        raise TaskOptionError(f"n_entities must be an int >= {MIN_ENTITIES}, got {n_entities!r}")
    rng = random.Random(f"knowledge-base:{seed}:{n_entities}")
    counts = _type_counts(n_entities)
    types = [t for t in ENTITY_TYPES for _ in range(counts[t])]
    names = _unique_names(rng, types)
    entities = [Entity(name, t) for name, t in zip(names, types, strict=True)]
    by_type = {t: [e for e in entities if e.type == t] for t in ENTITY_TYPES}
    facts = _link(rng, by_type)
    documents, support = _documents(rng, entities, facts, by_type)
    return KnowledgeBase(seed=seed, entities=entities, facts=facts, documents=documents, support=support)


def save_corpus(documents: Iterable[Document], path: str | os.PathLike[str]) -> Path:
    """Write documents as JSONL, atomically (temporary file renamed into place)."""
    return write_jsonl((json.dumps(doc.to_dict(), ensure_ascii=False) for doc in documents), path)


def load_corpus(path: str | os.PathLike[str]) -> list[Document]:
    """Read a corpus JSONL written by :func:`save_corpus` (or any file with id/title/text lines)."""
    source = Path(path)
    if not source.is_file():
        raise TaskFileNotFoundError(f"corpus file not found: {source} (write one with save_corpus(path))")
    documents = []
    with source.open(encoding="utf-8") as handle:
        for lineno, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise MalformedTaskFileError(
                    f"{source}:{lineno}: invalid JSON ({exc.msg} at column {exc.colno}); fix or remove the line"
                ) from None
            if not isinstance(record, dict) or not {"id", "text"} <= record.keys():
                have = ", ".join(record) if isinstance(record, dict) else type(record).__name__
                raise MissingFieldError(f"{source}:{lineno}: a document needs id and text; it has: {have}")
            documents.append(Document(str(record["id"]), str(record.get("title", "")), str(record["text"])))
    if not documents:
        raise EmptyTaskFileError(f"corpus file {source} holds no documents; regenerate it with save_corpus")
    return documents
