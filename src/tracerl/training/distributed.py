"""Data parallelism under torchrun: process group setup, sharding, gradient all-reduce.

The same command runs single-process or as `torchrun --nproc_per_node=N`. Each rank samples its
share of the groups; rollouts are all-gathered so every rank computes the same advantages and the
same informative-group decision; each rank then trains on its shard of the sequences and the
gradients are summed across ranks (each rank's loss is already its share of the whole-batch loss,
see `training.loss`), which is DDP's all-reduce with the averaging folded into the loss. gloo on
CPU, NCCL on GPUs.

With `TrainConfig.shard: fsdp2` the model is sharded instead of replicated (PyTorch FSDP2,
`fully_shard`): each rank keeps 1/N of every weight, base and adapter, and a forward all-gathers one
decoder layer at a time. Then every rank must run the same forwards in the same order; sampling,
whose forwards differ per rank, runs inside `full_parameters` (the whole model gathered once, no
collective in a forward).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
import torch.distributed as dist

T = TypeVar("T")


@dataclass(frozen=True)
class World:
    rank: int = 0
    size: int = 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def shard(self, items: list[T]) -> list[T]:
        """This rank's items: every size-th one, starting at rank (balanced, order-preserving)."""
        return items[self.rank::self.size]

    def chunk(self, items: list[T]) -> list[T]:
        """This rank's contiguous share (sizes differ by at most one, in rank order)."""
        base, extra = divmod(len(items), self.size)
        start = self.rank * base + min(self.rank, extra)
        return items[start:start + base + (1 if self.rank < extra else 0)]


def init_world() -> World:
    """Join the torchrun process group when launched by torchrun (WORLD_SIZE > 1); else one process."""
    size = int(os.environ.get("WORLD_SIZE", "1"))
    if size <= 1:
        return World()
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if torch.cuda.is_available() else "gloo")
    return World(rank=dist.get_rank(), size=dist.get_world_size())


def all_gather(world: World, value: Any) -> list[Any]:
    """Every rank's `value`, in rank order."""
    if world.size == 1:
        return [value]
    out: list[Any] = [None] * world.size
    dist.all_gather_object(out, value)
    return out


def all_reduce_sum_(world: World, tensors: list[torch.Tensor]) -> None:
    """Sum tensors across ranks in place (one flat buffer, one collective)."""
    if world.size == 1 or not tensors:
        return
    flat = torch.cat([t.reshape(-1) for t in tensors])
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    offset = 0
    for t in tensors:
        n = t.numel()
        t.copy_(flat[offset:offset + n].view_as(t))
        offset += n


def all_reduce_grads_(world: World, params: list[torch.nn.Parameter]) -> None:
    """Sum the gradients of `params` across ranks (params without a gradient count as zeros)."""
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    all_reduce_sum_(world, [p.grad for p in params])


def barrier(world: World) -> None:
    if world.size > 1:
        dist.barrier()


def shutdown(world: World) -> None:
    if world.size > 1 and dist.is_initialized():
        dist.destroy_process_group()


# ------------------------------------------------------------------ FSDP2 ---------------------------
def shard_model(model: torch.nn.Module, world: World, device: torch.device) -> None:
    """Shard `model` (a PEFT model) across the ranks with FSDP2, in place; the shards go to `device`.

    Loaded on the CPU, no GPU ever holds more than its shards and one layer whole. One FSDP unit per decoder layer (the classes the base names in `_no_split_modules`, as accelerate
    and TRL wrap them), the rest (embeddings, final norm, head) in the root's. Gradients are summed
    across ranks, not averaged: each rank's loss is already its share of the whole batch's.
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    if world.size == 1:
        return
    if device.type == "cuda":
        torch.cuda.set_device(device)
    mesh = init_device_mesh(device.type, (world.size,))
    unit_names = set(getattr(model.get_base_model(), "_no_split_modules", None) or [])
    units = [m for m in model.modules() if type(m).__name__ in unit_names]
    if not units:
        raise ValueError(f"{type(model.get_base_model()).__name__} names no decoder layer class (_no_split_modules)")
    for unit in units:
        fully_shard(unit, mesh=mesh)
    fully_shard(model, mesh=mesh, reshard_after_forward=False)  # the root's weights are needed again in backward
    for m in fsdp_modules(model):
        m.set_gradient_divide_factor(1.0)
        m.set_force_sum_reduction_for_comms(True)  # a plain SUM: gloo has no PREMUL_SUM


def fsdp_modules(model: torch.nn.Module) -> list[Any]:
    """The FSDP2 units of `model`, root first ([] when it is not sharded)."""
    from torch.distributed.fsdp import FSDPModule

    return [m for m in model.modules() if isinstance(m, FSDPModule)]


def is_sharded(model: torch.nn.Module) -> bool:
    return bool(fsdp_modules(model))


@contextmanager
def full_parameters(model: torch.nn.Module) -> Iterator[None]:
    """Inside, every rank holds the whole (sharded) model and a forward runs no collective, so ranks may run
    different numbers of forwards (sampling). All ranks enter together (the gather is a collective).
    Outside, the shards only. A model that is not sharded is left as it is."""
    units = fsdp_modules(model)
    if not units:
        yield
        return
    for m in units:
        m.set_reshard_after_forward(False, recurse=False)
        m.unshard()
    try:
        yield
    finally:
        for m in units:
            m.reshard()
            m.set_reshard_after_forward(m is not model, recurse=False)  # as `shard_model` set them


def full_tensor(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor of a shard (a collective: every rank calls it, in the same order); a plain tensor as is."""
    from torch.distributed.tensor import DTensor

    return t.full_tensor() if isinstance(t, DTensor) else t


def shard_like(full: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """This rank's shard of `full`, laid out as `like` (every rank holds `full`: no communication)."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    if not isinstance(like, DTensor):
        return full.to(like.device)
    return distribute_tensor(full.to(like.device), like.device_mesh, like.placements, src_data_rank=None)


def local_numel(params: list[torch.Tensor]) -> int:
    """Elements this rank stores of `params` (a shard's local part)."""
    from torch.distributed.tensor import DTensor

    return sum((p.to_local() if isinstance(p, DTensor) else p).numel() for p in params)
