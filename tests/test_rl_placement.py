"""Device and precision as configuration, bf16 mixed precision and gradient checkpointing, on the CPU.

A GPU runs the same code paths with ``device: cuda`` (``tests/perf/gpu_check.sh`` measures them there);
here ``auto`` must mean the CPU in fp32, bf16 must keep fp32 master weights and optimizer state, and
gradient checkpointing must change memory, not gradients.
"""

from __future__ import annotations

import copy
import re

import pytest
import torch

from tests.grpo_samples import grpo_groups
from workbench.backends.base import GenerationRequest
from workbench.backends.hf import HFBackend
from workbench.backends.loop_thread import run_sync
from workbench.models import load
from workbench.models.placement import Placement, placement_of
from workbench.rl.config import TrainConfig
from workbench.rl.samples import Sample
from workbench.rl.trainer import OptimConfig, PolicyTrainer


@pytest.fixture(scope="module")
def tiny():
    return load("tiny")


def _samples(vocab: int, n: int = 6, seed: int = 0, policy: str = "p") -> list[Sample]:
    """A GRPO group: one prompt, several completions (shared prefixes in the row)."""
    return grpo_groups(vocab, 1, n, seed, policy=policy)


def test_auto_is_the_cpu_in_fp32_without_a_gpu():
    assert not torch.cuda.is_available()  # this suite runs on CPUs; a GPU machine runs gpu_check.sh
    placement = Placement.resolve("auto", "auto")
    assert (placement.device.type, placement.dtype, placement.mixed) == ("cpu", torch.float32, False)
    assert Placement.resolve("cpu", "bfloat16").mixed


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("device", "gpu", "device must be one of auto | cpu | cuda | cuda:N, got 'gpu'"),
        ("device", "cuda:x", "device must be one of"),
        ("dtype", "float16", "dtype must be auto, float32 or bfloat16, got 'float16'"),
    ],
)
def test_a_bad_device_or_dtype_names_the_field(field, value, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        TrainConfig(**{field: value})


def test_a_gpu_this_machine_lacks_is_a_clear_error():
    with pytest.raises(ValueError, match="this machine has no CUDA GPU"):
        Placement.resolve("cuda:0", "auto")


def test_the_config_hands_its_precision_to_the_trainer():
    assert TrainConfig().optim().compute_dtype == "float32"
    config = TrainConfig(dtype="bfloat16", gradient_checkpointing=True)
    assert (config.optim().compute_dtype, config.optim().gradient_checkpointing) == ("bfloat16", True)
    assert TrainConfig.from_yaml(config.to_yaml()).dtype == "bfloat16"


def _grads(model, config: OptimConfig, samples: list[Sample]) -> dict[str, torch.Tensor]:
    trained = copy.deepcopy(model)
    trainer = PolicyTrainer({"p": trained}, config)
    grads: dict[str, torch.Tensor] = {}
    trainer.optimizer.register_step_pre_hook(
        lambda *_: grads.update(
            {n: p.grad.clone() for n, p in trained.named_parameters() if p.grad is not None}
        )
    )
    trainer.step(samples)
    return grads


def test_gradient_checkpointing_gives_the_same_gradients_on_packed_shared_rows(tiny):
    model, _ = tiny
    samples = _samples(model.config.vocab_size)
    plain = _grads(model, OptimConfig(max_grad_norm=None), samples)
    checkpointed = _grads(model, OptimConfig(max_grad_norm=None, gradient_checkpointing=True), samples)
    assert plain.keys() == checkpointed.keys() and plain
    for name, grad in plain.items():
        torch.testing.assert_close(checkpointed[name], grad, atol=1e-6, rtol=1e-5, msg=name)


def test_bf16_trains_fp32_master_weights_with_fp32_adam_state(tiny):
    model, _ = tiny
    trained = copy.deepcopy(model)
    trainer = PolicyTrainer({"p": trained}, OptimConfig(learning_rate=1e-3, compute_dtype="bfloat16"))
    metrics = trainer.step(_samples(model.config.vocab_size))
    assert metrics["optimizer_steps"] == 1 and torch.isfinite(torch.tensor(metrics["grad_norm"]))
    assert {p.dtype for p in trained.parameters()} == {torch.float32}
    state = [s for s in trainer.optimizer.state.values() if "exp_avg" in s]
    assert state and {s["exp_avg"].dtype for s in state} == {torch.float32}
    assert any(not torch.equal(a, b) for a, b in zip(trained.parameters(), model.parameters(), strict=True))
    fp32 = _grads(model, OptimConfig(max_grad_norm=None), _samples(model.config.vocab_size))
    bf16 = _grads(
        model, OptimConfig(max_grad_norm=None, compute_dtype="bfloat16"), _samples(model.config.vocab_size)
    )
    gap = sum(float((bf16[n] - g).pow(2).sum()) for n, g in fp32.items()) ** 0.5
    norm = sum(float(g.pow(2).sum()) for g in fp32.values()) ** 0.5
    assert 0 < gap / norm < 0.05, "bf16 autocast must change the rounding, not the gradient"


def test_lora_in_bf16_keeps_the_base_in_bf16_and_the_adapters_in_fp32(tmp_path):
    from workbench.rl.policies import PolicySet
    from workbench.topology import load as load_topology

    topology = load_topology("marsrl_cpu")
    config = TrainConfig(
        model="tiny", policies="lora", policy_per_role=False, dtype="bfloat16", runs_dir=str(tmp_path)
    )
    policies, reference = PolicySet.load(topology, config, with_reference=True)
    model = next(iter(policies.unique_models().values()))
    dtypes = {(p.requires_grad, p.dtype) for p in model.parameters()}
    assert dtypes == {(True, torch.float32), (False, torch.bfloat16)}
    assert {p.dtype for p in reference.parameters()} == {torch.bfloat16}
    trainer = PolicyTrainer(policies.models, config.optim(), ref_model=reference, activate=policies.activate)
    samples = _samples(model.config.vocab_size)
    for s in samples:
        s.policy = next(iter(policies.models))
    assert trainer.step(samples)["optimizer_steps"] == 1


def test_the_hf_backend_decodes_a_trainers_fp32_model_under_bf16_autocast(tiny):
    model, tokenizer = tiny
    backend = HFBackend(copy.deepcopy(model), tokenizer, placement=Placement.resolve("cpu", "bfloat16"))
    request = GenerationRequest(prompt_ids=[1, 2, 3, 4], max_tokens=5, temperature=0.0, n=2)
    out = run_sync(lambda: backend.generate(request))
    assert [len(g.completion_ids) for g in out] == [5, 5]
    assert all(isinstance(lp, float) for g in out for lp in g.logprobs)
    assert placement_of(backend.model) == Placement(torch.device("cpu"), torch.float32)


def test_the_hf_backend_loads_a_model_by_name_where_told():
    backend = HFBackend("tiny", device="cpu", dtype="bfloat16")
    assert {p.dtype for p in backend.model.parameters()} == {torch.bfloat16}  # rollout only: stored in bf16
    out = run_sync(
        lambda: backend.generate(GenerationRequest(prompt_ids=[1, 2, 3], max_tokens=3, temperature=0.0))
    )
    assert len(out[0].completion_ids) == 3


def test_trainer_ranks_on_gpus_reduce_over_nccl_and_on_cpus_over_gloo():
    from workbench.rl.data_parallel import collective_backend

    assert (collective_backend(on_gpu=True), collective_backend(on_gpu=False)) == ("nccl", "gloo")


def test_the_learning_rate_warms_up_over_optimizer_steps_and_a_resumed_trainer_continues(tiny):
    model, _ = tiny
    config = OptimConfig(learning_rate=1e-3, warmup_steps=2, mini_batch_size=3)  # two updates a step
    trained = copy.deepcopy(model)
    trainer = PolicyTrainer({"p": trained}, config)
    moves = []
    for step in range(2):
        before = [p.detach().clone() for p in trained.parameters()]
        metrics = trainer.step(_samples(model.config.vocab_size, seed=step), step)
        moves.append(
            max(
                float((p.detach() - b).abs().max()) for p, b in zip(trained.parameters(), before, strict=True)
            )
        )
        assert metrics["optimizer_steps"] == 2
    # AdamW's first step moves a weight by at most its rate: 1/3 of it, then 2/3 (two updates in the first step)
    assert moves[0] == pytest.approx(1e-3 * (1 / 3 + 2 / 3), rel=1e-3)
    assert metrics["learning_rate"] == pytest.approx(1e-3)
    resumed = PolicyTrainer({"p": copy.deepcopy(trained)}, config)
    resumed.optimizer.load_state_dict(trainer.optimizer.state_dict())
    assert resumed.learning_rate() == pytest.approx(1e-3)
    fresh = PolicyTrainer({"p": copy.deepcopy(model)}, config)
    assert fresh.learning_rate() == pytest.approx(1e-3 / 3)
    assert PolicyTrainer({"p": copy.deepcopy(model)}, OptimConfig(learning_rate=1e-3)).learning_rate() == 1e-3


class _SleepyEngine:
    """What the training loop asks of an engine in sleep mode (vLLM's exists only on a GPU): the calls in order."""

    can_sleep = True

    def __init__(self, calls: list[str]):
        self.calls = calls

    def sleep(self) -> float:
        self.calls.append("sleep")
        return 0.0

    def wake_up(self) -> float:
        self.calls.append("wake_up")
        return 0.0


def test_engines_in_sleep_mode_sleep_through_the_update_and_wake_even_when_it_fails():
    from workbench.rl.policies import asleep

    calls: list[str] = []
    engine = _SleepyEngine(calls)
    awake = type("Plain", (), {"can_sleep": False})()
    with asleep({"solver": engine, "verifier": engine, "judge": awake}):  # one engine shared by two policies
        calls.append("update")
    assert calls == ["sleep", "update", "wake_up"]
    calls.clear()
    with pytest.raises(RuntimeError, match="update failed"), asleep({"solver": engine}):
        raise RuntimeError("update failed")
    assert calls == ["sleep", "wake_up"]
