"""Launch budget: aten ops dispatched per trainer micro-batch and per decode token step, counted on the CPU.

    python -m tests.perf.bench_launches              # the Qwen2.5-0.5B shape, into tests/perf/results/launches.json
    python -m tests.perf.bench_launches --quick      # the qwen2-mini shape, before/after only (CI size)

On a GPU every op the dispatcher runs is a kernel launch from Python (views aside), so at 0.5B the CPU's
dispatch time can equal the GPU's compute. :class:`OpCounter` is a ``TorchDispatchMode`` that counts what reaches
the dispatcher below autograd and autocast: the forward's ops, autocast's casts, the backward's ops and the
gradient accumulation, each op once (a composite op counts as the ops it decomposes into). ``views`` are ops
that make a view (no kernel on a GPU); ``kernels`` the rest.

**Micro-batch** (forward + loss + backward, the trainer's own path: ``collate``, ``token_logprobs`` under
``Placement.autocast``, ``PolicyTrainer._terms``, ``backward``; shared prefixes and ``packed`` attention as the
trainer sets them). Counted on fake tensors (``FakeTensorMode``: meta storage presented as CPU tensors, so
CPU autocast applies and nothing is computed), at the real widths, on models cut to 1, 2 and 3 decoder
layers: per layer = count(2) - count(1), checked equal to count(3) - count(2), and the whole model =
count(1) + (layers - 1) x per layer. The GPU's choices are taken on purpose: the attention path is forced
(``varlen``: the kernel bf16 training takes once q/k/v are cast; ``padded``: fp32 on a GPU; ``loop``, the CPU's,
grows with the samples and is shown for that) and the LM head recomputes its chunks in the backward pass as
on a GPU. Each count is of the second micro-batch of an optimizer step (gradients accumulate into
``.grad``; the first one's are stolen, a few ops fewer). Samples: 8 and 64 in GRPO groups of 8 sharing
their prompts, at the same token count (the LM head's ops grow with completion tokens, one chunk per
``chunk_rows(vocab)`` rows, never with samples); ``head_chunk`` is what one chunk more costs.

Variants: ``fp32``; ``bf16`` (autocast over fp32 master weights: the training case, a cast before every
linear); ``bf16+compute_weights`` (``workbench.rl.compute_weights``: bf16 copies of the linear weights made once
per optimizer step, one fused copy counted apart, gradients accumulated into the fp32 masters).

**Decode step** (``workbench.backends.hf_static_decode``, ``capture=False``): the ops of one token step
(``StaticDecoder._forward_step``: the forward over one token a row, sampling, the drawn token's log-prob),
counted on real tensors on the CPU at the real widths (layers cut as above), for 8 and 64 rows; bf16 weights
(a rollout copy) and fp32 weights. (fp32 weights under bf16 autocast, the trained model generating, fail here:
the prefill's cache holds fp32 values and the step writes bf16 ones into it.)
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import functools
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from tests.perf.runner import machine, now, write_json
from workbench.rl.samples import Sample

DEFAULT_OUT = Path(__file__).parent / "results" / "launches.json"
VARIANTS = ("fp32", "bf16", "bf16+compute_weights")
PATHS = ("varlen", "padded", "loop")
# ops that only make a view or alias but are not flagged as views in their schema
_ALIASES = {"aten._unsafe_view.default", "aten.alias.default", "aten.lift_fresh.default"}


class OpCounter(TorchDispatchMode):
    """Counts the ops dispatched while active (those returning a tensor or nothing, an in-place ``_foreach``
    op; ``prim.device`` and friends are queries, not ops): ``total``, ``views``, ``kernels`` (= total - views),
    ``by_op``."""

    def __init__(self) -> None:
        super().__init__()
        self.by_op: collections.Counter[str] = collections.Counter()
        self.views = 0
        self.active = True

    @property
    def total(self) -> int:
        return sum(self.by_op.values())

    @property
    def kernels(self) -> int:
        return self.total - self.views

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if self.active and (out is None or any(isinstance(x, torch.Tensor) for x in tree_flatten(out)[0])):
            name = str(func)
            self.by_op[name] += 1
            self.views += bool(getattr(func, "is_view", False) or name in _ALIASES)
        return out

    def summary(self) -> dict[str, int]:
        return {"total": self.total, "kernels": self.kernels, "views": self.views}


def _config(shape: str, layers: int) -> Any:
    from tests.perf import shapes

    config = shapes.config(shape)
    config.num_hidden_layers = layers
    return config


def _model(config: Any, dtype: torch.dtype = torch.float32) -> Any:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="sdpa")


def grouped_samples(vocab: int, n: int, tokens: int, group: int = 8, seed: int = 0) -> list[Sample]:
    """``n`` samples in GRPO groups of ``group`` sharing a prompt, ``tokens`` computed tokens in all (shared
    prompts once): each group's prompt 1/15 of the group's tokens, each completion the rest split evenly."""
    import random

    rng = random.Random(seed)
    per_group = tokens // (n // group)
    prompt = max(2, per_group // 15)
    completion = (per_group - prompt) // group
    out = []
    for _group in range(n // group):
        ids = [rng.randrange(10, vocab) for _ in range(prompt)]
        for i in range(group):
            c = [rng.randrange(10, vocab) for _ in range(completion)]
            role = "solver"
            out.append(
                Sample(ids, c, [1] * len(c), [0.0] * len(c), role=role, policy=role, advantage=i - 3.5)
            )
    return out


@contextlib.contextmanager
def gpu_choices(path: str) -> Iterator[None]:
    """The attention path forced to ``path`` and the LM head recomputing its chunks, as on a GPU."""
    from workbench.rl import packing
    from workbench.rl.packed_attention import forced_path

    original = packing.chunked_logprobs
    packing.chunked_logprobs = functools.partial(original, recompute=True)
    try:
        with forced_path(path):
            yield
    finally:
        packing.chunked_logprobs = original


def micro_batch_ops(
    shape: str,
    layers: int,
    variant: str,
    path: str,
    samples: list[Sample],
    token_budget: int = 8192,
    fake: bool = True,
) -> dict[str, Any]:
    """Ops of one steady-state trainer micro-batch (the second of an optimizer step), on fake tensors (or,
    ``fake=False``, on real CPU tensors: the same count, computed)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from workbench.rl.compute_weights import forward_scope
    from workbench.rl.loss import LossConfig
    from workbench.rl.packing import collate, token_logprobs
    from workbench.rl.trainer import OptimConfig, PolicyTrainer

    fake = FakeTensorMode(allow_non_fake_inputs=True) if fake else contextlib.nullcontext()
    config = OptimConfig(
        token_budget=token_budget,
        compute_dtype="float32" if variant == "fp32" else "bfloat16",
        compute_weights=variant.endswith("compute_weights"),
        loss=LossConfig(aggregation="seq_mean_token_mean"),
    )
    with fake:
        model = _model(_config(shape, layers))
        trainer = PolicyTrainer({"solver": model}, config)
    micro = trainer._plan(samples, list(range(len(samples))))[0]
    batch = collate(samples, micro, share_prefixes=trainer._sharing)
    batch.layout.padded()  # the padded path's indices, built on the host as the GPU builds them on the device
    model.train()
    counter = OpCounter()
    refresh = OpCounter()
    with fake, gpu_choices(path):
        if trainer.compute_weights is not None:
            with refresh:
                trainer.compute_weights.refresh()
        for k in range(2):  # the second is counted: its gradients accumulate into the first's
            counter.active = k == 1
            with counter:
                with trainer.placement.autocast(), forward_scope(trainer.compute_weights):
                    logps, entropy = token_logprobs(model, batch, config.temperature, with_entropy=True)
                terms = trainer._terms(micro, batch, logps, entropy, None, None, float(len(samples)))
                terms.loss.backward()
    return {
        **counter.summary(),
        "by_op": dict(counter.by_op.most_common()),
        "per_optimizer_step": refresh.total,
        "tokens": batch.n_tokens,
        "completion_tokens": int(batch.target_ids.shape[0]),
        "samples": len(micro),
    }


def _layered(counts: dict[int, dict[str, Any]], layers: int) -> dict[str, Any]:
    """Per layer (count(2) - count(1)), its check (count(3) - count(2)), and the whole model's count."""
    out: dict[str, Any] = {}
    for key in ("total", "kernels", "views"):
        per = counts[2][key] - counts[1][key]
        out[key] = {
            "per_layer": per,
            "outside_layers": counts[1][key] - per,
            "model": counts[1][key] + (layers - 1) * per,
            "linear_in_layers": counts[3][key] - counts[2][key] == per,
        }
    a, b = counts[1]["by_op"], counts[2]["by_op"]
    out["per_layer_by_op"] = {k: b.get(k, 0) - a.get(k, 0) for k in b if b.get(k, 0) != a.get(k, 0)}
    return out


def decode_step_ops(shape: str, layers: int, rows: int, weights: str, steps: int = 3) -> dict[str, Any]:
    """Ops of one static-decode token step (``capture=False``) on real CPU tensors, the same every step."""
    from types import SimpleNamespace

    from workbench.backends.base import GenerationRequest
    from workbench.backends.hf_static_decode import StaticDecoder

    config = _config(shape, layers)
    model = _model(config, torch.bfloat16 if weights == "bf16" else torch.float32).eval()
    decoder = StaticDecoder(model, max_batch=rows, capture=False)
    counts = []
    original = decoder._forward_step

    def counted(*args: Any, **kwargs: Any) -> None:
        with OpCounter() as counter:
            original(*args, **kwargs)
        counts.append(counter.summary())

    decoder._forward_step = counted  # type: ignore[method-assign]
    generator = torch.Generator().manual_seed(0)
    prompt = torch.randint(10, config.vocab_size, (rows, 8), generator=generator)
    request = GenerationRequest(prompt_ids=[], max_tokens=steps + 1, temperature=1.0)
    tokenizer = SimpleNamespace(decode=lambda ids, **_: "")
    decoder.decode(tokenizer, prompt, torch.ones_like(prompt), [request] * rows, [-1], list(range(rows)))
    if len({json.dumps(c) for c in counts}) != 1:
        raise AssertionError(f"decode steps dispatched different op counts: {counts}")
    return counts[0]


def run(
    shape: str,
    layers: int,
    tokens: int,
    sample_counts: list[int],
    decode: bool = True,
    variants: tuple[str, ...] = VARIANTS,
    paths: tuple[str, ...] = PATHS,
    fake: bool = True,
) -> dict[str, Any]:
    """Every count of the module docstring; ``fake=False`` counts on real CPU tensors (not ``varlen``)."""
    config = _config(shape, layers)
    from workbench.rl.logprob_head import chunk_rows

    workloads = {n: grouped_samples(config.vocab_size, n, tokens) for n in sample_counts}
    out: dict[str, Any] = {
        "shape": shape,
        "layers": layers,
        "micro_batch": {},
        "workload": {
            "tokens": tokens,
            "samples": sample_counts,
            "group": 8,
            "chunk_rows": chunk_rows(config.vocab_size),
        },
    }
    started = time.perf_counter()
    for variant in variants:
        out["micro_batch"][variant] = {}
        for path in paths:
            if path == "loop" and variant != "bf16":
                continue
            by_samples = {}
            for n, samples in workloads.items():
                counts = {k: micro_batch_ops(shape, k, variant, path, samples, fake=fake) for k in (1, 2, 3)}
                entry = _layered(counts, layers)
                entry["micro_batch"] = {k: counts[1][k] for k in ("tokens", "completion_tokens", "samples")}
                entry["per_optimizer_step"] = counts[1]["per_optimizer_step"]
                by_samples[str(n)] = entry
                print(
                    f"{variant:>22} {path:>7} {n:>3} samples: {entry['total']['per_layer']} ops a layer "
                    f"({entry['kernels']['per_layer']} kernels), {entry['total']['model']} a micro-batch "
                    f"({entry['kernels']['model']} kernels)",
                    flush=True,
                )
            first, last = (by_samples[str(n)] for n in (sample_counts[0], sample_counts[-1]))
            out["micro_batch"][variant][path] = {
                "by_samples": by_samples,
                "grows_with_samples": first["total"]["model"] != last["total"]["model"],
            }
    n = sample_counts[-1]
    if fake:  # one more LM head chunk: the same samples with completions one chunk longer in all
        more = grouped_samples(
            config.vocab_size, n, tokens + chunk_rows(config.vocab_size) * 16 // 15 + 8 * n
        )
        base = micro_batch_ops(shape, 1, "bf16", paths[0], workloads[n])
        extra = micro_batch_ops(shape, 1, "bf16", paths[0], more)
        out["head_chunk"] = {
            "completion_tokens": [base["completion_tokens"], extra["completion_tokens"]],
            "ops": extra["total"] - base["total"],
        }
    before = out["micro_batch"]["bf16"][paths[0]]["by_samples"][str(n)]
    after = out["micro_batch"]["bf16+compute_weights"][paths[0]]["by_samples"][str(n)]
    out["after_vs_before"] = {
        "path": paths[0],
        **{key: round(before[key]["model"] / after[key]["model"], 3) for key in ("total", "kernels")},
    }
    out["micro_batch_seconds"] = round(time.perf_counter() - started, 1)
    if decode:
        out["decode_step"] = {}
        for weights in ("bf16", "fp32"):
            per_rows = {}
            for rows in (sample_counts[0], sample_counts[-1]):
                counts = {k: decode_step_ops(shape, k, rows, weights) for k in (1, 2, 3)}
                counts = {k: {**v, "by_op": {}} for k, v in counts.items()}
                entry = _layered(counts, layers)
                entry.pop("per_layer_by_op")
                per_rows[str(rows)] = entry
                print(
                    f"decode {weights:>14} {rows:>3} rows: {entry['total']['model']} ops a step", flush=True
                )
            out["decode_step"][weights] = {
                "by_rows": per_rows,
                "grows_with_rows": len({json.dumps(v) for v in per_rows.values()}) != 1,
            }
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="qwen2-mini, bf16 before/after on the padded path, real CPU tensors, no decode (CI size)",
    )
    parser.add_argument(
        "--shape", help="a shape of tests/perf/shapes (default: qwen2.5-0.5b, quick: qwen2-mini)"
    )
    parser.add_argument(
        "--tokens", type=int, help="tokens of the counted micro-batch (default 7680; quick 480)"
    )
    parser.add_argument(
        "--samples", type=int, nargs="+", help="sample counts, groups of 8 (default 8 64; quick 8 16)"
    )
    parser.add_argument("--no-decode", action="store_true", help="leave out the decode step")
    parser.add_argument("--out", type=Path, help=f"JSON file (default {DEFAULT_OUT}; quick: not written)")
    args = parser.parse_args(argv)
    args.samples = args.samples or ([8, 16] if args.quick else [8, 64])
    shape = args.shape or ("qwen2-mini" if args.quick else "qwen2.5-0.5b")
    tokens = args.tokens or (128 if args.quick else 7680)
    from tests.perf import shapes

    full_layers = json.loads((shapes.SHAPES / f"{shape}.json").read_text())["num_hidden_layers"]
    result = {
        "benchmark": "launches",
        "mode": "quick" if args.quick else "full",
        "when": now(),
        "machine": machine(),
        **run(
            shape,
            full_layers,
            tokens,
            args.samples,
            decode=not (args.no_decode or args.quick),
            variants=("bf16", "bf16+compute_weights") if args.quick else VARIANTS,
            paths=("padded",) if args.quick else PATHS,
            fake=not args.quick,
        ),
    }
    out = args.out or (None if args.quick else DEFAULT_OUT)
    if out is not None:
        write_json(out, result)
        print(f"wrote {out}")
    return result


if __name__ == "__main__":
    main()
