"""MarsRL's agent-level pipeline for grouped flows: each step's rollout batch is new problems plus the
next agent of earlier ones.

A group (one problem's grouped rollout: the Solver sampled G times, k outputs selected for the
Verifier, the Corrector only on flagged ones, early termination) advances one level per step. Step t
admits its new problems, whose Solvers run beside the Verifiers of step t-1's problems and the
Correctors of step t-2's, all released together, so the backend decodes them as one batch instead
of one agent after another; every call scored in that level (agent-specific rewards) trains at step t,
without waiting for the rest of its episode. A Verifier at step t judges a Solver output of an
earlier policy: that lag is recorded (``pipeline/input_lag_*``). Calls whose reward needs the whole
episode (``outcome`` or ``parent`` rules) train when it ends, so they can be up to the flow's depth
old (``policy_lag/*``).

With ``max_staleness = 1`` (the default) the next step's level starts as soon as this one's is done,
so it rolls out (from the rollout backend's own weight copy) while the trainer updates on this one, and
its calls train one version late; ``0`` keeps rollout and update apart (every call trains on the policy
that generated it). The level rolled out beside the update decodes with the weights from before it, all its
calls: the rollout engine (an hf rollout copy, vLLM) holds the update back (``hold_weights``) until the next
level opens, so which weights a call sees is the schedule's, not the timing's.

With ``carry`` (the run has a ``segment_len``; flows of call nodes, one generation each) a step decodes
at most one segment of each call: a call
that has not finished then waits for the next step, whose batch decodes its next segment with the newer
policy (MarsRL's segment rollout in the pipeline, so a step no longer waits for its longest completion).
``max_staleness`` bounds how many steps a call may be carried over (its policy lag when it trains; past
it the call decodes to its end in the step), and the next level never rolls out during the update.

An episode is stored at the step it finished. The last step drains the pipeline (more levels, no new
problems, no call carried), and so does every checkpoint step (``drain_every``), so a resumed run has
no group half done.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

from workbench.backends.loop_thread import LoopThread
from workbench.backends.segmented import segment_hooks
from workbench.backends.wrapper import unwrap
from workbench.engine.runner import Rollout
from workbench.rl.scheduling.base import BatchFor, StepRollout, view
from workbench.topology.spec import CallNode

if TYPE_CHECKING:
    from workbench.engine.records import CallRecord, EpisodeRecord
    from workbench.tasks import Task


def overlaps(max_staleness: int, carry: bool) -> bool:
    """Whether the pipeline rolls the next level out during the update (never while it carries calls)."""
    return not carry and max_staleness >= 1


def check(engine: Rollout, max_staleness: int, carry: bool) -> None:
    """Raise ``ValueError`` when the pipeline cannot run ``engine``'s topology with these settings (a cluster
    run checks this in the driver before its workers start)."""
    if not engine.grouped_mode:
        raise ValueError(
            "scheduler 'pipeline' runs grouped flows (a node with select, as MarsRL's); this topology "
            "has none: use scheduler 'async' for episode-level overlap"
        )
    if carry:
        several = [
            name for name, node in engine.topology.flow.nodes.items() if not isinstance(node, CallNode)
        ]
        if several:
            raise ValueError(
                f"the pipeline with segment_len carries calls of single-generation nodes (call nodes) only; "
                f"{', '.join(several)} may generate several times a step (agent, map or dag nodes): drop "
                "segment_len or use scheduler 'async'"
            )
    if not isinstance(max_staleness, int) or max_staleness < 0 or (not carry and max_staleness > 1):
        raise ValueError(
            f"max_staleness of the pipeline is 0 or 1 (an integer >= 0 with segment_len), got {max_staleness!r}"
        )


class PipelineScheduler:
    def __init__(
        self,
        engine: Rollout,
        batch_for: BatchFor,
        group_size: int,
        last_step: int,
        max_staleness: int = 1,
        drain_every: int | None = None,
        carry: bool = False,
    ):
        check(engine, max_staleness, carry)
        self.engine, self.batch_for, self.group_size = engine, batch_for, group_size
        self.last_step, self.drain_every = last_step, drain_every
        self.overlap = overlaps(max_staleness, carry)
        self.max_carry = max_staleness if carry else 0
        self.loop = LoopThread("rollout")
        self._holding = [b for b in map(unwrap, engine.backends.values()) if hasattr(b, "hold_weights")]
        if self.overlap:  # updates land only between two levels (``_step``)
            for backend in {id(b): b for b in self._holding}.values():
                backend.hold_weights()
        self._publishes = 0  # updates published so far (trainer side)
        self._applied = 0  # of those, applied to the rollout's weights (rollout loop side)
        self.ahead: dict[int, concurrent.futures.Future] = {}  # step -> its level, started early
        # rollout-loop state (touched only on the loop's thread)
        self.live = 0  # groups not finished
        self.parked = 0  # groups waiting at the gate for the next level
        self.release: asyncio.Event | None = None
        self.quiet: asyncio.Event | None = None
        self.level = 0  # levels opened so far
        self.draining = False
        self.carrying: set[_GroupSegments] = set()  # groups whose running calls all wait for the next level
        self.taken: set[int] = set()  # ids of the calls of unfinished groups handed to training
        self.ready: dict[int, tuple[EpisodeRecord, list[CallRecord]]] = {}
        self.finished: list[EpisodeRecord] = []
        self.failure: BaseException | None = None

    # ---------------------------------------------------------------- trainer side

    def rollout(self, step: int) -> StepRollout:
        started = time.perf_counter()
        level = self.ahead.pop(step, None) or self._start(step)
        episodes, train = level.result()
        if self.overlap and step + 1 < self.last_step:
            self.ahead[step + 1] = self._start(step + 1)  # rolls out while this step's update runs
        return StepRollout(episodes, train, trainer_wait_s=time.perf_counter() - started)

    def _start(self, step: int) -> concurrent.futures.Future:
        drain = step >= self.last_step - 1 or bool(self.drain_every and (step + 1) % self.drain_every == 0)
        coroutine = self._step(self.batch_for(step), drain, step, self._publishes)
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop.loop)

    def published(self, step: int) -> None:
        self._publishes += 1

    def run(self, factory: Callable[[], Coroutine]) -> Any:
        return self.loop.run(factory())

    def close(self) -> None:
        self.engine.cancel()
        self.loop.stop()

    # ---------------------------------------------------------------- rollout loop side

    async def _step(
        self, tasks: list[Task], drain: bool, step: int, publishes: int = 0
    ) -> tuple[list[EpisodeRecord], list[EpisodeRecord]]:
        """One level of every group in flight plus the first of the new ones (started at ``step``: their
        requests' seeds), with the weights of the first ``publishes`` updates; to the end if ``drain``."""
        if self.overlap and publishes > self._applied:  # no level decodes now: the held updates land
            for backend in {id(b): b for b in self._holding}.values():
                backend.apply_held(publishes - self._applied)
            self._applied = publishes
        self.draining = drain
        self._open_level()
        for task in tasks:
            self.live += 1
            asyncio.ensure_future(self._group(task, step))
        await self._settled()
        while drain and self.live:
            self._open_level()
            await self._settled()
        if self.failure is not None:
            raise self.failure
        finished, self.finished = self.finished, []
        for record in finished:  # calls scored only at the end (outcome, parent rules)
            self._collect(record)
            # its calls go to the store and may be freed: Python reuses the ids of freed objects, and a
            # new call whose id were still in ``taken`` would never train
            self.taken.difference_update(id(c) for c in record.calls)
        train = [view(record, calls) for record, calls in self.ready.values()]
        self.ready = {}
        return finished, train

    def _open_level(self) -> None:
        released, self.release = self.release, asyncio.Event()
        self.quiet, self.parked = asyncio.Event(), 0
        self.level += 1
        self.carrying.clear()  # their calls go on in this level
        if released is not None:
            released.set()

    async def _settled(self) -> None:
        """Until every live group waits at the gate or has finished."""
        self._check()
        await self.quiet.wait()

    def _check(self) -> None:
        if self.quiet is not None and self.parked + len(self.carrying) >= self.live:
            self.quiet.set()

    async def _gate(self) -> None:
        release = self.release
        self.parked += 1
        self._check()
        await release.wait()

    async def _group(self, task: Task, step: int) -> None:
        segment_hooks.set(_GroupSegments(self))  # this task's context: every call of the group sees it
        try:
            records = await self.engine.grouped(task, self.group_size, self._on_level, self._gate, step=step)
            self.finished += records
        except BaseException as error:  # noqa: BLE001 - handed to the trainer at the end of the step
            self.failure = error
        finally:
            self.live -= 1
            self._check()

    def _on_level(self, task: Task, records: list[EpisodeRecord]) -> None:
        for record in records:
            self._collect(record)

    def _collect(self, record: EpisodeRecord) -> None:
        new = [c for c in record.calls if c.rewards and id(c) not in self.taken]
        self.taken.update(id(c) for c in new)
        if new:
            self.ready.setdefault(id(record), (record, []))[1].extend(new)


class _GroupSegments:
    """One group's segmented calls (``segment_hooks``): it holds a call over to the next level when the
    scheduler carries, and tells the scheduler when all the group's running calls wait for that level."""

    def __init__(self, scheduler: PipelineScheduler):
        self.scheduler = scheduler
        self.active = 0  # calls decoding (started, not finished, not waiting for the next level)
        self.waiting: dict[int, int] = {}  # level -> calls waiting for the level after it

    def running(self, change: int) -> None:
        self.active += change
        self._update()

    async def between_segments(self, carried: int) -> bool:
        scheduler = self.scheduler
        if scheduler.draining or carried >= scheduler.max_carry:
            return False
        level, release = scheduler.level, scheduler.release
        self.waiting[level] = self.waiting.get(level, 0) + 1
        self.active -= 1
        self._update()
        try:
            await release.wait()
        finally:
            self.waiting[level] -= 1
            if not self.waiting[level]:
                del self.waiting[level]
            self.active += 1
        return True

    def _update(self) -> None:
        scheduler = self.scheduler
        waiting_now = self.waiting.get(scheduler.level, 0)
        if self.active == 0 and waiting_now and waiting_now == sum(self.waiting.values()):
            scheduler.carrying.add(self)
        else:
            scheduler.carrying.discard(self)
        scheduler._check()
