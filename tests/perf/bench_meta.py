"""FLOPs and memory of one policy update, counted on the meta device: nothing allocated, nothing computed.

    python -m tests.perf.bench_meta              # 0.5B, 1.5B, 7B-LoRA at the GPU workload -> results/meta.json
    python -m tests.perf.bench_meta --quick      # the qwen2-mini shape at a small workload (CI size)
    python -m tests.perf.bench_meta --docs       # docs/performance.md's tables from results/{launches,meta}.json

The models are the shapes of ``tests/perf/shapes`` built under ``FakeTensorMode`` (meta storage presented as
CPU tensors, so CPU autocast applies), trained as ``PolicyTrainer`` trains them: bf16 autocast over fp32
master weights (the 7B shape: one LoRA adapter a role on its frozen bf16 base), packed micro-batches of the
GPU benchmark's workload (``tests/perf/profiles/gpu.yaml``: 64 samples in GRPO groups of 8 sharing their
prompt, prompts ~256 and completions ~256 tokens, token budget 8,192), shared prefixes computed once, the LM
head recomputing its chunks in the backward pass as on a GPU.

**FLOPs.** ``torch.utils.flop_counter.FlopCounterMode`` over every micro-batch's forward and backward: each
matmul as it is dispatched, and attention as its kernel computes it, per path
(``workbench.rl.packed_attention``): ``varlen`` (FlashAttention's variable-length kernel skips what the causal
mask hides: q·k − q(q−1)/2 query-key pairs a segment of q queries and k keys), ``padded`` (one sdpa over the
segments padded to the longest: segments × Lq × Lk pairs, mask or not) and ``loop`` (sdpa a segment, counted
whole: q·k). The counter has no formula for the CPU's sdpa op or for ``varlen_attn``: both are given one here
(backward = 2 x forward, torch's convention). Against them: ``model_flops`` (``tests/perf/bench_precision``,
what MFU has been reported on: every sample's tokens, prompts repeated, attention over each sample's whole
length) and ``computed_flops`` (the same formula on the tokens the rows hold). Tokens: ``computed`` (the
packed rows' tokens, a shared prompt once) against ``logical`` (every sample whole).

**Memory.** Parameters, gradients and AdamW state from the trained parameters' counts and dtypes; activations
as the bytes of the distinct storages the forward saves for the backward (``saved_tensors_hooks``, parameters
themselves left out; autocast's bf16 copies of the weights are saved tensors too and are counted, apart as
``weight_casts``), the largest micro-batch's; plus the LM head's working chunk. Against a 24 GB device.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import time
from pathlib import Path
from typing import Any
from unittest import mock

import torch

from tests.perf.bench_launches import gpu_choices
from tests.perf.runner import machine, now, write_json
from workbench.rl.memory_plan import storage_key as _storage_key

DEFAULT_OUT = Path(__file__).parent / "results" / "meta.json"
TARGET_BYTES = 24 * 10**9
PATHS = ("varlen", "padded", "loop")
SHAPES = {"qwen2.5-0.5b": False, "qwen2.5-1.5b": False, "qwen2.5-7b": True}  # shape -> LoRA
_PAIRS = {"causal": 0.0}  # query-key pairs of the micro-batch being counted (the varlen formula reads them)


def _dense_attention(query_shape: Any, key_shape: Any, value_shape: Any, *args: Any, **kwargs: Any) -> int:
    """sdpa ``[B, H, Lq, D]`` x ``[B, Hkv, Lk, D]``: two matmuls over every query-key pair of every head."""
    b, h, lq, d = query_shape
    lk = key_shape[2]
    return 4 * b * h * lq * lk * d


def _dense_attention_backward(*shapes: Any, **kwargs: Any) -> int:
    return 2 * _dense_attention(*shapes[1:4])  # (grad_out, query, key, value, ...)


def _varlen(query_shape: Any, *args: Any, **kwargs: Any) -> int:
    """varlen ``[T, H, D]``: two matmuls over the causal query-key pairs of the segments."""
    _, h, d = query_shape
    return int(4 * h * d * _PAIRS["causal"])


def _varlen_backward(grad_shape: Any, query_shape: Any, *args: Any, **kwargs: Any) -> int:
    return 2 * _varlen(query_shape)


def flop_formulas() -> dict[Any, Any]:
    """The formulas ``FlopCounterMode`` lacks: the CPU's fused sdpa and torch's varlen attention."""
    aten = torch.ops.aten
    formulas = {
        aten._scaled_dot_product_flash_attention_for_cpu: _dense_attention,
        aten._scaled_dot_product_flash_attention_for_cpu_backward: _dense_attention_backward,
    }
    with contextlib.suppress(AttributeError, RuntimeError, ImportError):
        importlib.import_module("torch.nn.attention.varlen")  # registers the op
        formulas[torch.ops.torch_attn._varlen_attn] = _varlen
        formulas[torch.ops.torch_attn._varlen_attn_backward] = _varlen_backward
    return formulas


def causal_pairs(layout: Any) -> float:
    """Query-key pairs a causal kernel computes: q·k − q(q−1)/2 a segment (bottom-right aligned)."""
    q = (layout.cu_q[1:] - layout.cu_q[:-1]).double()
    k = (layout.cu_k[1:] - layout.cu_k[:-1]).double()
    return float((q * k - q * (q - 1) / 2).sum())


def account(
    shape: str, lora: bool, path: str, samples: list[Any], token_budget: int, fake: bool = True
) -> dict[str, Any]:
    """FLOPs, tokens and memory of one update over ``samples`` (module docstring), on fake tensors (or,
    ``fake=False``, real CPU ones: a tiny shape in CI, where they are faster)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils.flop_counter import FlopCounterMode

    from tests.perf import shapes
    from tests.perf.bench_precision import computed_flops, model_flops
    from workbench.rl.loss import LossConfig
    from workbench.rl.packing import collate, token_logprobs
    from workbench.rl.trainer import OptimConfig, PolicyTrainer

    fake = FakeTensorMode(allow_non_fake_inputs=True) if fake else contextlib.nullcontext()
    with fake:
        model = shapes.build(shape, device="cpu", dtype=torch.bfloat16 if lora else torch.float32).train()
        activate = None
        if lora:
            from peft import LoraConfig, get_peft_model

            options = {"r": 16, "lora_alpha": 32, "lora_dropout": 0.0, "target_modules": "all-linear"}
            # peft moves each new adapter to its base layer's device by swapping tensors, which fake ones refuse:
            # they are made on that (fake) device already
            with mock.patch.object(torch.nn.Module, "to", lambda module, *a, **k: module):
                model = get_peft_model(model, LoraConfig(**options), adapter_name="solver")
                model.add_adapter("verifier", LoraConfig(**options))
            for name, parameter in model.named_parameters():
                parameter.requires_grad = "lora_" in name
                if parameter.requires_grad:
                    parameter.data = parameter.data.float()

            def activate(policy: str) -> Any:
                model.set_adapter(policy)
                return model

        config = OptimConfig(
            token_budget=token_budget,
            compute_dtype="bfloat16",
            compute_weights=False,
            loss=LossConfig(aggregation="seq_mean_token_mean"),
        )
        trainer = PolicyTrainer({"solver": model, "verifier": model}, config, activate=activate)
    base = model.get_base_model() if lora else model
    plan = trainer._plan(samples, list(range(len(samples))))
    batches = [collate(samples, micro, share_prefixes=trainer._sharing) for micro in plan]
    for batch in batches:
        batch.layout.padded()  # the padded path's indices, built on the host (the device builds them on a GPU)
    pairs = {id(batch): causal_pairs(batch.layout) for batch in batches}
    parameters = {_storage_key(p) for p in model.parameters()}
    weights = {tuple(m.weight.shape) for m in base.modules() if isinstance(m, torch.nn.Linear)}
    counter = FlopCounterMode(display=False, custom_mapping=flop_formulas())
    activations: list[int] = []
    weight_casts = 0
    with fake, gpu_choices(path), counter:
        for micro, batch in zip(plan, batches, strict=True):
            _PAIRS["causal"] = pairs[id(batch)]
            saved: dict[int, int] = {}
            casts: dict[int, int] = {}

            def pack(tensor: torch.Tensor, saved: dict = saved, casts: dict = casts) -> torch.Tensor:
                key = _storage_key(tensor)
                if key not in parameters:
                    nbytes = tensor.untyped_storage().nbytes()
                    saved[key] = nbytes
                    shape_ = tuple(tensor.shape)
                    if tensor.dtype == torch.bfloat16 and any(shape_ in (w, w[::-1]) for w in weights):
                        casts[key] = nbytes
                return tensor

            model_of = trainer.activate(samples[micro[0]].policy)
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                with trainer.placement.autocast():
                    logps, entropy = token_logprobs(model_of, batch, 1.0, with_entropy=True)
                terms = trainer._terms(micro, batch, logps, entropy, None, None, float(len(samples)))
            terms.loss.backward()
            activations.append(sum(saved.values()))
            weight_casts = max(weight_casts, sum(casts.values()))
    trained = [p for p in model.parameters() if p.requires_grad]
    frozen = [p for p in model.parameters() if not p.requires_grad]
    n_trained = sum(p.numel() for p in trained)
    param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    grad_bytes = sum(p.numel() * p.element_size() for p in trained)
    adam_bytes = 2 * 4 * n_trained  # exp_avg and exp_avg_sq in fp32 (fused AdamW's step counters aside)
    from workbench.rl.logprob_head import CHUNK_ELEMENTS

    head_chunk = CHUNK_ELEMENTS * 4 * 2  # a chunk's fp32 log-softmax and its gradient
    peak = param_bytes + grad_bytes + adam_bytes + max(activations) + head_chunk
    logical = model_flops(base, samples, frozen=lora)
    computed = computed_flops(base, batches, frozen=lora)
    counted = float(counter.get_total_flops())
    return {
        "shape": shape,
        "lora": lora,
        "path": path,
        "micro_batches": len(batches),
        "tokens": {
            "logical": sum(s.n_tokens for s in samples),
            "computed": sum(b.n_tokens for b in batches),
            "completion": sum(len(s.completion_ids) for s in samples),
        },
        "flops": {
            "counted": counted,
            "model_flops_logical": logical,
            "computed_flops_formula": computed,
            "counted_vs_logical": round(counted / logical, 4),
            "attention_counted": float(
                sum(
                    v
                    for k, v in counter.get_flop_counts()["Global"].items()
                    if "attention" in str(k) or "attn" in str(k)
                )
            ),
        },
        "memory": {
            "parameters": param_bytes,
            "frozen_parameters": sum(p.numel() * p.element_size() for p in frozen),
            "gradients": grad_bytes,
            "adamw_state": adam_bytes,
            "activations": max(activations),
            "weight_casts": weight_casts,
            "head_chunk": head_chunk,
            "peak_estimate": peak,
            "target": TARGET_BYTES,
            "fits": peak <= TARGET_BYTES,
        },
        "trained_parameters": n_trained,
    }


DOCS = Path(__file__).resolve().parents[2] / "docs" / "performance.md"
BEGIN, END = "<!-- launches-meta:begin -->", "<!-- launches-meta:end -->"


def _gb(n: float) -> str:
    return f"{n / 1e9:.1f}"


def render(launches: dict[str, Any], meta: dict[str, Any]) -> str:
    """The launch-budget and meta-device tables of docs/performance.md, from the two results' JSON."""
    lines = []
    n = str(launches["workload"]["samples"][-1])
    few = str(launches["workload"]["samples"][0])
    lines += [
        f"**Launch budget** ({launches['mode']} mode, {launches['shape']}, {launches['layers']} layers, "
        f"{launches['when']}): aten ops dispatched per trainer micro-batch (forward + loss + backward, "
        f"{launches['workload']['tokens']:,} tokens, groups of 8 sharing prompts); kernels = ops that are not "
        "views. Per layer = count(2 layers) - count(1 layer), the same as count(3) - count(2) in every row.",
        "",
        f"| precision | attention | ops a layer | kernels a layer | outside the layers | ops a micro-batch "
        f"| kernels a micro-batch | {few} vs {n} samples |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for variant, paths in launches["micro_batch"].items():
        for path, entry in paths.items():
            e = entry["by_samples"][n]
            same = "grows" if entry["grows_with_samples"] else "same"
            lines.append(
                f"| {variant} | {path} | {e['total']['per_layer']} | {e['kernels']['per_layer']} | "
                f"{e['total']['outside_layers']} | {e['total']['model']:,} | {e['kernels']['model']:,} | {same} |"
            )
    after = launches["after_vs_before"]
    lines += [
        "",
        f"Compute weights against autocast ({after['path']}): {after['kernels']:.2f}x fewer kernels, "
        f"{after['total']:.2f}x fewer ops (the issue's target: 2x; see below). One more LM-head chunk "
        f"({launches['workload']['chunk_rows']} completion tokens) adds {launches.get('head_chunk', {}).get('ops', '-')}"
        " ops.",
    ]
    if "compiled_vs_before" in launches:  # the compiled layers' rows: counted as in tests/perf/bench_launches
        c, rows = launches["compiled_vs_before"], launches["micro_batch"]["bf16+compute_weights+compiled"]
        e = rows[c["path"]]["by_samples"][n]
        lines += [
            "",
            f"Compiled layers ({c['path']}): {c['kernels_vs_bf16']:.2f}x fewer kernels a micro-batch than autocast "
            f"({c['kernels_vs_bf16+compute_weights']:.2f}x fewer than the compute weights alone; ops "
            f"{c['total_vs_bf16']:.2f}x), {e['generated_kernels_per_layer']} of a layer's "
            f"{e['kernels']['per_layer']} kernels generated by inductor, counted on real tensors at "
            f"{e['counted_at']['tokens']:,} tokens (the CPU's inductor).",
        ]
    if "decode_step" in launches:
        lines += [
            "",
            "| decode step (static cache, no capture) | ops a layer | kernels a layer | ops a step "
            "| kernels a step | 8 vs 64 rows |",
            "|---|---|---|---|---|---|",
        ]
        for weights, entry in launches["decode_step"].items():
            e = next(iter(entry["by_rows"].values()))
            same = "grows" if entry["grows_with_rows"] else "same"
            lines.append(
                f"| {weights} weights | {e['total']['per_layer']} | {e['kernels']['per_layer']} | "
                f"{e['total']['model']:,} | {e['kernels']['model']:,} | {same} |"
            )
    w = meta["workload"]
    lines += [
        "",
        f"**FLOPs and memory on the meta device** ({meta['mode']} mode, {meta['when']}): one update of "
        f"{w['samples']} samples (groups of {w['group']} sharing a prompt, prompts ~{w['prompt']}, completions "
        f"~{w['completion']}, token budget {w['token_budget']:,}), bf16 autocast over fp32 masters (7B: LoRA "
        "r=16 a role on the frozen bf16 base). Counted: `FlopCounterMode` over every micro-batch; logical: "
        "`model_flops` (every sample whole); formula: `computed_flops` on the rows' tokens. MFU's denominator "
        "either way: counted / logical is how much MFU on logical tokens overstates the hardware's.",
        "",
        "| shape | attention | tokens computed / logical | TFLOPs counted | formula | logical | counted / logical |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, paths in meta["shapes"].items():
        for path, e in paths.items():
            t, f = e["tokens"], e["flops"]
            lines.append(
                f"| {name}{' LoRA' if e['lora'] else ''} | {path} | {t['computed']:,} / {t['logical']:,} | "
                f"{f['counted'] / 1e12:.1f} | {f['computed_flops_formula'] / 1e12:.1f} | "
                f"{f['model_flops_logical'] / 1e12:.1f} | {f['counted_vs_logical']:.2f} |"
            )
    lines += [
        "",
        "| shape | attention | parameters | gradients | AdamW state | activations (of which weight casts) "
        "| LM-head chunk | peak estimate (GB) | within 24 GB |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, paths in meta["shapes"].items():
        for path, e in paths.items():
            m = e["memory"]
            lines.append(
                f"| {name}{' LoRA' if e['lora'] else ''} | {path} | {_gb(m['parameters'])} | {_gb(m['gradients'])} "
                f"| {_gb(m['adamw_state'])} | {_gb(m['activations'])} ({_gb(m['weight_casts'])}) | "
                f"{_gb(m['head_chunk'])} | {_gb(m['peak_estimate'])} | {'yes' if m['fits'] else 'no'} |"
            )
    return "\n".join(lines)


def write_docs(launches_json: Path, meta_json: Path, docs: Path = DOCS) -> None:
    """Rewrite the section between the markers of ``docs`` from the committed JSON."""

    text = docs.read_text()
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{docs} has no {BEGIN} ... {END} section")
    table = render(json.loads(launches_json.read_text()), json.loads(meta_json.read_text()))
    head, rest = text.split(BEGIN, 1)
    docs.write_text(f"{head}{BEGIN}\n{table}\n{END}{rest.split(END, 1)[1]}")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="qwen2-mini at a small workload (CI size)")
    parser.add_argument("--shapes", nargs="+", help=f"shapes (default {', '.join(SHAPES)}); LoRA for a 7b")
    parser.add_argument("--samples", type=int, default=64)
    parser.add_argument("--prompt", type=int, default=256)
    parser.add_argument("--completion", type=int, default=256)
    parser.add_argument("--token-budget", type=int, default=8192)
    parser.add_argument("--out", type=Path, help=f"JSON file (default {DEFAULT_OUT}; quick: not written)")
    parser.add_argument(
        "--docs",
        action="store_true",
        help="rewrite docs/performance.md's tables from the committed JSON, only",
    )
    args = parser.parse_args(argv)
    if args.docs:
        write_docs(DEFAULT_OUT.with_name("launches.json"), DEFAULT_OUT)
        print(f"wrote {DOCS}")
        return {}
    from tests.perf import shapes as shape_configs
    from tests.perf.bench_precision import workload

    if args.quick:
        names, args.samples, args.prompt, args.completion, args.token_budget = ["qwen2-mini"], 16, 24, 16, 256
    else:
        names = args.shapes or list(SHAPES)
    result: dict[str, Any] = {
        "benchmark": "meta",
        "mode": "quick" if args.quick else "full",
        "workload": {
            "samples": args.samples,
            "prompt": args.prompt,
            "completion": args.completion,
            "token_budget": args.token_budget,
            "group": 8,
        },
        "shapes": {},
    }
    out = args.out or (None if args.quick else DEFAULT_OUT)
    if args.shapes and out is not None and out.is_file():  # some shapes again: the others' figures kept
        result["shapes"] = json.loads(out.read_text()).get("shapes", {})
    for name in names:
        vocab = shape_configs.config(name).vocab_size
        samples = workload(vocab, args.samples, args.prompt, args.completion)
        result["shapes"][name] = {}
        for path in ("padded",) if args.quick else PATHS:  # quick: real CPU tensors (no varlen kernel)
            started = time.perf_counter()
            entry = account(
                name, SHAPES.get(name, False), path, samples, args.token_budget, fake=not args.quick
            )
            entry["seconds"] = round(time.perf_counter() - started, 1)
            result["shapes"][name][path] = entry
            memory = entry["memory"]
            print(
                f"{name:>14} {path:>7}: {entry['flops']['counted'] / 1e12:8.2f} TFLOP counted, "
                f"{entry['flops']['model_flops_logical'] / 1e12:8.2f} logical "
                f"({entry['flops']['counted_vs_logical']:.2f}x); tokens {entry['tokens']['computed']:,} of "
                f"{entry['tokens']['logical']:,}; peak ~{memory['peak_estimate'] / 1e9:.1f} GB "
                f"(activations {memory['activations'] / 1e9:.1f} GB) in {entry['seconds']} s",
                flush=True,
            )
            result["when"], result["machine"] = now(), machine()
            if out is not None:
                write_json(out, result)  # after every measurement
    if out is not None:
        print(f"wrote {out}")
    return result


if __name__ == "__main__":
    main()
