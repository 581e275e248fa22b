"""One call as the store writes it: the arguments of `StepWriter.add_call`.

A `CallRow` is the call's `CallFields` (declared once, in `records`) plus what only the store has: the
episode, stored ids instead of episode positions, the parsed action and per-token advantages. `CallRow.of`
builds it from the engine's `CallRecord`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import KW_ONLY, dataclass, fields
from typing import Any

from .records import CallFields, CallRecord


@dataclass
class CallRow(CallFields):
    """A call of an episode of the step. Token arrays (lists, numpy arrays or CPU tensors) are stored as
    int32/float32/uint8 BLOBs; `logprobs`, `mask` (TokenOwner codes) and `token_advantages` need one
    entry per completion token. `position` (order within the episode) defaults to the next free one;
    `policy_version` to the step's. `action`, `tool_calls`, `tool_results` and `timings` are JSON;
    `rewards` maps reward names to numbers. `parent_id` is the call that invoked this one, `source_id`
    the call whose output this one consumed (provenance), `previous_id` the call before it on its branch
    (grouped rollouts); `call_id` one reserved with `new_call_id()`."""

    episode_id: int
    _: KW_ONLY
    call_id: int | None = None
    parent_id: int | None = None
    source_id: int | None = None
    previous_id: int | None = None
    action: Any = None
    token_advantages: Any = None

    @classmethod
    def of(cls, call: CallRecord, episode_id: int, ids: Mapping[int, int]) -> CallRow:
        """The row of an engine's call record; ``ids`` maps the episode's positions to stored call ids (the
        record's `parent`, `source` and `previous` calls, stored before it)."""
        row = {f.name: getattr(call, f.name) for f in fields(CallFields)}
        row.update(mask=call.owners(), timings={**call.timings, "finish_reason": call.finish_reason})
        links = {f"{link}_id": ids.get(getattr(call, link)) for link in ("parent", "source", "previous")}
        return cls(**row, **links, episode_id=episode_id, action=call.parsed)


#: Keys accepted by add_call / add_calls (the fields of CallRow).
CALL_FIELDS = frozenset(f.name for f in fields(CallRow))
