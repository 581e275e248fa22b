"""The synchronous training loop (MARS style): roll out, score, compute advantages, update, sync, store.

Every step takes the next ``batch_size`` tasks of a seeded per-epoch shuffle (so a resumed run sees
the same data order), rolls out ``group_size`` samples each with the current policy, turns the
rewarded calls into samples, computes group advantages and balancing, updates the policy, makes
the new weights reach the rollout backend (the hf backend shares the model object; vLLM reloads
them from a saved copy, with a timeout), then stores the step's calls, advantages and metrics.
Checkpoints every ``checkpoint_every`` steps; a resumed run restarts after its newest checkpoint
and discards the stored steps after it, so no step is lost or duplicated.
"""

from __future__ import annotations

import copy
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

    from workbench.engine import Rollout
    from workbench.engine.runner import run_sync
    from workbench.models import load as load_model
    from workbench.runs import with_sampling, write_step
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
    try:
        model, tokenizer = load_model(config.model)
        ref = copy.deepcopy(model).eval() if config.kl_coef else None
        lora = {"r": config.lora_rank, "lora_alpha": config.lora_alpha, "target_modules": config.lora_targets}
        policies = PolicySet(topology, model, tokenizer, config.policies, lora)
        trainer = PolicyTrainer(policies.models, config.optim(), ref_model=ref, activate=policies.activate)
        backends = policies.backends(config.backend, config.model)
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
        status = "finished"
        for step in range(start, config.steps):
            if should_stop():
                status = "stopped"
                break
            started = time.perf_counter()
            batch = [tasks[i] for i in task_order(len(tasks), step, config.batch_size, config.seed)]
            episodes = run_sync(lambda b=batch: engine.run(b, group_size=config.group_size))
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
            trainer_metrics = trainer.step(samples, step)
            for m in policies.unique_models().values():
                m.eval()
            policy_version += 1
            sync_s = policies.sync(backends, run_dir, policy_version, config.sync_timeout_s)
            metrics, roles = rollout_metrics(episodes)
            learned, learned_roles = learning_metrics(samples, stats, trainer_metrics, policy_version - 1)
            metrics.update(learned)
            for role, values in learned_roles.items():
                roles.setdefault(role, {}).update(values)
            metrics.update(
                {"time/rollout_s": rollout_s, "time/advantages_s": advantage_s, "time/weight_sync_s": sync_s}
            )
            held_out = None
            if eval_tasks and _eval_due(config, step):
                eval_metrics, held_out = evaluate(greedy, eval_tasks, run_sync)
                metrics.update(eval_metrics)
            metrics["time/step_s"] = time.perf_counter() - started
            advantages = {(s.episode, s.position): s.advantage for s in samples}
            write_step(
                store,
                step,
                episodes,
                by_id,
                metrics,
                roles,
                policy_version=policy_version - 1,
                advantages=advantages,
                held_out=held_out,
            )
            log(
                f"step {step}: reward {metrics['reward/mean']:.3f}, loss {metrics.get('loss', 0.0):.4f}, "
                f"{metrics['time/step_s']:.1f} s"
            )
            if (step + 1) % config.checkpoint_every == 0 or step + 1 == config.steps:
                state = {"policy_version": policy_version, "updates": trainer.updates}
                checkpoint.save(
                    run_dir, step, policies, trainer.optimizer, state, keep=config.keep_checkpoints
                )
        if status == "finished" and eval_tasks:
            eval_metrics, held_out = evaluate(greedy, eval_tasks, run_sync)
            with store.step(config.steps, policy_version=policy_version) as final:
                final.log_metrics({**eval_metrics, "final_eval": 1.0})
                final.log_event("eval", held_out)
        store.set_status(status)
        for backend in {id(b): b for b in [*backends.values(), judge] if b is not None}.values():
            backend.close()
        return status
    except KeyboardInterrupt:
        store.set_status("stopped")
        raise
    except BaseException as error:
        import traceback

        store.log_event(
            "error", {"error": f"{type(error).__name__}: {error}", "traceback": traceback.format_exc()}
        )
        store.set_status("failed")
        raise
    finally:
        store.close()


def _eval_due(config: TrainConfig, step: int) -> bool:
    return step == 0 or (config.eval_every > 0 and step % config.eval_every == 0)
