"""Named read queries of the dashboard over one run: each answers one page, one episode, one call or what
changed, never a whole run.

Every function takes a read-only ``RunReader`` and runs a few indexed SQL queries, so a run with 100k
calls answers about as fast as a small one (``python -m tests.perf.bench_dashboard_queries``):

    step_list(reader)                       # one row per step: episodes, calls, mean episode reward
    role_list(reader)                       # the roles that have calls, for a role filter
    episodes_page(reader, step, page, size, EpisodeFilter(role="verifier1", search="Wrong"))
    call_tree(reader, episode_id)           # the episode's calls nested by parent, no token arrays
    call_detail(reader, call_id)            # one call's token ids, owners, logprobs and texts
    data_version(reader)                    # moves whenever another connection commits
    metrics_since(reader, last_id)          # the metric rows of complete steps past an id
    complete_totals(reader)                 # the last complete step and the calls of complete steps

Indexes used (``schema.py``): ``episodes_by_step`` for a step's episodes and their count,
``calls_by_episode`` for an episode's calls (the tree, the per-episode filters and counts),
``calls_by_step`` (covering) for the calls per step, ``calls_by_role`` for the roles list. The text
search has no index: it reads the prompt and completion text of the calls of the step it searches.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import pandas as pd

from .call_row import CallRow
from .codec import TokenOwner, from_cell, int_from_cell
from .reader import RunReader

PAGE_SIZE = 50
#: Longest error text an episode row carries (the full text is in the store).
ERROR_PREVIEW = 200
#: Characters of a call's completion a call tree node carries as its preview.
PREVIEW_CHARS = 120


# ---------------------------------------------------------------------------------------------- helpers
def _like(text: str) -> str:
    """``text`` as a LIKE pattern matching it anywhere (``%``, ``_`` and ``\\`` taken literally)."""
    escaped = text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


# ---------------------------------------------------------------------------------------------- steps
def step_list(reader: RunReader) -> pd.DataFrame:
    """One row per step (the one being written included): step, status, policy_version, started_at,
    finished_at, episodes, calls and mean_reward (mean episode reward; NaN where none is stored)."""
    return reader.sql(
        "SELECT s.step, s.status, s.policy_version, s.started_at, s.finished_at, "
        "(SELECT count(*) FROM episodes e WHERE e.step = s.step) AS episodes, "
        "(SELECT count(*) FROM calls c WHERE c.step = s.step) AS calls, "
        "(SELECT avg(e.reward) FROM episodes e WHERE e.step = s.step) AS mean_reward "
        "FROM steps s ORDER BY s.step"
    )


def role_list(reader: RunReader) -> list[str]:
    """The roles that have calls in the run, sorted (what a role filter offers)."""
    return [str(r) for r in reader.sql("SELECT DISTINCT role FROM calls ORDER BY role")["role"]]


# ---------------------------------------------------------------------------------------------- episodes
@dataclass(frozen=True)
class EpisodeFilter:
    """What a page of episodes is narrowed to; fields left empty do not filter.

    ``min_reward``/``max_reward`` bound the episode's reward (episodes with none never pass a bound).
    The call conditions (``role``, ``format_failures``, ``search``) must all hold for one and the same
    call of the episode: ``role="verifier1", search="Wrong"`` finds episodes where a verifier1 call
    says "Wrong". ``search`` looks in the calls' prompt and completion text, case-insensitively for
    ASCII letters (SQL ``LIKE``; ``%`` and ``_`` are taken literally).
    """

    role: str | None = None
    min_reward: float | None = None
    max_reward: float | None = None
    format_failures: bool = False
    search: str | None = None

    def clauses(self) -> tuple[list[str], list[Any]]:
        """SQL conditions on ``episodes e`` and their parameters."""
        clauses: list[str] = []
        params: list[Any] = []
        if self.min_reward is not None:
            clauses.append("e.reward >= ?")
            params.append(float(self.min_reward))
        if self.max_reward is not None:
            clauses.append("e.reward <= ?")
            params.append(float(self.max_reward))
        calls: list[str] = []
        if self.role:
            calls.append("c.role = ?")
            params.append(str(self.role))
        if self.format_failures:
            calls.append("c.format_error IS NOT NULL")
        if self.search:
            calls.append("(c.completion_text LIKE ? ESCAPE '\\' OR c.prompt_text LIKE ? ESCAPE '\\')")
            params += [_like(self.search)] * 2
        if calls:
            clauses.append(
                f"EXISTS (SELECT 1 FROM calls c WHERE c.episode_id = e.id AND {' AND '.join(calls)})"
            )
        return clauses, params


@dataclass(frozen=True)
class EpisodePage:
    """One page of episodes and how many pass the filter in all (for a paginator)."""

    rows: pd.DataFrame
    total: int
    page: int
    size: int

    @property
    def pages(self) -> int:
        """Number of pages (at least 1, so an empty result still reads "page 1 of 1")."""
        return max(1, -(-self.total // self.size))

    @property
    def first(self) -> int:
        """Index (0-based) of the page's first episode among all that pass."""
        return self.page * self.size


def episodes_page(
    reader: RunReader,
    step: int | None,
    page: int = 0,
    size: int = PAGE_SIZE,
    where: EpisodeFilter | None = None,
) -> EpisodePage:
    """Episodes ``page * size`` .. ``page * size + size - 1`` of ``step`` (all steps when None) that pass
    ``where``, in id order, with the total that pass.

    Rows: id, step, task_id, group_key, status, reward, error (its first characters), calls (how
    many), format_errors (calls with a format error) and roles (the roles that were called, ", "-joined).
    """
    if page < 0 or size < 1:
        raise ValueError(f"page must be >= 0 and size >= 1, got page={page}, size={size}")
    clauses, params = (where or EpisodeFilter()).clauses()
    if step is not None:
        clauses.insert(0, "e.step = ?")
        params.insert(0, int(step))
    condition = f" WHERE {' AND '.join(clauses)}" if clauses else ""
    total = int(reader.sql(f"SELECT count(*) AS n FROM episodes e{condition}", params)["n"].iloc[0])
    rows = reader.sql(
        "SELECT e.id, e.step, e.task_id, e.group_key, e.status, e.reward, "
        f"substr(e.error, 1, {ERROR_PREVIEW}) AS error, "
        "(SELECT count(*) FROM calls c WHERE c.episode_id = e.id) AS calls, "
        "(SELECT count(*) FROM calls c WHERE c.episode_id = e.id AND c.format_error IS NOT NULL) "
        "AS format_errors, "
        "(SELECT group_concat(DISTINCT c.role) FROM calls c WHERE c.episode_id = e.id) AS roles "
        f"FROM episodes e{condition} ORDER BY e.id LIMIT ? OFFSET ?",
        # past the end (no match at all, say) LIMIT 0 returns the columns without scanning again
        [*params, int(size) if page * size < total else 0, int(page) * int(size)],
    )
    rows["roles"] = [", ".join(r.split(",")) if isinstance(r, str) else "" for r in rows["roles"]]
    return EpisodePage(rows=rows, total=total, page=int(page), size=int(size))


# ---------------------------------------------------------------------------------------------- calls
@dataclass(kw_only=True)
class StoredCall(CallRow):
    """A call read back from the store: its `CallRow` (``call_id`` is its id; token arrays as lists, None
    where not read or not stored) and what the store derives: token counts, the start of its completion
    (``preview``), each completion token's owner (``owners``: the stored mask, all ``TRAINABLE`` where none
    is stored; filled by `call_detail`) and, in a call tree, the calls it started (``children``)."""

    n_prompt: int | None = None
    n_completion: int | None = None
    preview: str = ""
    owners: list[int] = field(default_factory=list)
    children: list[StoredCall] = field(default_factory=list)

    @property
    def id(self) -> int:
        return int(self.call_id)


#: The calls table's columns, named as StoredCall's fields (the id is ``call_id``).
_STORED = [f.name for f in fields(StoredCall) if f.name not in ("call_id", "preview", "owners", "children")]
#: What a call tree leaves out: the token arrays and full texts.
_BULKY = {
    "prompt_ids",
    "completion_ids",
    "logprobs",
    "mask",
    "token_advantages",
    "prompt_text",
    "completion_text",
}
_TREE_COLUMNS = ", ".join(
    [
        "id AS call_id",
        *(c for c in _STORED if c not in _BULKY),
        f"substr(completion_text, 1, {PREVIEW_CHARS}) AS preview",
    ]
)
_DETAIL_COLUMNS = ", ".join(["id AS call_id", *_STORED])


def _stored(row: Any) -> StoredCall:
    """A row of the calls table (a pandas row) as a StoredCall: arrays as lists, NULL as None."""
    return StoredCall(**{name: from_cell(value) for name, value in row._asdict().items()})


def call_tree(reader: RunReader, episode_id: int) -> list[StoredCall]:
    """The calls of one episode (no token arrays) as a forest: the top-level calls (no parent, or a parent
    outside the episode) in position order, each with its children nested."""
    frame = reader.sql(
        f"SELECT {_TREE_COLUMNS} FROM calls WHERE episode_id = ? ORDER BY position, id", [int(episode_id)]
    )
    nodes = [_stored(row) for row in frame.itertuples(index=False)]
    for node in nodes:
        node.preview = node.preview or ""  # no completion text stored
    by_id = {node.id: node for node in nodes}
    roots = []
    for node in nodes:
        parent = by_id.get(node.parent_id) if node.parent_id is not None else None
        if parent is None or parent is node:
            roots.append(node)
        else:
            parent.children.append(node)
    return roots


def walk(nodes: Sequence[StoredCall], depth: int = 0) -> Iterator[tuple[int, StoredCall]]:
    """Every call of a forest, depth first in position order, with its depth (0 for top-level calls)."""
    for node in nodes:
        yield depth, node
        yield from walk(node.children, depth + 1)


def call_detail(reader: RunReader, call_id: int) -> StoredCall:
    """The full token detail of one call (``prompt_ids`` and ``completion_ids`` lists, texts ``""`` where none
    is stored, ``owners`` filled); KeyError when the run has no call ``call_id``."""
    frame = reader.sql(f"SELECT {_DETAIL_COLUMNS} FROM calls WHERE id = ?", [int(call_id)])
    if frame.empty:
        raise KeyError(f"no call {call_id} in run {reader.run_id}")
    call = _stored(next(frame.itertuples(index=False)))
    call.prompt_ids, call.completion_ids = call.prompt_ids or [], call.completion_ids or []
    call.prompt_text, call.completion_text = call.prompt_text or "", call.completion_text or ""
    call.owners = call.mask or [int(TokenOwner.TRAINABLE)] * len(call.completion_ids)
    return call


# ---------------------------------------------------------------------------------------------- changes
def data_version(reader: RunReader) -> int:
    """SQLite's ``PRAGMA data_version`` of the reader's connection: it moves whenever another connection
    commits, so an unchanged number means nothing new to read."""
    return int(reader.sql("PRAGMA data_version").iloc[0, 0])


def metrics_since(reader: RunReader, last_id: int) -> pd.DataFrame:
    """The metric rows of complete steps with an id past ``last_id``, by id: id, step, role, name, value
    (role None for run-wide metrics)."""
    return reader.sql(
        "SELECT m.id, m.step, m.role, m.name, m.value FROM metrics m "
        "JOIN steps s ON s.step = m.step WHERE m.id > ? AND s.status = 'complete' ORDER BY m.id",
        (int(last_id),),
    )


def complete_totals(reader: RunReader) -> tuple[int | None, int]:
    """The run's last complete step (None before one) and how many calls its complete steps hold."""
    row = reader.sql(
        "SELECT max(step) AS last_step, (SELECT count(*) FROM calls WHERE step IN "
        "(SELECT step FROM steps WHERE status = 'complete')) AS calls "
        "FROM steps WHERE status = 'complete'"
    ).iloc[0]
    return int_from_cell(row["last_step"]), int(row["calls"])
