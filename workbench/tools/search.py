"""Local search: Okapi BM25 over a document corpus, answering in the shape of web search results.

``BM25Index`` is a small in-memory inverted index (lowercased alphanumeric tokens, a short English
stopword list) with the Lucene form of BM25: ``idf = ln(1 + (N - df + 0.5) / (df + 0.5))`` and term
weight ``idf * tf * (k1 + 1) / (tf + k1 * (1 - b + b * len / avglen))``. Each term's weights are
computed once at indexing time, so a query is a few vector additions (numpy).

``SearchTool`` (tool kind ``bm25``) serves an index to agents: a call takes one query (``query`` or
``q``, MATPO's ``google_search`` argument) or several (``queries``, MARS's multi-query search) and
returns up to ``top_k`` results per query as ``{"query", "rank", "title", "url", "snippet", "text",
"score"}``, where ``url`` is ``kb://<document id>`` unless the corpus gives one. Results whose url
contains a blocklisted substring (MATPO blocks ``huggingface.co/datasets``) are dropped before the
top ``k`` are taken. The default corpus is the multi-hop knowledge base of the ``multihop`` tasks
(``build_knowledge_base(kb_seed=0, n_entities=60)``, the generator's defaults).
"""

from __future__ import annotations

import math
import os
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from workbench.tools.base import Tool, ToolOptionError, ToolResult

_TOKEN = re.compile(r"[^\W_]+")
STOPWORDS = frozenset(
    [
        "a",
        "an",
        "and",
        "are",
        "as",
        "at",
        "be",
        "by",
        "did",
        "does",
        "do",
        "for",
        "from",
        "has",
        "have",
        "he",
        "her",
        "his",
        "how",
        "in",
        "is",
        "it",
        "its",
        "of",
        "on",
        "or",
        "she",
        "that",
        "the",
        "their",
        "this",
        "to",
        "was",
        "were",
        "what",
        "when",
        "where",
        "which",
        "who",
        "whom",
        "whose",
        "why",
        "with",
    ]
)


def tokenize(text: str, stopwords: frozenset[str] = STOPWORDS) -> list[str]:
    """Lowercased runs of letters and digits (punctuation and underscores split words), minus stopwords."""
    return [t for t in _TOKEN.findall(text.lower()) if t not in stopwords]


@dataclass(frozen=True)
class SearchDocument:
    """A document as the index holds it."""

    id: str
    title: str
    text: str
    url: str


def _as_document(item: Any, position: int) -> SearchDocument:
    if isinstance(item, Mapping):
        record = item
    elif hasattr(item, "text"):
        record = {"id": getattr(item, "id", None), "title": getattr(item, "title", ""), "text": item.text}
    else:
        raise ToolOptionError(
            f"corpus item {position} is a {type(item).__name__}; give Document objects or dicts with "
            "'id', 'title' and 'text'"
        )
    if not isinstance(record.get("text"), str):
        raise ToolOptionError(f"corpus item {position} has no 'text' string; every document needs one")
    doc_id = str(record.get("id") if record.get("id") is not None else position)
    return SearchDocument(
        doc_id, str(record.get("title") or ""), record["text"], str(record.get("url") or f"kb://{doc_id}")
    )


class BM25Index:
    """An Okapi BM25 index over documents (title and text are indexed together)."""

    def __init__(self, documents: Iterable[Any], k1: float = 1.5, b: float = 0.75):
        if k1 < 0 or not 0 <= b <= 1:
            raise ToolOptionError(f"BM25 needs k1 >= 0 and 0 <= b <= 1, got k1={k1}, b={b}")
        self.documents = [_as_document(d, i) for i, d in enumerate(documents)]
        if not self.documents:
            raise ToolOptionError("the search corpus is empty; give at least one document")
        self.k1, self.b = k1, b
        counts = [Counter(tokenize(f"{d.title}\n{d.text}")) for d in self.documents]
        lengths = np.array([sum(c.values()) for c in counts], dtype=np.float64)
        n = len(self.documents)
        norm = k1 * (1 - b + b * lengths / max(lengths.mean(), 1e-9))
        postings: dict[str, tuple[list[int], list[int]]] = {}
        for doc, counter in enumerate(counts):
            for term, tf in counter.items():
                entry = postings.get(term)
                if entry is None:
                    postings[term] = ([doc], [tf])
                else:
                    entry[0].append(doc)
                    entry[1].append(tf)
        self._postings: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        for term, (docs, tfs) in postings.items():
            ids = np.array(docs, dtype=np.int64)
            tf = np.array(tfs, dtype=np.float64)
            idf = math.log(1 + (n - len(docs) + 0.5) / (len(docs) + 0.5))
            self._postings[term] = (ids, idf * tf * (k1 + 1) / (tf + norm[ids]))

    def __len__(self) -> int:
        return len(self.documents)

    def scores(self, query: str) -> np.ndarray:
        """BM25 score of every document for ``query`` (a repeated query word counts once per repeat)."""
        out = np.zeros(len(self.documents))
        for term in tokenize(query):
            posting = self._postings.get(term)
            if posting is not None:
                out[posting[0]] += posting[1]
        return out

    def search(
        self, query: str, top_k: int = 10, blocklist: Sequence[str] = ()
    ) -> list[tuple[SearchDocument, float]]:
        """The ``top_k`` best documents with a positive score, best first; blocklisted urls skipped."""
        scores = self.scores(query)
        candidates = np.flatnonzero(scores > 0)
        if not len(candidates) or top_k <= 0:
            return []
        # Order by score, then by corpus position, so equal scores rank reproducibly.
        ranked = candidates[np.lexsort((candidates, -scores[candidates]))]
        out = []
        for doc in ranked:
            document = self.documents[doc]
            if any(pattern in document.url for pattern in blocklist):
                continue
            out.append((document, float(scores[doc])))
            if len(out) == top_k:
                break
        return out


def _load_corpus(corpus: Any, kb_seed: int, n_entities: int) -> list[Any]:
    if corpus is None:
        from workbench.tasks import build_knowledge_base

        return build_knowledge_base(kb_seed, n_entities).documents
    if isinstance(corpus, str | os.PathLike):
        from workbench.tasks import load_corpus

        return load_corpus(corpus)
    if hasattr(corpus, "documents"):  # a KnowledgeBase
        return list(corpus.documents)
    return list(corpus)


def queries_of(arguments: Mapping[str, Any]) -> list[str]:
    """The queries of a search call: ``queries`` (a list or one string), else ``query``, else ``q``."""
    queries = arguments.get("queries")
    if isinstance(queries, str):
        queries = [queries]
    if not queries:
        single = arguments.get("query", arguments.get("q"))
        queries = [single] if single else []
    return [q for q in (str(q).strip() for q in queries) if q]


SEARCH_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "queries": {
            "type": ["array", "string"],
            "items": {"type": "string"},
            "minItems": 1,
            "description": "Search queries; each returns its own results.",
        },
        "query": {"type": "string", "description": "One search query."},
        "q": {"type": "string", "description": "One search query (Serper's name for it)."},
        "purpose": {"type": "string", "description": "What the results are for (read by System 1)."},
        "num": {"type": "integer", "minimum": 1, "description": "Results per query (at most top_k)."},
    },
    "anyOf": [{"required": ["queries"]}, {"required": ["query"]}, {"required": ["q"]}],
}


class SearchTool(Tool):
    """Tool kind ``bm25``: BM25 search over a local corpus, returning web-search-shaped results.

    Options: ``corpus`` (a JSONL path from ``save_corpus``, a ``KnowledgeBase``, or documents; default
    the multihop KB built from ``kb_seed`` and ``n_entities``), ``top_k`` results per query, BM25's
    ``k1`` and ``b``, ``blocklist`` (url substrings to drop), ``snippet_chars`` (length of the
    ``snippet``), ``dedupe`` (drop a document already returned for an earlier query of the call).
    """

    description = "Search the corpus; returns the best matching documents for each query."
    parameters = SEARCH_PARAMETERS

    def __init__(
        self,
        corpus: Any = None,
        *,
        kb_seed: int = 0,
        n_entities: int = 60,
        top_k: int = 10,
        k1: float = 1.5,
        b: float = 0.75,
        blocklist: Sequence[str] = (),
        snippet_chars: int = 200,
        dedupe: bool = True,
        name: str = "search",
    ):
        if top_k < 1:
            raise ToolOptionError(f"bm25 top_k must be >= 1, got {top_k}")
        if isinstance(blocklist, str):
            blocklist = [blocklist]
        self.name = name
        self.top_k = top_k
        self.blocklist = tuple(blocklist)
        self.snippet_chars = snippet_chars
        self.dedupe = dedupe
        self.index = BM25Index(_load_corpus(corpus, kb_seed, n_entities), k1=k1, b=b)

    def search(self, queries: Sequence[str], top_k: int | None = None) -> list[dict[str, Any]]:
        """Results of all ``queries``, query by query, each ranked best first."""
        k = min(top_k or self.top_k, self.top_k)
        seen: set[str] = set()
        results: list[dict[str, Any]] = []
        for query in queries:
            rank = 0
            for document, score in self.index.search(
                query, k + len(seen) if self.dedupe else k, self.blocklist
            ):
                if self.dedupe and document.id in seen:
                    continue
                seen.add(document.id)
                rank += 1
                results.append(
                    {
                        "query": query,
                        "rank": rank,
                        "title": document.title,
                        "url": document.url,
                        "snippet": _snippet(document.text, self.snippet_chars),
                        "text": document.text,
                        "score": round(score, 4),
                    }
                )
                if rank == k:
                    break
        return results

    async def __call__(self, **arguments: Any) -> ToolResult:
        queries = queries_of(arguments)
        if not queries:
            return ToolResult.failure(f"{self.name}: no query given; pass 'queries' (a list) or 'query'")
        results = self.search(queries, arguments.get("num"))
        return ToolResult(ok=True, content=results, metadata={"queries": queries, "results": len(results)})


def _snippet(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    cut = text[:limit].rsplit(" ", 1)[0]
    return cut + " ..."
