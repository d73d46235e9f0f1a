"""Multi-process training with PyTorch DDP, launched by `torchrun` (gloo on CPU, NCCL on GPUs).

Without torchrun (WORLD_SIZE unset or 1) every helper here is a no-op, so the trainer has one code path.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import pickle
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta

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
    _buffers: dict[str, torch.Tensor] = field(default_factory=dict, repr=False, compare=False)

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
        code = self._buffer("code", 1, torch.int64)
        code.fill_(REASONS.index(reason))
        torch_dist.all_reduce(code, op=torch_dist.ReduceOp.MAX)
        return REASONS[int(code)]

    def gather(self, value) -> list:
        """`value` of every rank, in rank order (picklable objects; every rank must call it)."""
        if self.world == 1:
            return [value]
        payload = pickle.dumps(value)
        size = self._buffer("size", 1, torch.int64)
        size.fill_(len(payload))
        torch_dist.all_reduce(size, op=torch_dist.ReduceOp.MAX)  # the same on every rank: so are the capacities
        capacity = 8 + int(size)  # (each rank's buffers grow at the same calls: all_gather wants equal sizes)
        sent = self._buffer("sent", capacity, torch.uint8)
        received = [self._buffer(f"received{k}", capacity, torch.uint8) for k in range(self.world)]
        data = len(payload).to_bytes(8, "little") + payload
        sent[:len(data)].copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8))
        torch_dist.all_gather(received, sent)
        values = []
        for data in received:
            data = data.cpu().numpy().tobytes()
            values.append(pickle.loads(data[8:8 + int.from_bytes(data[:8], "little")]))
        return values

    def _buffer(self, name: str, size: int, dtype: torch.dtype) -> torch.Tensor:
        """The tensor `name` of at least `size` elements that this rank hands to collectives, the same one from call
        to call, which C++ code holds for the process's life.

        gloo's worker thread lets go of a finished collective's tensors a moment after the caller has returned.
        When that leaves a tensor held by Python alone, the thread takes the GIL to tell Python so, and in a process
        already shutting down it is ended there, inside C++ code: `terminate called without an active exception`,
        SIGABRT, after the training had written everything (one torchrun run in about twenty on a busy machine).
        A view of the tensor, never freed, holds it from C++ (its autograd record of the base), so gloo's release
        never leaves it to Python alone."""
        kept = self._buffers.get(name)
        if kept is None or kept.numel() < size:
            with torch.inference_mode(False):  # (a view of an inference tensor records no base)
                kept = torch.zeros(max(size, 2 * kept.numel() if kept is not None else 0), dtype=dtype,
                                   device=self.device)
                holder = kept.view(-1)
            assert holder._base is kept
            ctypes.pythonapi.Py_IncRef(ctypes.py_object(holder))  # (a replaced tensor stays held too)
            self._buffers[name] = kept
        return kept

    @contextlib.contextmanager
    def first(self) -> Iterator[bool]:
        """`with ctx.first() as mine: if mine: ...`: a block that rank 0 alone runs (taking and writing the run
        directory, preparing the corpus), the others waiting for it at its end; an XattnError or OSError it raises
        is raised on every rank. The others went on to their next collective and ended there with the process
        group's traceback (torchrun: rank 0 refused the run directory, or its disk filled at a checkpoint)."""
        if self.world == 1:
            yield True
            return
        problem = None
        try:
            yield self.rank == 0
        except (XattnError, OSError) as e:
            problem = e
        shared = self.gather(problem)[0]
        if shared is not None:
            raise problem if self.rank == 0 else shared


def setup(device: str, timeout_minutes: float = 60.0) -> Context:
    """Join the process group torchrun set up, if any; a process waits `timeout_minutes` for the others at a
    collective (PyTorch's defaults, 30 minutes on gloo and 10 on NCCL, ended the run while rank 0 prepared a large
    corpus alone)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        return Context()
    rank, local = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    use_cuda = device.partition(":")[0] in ("auto", "cuda") and torch.cuda.is_available()  # (not cpu:0, mps)
    if not torch_dist.is_initialized():
        torch_dist.init_process_group("nccl" if use_cuda else "gloo", timeout=timedelta(minutes=timeout_minutes))
    if use_cuda:
        torch.cuda.set_device(local)
    return Context(rank, world, torch.device(f"cuda:{local}") if use_cuda else torch.device("cpu"))


def teardown() -> None:
    if torch_dist.is_initialized():
        torch_dist.destroy_process_group()
