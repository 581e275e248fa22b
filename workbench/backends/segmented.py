"""Segment rollout: decode at most ``segment_len`` tokens of a request at a time, then queue it again.

A long completion no longer holds a static batch until its last token: after each segment it goes
back to the backend's queue and is batched with whatever is ready then, and a weight update that
lands between two segments is used by the next one. Every segment's policy version is kept, so
staleness is counted from the oldest segment (``Generation.policy_version``) and the trainer can
treat the importance ratio as the run's ``stale_ratio`` says (``workbench.rl.config``).

The continuation prompt is the exact prompt ids plus the completion ids so far (never re-tokenised
text); a stop string that straddles two segments is found on the joined completion.

A scheduler can carry unfinished requests over to its next step (MarsRL's segment rollout in the
pipeline): it sets ``segment_hooks`` (a context variable, so it reaches the calls of the coroutines it
starts) to an object told when a request starts and ends, and awaited between two of its segments,
where it may hold the request until the next step opens.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import time
from typing import Protocol

from workbench.backends.base import Generation, GenerationRequest, cut_at_stop
from workbench.backends.wrapper import BackendWrapper


class SegmentHooks(Protocol):
    def running(self, change: int) -> None:
        """A request of this context started (+1) or ended (-1)."""

    async def between_segments(self, carried: int) -> bool:
        """Awaited before a request's next segment (it was carried over ``carried`` times so far);
        True when it held the request over to a later step."""


segment_hooks: contextvars.ContextVar[SegmentHooks | None] = contextvars.ContextVar(
    "segment_hooks", default=None
)


class SegmentedBackend(BackendWrapper):
    """Splits every generation into segments of at most ``segment_len`` tokens."""

    def __init__(self, inner: object, segment_len: int):
        if not isinstance(segment_len, int) or segment_len < 1:
            raise ValueError(f"segment_len must be a positive integer, got {segment_len!r}")
        super().__init__(inner)
        self.segment_len = segment_len

    async def generate(self, request: GenerationRequest) -> list[Generation]:
        if request.n == 1:
            return [await self._one(request)]
        singles = [
            dataclasses.replace(request, n=1, seed=None if request.seed is None else request.seed + i)
            for i in range(request.n)
        ]
        return list(await asyncio.gather(*(self._one(r) for r in singles)))

    async def _one(self, request: GenerationRequest) -> Generation:
        started = time.perf_counter()
        hooks = segment_hooks.get()
        if hooks is not None:
            hooks.running(+1)
        try:
            ids, logprobs, versions, starts, finish, stop_reason = await self._segments(request, hooks)
        finally:
            if hooks is not None:
                hooks.running(-1)
        return Generation(
            completion_ids=ids,
            logprobs=logprobs,
            text=self.tokenizer.decode(ids, skip_special_tokens=True),
            finish_reason=finish,
            stop_reason=stop_reason,
            policy_version=min(versions, default=self.policy_version),
            timings={
                "generate_s": time.perf_counter() - started,
                "segments": len(versions),
                "segment_versions": versions,
                "segment_starts": starts,
            },
        )

    async def _segments(self, request: GenerationRequest, hooks: SegmentHooks | None) -> tuple:
        prompt = tuple(request.prompt_ids)
        ids: list[int] = []
        logprobs: list[float] = []
        versions: list[int] = []
        starts: list[int] = []
        finish, stop_reason, carried = "length", None, 0
        while len(ids) < request.max_tokens:
            if ids and hooks is not None:
                carried += await hooks.between_segments(carried)
            budget = min(self.segment_len, request.max_tokens - len(ids))
            # a seeded request's later segments draw on from another seed, not the first segment's draws again
            seed = None if request.seed is None else (request.seed + 1_000_003 * len(ids)) & 0x7FFF_FFFF
            segment = dataclasses.replace(
                request, prompt_ids=prompt + tuple(ids), max_tokens=budget, n=1, seed=seed
            )
            (piece,) = await self.inner.generate(segment)
            starts.append(len(ids))
            versions.append(piece.policy_version)
            ids += piece.completion_ids
            logprobs += piece.logprobs
            cut, stop_reason = cut_at_stop(self.tokenizer, ids, request.stop)
            if stop_reason is not None:
                ids, logprobs, finish = ids[:cut], logprobs[:cut], "stop"
                break
            if piece.finish_reason == "stop":
                finish, stop_reason = "stop", piece.stop_reason
                break
            if not piece.completion_ids:
                break
        return ids, logprobs, versions, starts, finish, stop_reason
