"""The registries the config names: score functions (model.score) and attention variants (model.attention).

A variant builds the attention module of one place (enc_self, dec_self, cross) in one layer from the model
config; every variant takes queries, keys/values from its `project_kv` and a boolean mask (its `forward`), or
does self-attention of one input (`attend_self`, with a cache while decoding), and reads what else it needs
(positions, a head mask, whether to return weights) from an AttentionContext.
- `learned`: multi-head attention with the config's score function (Vaswani et al. 2017).
- `gaussian`: hard-coded attention (You, Sun & Iyyer 2020), `GaussianAttention` below.
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor, nn

from xattn.attention import (AdditiveScore, AttentionContext, AttentionOutput, DotScore, GeneralScore,
                             MultiHeadAttention, ScaledDotScore, head_rows, linear, masked_softmax, merge_heads,
                             sliced)
from xattn.cache import LayerCache
from xattn.config import ModelConfig


SCORES: dict[str, Callable[[int, int], nn.Module]] = {
    "dot": lambda n_heads, head_dim: DotScore(),
    "scaled_dot": lambda n_heads, head_dim: ScaledDotScore(head_dim),
    "general": lambda n_heads, head_dim: GeneralScore(n_heads, head_dim),
    "additive": lambda n_heads, head_dim: AdditiveScore(n_heads, head_dim),
}
"""Score function name -> constructor (heads, head dimension)."""


def build_score(name: str, n_heads: int, head_dim: int) -> nn.Module:
    return SCORES[name](n_heads, head_dim)


def learned(cfg: ModelConfig, place: str, layer: int) -> nn.Module:
    heads = cfg.heads_of(place, layer)
    score = build_score(cfg.score, heads, cfg.head_dim)
    return MultiHeadAttention(cfg.d_model, heads, score, cfg.attention_dropout, cfg.head_dim)


def gaussian(cfg: ModelConfig, place: str, layer: int) -> nn.Module:
    return GaussianAttention(cfg.d_model, cfg.heads_of(place, layer), place, cfg.head_dim, cfg.length_ratio or 1.0)


class GaussianAttention(nn.Module):
    """Hard-coded attention (You, Sun & Iyyer 2020): head h weighs key position j by a Gaussian of standard
    deviation 1 centred at c = r * i + offset_h for query position i, the same for every input; only the
    value and output projections are learned (no queries, no keys).

    As in the authors' code (fallcat/stupidNMT): the heads alternate between the offsets of their place,
    encoder -1 and +1, decoder self-attention -1 and 0 (never a future token), cross-attention -1 and +1;
    r is 1 in self-attention and, in cross-attention, one fixed ratio of source to target length measured
    on the training data (model.length_ratio), so no target length is needed while decoding. Unlike that
    code, the densities are normalised over the keys the padding and look-ahead masks allow (a softmax of
    the log-density), so each row sums to 1; inside a sentence this changes them by under 1e-6.
    """

    OFFSETS = {"enc_self": (-1.0, 1.0), "dec_self": (-1.0, 0.0), "cross": (-1.0, 1.0)}
    STD = 1.0

    def __init__(self, d_model: int, n_heads: int, place: str, head_dim: int, ratio: float = 1.0):
        super().__init__()
        self.n_heads, self.head_dim = n_heads, head_dim
        self.v_proj, self.out_proj = linear(d_model, n_heads * head_dim), linear(n_heads * head_dim, d_model)
        offsets = [self.OFFSETS[place][h % 2] for h in range(n_heads)]
        self.register_buffer("offsets", torch.tensor(offsets).view(n_heads, 1, 1))  # (H, 1, 1), kept by pruning
        self.ratio = ratio if place == "cross" else 1.0

    def prune_heads(self, keep: list[int]) -> None:
        """Keep only heads `keep` (in that order), each with its own centre."""
        rows = head_rows(keep, self.head_dim)
        self.v_proj, self.out_proj = sliced(self.v_proj, rows=rows), sliced(self.out_proj, cols=rows)
        self.offsets = self.offsets[keep].clone()
        self.n_heads = len(keep)

    def project_kv(self, memory: Tensor) -> tuple[Tensor, Tensor]:
        """(B, S, D) memory -> no keys (a zero-width tensor, for the cache) and values (B, H, S, Dh)."""
        B, S, _ = memory.shape
        v = self.v_proj(memory).view(B, S, self.n_heads, self.head_dim).transpose(1, 2)
        return v[..., :0], v

    def weights(self, positions: Tensor, n_keys: int, mask: Tensor | None) -> Tensor:
        """The Gaussian weights (B or 1, H, T, S) of queries at `positions` (T,) over `n_keys` keys."""
        centre = positions.float().view(1, -1, 1) * self.ratio + self.offsets  # (H, T, 1)
        keys = torch.arange(n_keys, device=positions.device, dtype=torch.float32)
        scores = -0.5 * ((keys - centre) / self.STD) ** 2  # (H, T, S), the log-density up to a constant
        return masked_softmax(scores.unsqueeze(0), None if mask is None else mask.unsqueeze(1))

    def attend_self(self, x: Tensor, *, mask: Tensor | None = None, ctx: AttentionContext = AttentionContext(),
                    cache: LayerCache | None = None) -> AttentionOutput:
        """Self-attention of x (B, T, D), as MultiHeadAttention.attend_self."""
        kv = self.project_kv(x)
        return self(x, cache.append(*kv) if cache is not None else kv, mask=mask, ctx=ctx)

    def forward(self, query: Tensor, kv: tuple[Tensor, Tensor], *, mask: Tensor | None = None,
                ctx: AttentionContext = AttentionContext()) -> AttentionOutput:
        """query (B, T, D) (only its shape matters); kv from `project_kv`; mask (B, T or 1, S) bool."""
        B, T, _ = query.shape
        v = kv[1]
        positions = ctx.positions if ctx.positions is not None else torch.arange(T, device=query.device)
        weights = self.weights(positions, v.shape[2], mask).to(v.dtype)
        out = weights @ v  # (B, H, T, Dh)
        weights = weights.expand(B, -1, -1, -1) if ctx.need_weights else None
        return AttentionOutput(self.out_proj(merge_heads(out, ctx.head_mask)), weights)


VARIANTS: dict[str, Callable[..., nn.Module]] = {"learned": learned, "gaussian": gaussian}
"""Attention variant name -> builder (ModelConfig, place, layer) -> module."""


def build_attention(cfg: ModelConfig, place: str, layer: int) -> nn.Module:
    """The attention module that `cfg` gives `place` in layer `layer`."""
    return VARIANTS[cfg.variant(place, layer)](cfg, place, layer)
