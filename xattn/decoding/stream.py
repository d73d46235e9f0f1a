"""Continuous batching: greedy search over sentences that join and leave between steps.

A `Stream` holds the sentences being translated in slots of fixed pools: cross-attention K/V padded to the
longest source, self-attention K/V written at each sentence's own position (`SlotCache`). Every `step` is one
decoder pass over all occupied slots; a sentence that ends leaves at once (the last slot moves into its place,
so the pass stays dense), and sentences added with `add` join before the next step. A server therefore keeps
its batch full while clients come and go, instead of waiting for each batch's longest sentence, and can stop a
sentence between steps (`cancel`). Each sentence gets the tokens and score that greedy search
(`ancestral` with `argmax`) gives it alone, up to float rounding (a test).

Shapes: C slots, n occupied, L layers, H heads, Dh head dim, S longest source held, T positions held.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from xattn.config import DecodeConfig
from xattn.decoding.processors import StepState, constraints
from xattn.decoding.step import Hypothesis, first_argmax, hypothesis, make_step, max_lengths
from xattn.model import HeadMask, Transformer


def stream_problem(cfg: DecodeConfig, model: Transformer) -> str | None:
    """What keeps a Stream from decoding with `cfg` (None: nothing). It runs plain greedy search (no sampling,
    beam, minimum length, n-gram ban or shortlist) of a model whose attention is learned everywhere (hard-coded
    attention reads positions shared by the batch)."""
    for setting, plain in (("sampling", False), ("beam_size", 1), ("min_len", 0), ("no_repeat_ngram_size", 0),
                           ("shortlist", False)):
        if getattr(cfg, setting) != plain:
            return f"a stream runs plain greedy search: {setting} must be {plain} ({getattr(cfg, setting)!r} here)"
    return "a stream runs models with learned attention only" if model.cfg.attention else None


def streamable(cfg: DecodeConfig, model: Transformer) -> bool:
    """Whether a Stream can decode with `cfg` (stream_problem)."""
    return stream_problem(cfg, model) is None


class SlotLayer:
    """One decoder layer's view of a SlotCache, as Transformer.decode_states reads a LayerCache."""

    def __init__(self, cache: SlotCache, index: int):
        self.cache, self.index = cache, index

    @property
    def cross_k(self) -> Tensor:
        return self.cache.cross_k[self.index][: self.cache.n, :, : self.cache.S]  # (n, H, S, Dh)

    @property
    def cross_v(self) -> Tensor:
        return self.cache.cross_v[self.index][: self.cache.n, :, : self.cache.S]

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Write this step's K/V (n, H, 1, Dh) at each row's own position; all positions held (n, H, T, Dh)."""
        c, n = self.cache, self.cache.n
        at = c.at()
        c.self_k[self.index][at] = k[:, :, 0]
        c.self_v[self.index][at] = v[:, :, 0]
        T = c.T
        return c.self_k[self.index][:T, :n].permute(1, 2, 0, 3), c.self_v[self.index][:T, :n].permute(1, 2, 0, 3)


class SlotCache:
    """The decoder memory of a Stream: per layer, pools of C slots; rows 0..n-1 are occupied."""

    group = 1

    def __init__(self, cross_heads: list[int], self_heads: list[int], head_dim: int, device: torch.device,
                 dtype: torch.dtype):
        self.heads, self.head_dim, self.device, self.dtype = (cross_heads, self_heads), head_dim, device, dtype
        self.C, self.S_cap, self.T_cap, self.n = 0, 0, 0, 0
        self.S, self.T = 0, 0             # the longest source held, and positions + 1 of the furthest row: kept as
        #   ints (a step reads them once per layer; taking them from the tensors would cost a sync each time)
        self.rows = torch.arange(0, device=device)  # (n,)
        self.cross_k: list[Tensor] = []   # L x (C, H, S_cap, Dh)
        self.cross_v: list[Tensor] = []
        self.self_k: list[Tensor] = []    # L x (T_cap, C, H, Dh), time-major as LayerCache
        self.self_v: list[Tensor] = []
        self.mask = torch.zeros(0, 0, dtype=torch.bool, device=device)      # (C, S_cap) source tokens
        self.lengths = torch.zeros(0, dtype=torch.long, device=device)      # (C,) positions filled
        self.source_len = torch.zeros(0, dtype=torch.long, device=device)   # (C,)
        self.layers = [SlotLayer(self, i) for i in range(len(cross_heads))]

    # ------------------------------------------------------------------ what the model reads per step
    @property
    def src_mask(self) -> Tensor:
        return self.mask[: self.n, : self.S]

    @property
    def positions(self) -> Tensor:
        return self.lengths[: self.n]

    def self_mask(self) -> Tensor | None:
        """(n, 1, T): row r sees positions 0..lengths[r] (the one being written included); None for a lone row,
        which sees all T (a lone client's every step would otherwise build a mask of all True)."""
        if self.n == 1:
            return None
        return (torch.arange(self.T, device=self.device).unsqueeze(0) <= self.positions.unsqueeze(1)).unsqueeze(1)

    def at(self) -> tuple:
        """Where this step's K/V go in a (T, C, ...) pool: each occupied row's at its own position (an index_put);
        a lone row's (a lone client's every step) at T - 1, by an int and a slice: a plain copy, not an index_put
        (benchmarks/README.md, Serving under load, session 30)."""
        if self.n == 1:
            return self.T - 1, slice(0, 1)
        return self.positions, self.rows

    def advance(self, steps: int) -> None:
        self.lengths[: self.n] += steps
        self.T += steps if self.n else 0

    def _measure(self) -> None:
        """S, T and rows anew from the tensors, once the occupied rows have changed."""
        self.S = int(self.source_len[: self.n].max()) if self.n else 0
        self.T = int(self.lengths[: self.n].max()) + 1 if self.n else 0
        self.rows = torch.arange(self.n, device=self.device)

    # ------------------------------------------------------------------ rows joining and leaving
    def reserve(self, rows: int, source: int, positions: int) -> None:
        """Room for `rows` more occupied slots, sources of `source` tokens and `positions` target positions."""
        C, S, T = max(self.C, self.n + rows), max(self.S_cap, source), max(self.T_cap, positions)
        if (C, S, T) != (self.C, self.S_cap, self.T_cap):
            self._resize(*(max(2 * old, new) if new > old else old
                           for old, new in ((self.C, C), (self.S_cap, S), (self.T_cap, T))))

    @property
    def shrinkable(self) -> bool:
        """At most a quarter of the slots are occupied, and the pools are larger than `shrink` would make them."""
        return self.n <= self.C // 4 and max(1, 2 * self.n) < self.C

    def shrink(self, positions: int) -> None:
        """Smaller pools (when `shrinkable`): twice the rows held, the longest source held, and `positions` (the
        most any row held may still need). So a server keeps the memory of its busiest moment only while it is that
        busy (pools double when full and shrink to twice their rows at a quarter: each row moved is paid for by the
        rows that came or went since); pools already that small are left alone, so a lone client's pools are not
        made anew for every sentence."""
        self._resize(max(1, 2 * self.n), max(1, self.S), max(1, positions))

    def _resize(self, C: int, S: int, T: int) -> None:
        """Pools of C slots, S source and T target positions, holding what the occupied rows have written."""
        n, Dh = self.n, self.head_dim

        def moved(old: Tensor | None, shape: tuple, keep: tuple) -> Tensor:
            new = torch.zeros(shape, device=self.device, dtype=self.dtype)
            if old is not None:
                new[keep] = old[keep]
            return new
        cross, selfs = self.heads
        keep_cross = (slice(0, n), slice(None), slice(0, min(S, self.S_cap)))
        keep_self = (slice(0, min(T, self.T_cap)), slice(0, n))
        prior = lambda pools, i: pools[i] if pools else None  # noqa: E731
        self.cross_k = [moved(prior(self.cross_k, i), (C, H, S, Dh), keep_cross) for i, H in enumerate(cross)]
        self.cross_v = [moved(prior(self.cross_v, i), (C, H, S, Dh), keep_cross) for i, H in enumerate(cross)]
        self.self_k = [moved(prior(self.self_k, i), (T, C, H, Dh), keep_self) for i, H in enumerate(selfs)]
        self.self_v = [moved(prior(self.self_v, i), (T, C, H, Dh), keep_self) for i, H in enumerate(selfs)]
        mask = torch.zeros(C, S, dtype=torch.bool, device=self.device)
        mask[:n, : min(S, self.S_cap)] = self.mask[:n, : min(S, self.S_cap)]
        self.mask = mask
        self.lengths = torch.cat([self.lengths[:n], self.lengths.new_zeros(C - n)])
        self.source_len = torch.cat([self.source_len[:n], self.source_len.new_zeros(C - n)])
        self.C, self.S_cap, self.T_cap = C, S, T

    def place(self, kv: list[tuple[Tensor, Tensor]], mask: Tensor) -> None:
        """Occupy the next slots with new rows: per layer their cross K/V (b, H, S, Dh), their source mask (b, S)."""
        b, S = mask.shape
        rows = slice(self.n, self.n + b)
        for i, (k, v) in enumerate(kv):
            self.cross_k[i][rows, :, :S] = k
            self.cross_v[i][rows, :, :S] = v
        self.mask[rows] = False
        self.mask[rows, :S] = mask
        self.source_len[rows] = S
        self.lengths[rows] = 0
        self.n += b
        self._measure()

    def remove(self, slot: int) -> None:
        """Free `slot`: the last occupied slot moves into it."""
        last = self.n - 1
        if slot != last:
            for pools in (self.cross_k, self.cross_v):
                for x in pools:
                    x[slot] = x[last]
            T = int(self.lengths[last]) + 1
            for pools in (self.self_k, self.self_v):
                for x in pools:
                    x[:T, slot] = x[:T, last]
            for x in (self.mask, self.lengths, self.source_len):
                x[slot] = x[last]
        self.n = last
        self._measure()


class Stream:
    """Greedy search over sentences that join (`add`) and leave (when they end, or `cancel`) between steps."""

    def __init__(self, model: Transformer, cfg: DecodeConfig, head_mask: HeadMask | None = None):
        if problem := stream_problem(cfg, model):
            raise ValueError(problem)
        self.model, self.cfg, self.head_mask = model, cfg, head_mask
        mc = model.cfg
        self.step_fn = make_step(model, head_mask=head_mask)
        self.rules = constraints(cfg, mc)
        param = next(model.parameters())
        self.cache = SlotCache(mc.heads_per_layer("cross"), mc.heads_per_layer("dec_self"), mc.head_dim, param.device,
                               torch.float32)
        self.tags: list[Any] = []                      # per occupied slot
        self.out = torch.zeros(0, 0, dtype=torch.long, device=param.device)   # (C, T_cap) generated ids
        self.max_len = torch.zeros(0, dtype=torch.long, device=param.device)  # (C,)
        self.log_prob = torch.zeros(0, device=param.device)                   # (C,)
        self.relaxed = torch.zeros(0, dtype=torch.bool, device=param.device)
        self.last = torch.zeros(0, dtype=torch.long, device=param.device)     # (C,) the token each slot feeds next

    def __len__(self) -> int:
        return self.cache.n

    @torch.inference_mode()
    def add(self, src: Tensor, tags: list[Any]) -> None:
        """src (b, S) source ids, each row ending with EOS, pad after: b sentences join the stream as `tags`."""
        model, mc, cache = self.model, self.model.cfg, self.cache
        max_len = max_lengths(src, self.cfg, mc).to(src.device)
        n, b = cache.n, src.shape[0]
        cache.reserve(b, src.shape[1], int(max_len.max()) + 1)
        self._fit(cache.C, cache.T_cap)
        enc = model.encode(src, head_mask=self.head_mask)
        cache.place([layer.cross_attn.project_kv(enc.states) for layer in model.decoder.layers], enc.mask)
        self.out[n:n + b] = mc.pad_id
        self.max_len[n:n + b] = max_len
        self.log_prob[n:n + b] = 0.0
        self.relaxed[n:n + b] = False
        self.last[n:n + b] = mc.bos_id
        self.tags.extend(tags)

    def _fit(self, C: int, T: int) -> None:
        if self.out.shape[0] < C or self.out.shape[1] < T:  # never smaller on either side: the pools may have shrunk
            out = self.out.new_full((max(C, self.out.shape[0]), max(T, self.out.shape[1])), self.model.cfg.pad_id)
            out[: self.out.shape[0], : self.out.shape[1]] = self.out
            self.out = out
        for name in ("max_len", "log_prob", "relaxed", "last"):
            x = getattr(self, name)
            if x.shape[0] < C:
                setattr(self, name, torch.cat([x, x.new_zeros(C - x.shape[0])]))

    @torch.inference_mode()
    def step(self) -> list[tuple[Any, Hypothesis]]:
        """One decoder pass over every sentence in the stream; the ones that ended, as (tag, hypothesis)."""
        n = self.cache.n
        if n == 0:
            return []
        t = self.cache.lengths[:n].clone()  # (n,) the position each row chooses now
        raw, _ = self.step_fn(self.last[:n].unsqueeze(1), self.cache)
        state = StepState(t, self.out[:n, :0], self.max_len[:n])  # type: ignore[arg-type] (per-row t)
        lp, exhausted = self.rules(raw, state)
        if exhausted is not None:
            self.relaxed[:n] |= exhausted
        token = first_argmax(lp)  # (n,)
        self.log_prob[:n] += lp.gather(1, token.unsqueeze(1)).squeeze(1)
        self.out[torch.arange(n, device=token.device), t] = token
        self.last[:n] = token
        ended = token.eq(self.model.cfg.eos_id).nonzero().squeeze(1).tolist()
        done = [(slot, self._hypothesis(slot)) for slot in ended]
        out = [(self._remove(slot), hyp) for slot, hyp in sorted(done, key=lambda x: -x[0])]
        if out:
            self._shrink()
        return out

    @torch.inference_mode()
    def cancel(self, tag: Any) -> bool:
        """Stop translating the sentence `tag` (False: it is not in the stream)."""
        if tag not in self.tags:
            return False
        self._remove(self.tags.index(tag))
        self._shrink()
        return True

    def _shrink(self) -> None:
        n, cache = self.cache.n, self.cache
        if cache.shrinkable:  # the rows' longest output is read (a sync) only then
            cache.shrink(int(self.max_len[:n].max()) + 1 if n else 1)

    def _hypothesis(self, slot: int) -> Hypothesis:
        mc = self.model.cfg
        end = int(self.cache.lengths[slot])  # positions written, EOS included
        return hypothesis(self.out[slot, :end].tolist(), {mc.eos_id, mc.pad_id}, float(self.log_prob[slot]),
                          self.cfg.length_penalty, 0.0, None, bool(self.relaxed[slot]))

    def _remove(self, slot: int) -> Any:
        last = self.cache.n - 1
        self.cache.remove(slot)
        for x in (self.out, self.max_len, self.log_prob, self.relaxed, self.last):
            x[slot] = x[last]
        tag = self.tags[slot]
        self.tags[slot] = self.tags[last]
        self.tags.pop()
        return tag
