"""A trainer's rank in a group: its share of each mini-batch, and the sums that keep the group's figures whole.

Every rank sees the whole step's samples and draws the same mini-batches; it runs forward and backward on its
share of each (every ``size``-th sample). The models are sharded with FSDP2 (``workbench.rl.fsdp``), which
sums the gradients over the ranks; ``sum_`` adds up the step's statistics. A lone trainer is rank 0 of 1,
where the sums do nothing. Ranks on GPUs reduce over NCCL, ranks on CPUs over gloo.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

import torch

T = TypeVar("T")


@dataclass(frozen=True)
class Shard:
    rank: int = 0
    size: int = 1

    def mine(self, items: Sequence[T]) -> list[T]:
        """This rank's share of ``items``: every ``size``-th one, starting at ``rank``."""
        return list(items[self.rank :: self.size])

    def sum_(self, tensors: Sequence[torch.Tensor]) -> None:
        """Replace each tensor by its sum over the ranks, in place (one collective per dtype): the step's
        statistics (gradients are FSDP's to reduce)."""
        if self.size == 1 or not tensors:
            return
        import torch.distributed as dist

        by_dtype: dict[torch.dtype, list[torch.Tensor]] = defaultdict(list)
        for tensor in tensors:
            by_dtype[tensor.dtype].append(tensor)
        # NCCL reduces tensors on this rank's GPU, gloo on the CPU: the same sums, another place
        on = (
            torch.device("cuda", torch.cuda.current_device())
            if dist.get_backend() == "nccl"
            else torch.device("cpu")
        )
        for group in by_dtype.values():
            flat = torch.cat([t.detach().reshape(-1).to(on) for t in group])
            dist.all_reduce(flat)
            offset = 0
            for tensor in group:
                tensor.copy_(flat[offset : offset + tensor.numel()].view_as(tensor))
                offset += tensor.numel()


def collective_backend(on_gpu: bool) -> str:
    """The ``torch.distributed`` backend of a rank: NCCL where it holds a GPU, gloo on CPUs."""
    return "nccl" if on_gpu else "gloo"


def join(address: str, rank: int, size: int, timeout_s: float = 600.0, on_gpu: bool = False) -> Shard:
    """Join the group whose rank 0 listens at ``address`` (host:port): over NCCL if this rank trains on a
    GPU (``on_gpu``; every rank of a group must agree), else over gloo."""
    from datetime import timedelta

    import torch.distributed as dist

    dist.init_process_group(
        collective_backend(on_gpu),
        init_method=f"tcp://{address}",
        rank=rank,
        world_size=size,
        timeout=timedelta(seconds=timeout_s),
    )
    return Shard(rank, size)
