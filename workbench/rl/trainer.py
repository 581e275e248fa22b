"""The policy update: one rollout step's samples -> PPO-clip optimizer steps on the policy model(s).

Samples are split into mini-batches (one optimizer step each, ``ppo_epochs`` passes); each mini-batch
is packed into padding-free micro-batches by token budget, one role at a time so each role's share of
the gradient can be measured (the signal that one role dominates a shared policy). Policies map to
models: every policy on one shared model, or a model per policy. Given a ``Shard``, the trainer is one
rank of a group whose models are sharded with FSDP2 (``workbench.rl.fsdp``): it trains on its share of each
mini-batch (``workbench.rl.data_parallel``) and FSDP sums the gradients over the ranks. FSDP gathers weights
and reduces gradients in every forward and backward, so every rank runs as many passes per (role, policy)
as the rank with the most, in the same order, a short rank repeating a real micro-batch with its loss times 0.
Unless the gradient is large beside the GPU (``workbench.rl.fsdp.defers_gradient_sync``), each model's gradients
are reduce-scattered once per optimizer step (per role when each role's gradient is measured), on its last pass:
the passes before it accumulate them unsharded (``set_gradient_sync``), alike on every rank.

On a GPU the host never waits for the device inside a step: losses, statistics and gradient norms are summed
on the device and read once at its end, AdamW's step counts (the warm-up's) are kept on the host, and
per-sample log-probs are split by lengths the host knows (``tests/test_sync_audit.py`` counts the syncs).
"""

from __future__ import annotations

import math
import random
import time
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import torch

from workbench.models.placement import DTYPES, Placement
from workbench.rl.compiled_layers import compile_layers
from workbench.rl.compute_weights import forward_scope, make_compute_weights
from workbench.rl.config_sections import OptimConfig
from workbench.rl.data_parallel import Shard
from workbench.rl.fsdp import defers_gradient_sync, is_sharded, local, set_gradient_sync, token_logprobs
from workbench.rl.loss import LossTerms, policy_loss
from workbench.rl.packing import (
    collate,
    plan_micro_batches,
    plan_shared_micro_batches,
    use_block_attention,
)
from workbench.rl.samples import Sample

# the step totals each rank adds up over its share (the gradient norm is the same on every rank), in the
# order of the device tensor they are accumulated in: the loss, then LossTerms.STATS
_SUMMED = ("loss", "tokens", "clipped_low", "clipped_high", "kl", "entropy", "mastered", "ratio")


class PolicyTrainer:
    """Optimizes the policies' models on samples; ``models`` maps policy name -> model (may repeat)."""

    def __init__(
        self,
        models: dict[str, torch.nn.Module],
        config: OptimConfig,
        ref_model: Any = None,
        activate: Any = None,
        shard: Shard | None = None,
        fused: bool | None = None,
        defer_gradient_sync: bool | None = None,
    ):
        """``fused``: AdamW's single-kernel implementation (``torch.optim.AdamW(fused=True)``, which CPUs have
        too); None: on CUDA only, torch's default elsewhere. ``defer_gradient_sync`` (sharded models): reduce-
        scatter a model's gradients on its last micro-batch of an optimizer step only, accumulating them
        unsharded before (True), or after every micro-batch (False); None: ``fsdp.defers_gradient_sync``."""
        self.models = models
        self.shard = shard or Shard()  # this trainer's rank in a data-parallel group
        # switches a policy's adapter on before its forward pass (LoRA policies); default: look it up
        self.activate = activate or models.__getitem__
        self.config = config
        self.ref_model = ref_model
        trained_models = {id(m): m for m in models.values()}.values()
        if config.block_attention:
            for model in [*trained_models, *([ref_model] if ref_model is not None else [])]:
                use_block_attention(model)
        if config.gradient_checkpointing:
            for model in trained_models:  # non-reentrant: no inputs that require grad needed (LoRA)
                model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        first = next(iter(trained_models))
        self.sharded = is_sharded(first)
        if self.shard.size > 1 and not self.sharded:
            raise ValueError(
                "a trainer rank in a group trains sharded models (workbench.rl.fsdp.shard_models)"
            )
        # sharded models compute in the dtype FSDP's mixed precision gathers: no autocast, no compute weights
        dtype = torch.float32 if self.sharded else DTYPES[config.compute_dtype]
        self.placement = Placement(first.get_input_embeddings().weight.device, dtype)
        unique: dict[int, torch.nn.Parameter] = {}
        for model in models.values():
            for p in model.parameters():
                if p.requires_grad:
                    unique.setdefault(id(p), p)
        self.parameters = list(unique.values())
        if defer_gradient_sync is None:
            defer_gradient_sync = defers_gradient_sync(self.parameters, self.placement.device)
        self.defer_sync = self.sharded and defer_gradient_sync
        self.optimizer = torch.optim.AdamW(
            self.parameters,
            lr=config.learning_rate,
            betas=(config.beta1, config.beta2),
            eps=config.eps,
            weight_decay=config.weight_decay,
            # one kernel for all parameters on a GPU
            fused=(self.placement.device.type == "cuda" or None) if fused is None else fused,
        )
        self.updates = 0
        # bf16 copies of the trained weights for the forward, refreshed once per optimizer step (issue 47)
        self.compute_weights = make_compute_weights(
            config.compute_weights, trained_models, self.placement.device, self.placement.dtype
        )
        if config.compile_layers:  # issue 47: each decoder layer fused by torch.compile (not with FSDP)
            compile_layers(trained_models, sharded=self.sharded)
        # AdamW's step counter of each parameter, kept on the host (AdamW's own live on the device when fused):
        # read from the optimizer's state once, on first use and after every ``load_state_dict``
        self._steps: list[int] | None = None
        self.optimizer.register_load_state_dict_post_hook(self._forget_steps)

    # ------------------------------------------------------------------ public

    def learning_rate(self) -> float:
        """The rate of the next optimizer step: ``learning_rate`` after a linear warm-up over ``warmup_steps``.

        Steps taken are AdamW's own count (the most steps any parameter has taken), so a run resumed from a
        checkpoint (or a trainer rank given the group's state) continues the warm-up where it stopped. The
        count is kept on the host: AdamW's state is read once after it is loaded, never per optimizer step.
        """
        cfg = self.config
        taken = max(self._optimizer_steps(), default=0)
        return cfg.learning_rate * min(1.0, (taken + 1) / (cfg.warmup_steps + 1))

    def step(self, samples: Sequence[Sample], step_index: int = 0) -> dict[str, Any]:
        """Train on ``samples`` (those with a trained token); returns the step's metrics.

        In a data-parallel group every rank is given the same samples and trains on its share.
        """
        cfg = self.config
        trained = [s for s in samples if s.n_trained > 0]
        metrics: dict[str, Any] = {"samples": len(trained), "optimizer_steps": 0}
        if not trained:
            return metrics
        rng = random.Random(f"{cfg.seed}-{step_index}")
        batches = []
        for _epoch in range(cfg.ppo_epochs):
            order = list(range(len(trained)))
            rng.shuffle(order)
            size = cfg.mini_batch_size or len(order)
            batches += [order[start : start + size] for start in range(0, len(order), size)]

        def mine(shard: Shard) -> list[int]:
            return sorted({i for chosen in batches for i in shard.mine(chosen)})

        started = time.perf_counter()
        old = self._old_logprobs(trained, mine) if self._needs_old(trained) else None
        ref = self._ref_logprobs(trained, mine) if cfg.loss.kl_coef else None
        metrics["time/old_logprobs_s"] = time.perf_counter() - started
        started = time.perf_counter()
        # accumulated on the device, read once after the last update: no host synchronisation in between
        device = self.placement.device
        sums = torch.zeros(len(_SUMMED), dtype=torch.float64, device=device)
        norms = torch.zeros((), dtype=torch.float64, device=device)
        role_sq: dict[str, torch.Tensor] = {}
        for chosen in batches:
            norms += self._update(trained, chosen, old, ref, sums, role_sq)
            metrics["optimizer_steps"] += 1
        # the ranks' sums and their parts of each role's squared norm (the same roles, in the same order)
        summed = torch.cat([sums, *(v.reshape(1) for v in role_sq.values())])
        self.shard.sum_([summed])
        # the step's one read from the device: the sums, each role's squared norm and the gradient norm
        read = torch.cat([summed, norms.reshape(1)]).tolist()
        totals = dict(zip(_SUMMED, read, strict=False))
        totals["grad_norm"] = read[-1]
        metrics["time/update_s"] = time.perf_counter() - started
        tokens = max(totals["tokens"], 1.0)
        metrics.update(
            {
                "loss": totals["loss"] / max(metrics["optimizer_steps"], 1),
                "clip_fraction/low": totals["clipped_low"] / tokens,
                "clip_fraction/high": totals["clipped_high"] / tokens,
                "clip_fraction": (totals["clipped_low"] + totals["clipped_high"]) / tokens,
                "kl": totals["kl"] / tokens,
                "entropy": totals["entropy"] / tokens if totals["entropy"] else float("nan"),
                "ratio/mean": totals["ratio"] / tokens,
                "grad_norm": totals["grad_norm"] / max(metrics["optimizer_steps"], 1),
                "learning_rate": self.optimizer.param_groups[0]["lr"],  # the step's last update's
                "mastered_tokens_masked": totals["mastered"],
                "trained_tokens": totals["tokens"],
            }
        )
        norms = {role: math.sqrt(v) for role, v in zip(role_sq, read[len(_SUMMED) : -1], strict=True)}
        total = sum(norms.values())
        metrics["per_role"] = {
            role: {"grad_norm": norm, "grad_share": norm / total if total else 0.0}
            for role, norm in norms.items()
        }
        return metrics

    def close(self) -> None:
        """Nothing to release in one process (a ``TrainerGroup`` stops its ranks)."""

    # ------------------------------------------------------------------ internals

    @property
    def _sharing(self) -> bool:
        return self.config.block_attention and self.config.share_prefixes

    def _forget_steps(self, optimizer: torch.optim.Optimizer) -> None:
        self._steps = None  # a state was loaded: read its step counters again

    def _optimizer_steps(self) -> list[int]:
        """AdamW's step count of each parameter (0 for one it has not stepped), kept on the host."""
        if self._steps is None:
            state = self.optimizer.state
            self._steps = [
                int(state[p]["step"]) if "step" in state.get(p, {}) else 0 for p in self.parameters
            ]
        return self._steps

    def _needs_old(self, samples: Sequence[Sample]) -> bool:
        """The trainer's own pre-update log-probs are needed unless the single update is on-policy."""
        cfg = self.config
        several_updates = cfg.ppo_epochs > 1 or (cfg.mini_batch_size or len(samples)) < len(samples)
        if cfg.loss.old_from_engine and cfg.loss.engine_ratio_cap is None and cfg.loss.mastered_prob is None:
            return False  # the engine's log-probs are the old policy's
        return several_updates or cfg.loss.engine_ratio_cap is not None or cfg.loss.mastered_prob is not None

    @torch.no_grad()
    def _old_logprobs(self, samples: Sequence[Sample], share: Any) -> list[torch.Tensor]:
        return self._score(samples, share, lambda s: self.activate(s.policy))

    @torch.no_grad()
    def _ref_logprobs(self, samples: Sequence[Sample], share: Any) -> list[torch.Tensor]:
        if self.ref_model is None:
            raise ValueError("kl_coef > 0 needs a reference model; pass ref_model to PolicyTrainer")
        return self._score(samples, share, lambda s: self.ref_model)

    def _score(self, samples: Sequence[Sample], share: Any, model_of: Any) -> list[torch.Tensor]:
        """Per-token log-probs of ``samples[i] for i in share(self.shard)`` (the other entries are left empty).

        A micro-batch's log-probs come in sample order, each sample's completion in turn: they are split by
        the completion lengths (known on the host), never selected sample by sample with a mask (a sync each).
        """
        out: list[torch.Tensor] = [torch.empty(0)] * len(samples)
        for micro, counted in self._passes(samples, share):
            batch = collate(samples, micro, share_prefixes=self._sharing).to(self.placement.device)
            model = model_of(samples[micro[0]])
            model.eval()
            with self.placement.autocast():
                logps, _ = token_logprobs(model, batch, self.config.temperature)
            if not counted:  # a pass to keep in step with the group
                continue
            lengths = [len(samples[i].completion_ids) for i in micro]
            for i, part in zip(micro, logps.detach().split(lengths), strict=True):
                out[i] = part
        return out

    def _plan(self, samples: Sequence[Sample], indices: list[int]) -> list[list[int]]:
        """Micro-batches of ``indices`` that never mix roles (or policies), so per-role gradients can be measured."""
        return [micro for micros in self._plan_by_key(samples, indices).values() for micro in micros]

    def _plan_by_key(
        self, samples: Sequence[Sample], indices: list[int]
    ) -> dict[tuple[str, str], list[list[int]]]:
        """Micro-batches of ``indices`` by (role, policy), never mixing them, so per-role gradients can be measured."""
        by_role: dict[tuple[str, str], list[int]] = defaultdict(list)
        for i in indices:
            by_role[(samples[i].role, samples[i].policy)].append(i)
        planner = plan_shared_micro_batches if self._sharing else plan_micro_batches
        return {
            key: [
                [members[j] for j in micro]
                for micro in planner([samples[i] for i in members], self.config.token_budget)
            ]
            for key, members in by_role.items()
        }

    def _passes(self, samples: Sequence[Sample], share: Any) -> list[tuple[list[int], bool]]:
        """This rank's micro-batches of ``share(shard)`` (its indices into ``samples``), each with whether it
        counts: in a group every rank runs as many passes per (role, policy) as the rank with the most, in
        the same order (computed alike on every rank, which has every sample), repeating a real micro-batch
        of that key that does not count."""
        size = self.shard.size
        plans = [self._plan_by_key(samples, share(Shard(r, size))) for r in range(size)]
        out: list[tuple[list[int], bool]] = []
        for key in dict.fromkeys(key for plan in plans for key in plan):
            own = plans[self.shard.rank].get(key, [])
            most = max(len(plan.get(key, [])) for plan in plans)
            filler = next(plan[key][0] for plan in plans if plan.get(key))
            out += [(micro, True) for micro in own] + [(filler, False)] * (most - len(own))
        return out

    def _sync_points(self, samples: Sequence[Sample], passes: list[tuple[list[int], bool]]) -> set[int]:
        """The indices of ``passes`` after which a model's gradients are reduce-scattered when syncs are
        deferred: each model's last pass (the same on every rank, whose passes use the same models in turn)."""
        last = {id(self.models[samples[micro[0]].policy]): i for i, (micro, _) in enumerate(passes)}
        return set(last.values())

    def _update(
        self,
        trained: list[Sample],
        chosen: list[int],
        old: list[torch.Tensor] | None,
        ref: list[torch.Tensor] | None,
        sums: torch.Tensor,
        role_sq: dict[str, torch.Tensor],
    ) -> torch.Tensor:
        """One optimizer step on the mini-batch ``chosen`` (indices into ``trained``), on this rank's share;
        adds the loss and ``LossTerms.stats`` to ``sums`` and returns the gradient norm (device tensors).

        Gradients are gathered one role at a time (in the order roles first appear in the mini-batch, the
        same on every rank) and summed over the ranks, so each role's share of the gradient is measured on
        the whole mini-batch's gradient.
        """
        cfg = self.config
        everyone = [trained[i] for i in chosen]
        agg = cfg.loss.aggregation
        denominator = (
            float(sum(s.n_trained for s in everyone)) if agg == "token_mean" else float(len(everyone))
        )
        roles = list(dict.fromkeys(s.role for s in everyone))
        measure = cfg.measure_role_gradients and len(roles) > 1
        self.optimizer.zero_grad(set_to_none=True)
        if self.compute_weights is not None:  # issue 47: this optimizer step's bf16 weights
            self.compute_weights.refresh()
        gathered: list[torch.Tensor] | None = None  # the mini-batch's gradient, summed over roles and ranks
        # whether a parameter has a gradient (host values, no reads; the same on every rank, which runs the
        # same passes)
        touched = [False] * len(self.parameters)
        for role in roles if measure else [None]:

            def share(shard: Shard, role: str | None = role) -> list[int]:
                return [i for i in shard.mine(chosen) if role is None or trained[i].role == role]

            passes = self._passes(trained, share)
            syncs = self._sync_points(trained, passes)
            for index, (micro, counted) in enumerate(passes):
                batch = collate(trained, micro, share_prefixes=self._sharing).to(self.placement.device)
                model = self.activate(trained[micro[0]].policy)
                model.train()
                if self.defer_sync:  # reduce-scatter on the model's last pass of this gradient only
                    set_gradient_sync(model, index in syncs)
                # backward runs outside, in the dtypes autocast chose (and into the compute weights' masters)
                with self.placement.autocast(), forward_scope(self.compute_weights):
                    logps, entropy = token_logprobs(model, batch, cfg.temperature, with_entropy=True)
                if not counted:  # in step with the group: the same passes, no gradient, no statistics
                    self._terms(micro, batch, logps, entropy, None, None, denominator).loss.mul(
                        0.0
                    ).backward()
                    continue
                terms = self._terms(micro, batch, logps, entropy, old, ref, denominator)
                terms.loss.backward()
                sums[0] += terms.loss.detach().to(sums.dtype)
                sums[1:] += terms.stats
            # this role's gradient (taken out of the parameters, so the next role's starts at zero), summed
            # over the ranks by FSDP (each rank holds its shard of the sum)
            part = []
            for k, p in enumerate(self.parameters):
                touched[k] = touched[k] or p.grad is not None
                part.append(p.grad if p.grad is not None else torch.zeros_like(p))
                p.grad = None
            if roles:  # one kernel for all the parameters' norms (this rank's shards), read after the step
                squares = torch.stack(torch._foreach_norm([local(g) for g in part])).double().pow(2).sum()
                key = role if measure else roles[0]
                role_sq[key] = role_sq[key] + squares if key in role_sq else squares
            if gathered is None:
                gathered = part
            else:
                torch._foreach_add_([local(g) for g in gathered], [local(g) for g in part])
        for k, p in enumerate(self.parameters):  # AdamW leaves a parameter with no gradient alone
            p.grad = gathered[k] if touched[k] else None
        limit = cfg.max_grad_norm if cfg.max_grad_norm is not None else math.inf
        norm = torch.nn.utils.clip_grad_norm_(self.parameters, limit)  # over the shards: the global norm
        norm = norm.full_tensor() if self.sharded else norm
        for group in self.optimizer.param_groups:
            group["lr"] = self.learning_rate()
        steps = self._optimizer_steps()  # read before the step: a fresh optimizer's state is still empty
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        for k, was in enumerate(touched):  # AdamW counts a step for each parameter it updated
            steps[k] += was
        self.updates += 1
        return norm.detach().to(torch.float64)

    def _terms(
        self,
        micro: list[int],
        batch: Any,
        logps: torch.Tensor,
        entropy: torch.Tensor | None,
        old: list[torch.Tensor] | None,
        ref: list[torch.Tensor] | None,
        denominator: float,
    ) -> LossTerms:
        engine = batch.engine_logprobs.to(logps.dtype)
        if self.config.loss.old_from_engine:
            old_logps = engine
        elif old is not None:
            old_logps = torch.cat([old[i] for i in micro])
        else:
            old_logps = logps.detach()
        ref_logps = torch.cat([ref[i] for i in micro]) if ref is not None else None
        return policy_loss(
            logps,
            old_logps,
            batch.advantages.to(logps.dtype),
            batch.mask,
            batch.sample_index,
            len(micro),
            denominator,
            self.config.loss,
            ref_logps=ref_logps,
            engine_logps=engine,
            entropy=entropy,
        )
