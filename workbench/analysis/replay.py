"""``wb.replay``: re-run a stored episode from one of its calls, N times, and store the replays as a run.

Everything before the call is kept token for token (``workbench.engine.forcing``): the same prompts,
completions and tool results, tools never re-executed. Each *arm* is N continuations:

- ``resample``: the call and everything after it are sampled again (the parent state's value, V);
- ``keep``: the call is kept and everything after it is sampled (the call's value, Q);
- ``replace``: the call's first turn is the researcher's ``replacement`` text, the rest is sampled.

Continuation ``j`` seeds its generations with ``request_seed`` from ``seed`` (continuation 0 with
``seed`` itself), each call at its stored place (``workbench.engine.episode_state``; a run stored before calls
recorded their places: at its position): a source rolled out with ``per_call_seeds=True`` and
the same seed and settings is reproduced exactly by continuation 0 of the ``resample`` arm (from any sample
of a grouped call, that sample). Each arm is one step of a new run (config
kind ``replay``, linked to the source run, episode and call), which opens like any run.

``background=True`` creates the replay's run at once and replays in a spawned process (its config holds
everything the process needs, and ``plugins.pkl`` this process's plugins; the process loads them and the
source run's); ``wb.replay_calls`` (``workbench.analysis.replay_batch``) replays many calls.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workbench.analysis.estimate import CallEstimate, means
from workbench.analysis.replay_policies import Checkpoint, PolicySpec, backends_for, check_policies, describe
from workbench.analysis.replay_source import SourceCall, load_source
from workbench.backends import Backend
from workbench.backends.loop_thread import run_sync
from workbench.engine import EpisodeRecord, Rollout
from workbench.engine.forcing import Forcing, ReplayDivergence, ReplayUnsupported, request_seed
from workbench.rl.metrics import rollout_metrics
from workbench.store.episodes import write_step
from workbench.tasks import Task
from workbench.topology import Topology, to_dict
from workbench.topology.spec import with_sampling

ARMS = ("keep", "resample", "replace")
#: A replay's settings beside its call, ``n`` and tasks, with their defaults (``replay``'s arguments).
SETTINGS: dict[str, Any] = {"arms": None, "replacement": None, "policies": None, "backend": "hf", "sampling": None,
                            "seed": None, "max_tokens": None, "judge": None, "device": "auto", "dtype": "auto"}  # fmt: skip


@dataclass
class ReplayResult:
    """The replays of one call, by arm, where they were stored, and the call's estimated advantage."""

    run_dir: Path
    source: SourceCall
    arms: dict[str, list[EpisodeRecord]]
    estimate: CallEstimate | None
    seconds: float

    def frame(self) -> Any:
        """One row per replayed episode: arm, continuation, reward, status, calls."""
        import pandas as pd

        return pd.DataFrame(
            [
                {
                    "arm": arm,
                    "continuation": e.sample,
                    "reward": e.reward,
                    "status": e.status,
                    "calls": len(e.calls),
                }
                for arm, episodes in self.arms.items()
                for e in episodes
            ]
        )

    def __repr__(self) -> str:
        counts = ", ".join(f"{arm} x{len(e)}" for arm, e in self.arms.items())
        return f"ReplayResult(call {self.source.call_id} ({self.source.role}): {counts}, stored in {self.run_dir})"

    def _repr_html_(self) -> str:
        estimate = self.estimate._repr_html_() if self.estimate is not None else ""
        return f"<p>{self!r}</p>{estimate}"


@dataclass
class ReplayPlan:
    """What one replay does: its source call, the topology it re-runs and its settings."""

    source: SourceCall
    topology: Topology
    arms: tuple[str, ...]
    n: int
    replacement: str | None
    policies: dict[str, PolicySpec]
    backend: str | Backend
    sampling: dict[str, Any] | None
    seed: int
    max_tokens: int | None
    judge: str | Backend | None
    device: str
    dtype: str

    def config(self) -> dict[str, Any]:
        """The replay run's config: where it comes from and every setting (a background process reads it)."""
        return {
            "kind": "replay",
            "source": _source_config(self.source),
            "arms": list(self.arms),
            "n": self.n,
            "replacement": self.replacement,
            "policies": {name: describe(spec) for name, spec in self.policies.items()},
            "model": self.source.config.get("model"),
            "backend": self.backend if isinstance(self.backend, str) else type(self.backend).__name__,
            "sampling": self.sampling,
            "seed": self.seed,
            "max_tokens": self.max_tokens,
            "judge": self.judge
            if self.judge is None or isinstance(self.judge, str)
            else type(self.judge).__name__,
            "device": self.device,
            "dtype": self.dtype,
            "topology": to_dict(self.topology),
        }

    def check_named(self) -> None:
        """Refuse a plan whose players or judge are objects: a background process starts them by name."""
        named = all(isinstance(spec, str | Checkpoint) for spec in self.policies.values())
        if not (
            named and isinstance(self.backend, str) and (self.judge is None or isinstance(self.judge, str))
        ):
            raise ValueError("a background replay takes its policies, backend and judge by name (or step:K)")


def replay(
    run_dir: str | Path,
    call_id: int,
    n: int = 8,
    arms: Sequence[str] | None = None,
    replacement: str | None = None,
    policies: dict[str, PolicySpec] | None = None,
    backend: str | Backend = "hf",
    sampling: dict[str, Any] | None = None,
    seed: int | None = None,
    max_tokens: int | None = None,
    tasks: list[Task] | None = None,
    runs_dir: str | Path | None = None,
    run_id: str | None = None,
    judge: str | Backend | None = None,
    device: str = "auto",
    dtype: str = "auto",
    background: bool = False,
) -> ReplayResult | Any:
    """Replay call ``call_id`` of the run in ``run_dir`` ``n`` times per arm and store the replays as a new run.

    ``arms`` (default ``keep`` and ``resample``, plus ``replace`` when a ``replacement`` text is given) pick
    what is kept; the result's ``estimate`` is Q (keep) - V (resample) beside the call's GRPO advantage.
    ``policies`` maps a policy of the topology to what plays it: a model name or path, ``"step:K"`` (the
    source run's checkpoint at step K), ``Checkpoint(run_dir, step)`` or a backend; the others play the
    source run's model. ``backend`` is the kind (or one backend for every policy) that serves them.
    ``sampling`` overrides every role's sampling settings; ``seed`` defaults to the source run's;
    ``max_tokens`` to its cap. ``tasks`` are needed only for a run that kept no ``tasks.jsonl``.
    ``runs_dir`` defaults to the directory holding the source run.

    ``background=True`` returns a :class:`~workbench.training.BackgroundRun` of the replay's run at once (its
    ``run_dir`` already exists) and replays in a spawned process; policies, backend and judge by name.
    """
    settings = dict(arms=arms, replacement=replacement, policies=policies, backend=backend, sampling=sampling,
                    seed=seed, max_tokens=max_tokens, judge=judge, device=device, dtype=dtype)  # fmt: skip
    plan = plan_replay(run_dir, call_id, n, tasks, **settings)
    if background:
        plan.check_named()
    (replay_dir,) = create_runs([plan], runs_dir, run_id)
    if background:
        from workbench.training import launch

        return launch(replay_dir, replay_here)
    with Players(plan) as players:
        return replay_into(plan, replay_dir, players)


def plan_replay(
    run_dir: str | Path, call_id: int, n: int = 8, tasks: list[Task] | None = None, **settings: Any
) -> ReplayPlan:
    """Check that call ``call_id`` can be replayed so, and say how. ``settings`` are ``replay``'s (``arms``,
    ``replacement``, ``policies``, ``backend``, ``sampling``, ``seed``, ``max_tokens``, ``judge``, ``device``,
    ``dtype``), with its defaults."""
    unknown = sorted(set(settings) - set(SETTINGS))
    if unknown:
        raise TypeError(f"unknown replay settings {unknown}; the settings are {', '.join(SETTINGS)}")
    get = {**SETTINGS, **settings}.get
    replacement, policies, sampling, seed, max_tokens = (get(k) for k in ("replacement", "policies", "sampling",
                                                                          "seed", "max_tokens"))  # fmt: skip
    source = load_source(run_dir, call_id, tasks)
    arms = _arms(get("arms"), replacement)
    if n < 1:
        raise ValueError(f"n={n}: replay at least one continuation per arm")
    topology = with_sampling(source.topology, **sampling) if sampling else source.topology
    _check_replayable(source, topology)
    if _grouped(topology):  # one branch of the group: its calls up to this one, then one call a node
        source, topology = source.on_its_branch(), _one_branch(topology)
    check_policies(topology, source, policies or {})
    return ReplayPlan(
        source=source,
        topology=topology,
        arms=arms,
        n=n,
        replacement=replacement,
        policies=dict(policies or {}),
        backend=get("backend"),
        sampling=sampling,
        seed=int(source.config.get("seed", 0) if seed is None else seed),
        max_tokens=source.config.get("max_tokens") if max_tokens is None else max_tokens,
        judge=get("judge"),
        device=get("device"),
        dtype=get("dtype"),
    )


def create_runs(
    plans: Sequence[ReplayPlan], runs_dir: str | Path | None = None, run_id: str | None = None
) -> list[Path]:
    """A new run (status ``created``) for each plan, beside its source run unless ``runs_dir`` says where;
    several plans are one batch: an event of the first run lists them all, in order (``replay_here``). Each
    keeps this process's plugins (``plugins.pkl``), which its topology may name."""
    from workbench.engine import plugins
    from workbench.store import RunStore
    from workbench.tasks import save_jsonl
    from workbench.training import TASKS_FILE, storage_errors

    made: list[Path] = []
    for plan in plans:
        source = plan.source
        store = RunStore.create(
            Path(runs_dir) if runs_dir is not None else source.run_dir.parent,
            config=plan.config(),
            run_id=run_id if len(plans) == 1 else None,
            name=f"replay of call {source.call_id} ({source.role}) of {source.run_id}",
            topology=plan.topology.name,
        )
        try:
            with storage_errors(store.run_dir / TASKS_FILE):
                save_jsonl([source.task], store.run_dir / TASKS_FILE)  # for a background process
            with storage_errors(store.run_dir / plugins.PLUGINS_FILE):
                plugins.save(store.run_dir)  # a notebook's own tool kinds and verifiers, for the process
        finally:
            store.close()
        made.append(store.run_dir)
    if len(made) > 1:
        _record_batch(made)
    return made


def _record_batch(run_dirs: list[Path]) -> None:
    from workbench.store import RunStore

    store = RunStore.open(run_dirs[0])
    try:
        store.log_event("replay_batch", {"runs": [str(p) for p in run_dirs]})
    finally:
        store.close()


class Players:
    """The backends that play a plan's policies (and its judge), started once for every replay of a batch
    of calls from one run, closed on leaving."""

    def __init__(self, plan: ReplayPlan) -> None:
        self.served, self._owned = backends_for(
            plan.topology, plan.source, plan.policies, plan.backend, plan.device, plan.dtype
        )
        self.judge = _judge(plan.judge)
        if isinstance(plan.judge, str):
            self._owned.append(self.judge)

    def __enter__(self) -> Players:
        return self

    def __exit__(self, *exc: Any) -> None:
        for backend in self._owned:
            backend.close()


def replay_into(plan: ReplayPlan, replay_dir: Path, players: Players) -> ReplayResult:
    """Do ``plan`` in its run ``replay_dir`` (made by ``create_runs``) with ``players``; a failure is
    recorded as the run's end and raised."""
    (result,) = replay_all([plan], [replay_dir], players)
    return result


def replay_all(
    plans: Sequence[ReplayPlan], replay_dirs: Sequence[Path], players: Players
) -> list[ReplayResult]:
    """Do every plan in its run at once (the backend batches their continuations together), with ``players``.
    Each replay is stored, or its failure recorded as its run's end, before the first failure is raised."""
    from workbench.rl.run_end import record_end
    from workbench.store import RunStore

    stores = [RunStore.open(d) for d in replay_dirs]
    out: list[ReplayResult] = []
    failures: list[BaseException] = []
    try:
        for store in stores:
            store.set_status("running")
        started = time.perf_counter()

        async def every_plan() -> list[Any]:
            runs = (_roll_out(p.source, p.arms, p.n, _engines(p, players)) for p in plans)
            return await asyncio.gather(*runs, return_exceptions=True)

        done = run_sync(every_plan)
        seconds = time.perf_counter() - started
        for plan, store, rolled in zip(plans, stores, done, strict=True):
            try:
                if isinstance(rolled, BaseException):
                    raise rolled
                results = dict(zip(plan.arms, rolled, strict=True))
                _raise_divergence(results)
                _store(store, plan.source, results)
                out.append(ReplayResult(store.run_dir, plan.source, results, _estimate(plan.source, results),
                                        seconds))  # fmt: skip
            except Exception as error:  # noqa: BLE001 - recorded in its run; the others are still stored
                record_end(store, error, "failed")
                failures.append(error)
    except BaseException as error:
        for store in stores:
            if store.status == "running":
                record_end(store, error, "stopped" if isinstance(error, KeyboardInterrupt) else "failed")
        raise
    finally:
        for store in stores:
            store.close()
    if failures:
        raise failures[0]
    return out


def _engines(plan: ReplayPlan, players: Players) -> Callable[[str, int], Rollout]:
    """The engine of continuation ``j`` of an arm: the plan's prefix forced, the rest sampled by ``players``."""
    source, served = plan.source, players.served

    def engine(arm: str, j: int) -> Rollout:
        return Rollout(
            plan.topology,
            served,
            max_tokens=plan.max_tokens,
            judge=players.judge,
            seed=_replica_seed(plan.seed, j),
            forcing=Forcing(
                source.calls,
                source.position,
                keep=arm == "keep",
                replacement=plan.replacement if arm == "replace" else None,
                tokenizers={name: b.tokenizer for name, b in served.items()},
                seed_position=source.seed_position,
            ),
        )

    return engine


def replay_here(run_dir: str | Path) -> None:
    """Do the replay stored in ``run_dir`` by ``replay(..., background=True)`` (and the rest of its batch,
    ``replay_calls(..., background=True)``, in order), in this process. A ``STOP`` file in ``run_dir`` stops
    the batch before its next call; a call that fails is recorded in its run and the batch goes on."""
    from workbench.engine import plugins
    from workbench.store import RunReader
    from workbench.training import STOP_FILE

    first = Path(run_dir)
    plugins.load(first)  # what the launching process had registered; the source run's come with its plan
    with RunReader(first) as reader:
        events = reader.events(kind="replay_batch")
    batch = [Path(p) for p in events.iloc[-1]["payload"]["runs"]] if not events.empty else [first]
    failed = []
    try:
        plans = [plan_from_config(p) for p in batch]
        with Players(plans[0]) as players:
            for plan, replay_dir in zip(plans, batch, strict=True):
                if (first / STOP_FILE).exists():
                    _end_unstarted([replay_dir], "stopped")
                    continue
                try:
                    replay_into(plan, replay_dir, players)
                except Exception as error:  # noqa: BLE001 - recorded in its run; the batch goes on
                    failed.append(f"{replay_dir.name}: {type(error).__name__}: {error}")
                    print(f"replay {replay_dir.name} failed: {error}", flush=True)
    except BaseException as error:  # before or between calls: no run of the batch is left "created"
        _end_unstarted(batch[1:], "stopped" if isinstance(error, KeyboardInterrupt) else "failed", error)
        raise
    if failed and len(batch) == 1:
        raise RuntimeError(failed[0])


def _end_unstarted(run_dirs: Sequence[Path], status: str, error: BaseException | None = None) -> None:
    """End the runs of ``run_dirs`` that were not started (status ``created``) with ``status``."""
    from workbench.rl.run_end import record_end
    from workbench.store import RunStore

    for run_dir in run_dirs:
        store = RunStore.open(run_dir)
        try:
            if store.status == "created":
                record_end(store, error or RuntimeError("stopped before it started"), status)
        finally:
            store.close()


def plan_from_config(replay_dir: str | Path) -> ReplayPlan:
    """The plan a replay run's config records (what a background process replays)."""
    from workbench.store import RunReader
    from workbench.tasks import load_tasks
    from workbench.training import TASKS_FILE

    with RunReader(replay_dir) as reader:
        c = reader.config
    source = c["source"]
    policies = {
        name: Checkpoint(**spec) if isinstance(spec, dict) else spec
        for name, spec in (c.get("policies") or {}).items()
    }
    settings = {key: c[key] for key in SETTINGS if key in c}
    return plan_replay(source["run_dir"], source["call_id"], c["n"], load_tasks(Path(replay_dir) / TASKS_FILE),
                       **{**settings, "policies": policies})  # fmt: skip


def _source_config(source: SourceCall) -> dict[str, Any]:
    """Where a replay comes from, as its run's config records it."""
    return {
        "run_dir": str(source.run_dir),
        "run_id": source.run_id,
        "step": source.step,
        "episode_id": source.episode_id,
        "call_id": source.call_id,
        "position": source.position,
        "ancestors": sorted(source.ancestors),
        "role": source.role,
        "advantage": source.advantage,
        "task_id": source.task.id,
        "sample": source.sample,
    }


async def _roll_out(
    source: SourceCall, arms: Sequence[str], n: int, engine: Callable[[str, int], Rollout]
) -> list[list[EpisodeRecord]]:
    """Every arm's ``n`` continuations at once; forced calls are marked with the stored call they replay."""
    engines = {arm: [engine(arm, j) for j in range(n)] for arm in arms}
    runs = [asyncio.gather(*(e.episode(source.task, source.sample) for e in engines[arm])) for arm in arms]
    done = await asyncio.gather(*runs)
    for arm, episodes in zip(arms, done, strict=True):
        for j, (episode, e) in enumerate(zip(episodes, engines[arm], strict=True)):
            episode.sample = j
            for call in episode.calls:
                if call.position in e.forcing.forced:
                    call.timings["replayed_from"] = source.call_ids[call.position]
    return done


def _store(store: Any, source: SourceCall, results: dict[str, list[EpisodeRecord]]) -> None:
    """Each arm as one step of the replay's run."""
    for index, (arm, episodes) in enumerate(results.items()):
        metrics, role_metrics = rollout_metrics(episodes)
        write_step(store, index, episodes, {source.task.id: source.task}, metrics, role_metrics)
        store.log_event("replay_arm", {"arm": arm, "n": len(episodes)}, step=index)
    store.set_status("finished")


def _estimate(source: SourceCall, results: dict[str, list[EpisodeRecord]]) -> CallEstimate | None:
    """Q (keep) - V (resample) with their standard errors, where both arms ran."""
    if "keep" not in results or "resample" not in results:
        return None
    return CallEstimate(
        call_id=source.call_id,
        role=source.role,
        q=means(results["keep"], source.position, source.ancestors),
        v=means(results["resample"], source.position, source.ancestors),
        grpo_advantage=source.advantage,
        replaced=means(results["replace"], source.position, source.ancestors) if "replace" in results else {},
    )


def _raise_divergence(results: dict[str, list[EpisodeRecord]]) -> None:
    """A replay whose prefix could not be kept fails as a whole (the engine records it on each episode)."""
    for error in (e.error for episodes in results.values() for e in episodes if e.status == "error"):
        for kind in (ReplayDivergence, ReplayUnsupported):
            if error and error.startswith(f"{kind.__name__}: "):
                raise kind(error.split(": ", 1)[1])


def _arms(arms: Sequence[str] | None, replacement: str | None) -> tuple[str, ...]:
    if arms is None:
        arms = ("keep", "resample", "replace") if replacement is not None else ("keep", "resample")
    arms = tuple(dict.fromkeys(arms))
    unknown = [a for a in arms if a not in ARMS]
    if unknown or not arms:
        raise ValueError(f"unknown replay arms {unknown or arms}: choose from {', '.join(ARMS)}")
    if "replace" in arms and replacement is None:
        raise ValueError("the 'replace' arm needs a replacement text (replacement='...')")
    return arms


def _check_replayable(source: SourceCall, topology: Any) -> None:
    if source.call.parent is not None and _grouped(topology):
        raise ValueError(
            f"call {source.call_id} ({source.role}) runs inside another call (an agent used as a tool) of a "
            "grouped rollout: replay from a top-level call (its ancestor) instead"
        )
    if _grouped(topology) and source.position > 0 and source.call.previous is None:
        raise ValueError(
            f"call {source.call_id} of a grouped rollout has no link to the call before it on its branch (a "
            "run stored before links were kept): replay from its episode's first call, or roll out again"
        )


def _grouped(topology: Any) -> bool:
    """Whether episodes fan out: a node selects among the group's branches (MarsRL's grouped rollouts)."""
    return any(getattr(node, "select", None) is not None for node in topology.flow.nodes.values())


def _one_branch(topology: Any) -> Any:
    """The flow of one branch of a grouped rollout: each node runs once, on what reached it (no select).
    The continuation of a replay is one branch, so N continuations are N samples of the node's output."""
    nodes = {name: node.model_copy(update={"select": None}) if getattr(node, "select", None) else node
             for name, node in topology.flow.nodes.items()}  # fmt: skip
    return topology.model_copy(update={"flow": topology.flow.model_copy(update={"nodes": nodes})})


def _replica_seed(seed: int, j: int) -> int:
    """The seed of continuation ``j``: the replay's seed for the first, a derived one for the others."""
    return seed if j == 0 else request_seed(seed, "continuation", j, 0, 0)


def _judge(judge: str | Backend | None) -> Backend | None:
    if isinstance(judge, str):
        from workbench.backends import make_backend

        return make_backend("hf", judge)
    return judge
