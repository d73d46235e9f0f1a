"""Multi-process training with PyTorch DDP, launched by `torchrun` (gloo on CPU, NCCL on GPUs).

Without torchrun (WORLD_SIZE unset or 1) every helper here is a no-op, so the trainer has one code path.
"""
from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

import torch
import torch.distributed as torch_dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from xattn.errors import XattnError

REASONS = (None, "max_steps", "max_minutes", "max_epochs", "early_stopping", "interrupted")


@dataclass
class Context:
    rank: int = 0
    world: int = 1
    device: torch.device = torch.device("cpu")

    def wrap(self, model: nn.Module) -> nn.Module:
        if self.world == 1:
            return model
        ids = [self.device.index] if self.device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=ids)

    def shard(self, batches: list) -> list:
        """This rank's share of an epoch's batches; every rank gets the same number, one at least: an epoch that left
        none (fewer batches than processes, or data.corpora's draws all rounding to no pair) trained no step, and
        the epochs counted up to train.max_epochs as if the run were done."""
        usable = len(batches) // self.world * self.world
        if usable == 0 and batches:
            raise XattnError(f"an epoch holds {len(batches)} batch{'es' if len(batches) > 1 else ''} of training pairs "
                             f"for {self.world} training processes: lower train.max_tokens or start fewer processes")
        if usable == 0:
            raise XattnError("an epoch draws no training pair: raise data.upsample or the data.corpora's upsample")
        return batches if self.world == 1 else batches[self.rank:usable:self.world]

    def no_sync(self, model: nn.Module, last: bool):
        """Skip the gradient all-reduce on all but the last micro-batch of an accumulated step."""
        if self.world == 1 or last:
            return contextlib.nullcontext()
        return model.no_sync()

    def agree(self, reason: str | None) -> str | None:
        """The stop reason of whichever rank has one (the most severe), the same on every rank."""
        if self.world == 1:
            return reason
        code = torch.tensor([REASONS.index(reason)], device=self.device)
        torch_dist.all_reduce(code, op=torch_dist.ReduceOp.MAX)
        return REASONS[int(code)]

    def gather(self, value) -> list:
        """`value` of every rank, in rank order (picklable objects; every rank must call it)."""
        if self.world == 1:
            return [value]
        values: list = [None] * self.world
        torch_dist.all_gather_object(values, value)
        return values

    def barrier(self) -> None:
        if self.world > 1:
            torch_dist.barrier()


def setup(device: str) -> Context:
    """Join the process group torchrun set up, if any."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        return Context()
    rank, local = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    use_cuda = device.partition(":")[0] in ("auto", "cuda") and torch.cuda.is_available()  # (not cpu:0, mps)
    if not torch_dist.is_initialized():
        torch_dist.init_process_group("nccl" if use_cuda else "gloo")
    if use_cuda:
        torch.cuda.set_device(local)
    return Context(rank, world, torch.device(f"cuda:{local}") if use_cuda else torch.device("cpu"))


def teardown() -> None:
    if torch_dist.is_initialized():
        torch_dist.destroy_process_group()
