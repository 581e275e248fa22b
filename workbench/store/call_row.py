"""One call as the store writes it: the arguments of `StepWriter.add_call`, declared once.

`CallRow.of` builds it from the engine's `CallRecord`: the fields both share by name are copied; the
rest is where the store differs (ids instead of positions, the owner mask, the parsed action, the finish
reason kept in the timings, empty collections stored as NULL).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import KW_ONLY, dataclass, fields
from typing import Any

from .records import CallRecord


@dataclass
class CallRow:
    """A call of an episode of the step. Token arrays (lists, numpy arrays or CPU tensors) are stored as
    int32/float32/uint8 BLOBs; `logprobs`, `mask` (TokenOwner codes) and `token_advantages` need one
    entry per completion token. `position` (order within the episode) defaults to the next free one;
    `policy_version` to the step's. `action`, `tool_calls`, `tool_results` and `timings` are JSON;
    `rewards` maps reward names to numbers. `parent_id` is the call that invoked this one, `source_id`
    the call whose output this one consumed (provenance); `call_id` one reserved with `new_call_id()`."""

    episode_id: int
    role: str
    _: KW_ONLY
    call_id: int | None = None
    parent_id: int | None = None
    policy: str | None = None
    position: int | None = None
    prompt_ids: Any = None
    completion_ids: Any = None
    logprobs: Any = None
    mask: Any = None
    prompt_text: str | None = None
    completion_text: str | None = None
    action: Any = None
    tool_calls: Any = None
    tool_results: Any = None
    rewards: Mapping[str, float] | None = None
    advantage: float | None = None
    token_advantages: Any = None
    policy_version: int | None = None
    timings: Mapping[str, Any] | None = None
    format_error: str | None = None
    source_id: int | None = None

    @classmethod
    def of(
        cls, call: CallRecord, episode_id: int, parent_id: int | None = None, source_id: int | None = None
    ) -> CallRow:
        """The row of an engine's call record; `parent_id`/`source_id` are the stored ids of the calls at
        the record's `parent` and `source` positions."""
        row = {name: getattr(call, name) for name in _SHARED}
        row.update(
            mask=call.owners(),
            action=call.parsed,
            timings={**call.timings, "finish_reason": call.finish_reason},
            rewards=call.rewards or None,
            tool_calls=call.tool_calls or None,
            tool_results=call.tool_results or None,
        )
        return cls(**row, episode_id=episode_id, parent_id=parent_id, source_id=source_id)


#: Keys accepted by add_call / add_calls (the fields of CallRow).
CALL_FIELDS = frozenset(f.name for f in fields(CallRow))
_SHARED = CALL_FIELDS & {f.name for f in fields(CallRecord)}
