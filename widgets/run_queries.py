"""Server-side queries of the trajectory views: each answers one page or one episode, never a whole run.

Every function takes a read-only ``RunReader`` and runs one indexed SQL query (``episodes_by_step``,
``calls_by_episode``, ``calls_by_step``), so a run with 100k calls answers as fast as a small one: the
steps list, one page of a step's episodes with filters, one episode's call tree without its token
arrays, and one call's tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any

import pandas as pd

from workbench.store import RunReader
from workbench.store.codec import FLOAT_DTYPE, IDS_DTYPE, MASK_DTYPE, decode_array, loads

PAGE_SIZE = 50
TREE_COLUMNS = (
    "id, parent_id, source_id, role, policy, position, policy_version, n_prompt, n_completion, advantage, "
    "rewards, format_error, action, tool_calls, tool_results"
)


@dataclass(frozen=True)
class EpisodeFilter:
    """What a page of episodes is narrowed to; empty fields do not filter."""

    role: str | None = None
    min_reward: float | None = None
    max_reward: float | None = None
    format_failures: bool = False
    search: str | None = None

    def where(self) -> tuple[str, list[Any]]:
        clauses, params = ["e.step = ?", "e.status != 'running'"], []
        if self.min_reward is not None:
            clauses.append("e.reward >= ?")
            params.append(float(self.min_reward))
        if self.max_reward is not None:
            clauses.append("e.reward <= ?")
            params.append(float(self.max_reward))
        calls, call_params = [], []
        if self.role:
            calls.append("c.role = ?")
            call_params.append(self.role)
        if self.format_failures:
            calls.append("c.format_error IS NOT NULL")
        if self.search:
            calls.append("(instr(c.completion_text, ?) > 0 OR instr(c.prompt_text, ?) > 0)")
            call_params += [self.search, self.search]
        if calls:
            clauses.append(
                f"EXISTS (SELECT 1 FROM calls c WHERE c.episode_id = e.id AND {' AND '.join(calls)})"
            )
            params += call_params
        return " AND ".join(clauses), params


def steps(reader: RunReader) -> pd.DataFrame:
    """One row per step: status, episodes, mean episode reward."""
    return reader.sql(
        "SELECT s.step, s.status, s.policy_version, "
        "(SELECT count(*) FROM episodes e WHERE e.step = s.step) AS episodes, "
        "(SELECT avg(e.reward) FROM episodes e WHERE e.step = s.step) AS mean_reward "
        "FROM steps s ORDER BY s.step"
    )


def episodes_page(
    reader: RunReader, step: int, page: int = 0, size: int = PAGE_SIZE, where: EpisodeFilter | None = None
) -> tuple[pd.DataFrame, int]:
    """Episodes ``page * size`` .. of ``step`` that pass ``where``, and how many pass in all."""
    clause, params = (where or EpisodeFilter()).where()
    total = int(
        reader.sql(f"SELECT count(*) AS n FROM episodes e WHERE {clause}", [int(step), *params])["n"][0]
    )
    frame = reader.sql(
        f"SELECT e.id, e.task_id, e.group_key, e.status, e.reward, e.error, "
        f"(SELECT count(*) FROM calls c WHERE c.episode_id = e.id) AS calls "
        f"FROM episodes e WHERE {clause} ORDER BY e.id LIMIT ? OFFSET ?",
        [int(step), *params, int(size), int(page) * int(size)],
    )
    return frame, total


def call_tree(reader: RunReader, episode_id: int) -> pd.DataFrame:
    """The calls of one episode in position order, JSON fields decoded, token arrays left out."""
    frame = reader.sql(
        f"SELECT {TREE_COLUMNS} FROM calls WHERE episode_id = ? ORDER BY position", [int(episode_id)]
    )
    for column in ("rewards", "action", "tool_calls", "tool_results"):
        frame[column] = [loads(v) if isinstance(v, str) else v for v in frame[column]]
    return frame


def children(tree: pd.DataFrame) -> dict[Any, list[int]]:
    """parent call id (None for the episode's top level) -> its calls' row indices, in order."""
    out: dict[Any, list[int]] = {}
    ids = set(tree["id"])
    for i, parent in enumerate(tree["parent_id"]):
        key = None if pd.isna(parent) or parent not in ids else int(parent)
        out.setdefault(key, []).append(i)
    return out


@dataclass
class CallTokens:
    prompt_text: str
    completion_ids: list[int]
    tokens: list[str]
    owners: list[int]
    logprobs: list[float]
    advantage: float | None
    token_advantages: list[float] | None
    policy: str | None


def call_tokens(reader: RunReader, call_id: int) -> CallTokens:
    """One call's completion token by token: text, owner code, logprob, advantage."""
    row = reader.sql(
        "SELECT prompt_text, completion_ids, mask, logprobs, token_advantages, advantage, policy "
        "FROM calls WHERE id = ?",
        [int(call_id)],
    ).iloc[0]
    ids = [int(i) for i in decode_array(row["completion_ids"], IDS_DTYPE, "list") or []]
    owners = [int(o) for o in decode_array(row["mask"], MASK_DTYPE, "list") or [1] * len(ids)]
    logprobs = [float(x) for x in decode_array(row["logprobs"], FLOAT_DTYPE, "list") or []]
    token_adv = decode_array(row["token_advantages"], FLOAT_DTYPE, "list")
    return CallTokens(
        prompt_text=row["prompt_text"] or "",
        completion_ids=ids,
        tokens=token_texts(reader, ids),
        owners=owners,
        logprobs=logprobs,
        advantage=None if pd.isna(row["advantage"]) else float(row["advantage"]),
        token_advantages=None if token_adv is None else [float(x) for x in token_adv],
        policy=row["policy"],
    )


def token_texts(reader: RunReader, ids: list[int]) -> list[str]:
    """Each token's text with the run's tokenizer; ``<id>`` where no tokenizer can be loaded."""
    tokenizer = _tokenizer(str(reader.config.get("model") or ""))
    if tokenizer is None:
        return [f"<{i}>" for i in ids]
    return [tokenizer.decode([i], skip_special_tokens=False) for i in ids]


@cache
def _tokenizer(model: str) -> Any:
    if not model:
        return None
    try:
        from transformers import AutoTokenizer

        from workbench.models import resolve

        return AutoTokenizer.from_pretrained(resolve(model))
    except Exception:  # noqa: BLE001 - a missing model only costs the token texts
        return None
