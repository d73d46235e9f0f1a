"""The decoder's KV cache: per layer, self-attention keys and values that grow by a step and cross-attention keys
and values computed once (LayerCache); for a batch of hypotheses, the layers with the source mask, reordered along
beam back-pointers (`select`) or left by ended greedy rows (`remove`) (DecoderCache). Rows that keep their places are
not copied, where few others move (`moved_rows`).

Shapes as in xattn/attention.py: B rows, H heads, S source length, Dh head size.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor


@dataclass
class LayerCache:
    """One decoder layer's memory: self-attention K/V grow by a step; cross-attention K/V are fixed, but for the
    rows DecoderCache.select moves.

    Self-attention K/V live time-major in a buffer of `capacity` positions that doubles when full, so a step
    writes in place instead of copying everything decoded so far, and the filled part `buffer[:length]` is one
    block (contiguous, unless a selection in place narrowed the rows to a view). Reordering rows (`select`, once per
    beam step) copies only the rows that move within that block, where few do, or else the whole block into a spare
    buffer of the same size, and the two swap.
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

    def select(self, index: Tensor, moved: Tensor | None = None) -> None:
        """Keep (and reorder) the self-attention K/V of rows `index` (N,); with `moved` (moved_rows), by copying
        only those rows within the buffers, which then keep their first N rows (views)."""
        if self.buffer_k is None:
            return
        if moved is None:
            self.buffer_k = _reordered(self.buffer_k, self.storage_k, self.length, index)
            self.buffer_v = _reordered(self.buffer_v, self.storage_v, self.length, index)
            return
        held = [b for b in (self.buffer_k, self.buffer_v) if b.numel()]  # (none without heads; no keys hard-coded)
        if moved.shape[0] and held:
            _copy_rows(held, self.length, index, moved)
        self.buffer_k, self.buffer_v = self.buffer_k[:, : index.shape[0]], self.buffer_v[:, : index.shape[0]]

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


def filling(gone: Tensor) -> Tensor:
    """gone (N,) bool: the rows (or a beam's groups of rows) that leave -> the others' indices (N',) in an order that
    leaves those among the first N' in their places and moves the last ones into the places left there, so that a
    selection of them (DecoderCache.select) copies only those."""
    keep = (~gone).nonzero().squeeze(1)
    n = keep.shape[0]
    order = torch.arange(n, device=gone.device)
    order[gone[:n].nonzero().squeeze(1)] = keep[keep >= n]
    return order


def moved_rows(index: Tensor, rows: int) -> Tensor | None:
    """For keeping rows `index` (N,) of `rows`: those whose row changes (index[r] != r), if copying them within
    the tensors is the cheaper way, else None. It is, where at most half of them change and none is added: an
    index_select copies all N into a new tensor, reading and writing each once; moving M within the tensor reads
    and writes each twice (PyTorch gathers the right-hand side first). A beam step leaves most rows in place when
    children take their parents' slots (decoding/beam.py, in_parents_slots; benchmarks/README.md)."""
    if index.shape[0] > rows:
        return None
    moved = index.ne(torch.arange(index.shape[0], device=index.device)).nonzero().squeeze(1)
    return moved if 2 * moved.shape[0] <= index.shape[0] else None


def _rows_held(x: Tensor) -> int:
    """The rows of x's storage, x being a view of its first rows (or all of them)."""
    return x.untyped_storage().nbytes() // max(1, x.stride(0) * x.element_size())


def _copy_rows(buffers: list[Tensor], length: int, index: Tensor, moved: Tensor) -> None:
    """The first `length` positions of rows `moved` of one layer's (capacity, B, H, Dh) buffers, made together (the
    same rows per position), become those of their rows index[moved] (all read before any is written)."""
    to, source = _line_numbers(buffers[0], length, moved), _line_numbers(buffers[0], length, index[moved])
    for buffer in buffers:
        lines = _lines(buffer, length)
        lines.index_copy_(0, to, lines.index_select(0, source))


def _reordered(buffer: Tensor, storage: list[Tensor], length: int, index: Tensor) -> Tensor:
    """buffer[:, index] written into the spare storage, which becomes the current one (swapped in place)."""
    capacity, _, H, Dh = buffer.shape
    size = capacity * index.shape[0] * H * Dh
    if storage[1].numel() < size:
        storage[1] = buffer.new_empty(size)
    out = storage[1][:size].view(capacity, index.shape[0], H, Dh)
    if length and buffer.numel():
        torch.index_select(_lines(buffer, length), 0, _line_numbers(buffer, length, index),
                           out=out[:length].view(-1, H * Dh))
    storage.reverse()
    return out


def _lines(buffer: Tensor, length: int) -> Tensor:
    """The first `length` positions of a (capacity, B, H, Dh) buffer (or a view of its first B rows) as its
    storage's lines, one (position, row) pair each: copies of rows go line by line, since index_select along the
    rows of a buffer is slower, and on a narrowed one first copies it whole (PyTorch 2.13; the figures:
    benchmarks/README.md, Translation speed, session 31)."""
    return buffer.as_strided((length * (buffer.stride(0) // buffer.stride(1)), buffer.stride(1)), (buffer.stride(1), 1))


def _line_numbers(buffer: Tensor, length: int, rows: Tensor) -> Tensor:
    """(length * R,) the lines of _lines(buffer, length) holding rows `rows` (R,), position after position."""
    per_position = buffer.stride(0) // buffer.stride(1)
    start = torch.arange(0, length * per_position, per_position, device=rows.device)
    return (start.unsqueeze(1) + rows).view(-1)


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
        entries of `index` must come from one source group. Where few rows change (moved_rows), only those are
        copied, within the tensors."""
        sources = index.view(-1, self.group)[:, 0] // self.group if self.group > 1 else index  # (N / K,)
        moved = moved_rows(index, self.src_mask.shape[0] * self.group)
        moved_sources = moved_rows(sources, self.src_mask.shape[0]) if self.group > 1 else moved
        whole = moved_sources is not None and not moved_sources.shape[0] and sources.shape[0] == self.src_mask.shape[0]
        if not whole:  # (a new tensor: the mask may be the caller's EncoderOutput's)
            self.src_mask = self.src_mask.index_select(0, sources)
        for layer in self.layers:  # new tensors where many rows move, or few are kept (freeing the others)
            if moved_sources is None or 2 * sources.shape[0] < _rows_held(layer.cross_k):
                layer.cross_k = layer.cross_k.index_select(0, sources)
                layer.cross_v = layer.cross_v.index_select(0, sources)
            elif not whole:
                for name in ("cross_k", "cross_v"):
                    x = getattr(layer, name)
                    if moved_sources.shape[0]:
                        x.index_copy_(0, moved_sources, x.index_select(0, sources[moved_sources]))
                    setattr(layer, name, x[: sources.shape[0]])
            layer.select(index, moved)

    def remove(self, ended: Tensor) -> Tensor:
        """Drop rows `ended` (N_e,) of an ungrouped cache, distinct row indices: select(filling(...)), which moves the
        last of the other rows into their places, so that only those are copied (the tensors become views of the
        first rows, and the memory of the rows dropped is freed with the cache). Returns the new order, each kept
        row's old index (N - N_e,), for the caller's own per-row tensors."""
        assert self.group == 1, "remove drops rows of an ungrouped cache (select reorders beams)"
        gone = torch.zeros(self.src_mask.shape[0], dtype=torch.bool, device=ended.device)
        gone[ended] = True
        order = filling(gone)
        self.select(order)
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
