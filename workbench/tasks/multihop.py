"""Multi-hop questions (1 to 4 hops) over the generated knowledge base, for local deep research.

A question chains functional relations from a start entity, e.g. 3 hops:
"In which city was the founder of the manufacturer of the Quorvex Loom born?". Each hop's fact is
a sentence of the corpus that ``build_knowledge_base(kb_seed, n_entities)`` writes, so the answer
is reachable by searching the corpus hop by hop. Metadata holds the chain
(``[[subject, relation, object], ...]``), the documents supporting each hop, and ``kb_seed`` /
``n_entities`` to rebuild the corpus. Answers are entity names, checked by ``exact`` (default) or
``f1``.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from workbench.tasks.errors import TaskGenerationError, TaskOptionError
from workbench.tasks.knowledge_base import KnowledgeBase, build_knowledge_base
from workbench.tasks.registry import register_generator
from workbench.tasks.task import Task

MAX_HOPS = 4

# relation -> (noun phrase for an inner hop, question for the outermost hop); {x} is the inner text.
PHRASES: dict[str, tuple[str, str]] = {
    "born_in": ("the birthplace of {x}", "In which city was {x} born?"),
    "works_for": ("the employer of {x}", "Which company does {x} work for?"),
    "studied_at": ("the university where {x} studied", "At which university did {x} study?"),
    "located_in": ("the country where {x} is located", "In which country is {x} located?"),
    "mayor": ("the mayor of {x}", "Who is the mayor of {x}?"),
    "capital": ("the capital of {x}", "What is the capital of {x}?"),
    "founded_by": ("the founder of {x}", "Who founded {x}?"),
    "headquartered_in": ("the city where {x} is headquartered", "In which city is {x} headquartered?"),
    "ceo": ("the CEO of {x}", "Who is the CEO of {x}?"),
    "based_in": ("the city where {x} is based", "In which city is {x} based?"),
    "invented_by": ("the inventor of {x}", "Who invented {x}?"),
    "manufactured_by": ("the manufacturer of {x}", "Which company manufactures {x}?"),
}


def _walk(rng: random.Random, kb: KnowledgeBase, hops: int) -> list[tuple[str, str, str]] | None:
    start = rng.choice(kb.entities).name
    chain: list[tuple[str, str, str]] = []
    seen = {start}
    current = start
    for _ in range(hops):
        options = [r for r in kb.relations_of(current) if kb.follow(current, r) not in seen]
        if not options:
            return None
        relation = rng.choice(options)
        nxt = kb.follow(current, relation)
        assert nxt is not None
        chain.append((current, relation, nxt))
        seen.add(nxt)
        current = nxt
    return chain


def render_question(kb: KnowledgeBase, chain: Sequence[Sequence[str]]) -> str:
    """The question text for a relation chain starting at ``chain[0][0]``."""
    text = kb.entity(chain[0][0]).mention
    for _, relation, _ in chain[:-1]:
        text = PHRASES[relation][0].format(x=text)
    question = PHRASES[chain[-1][1]][1].format(x=text)
    return question[0].upper() + question[1:]


def _hops(hops: int | Sequence[int]) -> list[int]:
    values = [hops] if isinstance(hops, int) else list(hops)
    if not values or any(isinstance(h, bool) or h not in range(1, MAX_HOPS + 1) for h in values):
        raise TaskOptionError(f"multihop hops must be in 1..{MAX_HOPS} (or a list of such), got {hops!r}")
    return values


@register_generator("multihop")
def generate_multihop(
    n: int,
    seed: int,
    *,
    hops: int | Sequence[int] = (1, 2, 3, 4),
    n_entities: int = 60,
    kb_seed: int | None = None,
    verifier: str = "exact",
    knowledge_base: KnowledgeBase | None = None,
) -> list[Task]:
    """``n`` distinct questions; task ``i`` has ``hops[i % len(hops)]`` hops.

    The KB is ``build_knowledge_base(kb_seed, n_entities)`` (``kb_seed`` defaults to ``seed``), or
    ``knowledge_base`` when given (it must come from ``build_knowledge_base`` for metadata to match).
    """
    wanted = _hops(hops)
    kb = knowledge_base or build_knowledge_base(seed if kb_seed is None else kb_seed, n_entities)
    rng = random.Random(f"multihop:{seed}:{kb.seed}:{len(kb.entities)}")
    tasks: list[Task] = []
    questions: set[str] = set()
    for i in range(n):
        n_hops = wanted[i % len(wanted)]
        for _ in range(200):
            chain = _walk(rng, kb, n_hops)
            if chain is None:
                continue
            question = render_question(kb, chain)
            if question not in questions:
                break
        else:
            raise TaskGenerationError(
                f"multihop: could not find {n} distinct {n_hops}-hop questions in a KB of "
                f"{len(kb.entities)} entities; raise n_entities or lower n"
            )
        questions.add(question)
        tasks.append(
            Task(
                id=f"multihop-{seed}-{i:05d}",
                question=question,
                answer=chain[-1][2],
                verifier=verifier,
                metadata={
                    "source": "multihop",
                    "hops": n_hops,
                    "difficulty": n_hops,
                    "start": chain[0][0],
                    "chain": [list(hop) for hop in chain],
                    "relations": [r for _, r, _ in chain],
                    "answer_type": kb.entity(chain[-1][2]).type,
                    "supporting_docs": [kb.supporting_documents(*hop) for hop in chain],
                    "kb_seed": kb.seed,
                    "n_entities": len(kb.entities),
                },
            )
        )
    return tasks
