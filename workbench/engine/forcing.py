"""Forcing a stored episode's prefix: the generations and tool results a counterfactual replay keeps.

A replay re-runs an episode's flow on the same task. Up to its replay point, every generation is
answered from the stored calls instead of the backend, and every tool call returns the stored result
instead of running the tool; from there on the engine samples as usual. A stored agent call's
completion interleaves its own turns with inserted text, so each run of its own tokens (by the owner
mask) is one turn: the turn's prompt is the call's prompt plus the completion before it.

Every forced turn checks that the prompt the engine built is token-for-token the stored one (so is the
prompt of the replayed call itself), and raises ``ReplayDivergence`` where it is not: the spec, the
task, the templates or the tokenizer changed since the episode ran.

A stored call is found by its place in the episode's structure (``timings["place"]``,
``workbench.engine.episode_state``), so a replay forces the same calls whatever order its parallel branches
start in; an episode stored before calls recorded their places is replayed as it was made, by the order its
calls started in (and seeded by their positions, as it was).

``request_seed`` derives a generation request's own seed (the engine's ``Rollout(seed=...)``) from where the
request is (its call's place and turn); ``step_seed`` the seed of one training step's rollout, from which its
requests' seeds are derived in turn.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from workbench.backends.base import Generation
from workbench.store.codec import TokenOwner
from workbench.store.records import CallRecord

_OWN = frozenset({int(TokenOwner.TRAINABLE), int(TokenOwner.MASKED)})
_CAPPED = re.compile(r" \[\.\.\. (\d+) more\]\Z")  # what the engine appends to a long tool text it stores


class ReplayDivergence(RuntimeError):
    """The re-run of a stored episode's prefix built a prompt or a tool call the episode did not have."""


class ReplayUnsupported(ValueError):
    """A replay the forcing cannot keep exact (a routed tool's raw output is not stored)."""


def request_seed(seed: int, task_id: str, sample: int, place: int | str, turn: int) -> int:
    """The seed of one generation request: a 31-bit hash of the rollout seed and where the request is (its
    call's place, ``workbench.engine.episode_state``: on the episode's own line, its position)."""
    key = f"{seed}/{task_id}/{sample}/{place}/{turn}".encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big") & 0x7FFF_FFFF


def step_seed(seed: int, step: int) -> int:
    """The seed of training step ``step``'s rollout: a task drawn again in a later epoch draws other tokens."""
    return request_seed(seed, "step", step, 0, 0)


@dataclass(frozen=True)
class StoredTurn:
    """One generation of a stored call: the prompt it was given and the token span it produced."""

    prompt_ids: tuple[int, ...]
    start: int  # in the call's completion
    end: int
    last: bool


def turns(call: CallRecord) -> list[StoredTurn]:
    """The generations of a stored call, in order: each run of the call's own tokens in its completion."""
    owners = call.mask if call.mask is not None else [int(TokenOwner.TRAINABLE)] * len(call.completion_ids)
    spans: list[tuple[int, int]] = []
    for i, owner in enumerate(owners):
        if owner in _OWN:
            if spans and spans[-1][1] == i:
                spans[-1] = (spans[-1][0], i + 1)
            else:
                spans.append((i, i + 1))
    if not spans:  # an empty completion: one empty turn
        spans = [(0, 0)]
    prompt = list(call.prompt_ids)
    return [
        StoredTurn(tuple(prompt + list(call.completion_ids[:s])), s, e, k == len(spans) - 1)
        for k, (s, e) in enumerate(spans)
    ]


class Forcing:
    """Answers a rollout's generations and tool calls from a stored episode up to its replay point.

    ``calls``: the stored episode's calls. ``point``: the position of the replayed call. Calls before it
    are forced, except that the calls it runs inside (its ``ancestors``, where an agent is used as a tool)
    are forced only until it starts: the turns they take after its subflow returns are sampled. With
    ``keep=True`` the replayed call is forced too (its tool results included), and with ``replacement``
    its first turn is that text (tokenised by the role's tokenizer, ended with its end-of-sequence token)
    and the rest is sampled. ``tokenizers`` (by policy) make a tool text the store
    capped whole again from the call's tokens.

    Where every stored call has its place (``by_place``), a replay's call takes the position of the stored
    call at its place (``position``) and is seeded by its place; elsewhere (an episode stored before places,
    or one branch of a grouped episode renumbered) calls are numbered in the order they start and seeded by
    position: ``seed_position`` maps a position of the replay to the position whose request seeds it takes
    (``request_seed``), so a replay that renumbers the stored calls seeds each as the stored call was seeded.
    By default, the position itself.
    """

    def __init__(
        self,
        calls: list[CallRecord],
        point: int,
        keep: bool = False,
        replacement: str | None = None,
        tokenizers: dict[str, Any] | None = None,
        seed_position: Callable[[int], int] | None = None,
    ):
        if keep and replacement is not None:
            raise ValueError("a replay either keeps the call or replaces its text, not both")
        self.calls = {c.position: c for c in calls}
        if point not in self.calls:
            raise ValueError(f"the episode has no call at position {point}")
        self.point, self.keep, self.replacement = point, keep, replacement
        self.tokenizers = dict(tokenizers or {})
        self.seed_position = seed_position or (lambda position: position)
        self._turns = {p: turns(c) for p, c in self.calls.items()}
        places = {c.timings.get("place"): c.position for c in calls}
        self.by_place = None not in places
        self._positions = places if self.by_place else {}
        #: the first position of a call the stored episode does not have
        self.first_new = max(self.calls) + 1 if self.by_place else 0
        self.forced: set[int] = set()  # positions whose generations were answered here
        self.ancestors = ancestors(calls, point)
        self._reached = False  # the replayed call has started: its ancestors' later turns are sampled

    def position(self, place: str) -> int | None:
        """The position of the stored call at ``place`` (None: none, or calls are found by start order)."""
        return self._positions.get(place)

    def seed_key(self, position: int, place: str) -> int | str:
        """What the request seeds of the replay's call at ``position`` and ``place`` derive from."""
        return place if self.by_place else self.seed_position(position)

    def _forced(self, position: int) -> bool:
        if position in self.ancestors:
            return not self._reached
        return position < self.point or (self.keep and position == self.point)

    def generation(
        self, position: int, turn: int, prompt_ids: list[int], tokenizer: Any
    ) -> Generation | None:
        """The stored turn for a forced position (its prompt checked), the replacement, or None: sample it."""
        result = self._generation(position, turn, prompt_ids, tokenizer)
        if position == self.point:
            self._reached = True  # whatever the replayed call's subflow returns, its ancestors read afresh
        return result

    def _generation(
        self, position: int, turn: int, prompt_ids: list[int], tokenizer: Any
    ) -> Generation | None:
        stored = self._turns.get(position)
        if stored is None or not (self._forced(position) or position == self.point):
            return None
        if turn >= len(stored):
            if self._forced(position):
                raise self._diverged(position, turn, "asks for a turn the stored call did not have")
            return None
        spec = stored[turn]
        if (self._forced(position) or turn == 0) and tuple(prompt_ids) != spec.prompt_ids:
            raise self._diverged(position, turn, _first_difference(prompt_ids, spec.prompt_ids))
        call = self.calls[position]
        if self._forced(position):
            self.forced.add(position)
            ids = list(call.completion_ids[spec.start : spec.end])
            finish = call.finish_reason if spec.last and call.finish_reason == "length" else "stop"
            return Generation(
                completion_ids=ids,
                logprobs=list(call.logprobs[spec.start : spec.end]),
                text=tokenizer.decode(ids, skip_special_tokens=True),
                finish_reason=finish,
                policy_version=call.policy_version,
                timings={"forced": 1.0},
            )
        if self.replacement is not None and turn == 0:
            ids = list(tokenizer(self.replacement, add_special_tokens=False)["input_ids"])
            if tokenizer.eos_token_id is not None:
                ids.append(int(tokenizer.eos_token_id))
            return Generation(ids, [0.0] * len(ids), self.replacement, "stop", timings={"replaced": 1.0})
        return None

    def tool_result(self, position: int, index: int, name: str) -> tuple[str, dict[str, Any]] | None:
        """The stored text and summary of the ``index``-th tool call of a forced call; None to run it (a
        position that is not forced, or an agent-as-tool whose subflow the engine walks, forced in turn)."""
        if not self._forced(position) or position not in self.calls:
            return None
        call = self.calls[position]
        if index >= len(call.tool_results):
            raise self._diverged(position, None, f"makes tool call {index + 1}, the stored call made fewer")
        stored = dict(call.tool_results[index])
        if stored.get("name") != name:
            raise self._diverged(
                position, None, f"calls tool '{name}' where the stored call called '{stored.get('name')}'"
            )
        if stored.get("agent"):
            return None
        if stored.get("via"):
            if "documents" in stored:
                return None  # routed: ``routed_documents`` gives the engine the stored output to distil again
            raise ReplayUnsupported(
                f"call {position} ({call.role}) routed tool '{name}' through role '{stored['via']}': its raw "
                "output was not stored (a run from before it was), so the replay cannot keep it; replay from a "
                "call before it, or roll out again"
            )
        text = stored.pop("text", "")
        return self._full_text(call, text), stored

    def routed_documents(self, position: int, index: int) -> tuple[list[str] | None, dict[str, Any]]:
        """The stored raw output (documents) of a forced call's ``index``-th tool call where a role distilled
        it (MARS's System 1), and the call's summary; (None, {}) otherwise."""
        if not self._forced(position) or position not in self.calls:
            return None, {}
        stored = dict(self.calls[position].tool_results[index])
        if not stored.get("via") or stored.get("agent") or "documents" not in stored:
            return None, {}
        documents = stored.pop("documents")
        for derived in ("text", "via", "bins"):
            stored.pop(derived, None)
        return list(documents), stored

    def _full_text(self, call: CallRecord, text: str) -> str:
        """A stored tool text, made whole again where the store capped it: the call's inserted tokens hold
        all of it (the replay's prompt check then confirms it)."""
        capped = _CAPPED.search(text)
        tokenizer = self.tokenizers.get(call.policy)
        if capped is None or tokenizer is None:
            return text
        head = text[: capped.start()]
        inserted = [t for t, o in zip(call.completion_ids, call.mask or [], strict=False) if o not in _OWN]
        whole = tokenizer.decode(inserted, skip_special_tokens=False)
        start = whole.find(head)
        end = start + len(head) + int(capped.group(1))
        return text if start < 0 or end > len(whole) else whole[start:end]

    def _diverged(self, position: int, turn: int | None, what: str) -> ReplayDivergence:
        call = self.calls[position]
        where = f"call {position} ({call.role})" + ("" if turn is None else f", turn {turn}")
        return ReplayDivergence(
            f"replaying the stored episode, {where} {what}: the spec, task, templates or tokenizer differ "
            "from the ones the episode ran with (replay with the run's own topology and task)"
        )


def ancestors(calls: list[CallRecord], point: int) -> frozenset[int]:
    """The positions of the calls that the call at ``point`` runs inside (an agent used as a tool, nested)."""
    by_position = {c.position: c for c in calls}
    found, parent = set(), by_position[point].parent
    while parent is not None:
        found.add(parent)
        parent = by_position[parent].parent
    return frozenset(found)


def _first_difference(built: list[int], stored: tuple[int, ...]) -> str:
    at = next(
        (i for i, (a, b) in enumerate(zip(built, stored, strict=False)) if a != b),
        min(len(built), len(stored)),
    )
    return (
        f"builds a prompt of {len(built)} tokens that differs from the stored one ({len(stored)} tokens) "
        f"from token {at} on"
    )
