"""The training loop: set the run up, then per step roll out, score, compute advantages, update, sync, store.

Every step's batch is the next ``batch_size`` tasks of a seeded per-epoch shuffle (so a resumed run sees
the same data order), rolled out ``group_size`` times each. The scheduler (``config.scheduler``, see
``workbench.rl.scheduling``) decides when: synchronously with the current policy, ahead of training
within ``max_staleness`` versions, or as MarsRL's agent-level pipeline.

``setup`` builds the run's parts (a ``Run``); ``train_step`` runs one step as named phases
(``workbench.rl.phases``), carrying a ``StepBatch`` from one to the next: the rewarded calls become
samples, get group advantages and balancing, update the policy; the new weights then reach the rollout
backend (the hf backend shares the model object, or under async serves a copy refreshed between
batches; vLLM reloads them from a saved copy, with a timeout), and the step's calls, advantages and
metrics are stored. Checkpoints every ``checkpoint_every`` steps; a resumed run restarts after its newest
checkpoint and discards the stored steps after it, so no step is lost or duplicated.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from workbench.backends.wrapper import unwrap
from workbench.rl import checkpoint
from workbench.rl.advantages import AdvantageStats, balance, compute_advantages
from workbench.rl.config import TrainConfig
from workbench.rl.display import progress_line
from workbench.rl.evaluation import evaluate
from workbench.rl.metrics import learning_metrics, rollout_metrics
from workbench.rl.parts import load_policies, policy_trainer, rollout_engine
from workbench.rl.phases import StepTimer
from workbench.rl.policies import PolicySet, asleep, per_role_policies
from workbench.rl.run_end import record_end
from workbench.rl.samples import Sample, from_episodes
from workbench.rl.scheduling import (
    StepRollout,
    bubble_metrics,
    busiest,
    input_lag_metrics,
    make_scheduler,
    rollout_backends,
)
from workbench.rl.scheduling.pipeline import overlaps
from workbench.store.episodes import write_step
from workbench.topology.spec import with_sampling

#: ``apply_held``'s count for all the updates an engine holds
EVERY_HELD = 1 << 30


def task_order(n_tasks: int, step: int, batch_size: int, seed: int) -> list[int]:
    """Indices of the tasks of ``step``: consecutive slices of a fresh seeded shuffle per epoch."""
    out: list[int] = []
    position = step * batch_size
    while len(out) < batch_size:
        epoch, offset = divmod(position, n_tasks)
        order = list(range(n_tasks))
        random.Random(f"{seed}-epoch-{epoch}").shuffle(order)
        take = min(batch_size - len(out), n_tasks - offset)
        out += order[offset : offset + take]
        position += take
    return out


def load_tasks_for(config: TrainConfig) -> tuple[list[Any], list[Any]]:
    """Training tasks and held-out tasks (another seed) as the config names them; with ``held_out_by``, no
    training task shares that metadata value with a held-out one."""
    from workbench.tasks import generate, list_generators, load_tasks

    if config.tasks in list_generators():
        train = generate(config.tasks, n=config.n_tasks, seed=config.seed, **config.task_options)
        held_out = (
            generate(config.tasks, n=config.eval_tasks, seed=config.seed + 10_000, **config.task_options)
            if config.eval_tasks
            else []
        )
    else:
        tasks = load_tasks(config.tasks)
        n_eval = min(config.eval_tasks, len(tasks) // 2)
        train, held_out = tasks[n_eval:], tasks[:n_eval]
    if config.held_out_by and held_out:
        key = config.held_out_by
        held = {t.metadata.get(key) for t in held_out}
        train = [t for t in train if t.metadata.get(key) not in held]
        if not train:
            raise ValueError(
                f"held_out_by={key!r}: every training task shares its {key} with a held-out task; "
                "raise n_tasks or lower eval_tasks"
            )
    return train, held_out


# ---------------------------------------------------------------------- the run and its set-up


@dataclass
class Run:
    """A training run's parts: ``open_run`` gives the run's data and store, ``setup`` the rest."""

    config: TrainConfig
    run_dir: Path
    topology: Any
    tasks: list[Any]
    eval_tasks: list[Any]
    store: Any
    log: Callable[[str], None] = print
    policies: PolicySet | None = None
    trainer: Any = None  # a PolicyTrainer, or a cluster's TrainerGroup
    backends: dict[str, Any] = field(default_factory=dict)  # the rollout backends, metered
    engine: Any = None  # the rollout engine
    greedy: Any = None  # the same at temperature 0: the held-out evaluation
    scheduler: Any = None
    start: int = 0  # the first step to run (after the newest checkpoint)
    policy_version: int = 0  # updates that have reached the rollout backends

    @cached_property
    def by_id(self) -> dict[str, Any]:
        """Every task of the run, training and held out, by id."""
        return {t.id: t for t in [*self.tasks, *self.eval_tasks]}

    def batch_for(self, step: int) -> list[Any]:
        """The tasks of ``step``."""
        order = task_order(len(self.tasks), step, self.config.batch_size, self.config.seed)
        return [self.tasks[i] for i in order]

    def save_checkpoint(self, step: int) -> None:
        state = {"policy_version": self.policy_version, "updates": self.trainer.updates}
        checkpoint.save(
            self.run_dir,
            step,
            self.trainer,
            state,
            keep=self.config.keep_checkpoints,
        )


def open_run(
    config: TrainConfig,
    run_dir: Path,
    topology: Any = None,
    tasks: list[Any] | None = None,
    eval_tasks: list[Any] | None = None,
    log: Callable[[str], None] = print,
) -> Run:
    """The run's topology (sampling at the config's temperature), tasks and open store."""
    from workbench.engine.spec_checks import load, validate
    from workbench.store import RunStore

    random.seed(config.seed)
    topology = load(config.topology) if topology is None else validate(topology)  # every check
    topology = with_sampling(topology, temperature=config.temperature)
    if config.policy_per_role:
        topology = per_role_policies(topology)
    if tasks is None:
        tasks, eval_tasks = load_tasks_for(config)
    if not tasks:
        raise ValueError("no training tasks: set tasks/n_tasks in the config")
    return Run(config, Path(run_dir), topology, tasks, eval_tasks or [], RunStore.open(run_dir), log)


#: Builds a run's trainer over its policies, given the frozen KL reference (or None).
TrainerFor = Callable[[Run, Any], Any]
#: Builds a run's scheduler over its rollout engine.
SchedulerFor = Callable[[Run], Any]


def setup(run: Run, trainer_for: TrainerFor | None = None, scheduler_for: SchedulerFor | None = None) -> Run:
    """Build the run's policies, trainer, rollout backends, engines and scheduler, and resume it from its
    newest checkpoint. The parts built so far stay on ``run``, so they are closed if a later one fails.

    ``trainer_for`` and ``scheduler_for`` build the trainer and the scheduler; by default they run in this
    process (``local_trainer``, ``local_scheduler``). A config that names a cluster needs the cluster's
    (``workbench.cluster.parts``, which ``workbench.training.run_training`` passes).
    """
    config = run.config
    if config.cluster is not None and scheduler_for is None:
        raise ValueError(
            f"this config rolls out on the cluster {config.cluster!r}: train it with "
            "workbench.training.run_training, which gives the loop the cluster's scheduler and trainer"
        )
    with_reference = bool(config.kl_coef) and not config.cluster_trainers
    run.policies, reference = load_policies(run.topology, config, config.seed, with_reference)
    run.log(f"policies on {run.policies.placement.describe()}")
    run.trainer = (trainer_for or local_trainer)(run, reference)
    # a rollout running beside the update generates from its own copy of the weights
    beside = config.scheduler == "async" or (
        config.scheduler == "pipeline" and overlaps(config.max_staleness, bool(config.segment_len))
    )
    if config.cluster is not None and not run.eval_tasks:
        # the rollout workers generate and this process evaluates nothing: it starts no engine of its own
        # (a vLLM engine would cost its start and its memory for nothing); the trained models stand in
        served = run.policies.backends("hf", config.model)
    else:
        served = run.policies.backends(
            config.backend, config.model, own_weights=beside, options=config.vllm_options
        )
    run.backends = rollout_backends(served, config.segment_len)
    _resume(run)
    run.policies.sync(run.backends, run.run_dir, run.policy_version, config.sync_timeout_s)
    run.store.set_status("running")
    judge = config.make_judge()
    run.engine = rollout_engine(run.topology, config, run.backends, judge)
    run.greedy = rollout_engine(with_sampling(run.topology, temperature=0.0), config, run.backends, judge)
    run.scheduler = (scheduler_for or local_scheduler)(run)
    return run


def local_trainer(run: Run, reference: Any) -> Any:
    """The update in this process: a PolicyTrainer over the run's policies."""
    return policy_trainer(run.policies, run.config, reference)


def _resume(run: Run) -> None:
    """Continue after the newest checkpoint, if any, and drop the steps stored after it."""
    latest = checkpoint.latest(run.run_dir)
    if latest is not None:
        state = checkpoint.load(latest, run.policies, run.trainer)
        run.start, run.policy_version = state["step"] + 1, state["policy_version"]
        run.trainer.updates = state.get("updates", 0)
        run.log(f"resuming after step {state['step']} from {latest}")
    discarded = run.store.discard_steps_after(run.start - 1 if run.start else None)
    if discarded:
        run.log(f"discarded steps {discarded} written after the checkpoint; they are redone")


def local_scheduler(run: Run) -> Any:
    """The scheduler the config names, rolling out in this process."""
    config = run.config
    return make_scheduler(
        config.scheduler,
        run.engine,
        run.batch_for,
        config.group_size,
        run.start,
        config.steps,
        config.max_staleness,
        drain_every=config.checkpoint_every,
        carry=bool(config.segment_len),
    )


# ---------------------------------------------------------------------- the run from start to end


def run_training(
    config: TrainConfig,
    run_dir: Path,
    topology: Any = None,
    tasks: list[Any] | None = None,
    eval_tasks: list[Any] | None = None,
    should_stop: Callable[[], bool] = lambda: False,
    log: Callable[[str], None] = print,
    trainer_for: TrainerFor | None = None,
    scheduler_for: SchedulerFor | None = None,
) -> str:
    """Train in this process, writing into the existing run ``run_dir``; resumes from its newest checkpoint.

    ``trainer_for``/``scheduler_for``: as in ``setup`` (a run on a Ray cluster is trained through
    ``workbench.training.run_training``, which passes the cluster's). Returns the final run status
    (``finished`` or ``stopped``).
    """
    run = open_run(config, run_dir, topology, tasks, eval_tasks, log)
    with _recorded(run):
        setup(run, trainer_for, scheduler_for)
        for step in range(run.start, config.steps):
            if should_stop():
                stop(run, step)
                return end(run, "stopped")
            train_step(run, step)
        return end(run, "finished")


@contextmanager
def _recorded(run: Run) -> Iterator[None]:
    """Store why the run ended early, if it does; close its parts in any case."""
    try:
        yield
    except KeyboardInterrupt as interrupt:
        record_end(run.store, interrupt, "stopped")
        raise
    except BaseException as error:
        record_end(run.store, error, "failed")
        raise
    finally:
        # the rollout pool before the trainer group that may own Ray
        for part in (run.scheduler, run.trainer):
            if part is not None:
                part.close()
        run.store.close()


def stop(run: Run, step: int) -> None:
    """Asked to stop before ``step``: under the sync scheduler nothing is in flight between steps, so a
    checkpoint of the last step lets a resume redo none."""
    if step > run.start and step % run.config.checkpoint_every and run.config.scheduler == "sync":
        run.save_checkpoint(step - 1)


def end(run: Run, status: str) -> str:
    """The final held-out evaluation of a finished run; close the scheduler and backends, store ``status``."""
    config = run.config
    if status == "finished" and run.eval_tasks:
        # the final weights: a rollout engine holding updates for its scheduler (async, pipeline) has the last
        # step's still held, no batch left to open it
        for backend in {id(unwrap(b)): unwrap(b) for b in run.backends.values()}.values():
            if hasattr(backend, "apply_held"):
                backend.apply_held(EVERY_HELD)
        eval_metrics, held_out = evaluate(run.greedy, run.eval_tasks, run.scheduler.run)
        with run.store.step(config.steps, policy_version=run.policy_version) as final:
            final.log_metrics({**eval_metrics, "final_eval": 1.0})
            final.log_event("eval", held_out)
    run.scheduler.close()
    run.store.set_status(status)
    judge = run.engine.judge
    for backend in {id(b): b for b in [*run.backends.values(), judge] if b is not None}.values():
        backend.close()
    return status


# ---------------------------------------------------------------------- one step, phase by phase


@dataclass
class StepBatch:
    """What a step carries from phase to phase."""

    step: int
    rollout: StepRollout  # the scheduler's: episodes to store, and what trains now
    samples: list[Sample] = field(default_factory=list)
    stats: AdvantageStats | None = None
    evaluation: dict[str, float] = field(default_factory=dict)  # the held-out metrics, when due
    held_out: dict | None = None  # the held-out scores per task, when due
    trained: dict[str, Any] = field(default_factory=dict)  # the trainer's metrics


def train_step(run: Run, step: int) -> None:
    """One step: each phase under the step's timer, which gives its ``time/*`` metric."""
    config, timer = run.config, StepTimer()
    busy_before = busiest(run.backends)
    with timer.phase("rollout"):
        batch = StepBatch(step, run.scheduler.rollout(step))
    with timer.phase("score"):  # the rewarded calls become samples
        batch.samples = _samples(batch.rollout.train, config.train_roles)
    with timer.phase("advantages"):
        batch.stats = compute_advantages(
            batch.samples, batch.rollout.train, run.topology, config.advantage_eps, config.scale_advantages
        )
        rng = random.Random(f"{config.seed}-{step}")
        batch.samples = balance(batch.samples, run.topology, config.group_size, rng, batch.stats)
    if run.eval_tasks and _eval_due(config, step):
        with timer.phase("evaluation"):  # the policy this step rolled out with: before its update
            batch.evaluation, batch.held_out = evaluate(run.greedy, run.eval_tasks, run.scheduler.run)
    with timer.phase("update"), asleep(run.backends):  # engines in sleep mode give the GPU to the update
        batch.trained = run.trainer.step(batch.samples, step)
        for model in run.policies.unique_models().values():
            model.eval()
    with timer.phase("sync"):
        run.policy_version += 1
        run.policies.sync(run.backends, run.run_dir, run.policy_version, config.sync_timeout_s)
        run.scheduler.published(step)
    with timer.phase("record"):
        _record(run, batch, timer, busiest(run.backends) - busy_before)
    if (step + 1) % config.checkpoint_every == 0 or step + 1 == config.steps:
        with timer.phase("checkpoint"):
            run.save_checkpoint(step)


def _samples(episodes: list[Any], train_roles: list[str] | None) -> list[Sample]:
    """The samples of the scored calls; those of roles not trained keep no trained token."""
    samples = from_episodes(episodes)
    if train_roles is not None:
        for s in samples:
            if s.role not in train_roles:
                s.mask = [0] * len(s.mask)
    return samples


def _record(run: Run, batch: StepBatch, timer: StepTimer, rollout_busy_s: float) -> None:
    """Store the step: its episodes, each trained call's advantage, the metrics; log a line."""
    got, trained_with = batch.rollout, run.policy_version - 1
    metrics, roles = rollout_metrics(got.episodes)
    learned, learned_roles = learning_metrics(batch.samples, batch.stats, batch.trained, trained_with)
    for role, values in learned_roles.items():
        roles.setdefault(role, {}).update(values)
    metrics = {
        **metrics,
        **learned,
        **timer.metrics(),
        **input_lag_metrics(got.episodes),
        **got.metrics,
        **batch.evaluation,
    }
    metrics.update(bubble_metrics(metrics["time/step_s"], rollout_busy_s, got.trainer_wait_s))
    for s in batch.samples:
        call = s.call
        call.advantage = s.advantage
        call.timings["trained_step"] = batch.step
    write_step(
        run.store,
        batch.step,
        got.episodes,
        run.by_id,
        metrics,
        roles,
        policy_version=trained_with,
        held_out=batch.held_out,
    )
    _log_step(run.log, batch.step, got.episodes, metrics, roles)


def _log_step(log: Callable[[str], None], step: int, episodes: list[Any], metrics: dict, roles: dict) -> None:
    log(progress_line(step, metrics, roles))
    # an episode's error (a tool that cannot be built, a backend error) must not pass silently
    failed = [e for e in episodes if e.status == "error"]
    if failed:
        log(f"step {step}: {len(failed)} of {len(episodes)} episodes failed; the first: {failed[0].error}")


def _eval_due(config: TrainConfig, step: int) -> bool:
    return step == 0 or (config.eval_every > 0 and step % config.eval_every == 0)
