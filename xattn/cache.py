"""The decoder's KV cache: per layer, self-attention keys and values that grow by a step and cross-attention keys
and values computed once (LayerCache); for a batch of hypotheses, the layers with the source mask, reordered along
beam back-pointers (`select`) or left by ended greedy rows (`remove`) (DecoderCache).

Shapes as in xattn/attention.py: B rows, H heads, S source length, Dh head size.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor


@dataclass
class LayerCache:
    """One decoder layer's memory: self-attention K/V grow by a step; cross-attention K/V are fixed, but for the
    rows `move` copies when rows leave.

    Self-attention K/V live time-major in a buffer of `capacity` positions that doubles when full, so a step
    writes in place instead of copying everything decoded so far, and the filled part `buffer[:length]` is one
    block (contiguous, unless `move` narrowed the rows to a view). Reordering rows (`select`, once per beam step)
    copies only that block, into a spare buffer of the same size, and the two swap.
    """
    cross_k: Tensor                 # (B / group, H, S, Dh)
    cross_v: Tensor
    buffer_k: Tensor | None = None  # (capacity, B, H, Dh), a view of storage_k[0]
    buffer_v: Tensor | None = None
    storage_k: list[Tensor] = field(default_factory=list)  # two flat buffers: the current one and the spare
    storage_v: list[Tensor] = field(default_factory=list)
    length: int = 0                 # filled positions of the buffers

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Add this step's self-attention K/V (B, H, n, Dh); return all of them so far, (B, H, t, Dh)."""
        end = self.length + k.shape[2]
        if self.buffer_k is None or end > self.buffer_k.shape[0]:
            capacity = max(16, 2 * end)
            self.buffer_k, self.storage_k = _grown(self.buffer_k, self.length, capacity, k)
            self.buffer_v, self.storage_v = _grown(self.buffer_v, self.length, capacity, v)
        self.buffer_k[self.length: end] = k.permute(2, 0, 1, 3)
        self.buffer_v[self.length: end] = v.permute(2, 0, 1, 3)
        self.length = end
        return self.self_k, self.self_v

    def select(self, index: Tensor) -> None:
        """Keep (and reorder) the self-attention K/V of rows `index` (N,)."""
        if self.buffer_k is not None:
            self.buffer_k = _reordered(self.buffer_k, self.storage_k, self.length, index)
            self.buffer_v = _reordered(self.buffer_v, self.storage_v, self.length, index)

    def move(self, to: Tensor, rows: Tensor, n: int) -> None:
        """Copy rows `rows` of every K/V over rows `to`, then keep the first `n` rows (views: nothing else copied)."""
        for name in ("cross_k", "cross_v"):
            x = getattr(self, name)
            x[to] = x[rows]
            setattr(self, name, x[:n])
        if self.buffer_k is not None:
            for name in ("buffer_k", "buffer_v"):
                x = getattr(self, name)
                x[: self.length, to] = x[: self.length, rows]
                setattr(self, name, x[:, :n])

    @property
    def self_k(self) -> Tensor | None:
        return self.buffer_k[: self.length].permute(1, 2, 0, 3) if self.buffer_k is not None else None  # (B, H, t, Dh)

    @property
    def self_v(self) -> Tensor | None:
        return self.buffer_v[: self.length].permute(1, 2, 0, 3) if self.buffer_v is not None else None


def _grown(buffer: Tensor | None, length: int, capacity: int, new: Tensor) -> tuple[Tensor, list[Tensor]]:
    """A (capacity, B, H, Dh) buffer for rows like `new` (B, H, n, Dh), holding buffer[:length]; its storages."""
    B, H, _, Dh = new.shape
    storage = [new.new_empty(capacity * B * H * Dh), new.new_empty(capacity * B * H * Dh)]
    grown = storage[0].view(capacity, B, H, Dh)
    if buffer is not None:
        grown[:length] = buffer[:length]
    return grown, storage


def _reordered(buffer: Tensor, storage: list[Tensor], length: int, index: Tensor) -> Tensor:
    """buffer[:, index] written into the spare storage, which becomes the current one (swapped in place)."""
    capacity, _, H, Dh = buffer.shape
    size = capacity * index.shape[0] * H * Dh
    if storage[1].numel() < size:
        storage[1] = buffer.new_empty(size)
    out = storage[1][:size].view(capacity, index.shape[0], H, Dh)
    torch.index_select(buffer[:length], 1, index, out=out[:length])
    storage.reverse()
    return out


@dataclass
class DecoderCache:
    """State of incremental decoding for a batch of hypotheses; see `Transformer.new_cache`.

    With `group` = K, the B rows are B / K groups of K consecutive hypotheses of one source (a beam): cross-attention
    K/V and the source mask are stored once per source, and the K rows of a group attend to them as K query
    positions of one sequence, which is exact because cross-attention has no mask among queries.
    """
    layers: list[LayerCache]
    src_mask: Tensor                # (B / group, S) bool, True = token
    length: int = 0                 # target positions processed so far
    group: int = 1

    def select(self, index: Tensor) -> None:
        """Keep (and reorder) rows `index` (N,), e.g. along beam back-pointers; with group K, every K consecutive
        entries of `index` must come from one source group."""
        sources = index.view(-1, self.group)[:, 0] // self.group if self.group > 1 else index  # (N / K,)
        same_sources = self.group > 1 and sources.shape[0] == self.src_mask.shape[0] and \
            torch.equal(sources, torch.arange(sources.shape[0], device=sources.device))
        if not same_sources:
            self.src_mask = self.src_mask.index_select(0, sources)
        for layer in self.layers:
            if not same_sources:
                layer.cross_k = layer.cross_k.index_select(0, sources)
                layer.cross_v = layer.cross_v.index_select(0, sources)
            layer.select(index)

    def remove(self, ended: Tensor) -> Tensor:
        """Drop rows `ended` (N_e,) of an ungrouped cache, distinct row indices, moving the last of the other rows
        into their places: only those rows are copied, where `select` copies every row kept (the tensors become views
        of the first rows, so the memory of the rows dropped is freed with the cache). Returns the new order, each
        kept row's old index (N - N_e,), for the caller's own per-row tensors."""
        assert self.group == 1, "remove drops rows of an ungrouped cache (select reorders beams)"
        N = self.src_mask.shape[0]
        n = N - ended.numel()
        gone = torch.zeros(N, dtype=torch.bool, device=ended.device)
        gone[ended] = True
        to = ended[ended < n]  # the places of ended rows among the first n
        rows = (~gone[n:]).nonzero().squeeze(1) + n  # the kept rows beyond the first n, as many
        order = torch.arange(n, device=ended.device)
        order[to] = rows
        self.src_mask = self.src_mask[order]  # a new tensor: the mask may be the caller's EncoderOutput's
        for layer in self.layers:
            layer.move(to, rows, n)
        return order

    positions = None
    """Per-row positions: None, since the rows of this cache all stand at `length` (decoding/stream.py's do not)."""

    def advance(self, steps: int) -> None:
        """Count `steps` more positions decoded (the model calls this after each decoder pass)."""
        self.length += steps

    def expand(self, copies: int, grouped: bool) -> None:
        """Give each row `copies` consecutive copies: as one group (beam search) or as independent rows. Self-attention
        K/V already decoded are copied either way; a group shares its cross-attention K/V."""
        if grouped:
            assert self.group == 1, "a cache is grouped once"
            index = torch.arange(self.src_mask.shape[0], device=self.src_mask.device).repeat_interleave(copies)
            for layer in self.layers:
                layer.select(index)
            self.group = copies
            return
        self.select(torch.arange(self.src_mask.shape[0], device=self.src_mask.device).repeat_interleave(copies))
