"""Launch budget: aten ops dispatched per trainer micro-batch and per decode token step, counted on the CPU.

    python -m tests.perf.bench_launches              # the Qwen2.5-0.5B shape, into tests/perf/results/launches.json
    python -m tests.perf.bench_launches --quick      # the qwen2-mini shape, before/after only (CI size)
    python -m tests.perf.bench_launches --compiled-only   # the compiled layers' rows into the results file

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
per optimizer step, one fused copy counted apart, gradients accumulated into the fp32 masters);
``bf16+compute_weights+compiled`` (``workbench.rl.compiled_layers``: each decoder layer compiled by inductor,
packed attention eager between its two graphs).

**Compiled layers.** A dispatch mode cannot see into an inductor graph (under a plain one dynamo runs the
region eagerly). :class:`CompiledOpCounter` lets the compiled code run and counts what it launches: the ops the
generated wrapper dispatches (``aten.mm.out`` and the other library calls, ops inductor falls back to) as
above, and each call of a kernel inductor generated (:data:`GENERATED`). That needs real tensors and the CPU's
inductor (C++ kernels; a GPU's are Triton's, and no CUDA codegen runs without a GPU here), so the layers are
counted on real CPU tensors at the real widths, cut to 1, 2 and 3 layers, at a small micro-batch
(``--compiled-tokens``, default 256, 8 and 64 samples): one graph serves every token count, so a layer's
kernels do not depend on it (checked: the same at 8 and 64 samples). Outside the layers the code is the eager
one, counted at the benchmark's tokens in the ``bf16+compute_weights`` rows (``tests/perf/test_launches.py``
checks it is the same count with compiled layers); the micro-batch's count is that plus layers x the compiled count a layer. On the ``varlen``
path the stand-in runs as one op forward and one backward (:func:`counted_varlen`), as the kernel dispatches.

**Decode step** (``workbench.backends.hf_static_decode``, ``capture=False``): the ops of one token step
(``StaticDecoder._forward_step``: the forward over one token a row, sampling, the drawn token's log-prob),
counted on real tensors on the CPU at the real widths (layers cut as above), for 8 and 64 rows; bf16 weights
(a rollout copy) and fp32 weights. (fp32 weights under bf16 autocast, the trained model generating, fail here:
the prefill's cache holds fp32 values and the step writes bf16 ones into it.)
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import contextlib
import functools
import json
import sys
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
EAGER, COMPILED = "bf16+compute_weights", "bf16+compute_weights+compiled"
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


GENERATED = "inductor.generated_kernel"  # by_op's name for a kernel inductor generated (CompiledOpCounter)


class CompiledOpCounter(OpCounter):
    """:class:`OpCounter` that lets compiled code run (``ignore_compile_internals``: a plain dispatch mode makes
    dynamo run a compiled region eagerly) and counts what it launches: the ops its wrapper dispatches (library
    calls as ``aten.mm.out``, ops inductor falls back to) like any other, and each call of a kernel inductor
    generated (C++ on the CPU, Triton on a GPU) as :data:`GENERATED`, caught by ``sys.setprofile`` as a call of
    a ``kernel`` function from inductor's generated modules. On the thread it is entered on (the CPU's autograd
    runs the backward there)."""

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        return True

    def __enter__(self) -> CompiledOpCounter:
        from torch._inductor.runtime.cache_dir_utils import cache_dir

        root = cache_dir()

        def profile(frame: Any, event: str, arg: Any) -> None:
            if (
                event == "c_call"
                and self.active
                and getattr(arg, "__name__", "") == "kernel"
                and frame.f_code.co_filename.startswith(root)
            ):
                self.by_op[GENERATED] += 1

        self._profile = sys.getprofile()
        sys.setprofile(profile)
        return super().__enter__()

    def __exit__(self, *exc: Any) -> None:
        super().__exit__(*exc)
        sys.setprofile(self._profile)


@torch.library.custom_op("bench_launches::varlen", mutates_args=())
def _varlen(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_q: torch.Tensor,
    cu_k: torch.Tensor,
    max_q: int,
    max_k: int,
    scale: float | None,
    left: int,
    right: int,
) -> torch.Tensor:
    from workbench.rl.packed_attention import varlen_attn_standin

    out = varlen_attn_standin(q, k, v, cu_q, cu_k, max_q, max_k, scale=scale, window_size=(left, right))
    return out.clone() if out.data_ptr() in (q.data_ptr(), k.data_ptr(), v.data_ptr()) else out


@_varlen.register_fake
def _(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *args: Any) -> torch.Tensor:
    return torch.empty_like(q)


@torch.library.custom_op("bench_launches::varlen_backward", mutates_args=())
def _varlen_backward(
    grad: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_q: torch.Tensor,
    cu_k: torch.Tensor,
    max_q: int,
    max_k: int,
    scale: float | None,
    left: int,
    right: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    from workbench.rl.packed_attention import varlen_attn_standin

    def gradients() -> tuple[torch.Tensor, ...]:
        inputs = [x.detach().requires_grad_() for x in (q, k, v)]
        window = (left, right)
        out = varlen_attn_standin(*inputs, cu_q, cu_k, max_q, max_k, scale=scale, window_size=window)
        return torch.autograd.grad(out, inputs, grad)

    # an op's kernel runs below autograd; a fresh thread has autograd (and no dispatch mode counting)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(gradients).result()


@_varlen_backward.register_fake
def _(grad: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *args: Any) -> tuple:
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _varlen_setup(ctx: Any, inputs: tuple, output: torch.Tensor) -> None:
    ctx.save_for_backward(*inputs[:5])
    ctx.rest = inputs[5:]


def _varlen_grad(ctx: Any, grad: torch.Tensor) -> tuple:
    return (*_varlen_backward(grad, *ctx.saved_tensors, *ctx.rest), *([None] * 7))


_varlen.register_autograd(_varlen_grad, setup_context=_varlen_setup)


def counted_varlen(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cu_seq_q: torch.Tensor,
    cu_seq_k: torch.Tensor,
    max_q: int,
    max_k: int,
    *,
    return_aux: Any = None,
    scale: float | None = None,
    window_size: tuple[int, int] = (-1, -1),
) -> torch.Tensor:
    """The varlen stand-in (``varlen_attn``'s signature, for ``varlen_on_cpu``) as one op forward and one
    backward, as torch's ``varlen_attn`` dispatches (``torch_attn._varlen_attn`` and its backward): counting
    the varlen path on real CPU tensors as fake tensors count the real kernel."""
    return _varlen(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, scale, *window_size)


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
    from workbench.rl.packed_attention import varlen_on_cpu
    from workbench.rl.packing import collate, token_logprobs
    from workbench.rl.trainer import OptimConfig, PolicyTrainer

    compiled = variant.endswith("+compiled")
    if compiled and fake:
        raise ValueError("compiled layers are counted on real tensors (inductor runs what it generates)")
    fake = FakeTensorMode(allow_non_fake_inputs=True) if fake else contextlib.nullcontext()
    config = OptimConfig(
        token_budget=token_budget,
        compute_dtype="float32" if variant.startswith("fp32") else "bfloat16",
        compute_weights="compute_weights" in variant,
        compile_layers=compiled,
        loss=LossConfig(aggregation="seq_mean_token_mean"),
    )
    with fake:
        model = _model(_config(shape, layers))
        trainer = PolicyTrainer({"solver": model}, config)
    micro = trainer._plan(samples, list(range(len(samples))))[0]
    batch = collate(samples, micro, share_prefixes=trainer._sharing)
    batch.layout.padded()  # the padded path's indices, built on the host as the GPU builds them on the device
    model.train()
    counter = CompiledOpCounter() if compiled else OpCounter()
    refresh = OpCounter()
    # real CPU tensors on the varlen path: the stand-in as one op each way, as the kernel dispatches
    kernel = (
        varlen_on_cpu(counted_varlen) if path == "varlen" and not isinstance(fake, FakeTensorMode) else None
    )
    with fake, gpu_choices(path), kernel or contextlib.nullcontext():
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


def _ratios(rows: dict[str, Any], path: str, n: int) -> dict[str, Any]:
    """How many times fewer ops and kernels a micro-batch the compiled layers dispatch than autocast (``bf16``)
    and the compute weights alone, on ``path`` at ``n`` samples."""
    compiled = rows[COMPILED][path]["by_samples"][str(n)]
    eager = {v: rows[v][path]["by_samples"][str(n)] for v in ("bf16", EAGER)}
    return {
        "path": path,
        **{
            f"{key}_vs_{v}": round(eager[v][key]["model"] / compiled[key]["model"], 3)
            for key in ("total", "kernels")
            for v in eager
        },
    }


def compiled_counts(
    shape: str,
    layers: int,
    tokens: int,
    sample_counts: list[int],
    paths: list[str],
    eager: dict[str, Any],
) -> dict[str, Any]:
    """The compiled layers' rows (module docstring): per layer from real CPU tensors at ``tokens`` (inductor's
    kernels do not depend on the token count: one graph for all), outside the layers the eager count of the
    same variant at the benchmark's tokens (``eager[EAGER]``, the same code; ``outside_layers_counted``: the
    compiled run's at ``tokens``)."""
    config = _config(shape, layers)
    rows: dict[str, Any] = {}
    for path in paths:
        by_samples = {}
        for n in sample_counts:
            samples = grouped_samples(config.vocab_size, n, tokens)
            counts = {k: micro_batch_ops(shape, k, COMPILED, path, samples, fake=False) for k in (1, 2, 3)}
            entry = _layered(counts, layers)
            full = eager[EAGER][path]["by_samples"][str(n)]
            for key in ("total", "kernels", "views"):
                e = entry[key]
                e["outside_layers_counted"] = e["outside_layers"]  # at ``tokens``
                e["outside_layers"] = full[key]["outside_layers"]
                e["model"] = e["outside_layers"] + layers * e["per_layer"]
            entry["micro_batch"] = full["micro_batch"]
            entry["counted_at"] = {k: counts[1][k] for k in ("tokens", "completion_tokens", "samples")}
            entry["generated_kernels_per_layer"] = entry["per_layer_by_op"].get(GENERATED, 0)
            by_samples[str(n)] = entry
            print(
                f"{COMPILED:>22} {path:>7} {n:>3} samples: {entry['total']['per_layer']} ops a layer "
                f"({entry['kernels']['per_layer']} kernels, {entry['generated_kernels_per_layer']} generated), "
                f"{entry['kernels']['model']} kernels a micro-batch",
                flush=True,
            )
        first, last = (by_samples[str(n)] for n in (sample_counts[0], sample_counts[-1]))
        rows[path] = {
            "by_samples": by_samples,
            "grows_with_samples": first["per_layer_by_op"] != last["per_layer_by_op"]
            or first["total"]["model"] != last["total"]["model"],
        }
    return rows


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
    compiled_tokens: int | None = None,
) -> dict[str, Any]:
    """Every count of the module docstring; ``fake=False`` counts on real CPU tensors. ``compiled_tokens``:
    also the compiled layers' variant, its layers counted on real tensors at that many tokens (module
    docstring)."""
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
    if compiled_tokens:
        out["micro_batch"][COMPILED] = compiled_counts(
            shape,
            layers,
            compiled_tokens,
            sample_counts,
            [p for p in paths if p != "loop"],
            out["micro_batch"],
        )
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
    if compiled_tokens:
        out["compiled_vs_before"] = _ratios(out["micro_batch"], paths[0], n)
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


def add_compiled(path: Path, tokens: int) -> dict[str, Any]:
    """The compiled layers' rows and ratios counted into the results in ``path`` (its eager counts kept)."""
    result = json.loads(path.read_text())
    started = time.perf_counter()
    samples = result["workload"]["samples"]
    paths = [p for p in result["micro_batch"][EAGER] if p != "loop"]
    result["micro_batch"][COMPILED] = compiled_counts(
        result["shape"], result["layers"], tokens, samples, paths, result["micro_batch"]
    )
    result["compiled_vs_before"] = _ratios(result["micro_batch"], paths[0], samples[-1])
    result["compiled_when"] = now()
    result["compiled_seconds"] = round(time.perf_counter() - started, 1)
    write_json(path, result)
    print(f"wrote {path}")
    return result


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
    parser.add_argument(
        "--compiled-tokens",
        type=int,
        help="tokens of the micro-batch the compiled layers are counted on, real tensors (default 256; 0: none; "
        "quick: none, tests/perf/test_launches.py counts them at its shape)",
    )
    parser.add_argument(
        "--compiled-only",
        action="store_true",
        help="count the compiled layers only, into the eager counts already in --out (default: the results file)",
    )
    parser.add_argument("--out", type=Path, help=f"JSON file (default {DEFAULT_OUT}; quick: not written)")
    args = parser.parse_args(argv)
    if args.compiled_tokens is None:
        args.compiled_tokens = 0 if args.quick else 256
    if args.compiled_only:
        return add_compiled(args.out or DEFAULT_OUT, args.compiled_tokens or 256)
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
            compiled_tokens=args.compiled_tokens,
        ),
    }
    out = args.out or (None if args.quick else DEFAULT_OUT)
    if out is not None:
        write_json(out, result)
        print(f"wrote {out}")
    return result


if __name__ == "__main__":
    main()
