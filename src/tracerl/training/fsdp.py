"""FSDP2 for `TrainConfig.shard: fsdp2`: the base and the adapter sharded over the ranks instead of replicated.

`fully_shard` (PyTorch FSDP2) per decoder layer: each rank keeps 1/N of every weight and a forward
all-gathers one layer at a time, so every rank must run the same forwards in the same order
(`GRPOTrainer` keeps them in step). A sharded run samples on servers (`build_trainer` refuses
in-process rollouts); sampling in the trainer, whose forwards differ per rank, would run inside
`full_parameters` (the whole model gathered once, no collective in a forward). The token log-probs'
output head, applied over chunks after the model's forward (`training.loss`), uses the root unit's
weights while FSDP2 keeps them gathered (the root is not resharded between forward and backward). Adapter and
checkpoint files hold whole tensors, as an unsharded run's do (`FullState`, `load_sharded_checkpoint`).
Each rank reads the whole base into CPU memory before it keeps its shard (N copies in host memory
while loading). Tested with gloo on CPU (tests/training/test_distributed_fsdp.py), where the default
gradient reduction fails ("Cannot use ReduceOp.PREMUL_SUM with Gloo"): gradients are summed with a
plain SUM instead (`set_force_sum_reduction_for_comms`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.tensor import DTensor, distribute_tensor

from tracerl.core.io import read_json
from tracerl.training import checkpoint as ckpt
from tracerl.training.distributed import World


def shard_model(model: torch.nn.Module, world: World, device: torch.device) -> None:
    """Shard `model` (a PEFT model) across the ranks with FSDP2, in place; the shards go to `device`.

    Loaded on the CPU, no GPU holds more than its shards and one layer whole. One FSDP unit per decoder
    layer (the classes the base names in `_no_split_modules`, as accelerate and TRL wrap them), the rest
    (embeddings, final norm, head) in the root's. Gradients are summed across ranks, not averaged: each
    rank's loss is already its share of the whole batch's.
    """
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
    return t.full_tensor() if isinstance(t, DTensor) else t


def shard_like(full: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """This rank's shard of `full`, laid out as `like` (every rank holds `full`: no communication)."""
    if not isinstance(like, DTensor):
        return full.to(like.device)
    return distribute_tensor(full.to(like.device), like.device_mesh, like.placements, src_data_rank=None)


def local_numel(params: list[torch.Tensor]) -> int:
    """Elements this rank stores of `params` (a shard's local part)."""
    return sum((p.to_local() if isinstance(p, DTensor) else p).numel() for p in params)


def load_sharded_checkpoint(path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                            rank: int) -> ckpt.TrainState:
    """`checkpoint.load_checkpoint` for a sharded model: each rank keeps its shard of the saved (whole) tensors."""

    saved = load_file(str(path / "adapter" / "adapter_model.safetensors"))
    adapter = model.active_adapter
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.requires_grad:
                p.copy_(shard_like(saved[name.replace(f".{adapter}.", ".")].to(p.dtype), p))
    state = ckpt.load_optimizer_state(path)
    params = [p for group in optimizer.param_groups for p in group["params"]]
    for index, values in state["state"].items():
        for key, value in values.items():
            if key != "step":
                values[key] = shard_like(value, params[index])
    optimizer.load_state_dict(state)
    if ckpt.rng_file(path, rank).exists():
        ckpt.set_rng_state(ckpt.load_rng_state(ckpt.rng_file(path, rank)))
    data = read_json(path / "state.json")
    return ckpt.TrainState(step=int(data["step"]), rollouts_used=int(data["rollouts_used"]),
                           metrics_rows=int(data["metrics_rows"]))


@dataclass
class FullState:
    """A sharded run's adapter and optimizer state gathered whole, in the shape `checkpoint` writes:
    `save_pretrained` writes the whole adapter, `state_dict` is the optimizer's with whole tensors, so a
    sharded run's files are those of an unsharded one."""
    model: Any
    adapter_state: dict[str, torch.Tensor]
    optimizer_state: dict[str, Any] | None

    @classmethod
    def gather(cls, model: Any, optimizer: torch.optim.Optimizer | None) -> FullState:
        """Every rank calls this (each whole tensor is a collective); one object stands for model and optimizer."""
        adapter = {n: full_tensor(p.detach()) for n, p in model.named_parameters() if p.requires_grad}
        opt = None
        if optimizer is not None:
            opt = optimizer.state_dict()
            opt["state"] = {i: {k: full_tensor(v) for k, v in values.items()} for i, values in opt["state"].items()}
        return cls(model, adapter, opt)

    def save_pretrained(self, directory: str | Path, **options: Any) -> None:
        self.model.save_pretrained(str(directory), state_dict=self.adapter_state, **options)

    def state_dict(self) -> dict[str, Any]:
        assert self.optimizer_state is not None
        return self.optimizer_state

