"""Model shapes for throughput benchmarks: the library's named shapes with random weights, no hub download.

The configs are ``workbench.models.shapes`` (Qwen2.5-0.5B/1.5B/7B, Qwen3-14B, ...; ``qwen2-mini`` is a small
one of the Qwen2.5 family, for running the GPU script on a CPU). Throughput, memory and MFU depend on the
shape, not on the weights' values, so random weights measure them.

    python -m tests.perf.shapes materialize qwen2.5-0.5b DIR    # a loadable checkpoint dir (random weights)

A materialised checkpoint carries the ``tiny`` model's byte-level tokenizer (with its chat template): ids past
its vocabulary decode to nothing, which a random model's text does not miss.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import torch

from workbench.models.shapes import SHAPES, config, names

__all__ = ["SHAPES", "build", "config", "materialize", "names", "parameters"]


def build(
    name: str, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32, seed: int = 0
) -> Any:
    """A randomly initialised model of shape ``name``, made directly on ``device`` in ``dtype``."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config(name), dtype=dtype, attn_implementation="sdpa")
    return model.eval()


def parameters(name: str) -> int:
    """Parameter count of shape ``name`` (counted on the meta device: nothing allocated)."""
    with torch.device("meta"):
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_config(config(name))
    return sum(p.numel() for p in model.parameters())


def materialize(name: str, out: Path, device: str = "cpu") -> Path:
    """Save shape ``name`` with random weights (bf16 on disk) and a tokenizer as a checkpoint directory."""
    from workbench.models.tiny import build_tokenizer

    tokenizer = build_tokenizer()
    model = build(name, device=device, dtype=torch.bfloat16)
    for key in ("eos_token_id", "bos_token_id", "pad_token_id"):
        setattr(model.config, key, getattr(tokenizer, key))
        setattr(model.generation_config, key, getattr(tokenizer, key))
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    make = sub.add_parser("materialize", help="write a random-weight checkpoint directory of a shape")
    make.add_argument("name", choices=names())
    make.add_argument("out", type=Path)
    make.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    sub.add_parser("list", help="the shapes and their parameter counts")
    args = parser.parse_args(argv)
    if args.command == "materialize":
        print(f"wrote {materialize(args.name, args.out, args.device)}")
    else:
        for name in names():
            print(f"{name}: {parameters(name) / 1e9:.3f} B parameters")


if __name__ == "__main__":
    main()
