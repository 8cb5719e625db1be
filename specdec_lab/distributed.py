"""Data-parallel training across the GPUs of one machine (torch.distributed over NCCL, or gloo on CPUs), for the
trainers: `torchrun --nproc_per_node 4 -m specdec_lab.train_eagle ...` runs four copies, one per GPU.

Each copy draws the same global sample of `batch_size x world` rows and trains on its own slice (the same per-GPU
batch as one GPU would use); after each backward pass the gradients are averaged across copies (one all-reduce of
all of them, flattened), so every copy takes the same optimizer step and keeps the same weights. Only the first
copy (rank 0) logs, evaluates and saves. Launched without torchrun, everything here is a no-op: world size 1.
"""
from __future__ import annotations

import os

import torch
import torch.distributed as dist

from specdec_utils.training import OneProcess


def launched() -> bool:
    """True when started by torchrun (or anything that sets WORLD_SIZE > 1)."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def setup() -> torch.device | None:
    """Join the process group when launched by torchrun (NCCL on GPUs, gloo otherwise) and return this copy's
    device (cuda:LOCAL_RANK on GPUs); None when not launched (the caller picks its device as usual)."""
    if not launched():
        return None
    if not dist.is_initialized():
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        if backend == "nccl":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group(backend)
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


def rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def is_main() -> bool:
    return rank() == 0


def average_gradients(params) -> None:
    """Average the gradients of `params` over every copy, in place (one all-reduce of them all, flattened)."""
    if world_size() == 1:
        return
    grads = [p.grad for p in params if p.grad is not None]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    flat /= world_size()
    offset = 0
    for g in grads:
        g.copy_(flat[offset:offset + g.numel()].view_as(g))
        offset += g.numel()


def agree_max(value: float, device) -> float:
    """The largest of every copy's `value` (e.g. the fraction of a time budget spent: every copy stops together)."""
    if world_size() == 1:
        return value
    t = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t)


def shard(indices: list) -> list:
    """This copy's slice of a global sample (every world_size-th row, from its rank)."""
    return indices[rank()::world_size()]


def barrier() -> None:
    """Wait until every copy reaches this point (nothing to wait for without torchrun)."""
    if world_size() > 1:
        dist.barrier()


def save_checkpoint(path, state: dict) -> None:
    """Write a training state from the first copy (the others hold the same weights), through a temporary file
    (`training.OneProcess.save_checkpoint`)."""
    if is_main():
        OneProcess.save_checkpoint(path, state)


def load_checkpoint(path, device) -> dict | None:
    """The training state saved at `path`, or None when there is none yet: every copy reads it, so all of them go
    on from the same step (`training.OneProcess.load_checkpoint`)."""
    return OneProcess.load_checkpoint(path, device)


def finish() -> None:
    """Leave the process group (at the end of a torchrun job)."""
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
