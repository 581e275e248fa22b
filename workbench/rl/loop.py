"""The training loop: take the step's rollout from the scheduler, score, compute advantages, update, sync, store.

Every step's batch is the next ``batch_size`` tasks of a seeded per-epoch shuffle (so a resumed run sees
the same data order), rolled out ``group_size`` times each. The scheduler (``config.scheduler``, see
``workbench.rl.scheduling``) decides when: synchronously with the current policy, ahead of training
within ``max_staleness`` versions, or as MarsRL's agent-level pipeline. The loop turns the
rewarded calls into samples, computes group advantages and balancing, updates the policy, makes
the new weights reach the rollout backend (the hf backend shares the model object, or under async
serves a copy refreshed between batches; vLLM reloads
them from a saved copy, with a timeout), then stores the step's calls, advantages and metrics.
Checkpoints every ``checkpoint_every`` steps; a resumed run restarts after its newest checkpoint
and discards the stored steps after it, so no step is lost or duplicated.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from workbench.rl import checkpoint
from workbench.rl.advantages import balance, compute_advantages
from workbench.rl.config import TrainConfig
from workbench.rl.evaluation import evaluate
from workbench.rl.metrics import learning_metrics, rollout_metrics
from workbench.rl.policies import PolicySet, per_role_policies
from workbench.rl.samples import from_episodes
from workbench.rl.scheduling import (
    bubble_metrics,
    busiest,
    input_lag_metrics,
    make_scheduler,
    rollout_backends,
)
from workbench.rl.scheduling.pipeline import overlaps
from workbench.rl.trainer import PolicyTrainer


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
    """Training tasks and held-out tasks (another seed) as the config names them."""
    from workbench.tasks import generate, list_generators, load_tasks

    if config.tasks in list_generators():
        train = generate(config.tasks, n=config.n_tasks, seed=config.seed, **config.task_options)
        held_out = (
            generate(config.tasks, n=config.eval_tasks, seed=config.seed + 10_000, **config.task_options)
            if config.eval_tasks
            else []
        )
        return train, held_out
    tasks = load_tasks(config.tasks)
    n_eval = min(config.eval_tasks, len(tasks) // 2)
    return tasks[n_eval:], tasks[:n_eval]


def run_training(
    config: TrainConfig,
    run_dir: Path,
    topology: Any = None,
    tasks: list[Any] | None = None,
    eval_tasks: list[Any] | None = None,
    should_stop: Callable[[], bool] = lambda: False,
    log: Callable[[str], None] = print,
) -> str:
    """Train in this process, writing into the existing run ``run_dir``; resumes from its newest checkpoint.

    Returns the final run status (``finished`` or ``stopped``).
    """
    import torch

    from workbench.engine import Rollout, plugins
    from workbench.runs import record_end, with_sampling, write_step
    from workbench.store import RunStore
    from workbench.topology import load as load_topology

    torch.manual_seed(config.seed)
    random.seed(config.seed)
    topology = load_topology(config.topology) if topology is None else topology
    topology = with_sampling(topology, temperature=config.temperature)
    if config.policy_per_role:
        topology = per_role_policies(topology)
    if tasks is None:
        tasks, eval_tasks = load_tasks_for(config)
    eval_tasks = eval_tasks or []
    if not tasks:
        raise ValueError("no training tasks: set tasks/n_tasks in the config")
    by_id = {t.id: t for t in [*tasks, *eval_tasks]}

    store = RunStore.open(run_dir)
    scheduler = trainer = None
    try:
        policies, ref = PolicySet.load(
            topology, config, with_reference=bool(config.kl_coef) and not config.cluster_trainers
        )
        log(f"policies on {policies.placement.describe()}")
        if config.cluster_trainers:
            from workbench.cluster import TrainerGroup
            from workbench.topology import to_dict

            trainer = TrainerGroup(
                config.cluster,
                to_dict(topology),
                config.to_dict(),
                policies,
                config.cluster_trainers,
                config.cluster_cpus_per_trainer,
                config.cluster_gpus_per_trainer,
                log=log,
                plugins=plugins.snapshot(),
            )
        else:
            trainer = PolicyTrainer(
                policies.models, config.optim(), ref_model=ref, activate=policies.activate
            )
        # a rollout running beside the update generates from its own copy of the weights
        beside = config.scheduler == "async" or (
            config.scheduler == "pipeline" and overlaps(config.max_staleness, bool(config.segment_len))
        )
        served = policies.backends(config.backend, config.model, own_weights=beside)
        backends = rollout_backends(served, config.segment_len)
        policy_version, start = 0, 0
        latest = checkpoint.latest(run_dir)
        if latest is not None:
            state = checkpoint.load(latest, policies, trainer.optimizer)
            start, policy_version = state["step"] + 1, state["policy_version"]
            trainer.updates = state.get("updates", 0)
            log(f"resuming after step {state['step']} from {latest}")
        discarded = store.discard_steps_after(start - 1 if start else None)
        if discarded:
            log(f"discarded steps {discarded} written after the checkpoint; they are redone")
        policies.sync(backends, run_dir, policy_version, config.sync_timeout_s)
        store.set_status("running")
        judge = config.make_judge()
        engine = Rollout(topology, backends, max_tokens=config.max_tokens, judge=judge)
        greedy = Rollout(
            with_sampling(topology, temperature=0.0), backends, max_tokens=config.max_tokens, judge=judge
        )

        def batch_for(step: int) -> list[Any]:
            return [tasks[i] for i in task_order(len(tasks), step, config.batch_size, config.seed)]

        if config.cluster is not None:
            from workbench.cluster import ClusterScheduler, RolloutPool
            from workbench.topology import to_dict

            pool = RolloutPool(
                config.cluster,
                to_dict(topology),
                config.to_dict(),
                config.cluster_workers,
                config.cluster_cpus_per_worker,
                config.cluster_gpus_per_worker,
                config.cluster_max_restarts,
                log=log,
                plugins=plugins.snapshot(),
            )
            scheduler = ClusterScheduler(pool, batch_for, config.group_size, policies.state, policy_version)
        else:
            scheduler = make_scheduler(
                config.scheduler,
                engine,
                batch_for,
                config.group_size,
                start,
                config.steps,
                config.max_staleness,
                drain_every=config.checkpoint_every,
                carry=bool(config.segment_len),
            )
        status = "finished"
        for step in range(start, config.steps):
            if should_stop():
                status = "stopped"
                if step > start and step % config.checkpoint_every and config.scheduler == "sync":
                    # nothing in flight between sync steps: keep the last step, so a resume redoes none
                    state = {"policy_version": policy_version, "updates": trainer.updates}
                    checkpoint.save(
                        run_dir, step - 1, policies, trainer.optimizer, state, keep=config.keep_checkpoints
                    )
                break
            started = time.perf_counter()
            busy_before = busiest(backends)
            got = scheduler.rollout(step)
            episodes = got.train
            rollout_s = time.perf_counter() - started
            samples = from_episodes(episodes)
            if config.train_roles is not None:
                for s in samples:
                    if s.role not in config.train_roles:
                        s.mask = [0] * len(s.mask)
            t0 = time.perf_counter()
            stats = compute_advantages(
                samples, episodes, topology, config.advantage_eps, config.scale_advantages
            )
            samples = balance(
                samples, topology, config.group_size, random.Random(f"{config.seed}-{step}"), stats
            )
            advantage_s = time.perf_counter() - t0
            eval_metrics, held_out = {}, None
            # the held-out evaluation scores the policy this step rolled out with: before its update
            if eval_tasks and _eval_due(config, step):
                eval_metrics, held_out = evaluate(greedy, eval_tasks, scheduler.run)
            trainer_metrics = trainer.step(samples, step)
            for m in policies.unique_models().values():
                m.eval()
            policy_version += 1
            sync_s = policies.sync(backends, run_dir, policy_version, config.sync_timeout_s)
            scheduler.published(step)
            metrics, roles = rollout_metrics(got.episodes)
            learned, learned_roles = learning_metrics(samples, stats, trainer_metrics, policy_version - 1)
            metrics.update(learned)
            for role, values in learned_roles.items():
                roles.setdefault(role, {}).update(values)
            metrics.update(
                {"time/rollout_s": rollout_s, "time/advantages_s": advantage_s, "time/weight_sync_s": sync_s}
            )
            metrics.update(input_lag_metrics(got.episodes))
            metrics.update(got.metrics)
            metrics.update(eval_metrics)
            metrics["time/step_s"] = time.perf_counter() - started
            metrics.update(
                bubble_metrics(metrics["time/step_s"], busiest(backends) - busy_before, got.trainer_wait_s)
            )
            for s in samples:
                call = episodes[s.episode].calls[_index(episodes[s.episode], s.position)]
                call.advantage = s.advantage
                call.timings["trained_step"] = step
            write_step(
                store,
                step,
                got.episodes,
                by_id,
                metrics,
                roles,
                policy_version=policy_version - 1,
                held_out=held_out,
            )
            per_role = ", ".join(
                f"{r} {v['reward/mean']:.2f}" for r, v in roles.items() if "reward/mean" in v
            )
            log(
                f"step {step}: reward {metrics.get('reward/mean', 0.0):.3f}, loss {metrics.get('loss', 0.0):.4f}, "
                f"{metrics['time/step_s']:.1f} s" + (f" (role rewards: {per_role})" if per_role else "")
            )
            # an episode's error (a tool that cannot be built, a backend error) must not pass silently
            failed = [e for e in got.episodes if e.status == "error"]
            if failed:
                log(
                    f"step {step}: {len(failed)} of {len(got.episodes)} episodes failed; the first: {failed[0].error}"
                )
            if (step + 1) % config.checkpoint_every == 0 or step + 1 == config.steps:
                state = {"policy_version": policy_version, "updates": trainer.updates}
                checkpoint.save(
                    run_dir, step, policies, trainer.optimizer, state, keep=config.keep_checkpoints
                )
        if status == "finished" and eval_tasks:
            eval_metrics, held_out = evaluate(greedy, eval_tasks, scheduler.run)
            with store.step(config.steps, policy_version=policy_version) as final:
                final.log_metrics({**eval_metrics, "final_eval": 1.0})
                final.log_event("eval", held_out)
        scheduler.close()
        store.set_status(status)
        for backend in {id(b): b for b in [*backends.values(), judge] if b is not None}.values():
            backend.close()
        return status
    except KeyboardInterrupt as interrupt:
        record_end(store, interrupt, "stopped")
        raise
    except BaseException as error:
        record_end(store, error, "failed")
        raise
    finally:
        for part in (scheduler, trainer):  # the rollout pool before the trainer group that may own Ray
            if part is not None:
                part.close()
        store.close()


def _index(episode: Any, position: int) -> int:
    return next(i for i, c in enumerate(episode.calls) if c.position == position)


def _eval_due(config: TrainConfig, step: int) -> bool:
    return step == 0 or (config.eval_every > 0 and step % config.eval_every == 0)
