"""Placement: what a cluster run asks Ray for, checked against what the cluster has before any actor starts.

A run reserves ``cluster_workers`` rollout workers and ``cluster_trainers`` trainer ranks, each with its
CPUs and GPUs (``ActorGroup``). ``problems`` compares that with the cluster's totals and with each of its
nodes, since an actor must fit on one (a pure function, so it is tested without Ray); ``connect`` joins the cluster and fails the run in
seconds, naming both sides, when it cannot be placed, rather than leaving actors waiting for ever. The
driver's own model runs in the training process, outside Ray's count: it is named, not reserved.

Trainer ranks on GPUs are FSDP ranks: ``run_needs`` also takes the trainer's memory settings (policies,
token budget, checkpointing, the KL reference) and ``problems`` checks the memory plan
(``workbench.rl.memory_plan``) of the model on that many ranks against each GPU's memory: the config's
``cluster_gpu_memory_gib``, else the cluster's GPU type (Ray's ``accelerator_type`` resource), else this
machine's GPU for a local cluster; a model whose config cannot be read is not checked. When it does not fit,
the message names only the changes the plan says would make it fit (``memory_fixes``: more ranks, gradient
checkpointing, a lower token budget, LoRA, bf16 compute; each alone, or failing that together).

Actors that still do not answer after a few seconds (Ray holds an actor ``PENDING_CREATION`` until a node has
its resources free, e.g. while another job holds them) are reported every ``WAIT_LOG_EVERY_S`` seconds by
``wait_started``: how many, and whether they wait for resources or are still loading their policies.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

#: Seconds between two "still waiting" lines while actors start.
WAIT_LOG_EVERY_S = 5.0
#: The resources a run reserves, as Ray names them, and how the messages name them.
RESOURCES = (("CPU", "CPU"), ("GPU", "GPU"))
#: GiB of the GPUs Ray names in its ``accelerator_type:<name>`` resource.
GPU_MEMORY_GIB = {
    "H200": 141.0,
    "H100": 80.0,
    "A100-80G": 80.0,
    "A100-40G": 40.0,
    "L40S": 48.0,
    "A10G": 24.0,
    "L4": 24.0,
}
_EPS = 1e-6  # Ray counts resources in fixed point (1e-4); a sum of floats may miss by a hair
#: The most trainer ranks the memory advice tries (the shards stop shrinking what does not divide long before).
MAX_ADVISED_RANKS = 64
#: How many times the advice halves the token budget looking for one that fits (each a forward on fake tensors).
TOKEN_BUDGET_HALVINGS = 3


class PlacementError(RuntimeError):
    """The run asks for more than the Ray cluster has: it would wait for ever, so it does not start."""


@dataclass(frozen=True)
class ActorGroup:
    """``count`` actors of one kind (``name``, singular), each reserving ``cpus`` and ``gpus``; ``settings``
    name the config fields that set the count, the CPUs and the GPUs (for the message's advice)."""

    name: str
    count: int
    cpus: float
    gpus: float
    settings: tuple[str, str, str]

    def each(self) -> dict[str, float]:
        """What one actor reserves, by Ray's resource name (nonzero amounts only)."""
        return {r: a for r, a in (("CPU", self.cpus), ("GPU", self.gpus)) if a > 0}

    def label(self) -> str:
        """``2 rollout workers``, ``1 trainer rank``."""
        return f"{self.count} {self.name}{'' if self.count == 1 else 's'}"


def rollout_workers(count: int, cpus: float = 1.0, gpus: float = 0.0) -> ActorGroup:
    settings = ("cluster_workers", "cluster_cpus_per_worker", "cluster_gpus_per_worker")
    return ActorGroup("rollout worker", count, cpus, gpus, settings)


def trainer_ranks(count: int, cpus: float = 1.0, gpus: float = 0.0) -> ActorGroup:
    settings = ("cluster_trainers", "cluster_cpus_per_trainer", "cluster_gpus_per_trainer")
    return ActorGroup("trainer rank", count, cpus, gpus, settings)


@dataclass(frozen=True)
class Needs:
    """What a run reserves on the cluster (its ``groups`` of actors); ``driver`` names where the driver's own
    model runs (``cpu``, ``cuda:0``): in the training process, outside Ray's count, so named, not reserved."""

    groups: tuple[ActorGroup, ...]
    driver: str | None = None
    model: str | None = None  # what the trainer ranks train, for the memory plan (None: not checked)
    memory: Any = None  # their ``PlanSettings`` (the ranks' count as gpus)
    gpu_memory_gib: float | None = None  # each GPU's, when the config or this machine says


def run_needs(config: Any, driver: str | None = None) -> Needs:
    """The actors a run with this ``TrainConfig`` (or its ``to_dict()``) starts on the cluster."""
    get = config.get if isinstance(config, Mapping) else lambda name, default: getattr(config, name, default)
    groups = [
        rollout_workers(
            int(get("cluster_workers", 2)),
            float(get("cluster_cpus_per_worker", 1.0)),
            float(get("cluster_gpus_per_worker", 0.0)),
        )
    ]
    if int(get("cluster_trainers", 0) or 0):
        groups.append(
            trainer_ranks(
                int(get("cluster_trainers", 0)),
                float(get("cluster_cpus_per_trainer", 1.0)),
                float(get("cluster_gpus_per_trainer", 0.0)),
            )
        )
    trainers, gpus = int(get("cluster_trainers", 0) or 0), float(get("cluster_gpus_per_trainer", 0.0))
    if not (trainers and gpus > 0):
        return Needs(tuple(groups), driver)
    from workbench.rl.memory_plan import PlanSettings

    memory = PlanSettings(
        gpus=trainers,
        policies=get("policies", "shared"),
        roles=_policy_count(get),
        lora_rank=int(get("lora_rank", 8)),
        lora_targets=get("lora_targets", "all-linear"),
        gradient_checkpointing=bool(get("gradient_checkpointing", False)),
        token_budget=int(get("token_budget", 4096)),
        mixed_precision=get("dtype", "auto") != "float32",
        reference=float(get("kl_coef", 0.0)) > 0,
    )
    gpu_memory = get("cluster_gpu_memory_gib", None)
    if gpu_memory is None and get("cluster", None) == "local":
        gpu_memory = _local_gpu_memory()
    return Needs(tuple(groups), driver, str(get("model", "")), memory, gpu_memory)


def _policy_count(get: Callable[[str, Any], Any]) -> int:
    """How many policies the run trains (its topology's, a policy a trainable role with
    ``policy_per_role``); 1 when the topology cannot be read here."""
    from workbench.rl.policies import per_role_policies
    from workbench.topology import load

    try:
        topology = load(get("topology", "marsrl"))
    except Exception:  # noqa: BLE001 - a spec the run itself will reject with its own message
        return 1
    return len((per_role_policies(topology) if get("policy_per_role", False) else topology).policies)


def _local_gpu_memory() -> float | None:
    import torch

    if not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_properties(0).total_memory / 2**30


def gpu_memory_gib(needs: Needs, nodes: Sequence[Mapping[str, float]] | None) -> float | None:
    """Each GPU's GiB: the run's setting, else the smallest GPU type named by the cluster's GPU nodes."""
    if needs.gpu_memory_gib is not None:
        return float(needs.gpu_memory_gib)
    known = [
        GPU_MEMORY_GIB[name.split(":", 1)[1]]
        for node in nodes or ()
        if node.get("GPU", 0.0)
        for name in node
        if name.startswith("accelerator_type:") and name.split(":", 1)[1] in GPU_MEMORY_GIB
    ]
    return min(known) if known else None


def memory_problem(needs: Needs, nodes: Sequence[Mapping[str, float]] | None = None) -> str | None:
    """Why the trainer ranks' shards, gradients, AdamW state and micro-batch do not fit each GPU (the memory
    plan's numbers), or None: they fit, or it is not known (no GPU memory, no readable model config)."""
    gib = gpu_memory_gib(needs, nodes)
    if needs.memory is None or not needs.model or gib is None:
        return None
    from dataclasses import replace

    from workbench.rl.memory_plan import plan

    try:
        planned = plan(needs.model, replace(needs.memory, gpu_memory_gib=gib))
    except ValueError:
        return None
    if planned.fits:
        return None
    found = memory_fixes(needs.model, planned.settings)
    if not found:
        advice = (
            "nothing the plan can change fits it (more ranks, gradient checkpointing, a lower token_budget, "
            f"LoRA, bf16): it needs GPUs with more memory than {gib:g} GiB"
        )
    elif found[0].startswith("together"):
        advice = f"no single change fits it; {found[0]}"
    else:
        advice = "it fits with any of: " + "; ".join(found)
    gpus_each = next((g.gpus for g in needs.groups if g.name == "trainer rank"), 1.0)
    have = sum(float(node.get("GPU", 0.0)) for node in nodes or ())
    for fix in found:
        if fix.startswith("cluster_trainers: ") and nodes is not None:
            ranks = int(fix.split(" ")[1])
            if ranks * gpus_each > have + _EPS:
                needed = _count(ranks * gpus_each, "GPU")
                advice += f" (cluster_trainers: {ranks} needs {needed}; the cluster has {_n(have)})"
    return f"needs more GPU memory than each trainer rank has: {planned.summary()} — {advice}"


def memory_fixes(model: str, settings: Any) -> list[str]:
    """The changes to a run's config, each alone, that make the memory plan of ``model`` under ``settings``
    (``PlanSettings``) fit, as config settings with why: the fewest ranks (up to ``MAX_ADVISED_RANKS``) that
    fit, gradient checkpointing, the largest token budget of a few halvings, LoRA (its rank and targets as
    set), bf16 compute; only those the plan says fit. When none does alone, one line starting ``together``:
    the fewest of checkpointing, LoRA and bf16 that fit together, else all three with the fewest ranks that
    fit; empty when even that does not fit."""
    from dataclasses import replace

    from workbench.rl.memory_plan import plan

    def fits(**changes: Any) -> bool:
        return plan(model, replace(settings, **changes)).fits

    def fewest_ranks(**changes: Any) -> int | None:
        return next(
            (n for n in range(settings.gpus + 1, MAX_ADVISED_RANKS + 1) if fits(gpus=n, **changes)), None
        )

    out = []
    if (ranks := fewest_ranks()) is not None:
        out.append(f"cluster_trainers: {ranks} (FSDP ranks share the model's shards)")
    if not settings.gradient_checkpointing and fits(gradient_checkpointing=True):
        out.append("gradient_checkpointing: true (a layer's activations recomputed in the backward)")
    budget = settings.token_budget
    current = plan(model, settings)
    per_token = ("activations", "recomputed_layer", "logits")  # what a smaller micro-batch can shrink
    if current.total - sum(current.terms[t] for t in per_token) > current.budget:
        budget = 0  # the rest does not fit alone: no micro-batch is small enough (nothing measured)
    for _ in range(TOKEN_BUDGET_HALVINGS if budget else 0):
        budget //= 2
        if budget < 1:
            break
        if fits(token_budget=budget):
            out.append(f"token_budget: {budget} (a smaller micro-batch; the run takes more of them)")
            break
    if settings.policies != "lora" and fits(policies="lora"):
        out.append(f"policies: lora (rank {settings.lora_rank} adapters on a frozen base)")
    if not settings.mixed_precision and fits(mixed_precision=True):
        out.append("dtype: bfloat16 (bf16 compute over fp32 master weights)")
    if out:
        return out
    names = {
        "gradient_checkpointing": ("gradient_checkpointing: true", True),
        "mixed_precision": ("dtype: bfloat16", True),
        "policies": ("policies: lora", "lora"),
    }
    open_ = [k for k, (_, value) in names.items() if getattr(settings, k) != value]
    for size in range(2, len(open_) + 1):  # the fewest changes that fit together
        for chosen in itertools.combinations(open_, size):
            if fits(**{k: names[k][1] for k in chosen}):
                return ["together, " + " and ".join(names[k][0] for k in chosen)]
    every = {k: names[k][1] for k in open_}
    if (ranks := fewest_ranks(**every)) is not None:
        return ["together, " + " and ".join([*(names[k][0] for k in open_), f"cluster_trainers: {ranks}"])]
    return []


def _n(value: float) -> str:
    return f"{value:g}"


def _count(amount: float, label: str) -> str:
    """``4 CPUs``, ``1 GPU``, ``0.5 GPUs``."""
    return f"{_n(amount)} {label}{'' if amount == 1 else 's'}"


def _amounts(resources: Mapping[str, float]) -> str:
    """A node's or an actor's CPUs, and its GPUs when it has any: ``8 CPUs, 1 GPU``."""
    return ", ".join(
        _count(float(resources.get(r, 0.0)), label)
        for r, label in RESOURCES
        if r == "CPU" or resources.get(r, 0.0)
    )


def problems(
    needs: Needs, total: Mapping[str, float], nodes: Sequence[Mapping[str, float]] | None = None
) -> list[str]:
    """Why ``needs`` cannot be placed on a cluster with ``total`` resources and these ``nodes`` (each alive
    node's resources; None: not checked node by node); empty when it can."""
    out = []
    driver = needs.driver
    groups = [g for g in needs.groups if g.count > 0]
    for resource, label in RESOURCES:
        asking = [g for g in groups if g.count * g.each().get(resource, 0.0) > 0]
        need = sum(g.count * g.each()[resource] for g in asking)
        have = float(total.get(resource, 0.0))
        if need > have + _EPS:
            terms = " + ".join(f"{g.label()} x {_n(g.each()[resource])}" for g in asking)
            knobs = ", ".join(g.settings[1 if resource == "CPU" else 2] for g in asking)
            counts = ", ".join(g.settings[0] for g in asking)
            out.append(
                f"needs {_count(need, label)}: {terms}; the cluster has {_n(have)} — lower {knobs} or the counts "
                f"({counts}), or give the cluster more {label}s"
                + (
                    f" (the driver's own model, on {driver}, is outside Ray's count)"
                    if driver and resource == "GPU"
                    else ""
                )
            )
    if not out and (memory := memory_problem(needs, nodes)):
        out.append(memory)
    if nodes is not None and not out:
        for g in groups:
            each = g.each()
            if each and not any(all(node.get(r, 0.0) + _EPS >= a for r, a in each.items()) for node in nodes):
                sizes = "; ".join(sorted({_amounts(node) for node in nodes})) or "none alive"
                knobs = " or ".join(g.settings[1 if r == "CPU" else 2] for r in each)
                out.append(
                    f"needs {_amounts(each)} on one node for each {g.name}; no node of the cluster has that much "
                    f"(its nodes have {sizes}) — lower {knobs}"
                )
    return out


def check(
    needs: Needs, total: Mapping[str, float], nodes: Sequence[Mapping[str, float]] | None = None
) -> None:
    """Raise ``PlacementError`` naming what the run needs and what the cluster has, when it cannot be placed."""
    found = problems(needs, total, nodes)
    if found:
        raise PlacementError("this run cannot be placed on the Ray cluster: it " + "; it ".join(found))


def connect(address: str, needs: Needs | None = None) -> bool:
    """Join the Ray cluster at ``address`` (``local`` starts one here); True when this call started Ray.

    With ``needs``, check that the cluster can place them (``check``) before anything is started on it;
    when it cannot, Ray is shut down again if this call started it, and ``PlacementError`` is raised.
    """
    import ray

    started = False
    if not ray.is_initialized():
        if address == "local":
            ray.init(include_dashboard=False, logging_level="WARNING", log_to_driver=False)
        else:
            ray.init(address=address, logging_level="WARNING", log_to_driver=False)
        started = True
    if needs is not None:
        try:
            nodes = [node["Resources"] for node in ray.nodes() if node.get("Alive")]
            check(needs, ray.cluster_resources(), nodes)
        except PlacementError:
            if started:
                ray.shutdown()
            raise
    return started


def waiting(
    group: ActorGroup, pending: int, seconds: float, free: Mapping[str, float], total: Mapping[str, float]
) -> str:
    """The line that says ``pending`` actors of ``group`` have not started after ``seconds``, and what for."""
    each = group.each()
    short = [r for r, a in each.items() if float(free.get(r, 0.0)) + _EPS < a]
    head = f"{pending} of {group.label()} not started after {seconds:.0f} s"
    if short:
        wanted = " and ".join(_count(each[r], r) for r in short)
        free_now = ", ".join(
            f"{_n(float(free.get(r, 0.0)))} of {_count(float(total.get(r, 0.0)), r)}" for r in short
        )
        return (
            f"{head}: Ray holds them (PENDING_CREATION) until it can reserve {wanted} for each; free now: "
            f"{free_now} (other actors or jobs on the cluster hold the rest)"
        )
    return f"{head}: the cluster has their resources free; they are still loading their policies"


def wait_started(
    refs: Sequence[Any],
    group: ActorGroup,
    log: Callable[[str], None],
    every: float = WAIT_LOG_EVERY_S,
) -> None:
    """Wait until every ref (one call per actor of ``group``, e.g. ``pid.remote()``) is ready, saying every
    ``every`` seconds how many actors have not started and what they wait for. A failed call counts as
    ready: the caller's ``ray.get`` raises its error."""
    import ray

    started, pending = time.monotonic(), list(refs)
    while pending:
        _, pending = ray.wait(pending, num_returns=len(pending), timeout=every)
        if pending:
            seconds = time.monotonic() - started
            log(waiting(group, len(pending), seconds, ray.available_resources(), ray.cluster_resources()))
