"""The episode a replay starts from: a stored call, its episode's calls as records, its task and topology.

The stored calls become the engine's ``CallRecord``s again (exact token ids, owner masks, tool result
texts), which ``workbench.engine.forcing`` answers the replay's prefix from. The task comes from the
caller, the run's ``tasks.jsonl`` (every ``wb.rollout`` and background run keeps one), or a training
run's config (its tasks are generated from a seed). The run's plugins (its config's plugin modules and its
``plugins.pkl``) are loaded before its topology is read, as training and resume load them; a spec naming one
that neither holds (a run stored before foreground rollouts kept their code) is refused naming each unknown
plugin and how to register it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from workbench.engine.forcing import ancestors
from workbench.store import RunReader
from workbench.store.codec import from_cell, int_from_cell
from workbench.store.records import CallFields, CallRecord
from workbench.tasks import Task
from workbench.topology import Topology, TopologyError

#: A spec's problem naming something a plugin registers that this process does not know.
_UNKNOWN_PLUGIN = re.compile(r"unknown (tool kind|verifier|parser|post-processor|judge prompt) '([^']*)'")


@dataclass
class SourceCall:
    """A stored call to replay from, with what a replay needs of its run."""

    run_dir: Path
    run_id: str
    config: dict[str, Any]
    step: int
    episode_id: int
    call_id: int
    position: int
    role: str
    advantage: float | None
    sample: int
    reward: float
    calls: list[CallRecord]
    call_ids: dict[int, int]  # position -> stored call id
    topology: Topology
    task: Task
    #: Where a replay renumbered the calls (one branch of a grouped episode): each call's position in the
    #: stored episode, by its position in the replay; and how far past the stored episode's last position the
    #: replay's later calls are moved (``seed_position``).
    stored_positions: dict[int, int] = field(default_factory=dict)
    later_shift: int = 0

    def seed_position(self, position: int) -> int:
        """The stored position whose request seeds a replay's call at ``position`` takes: the stored call's own
        (so a replay from any sample of a grouped call reproduces that sample), and for a call after the
        replayed one, a position past the stored episode's last (no stored call's seeds)."""
        return self.stored_positions.get(position, position + self.later_shift)

    @property
    def call(self) -> CallRecord:
        return next(c for c in self.calls if c.position == self.position)

    @property
    def ancestors(self) -> frozenset[int]:
        """The positions of the calls this one runs inside (an agent used as a tool)."""
        return ancestors(self.calls, self.position)

    def on_its_branch(self) -> SourceCall:
        """The call on its branch alone: a grouped episode's calls from its first call to this one, along
        each call's ``previous``, renumbered as the one-branch episode a replay re-runs (positions 0..k): found
        by position and seeded as stored (``seed_position``), their places dropped (they name the group's)."""
        by_position = {c.position: c for c in self.calls}
        path = [self.call]
        while path[-1].previous is not None:
            path.append(by_position[path[-1].previous])
        path.reverse()
        calls = [
            replace(c, position=i, previous=None, source=None,
                    timings={k: v for k, v in c.timings.items() if k != "place"})
            for i, c in enumerate(path)
        ]  # fmt: skip
        ids = {i: self.call_ids[c.position] for i, c in enumerate(path)}
        stored = {i: c.position for i, c in enumerate(path)}
        point = len(path) - 1  # a later call k steps on seeds as if k past the stored episode's last call
        return replace(self, calls=calls, call_ids=ids, position=point, stored_positions=stored,
                       later_shift=max(by_position) - point)  # fmt: skip


def load_source(run_dir: str | Path, call_id: int, tasks: list[Task] | None = None) -> SourceCall:
    """The stored call ``call_id`` of the run in ``run_dir`` and everything a replay of it needs (the run's
    plugins loaded here first: its topology may name their tool kinds and verifiers)."""
    with RunReader(run_dir) as reader:
        info = reader.info()
        row = reader.sql("SELECT episode_id, step FROM calls WHERE id = ?", (int(call_id),))
        if row.empty:
            raise KeyError(f"no call {call_id} in {run_dir}")
        episode_id, step = int(row["episode_id"].iloc[0]), int(row["step"].iloc[0])
        episode = reader.sql("SELECT * FROM episodes WHERE id = ?", (episode_id,)).iloc[0]
        frame = reader.calls(episode=episode_id, arrays="list", complete_only=False)
    records = [_record(r, frame) for r in frame.itertuples(index=False)]
    call_ids = {int(p): int(i) for p, i in zip(frame["position"], frame["id"], strict=True)}
    position = next(p for p, i in call_ids.items() if i == int(call_id))
    config = info["config"]
    load_plugins(Path(info["run_dir"]), config)
    meta = episode["task_meta"] or {}
    stored = frame[frame["id"] == int(call_id)].iloc[0]
    return SourceCall(
        run_dir=Path(info["run_dir"]),
        run_id=info["id"],
        config=config,
        step=step,
        episode_id=episode_id,
        call_id=int(call_id),
        position=position,
        role=str(stored["role"]),
        advantage=from_cell(stored["advantage"]),
        sample=int(meta.get("sample", 0)),
        reward=float(episode["reward"] or 0.0),
        calls=records,
        call_ids=call_ids,
        topology=_replayed_topology(Path(info["run_dir"]), config),
        task=_task(Path(info["run_dir"]), config, str(episode["task_id"]), tasks),
    )


def _record(row: Any, frame: Any) -> CallRecord:
    """A stored call as the engine's record again: its `CallFields` as stored (NULL collections empty), its
    links to its parent, source and previous calls as positions in the episode."""
    ids = dict(zip(frame["id"], frame["position"], strict=True))
    stored = {f.name: from_cell(getattr(row, f.name)) for f in fields(CallFields)}
    empty = {"prompt_text": "", "completion_text": "", "tool_calls": [], "tool_results": [], "timings": {},
             "rewards": {}, "policy_version": 0}  # fmt: skip
    stored.update({k: v for k, v in empty.items() if stored[k] is None})
    links = {link: int_from_cell(getattr(row, f"{link}_id")) for link in ("parent", "source", "previous")}
    return CallRecord(
        **stored,
        **{link: None if i is None else int(ids[i]) for link, i in links.items()},
        node="",
        finish_reason=str(stored["timings"].get("finish_reason", "stop")),
        trainable=True,
        parsed=row.action,
    )


def load_plugins(run_dir: Path, config: dict[str, Any]) -> None:
    """Make the run's plugins available here, as its training and resume do: the plugin modules its config
    names (a training run's ``train_config.yaml``, which a resume may have changed), then its ``plugins.pkl``."""
    from workbench.engine import plugins

    plugins.load(run_dir, _plugin_modules(run_dir, config))


def _plugin_modules(run_dir: Path, config: dict[str, Any]) -> list[str]:
    from workbench.rl.run_files import CONFIG_FILE, run_config

    modules = run_config(run_dir).plugins if (run_dir / CONFIG_FILE).exists() else config.get("plugins")
    return list(modules or ())


def _replayed_topology(run_dir: Path, config: dict[str, Any]) -> Topology:
    """:func:`run_topology`, its plugins loaded; a spec naming plugins this process still does not know is
    refused naming them and saying how to register them."""
    try:
        return run_topology(run_dir, config)
    except TopologyError as error:
        missing = [f"{m[1]} '{m[2]}'" for p in error.problems if (m := _UNKNOWN_PLUGIN.search(p.message))]
        if not missing:
            raise
        error.args = (f"{error}\n{_plugins_hint(run_dir, config, missing)}",)
        raise


def _plugins_hint(run_dir: Path, config: dict[str, Any], missing: list[str]) -> str:
    """How to make ``missing`` (the run's plugins this process does not know) known to its replays."""
    from workbench.engine.plugins import PLUGINS_FILE

    kept = [PLUGINS_FILE] if (run_dir / PLUGINS_FILE).exists() else []
    kept += [f"plugin module {name}" for name in _plugin_modules(run_dir, config)]
    stored = (
        f"what it keeps ({', '.join(kept)}) does not define them" if kept else "it keeps no code for them"
    )
    return (
        f"the run names plugins unknown here ({', '.join(missing)}) and {stored}. Register them first (run the "
        "notebook cells that define them, or import their module), then replay from that process (wb.replay), "
        "or store them with the run for every later replay, the dashboard's too: "
        f"workbench.engine.plugins.save('{run_dir}')"
    )


def run_topology(run_dir: Path, config: dict[str, Any], registries: bool = True) -> Topology:
    """The spec the run ran: stored in its config (a rollout), beside it (a training run), or by name. With
    ``registries=False`` only the spec's own checks run: drawing it needs none of the tool kinds, verifiers and
    parsers it names registered here (a run's plugins are loaded only where it runs or replays)."""
    from workbench.engine import spec_checks
    from workbench.rl.policies import per_role_policies
    from workbench.rl.run_files import TOPOLOGY_FILE
    from workbench.topology import io

    from_dict, load = (spec_checks.from_dict, spec_checks.load) if registries else (io.from_dict, io.load)

    spec = config.get("topology")
    if not spec and not (run_dir / TOPOLOGY_FILE).exists():
        raise ValueError(f"the run in {run_dir} records no topology: its calls cannot be replayed or drawn")
    if isinstance(spec, dict):
        topology = from_dict(spec)
    elif (run_dir / TOPOLOGY_FILE).exists():
        topology = load(run_dir / TOPOLOGY_FILE)
    else:
        topology = load(spec)
    return per_role_policies(topology) if config.get("policy_per_role") else topology


def _task(run_dir: Path, config: dict[str, Any], task_id: str, tasks: list[Task] | None) -> Task:
    from workbench.training import TASKS_FILE

    candidates: list[Task] = list(tasks or [])
    if not candidates and (run_dir / TASKS_FILE).exists():
        from workbench.tasks import load_tasks

        candidates = load_tasks(run_dir / TASKS_FILE)
    if not candidates and config.get("kind") == "train":
        from workbench.rl.loop import load_tasks_for
        from workbench.rl.run_files import run_config

        train, held_out = load_tasks_for(run_config(run_dir))
        candidates = [*train, *held_out]
    found = next((t for t in candidates if t.id == task_id), None)
    if found is None:
        raise ValueError(
            f"the task '{task_id}' of the episode is not known here: pass the run's tasks (tasks=[...])"
        )
    return found
