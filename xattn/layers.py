"""Transformer layers: position-wise feed-forward, residual norms (post-LN, pre-LN), encoder and decoder layers.

Shapes: B batch, S source length, T target length, D model dim, H heads.
The attention modules are passed in by the builder (`model.py`), so a layer does not know which
score function, or whether a learned or hard-coded attention, it runs.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch.nn.functional as F
from torch import Tensor, nn

from xattn.attention import AttentionContext
from xattn.cache import LayerCache


ACTIVATIONS = {"relu": F.relu, "gelu": F.gelu, "swish": F.silu}
"""The activations of xattn.registry.ACTIVATIONS."""


class FeedForward(nn.Module):
    """Position-wise FFN: Linear(D, d_ff), activation, dropout, Linear(d_ff, D)."""

    def __init__(self, d_model: int, d_ff: int, activation: str = "relu", dropout: float = 0.0):
        super().__init__()
        self.fc1 = nn.Linear(d_model, d_ff)
        self.fc2 = nn.Linear(d_ff, d_model)
        self.activation = ACTIVATIONS[activation]
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(self.dropout(self.activation(self.fc1(x))))


class PostNorm(nn.LayerNorm):
    """Residual then LayerNorm, as in Vaswani et al. (2017): x <- LN(x + sublayer(x))."""

    def before(self, x: Tensor) -> Tensor:
        return x

    def after(self, x: Tensor, y: Tensor) -> Tensor:
        return self(x + y)


class PreNorm(nn.LayerNorm):
    """LayerNorm on the sublayer's input (Xiong et al. 2020): x <- x + sublayer(LN(x))."""

    def before(self, x: Tensor) -> Tensor:
        return self(x)

    def after(self, x: Tensor, y: Tensor) -> Tensor:
        return x + y


@dataclass(frozen=True, kw_only=True)
class DecoderInputs:
    """What a decoder layer reads besides its input, given by keyword, one per layer and call.

    cross_kv: the cross-attention keys and values, (B / group, H, S, Dh) each: one per group of `group` rows
    (a beam's rows share their sentence's, see DecoderCache). cross_mask (B / group, 1, S). self_mask
    (1 or B, T, T_all), None for one new position. cache: the layer's self-attention cache, which this call
    grows by its T positions (attention then runs over all positions so far); None for teacher forcing, all
    positions at once. self_ctx, cross_ctx: positions, head mask, whether to return weights (cross_ctx
    describes the folded queries: its positions repeat per row of a group).
    """
    cross_kv: tuple[Tensor, Tensor]
    cross_mask: Tensor
    self_mask: Tensor | None = None
    cache: LayerCache | None = None
    group: int = 1
    self_ctx: AttentionContext = AttentionContext()
    cross_ctx: AttentionContext = AttentionContext()


@dataclass
class LayerWeights:
    self_attn: Tensor | None = None     # (B, H, T, T) or (B, H, S, S)
    cross_attn: Tensor | None = None    # (B, H, T, S)


class EncoderLayer(nn.Module):
    """Self-attention over the source, then the FFN; each sublayer with residual + LayerNorm."""

    def __init__(self, self_attn: nn.Module, ffn: FeedForward, norm: type[nn.LayerNorm], d_model: int, dropout: float):
        super().__init__()
        self.self_attn = self_attn
        self.self_attn_norm = norm(d_model)
        self.ffn = ffn
        self.ffn_norm = norm(d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor, *, mask: Tensor, ctx: AttentionContext = AttentionContext()
                ) -> tuple[Tensor, LayerWeights]:
        """x (B, S, D), mask (B, 1, S) -> (B, S, D)."""
        a = self.self_attn.attend_self(self.self_attn_norm.before(x), mask=mask, ctx=ctx)
        x = self.self_attn_norm.after(x, self.dropout(a.out))
        x = self.ffn_norm.after(x, self.dropout(self.ffn(self.ffn_norm.before(x))))
        return x, LayerWeights(self_attn=a.weights)


class DecoderLayer(nn.Module):
    """Masked self-attention, cross-attention over the encoder output, then the FFN."""

    def __init__(self, self_attn: nn.Module, cross_attn: nn.Module, ffn: FeedForward, norm: type[nn.LayerNorm],
                 d_model: int, dropout: float):
        super().__init__()
        self.self_attn = self_attn
        self.self_attn_norm = norm(d_model)
        self.cross_attn = cross_attn
        self.cross_attn_norm = norm(d_model)
        self.ffn = ffn
        self.ffn_norm = norm(d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor, *, inputs: DecoderInputs) -> tuple[Tensor, LayerWeights]:
        """x (B, T, D) -> (B, T, D), with what else the layer reads in `inputs` (DecoderInputs)."""
        a = self.self_attn.attend_self(self.self_attn_norm.before(x), mask=inputs.self_mask, ctx=inputs.self_ctx,
                                       cache=inputs.cache)
        x = self.self_attn_norm.after(x, self.dropout(a.out))
        h = self.cross_attn_norm.before(x)
        c = self.cross_attn(fold(h, inputs.group), inputs.cross_kv, mask=inputs.cross_mask, ctx=inputs.cross_ctx)
        x = self.cross_attn_norm.after(x, self.dropout(c.out.view_as(x)))
        x = self.ffn_norm.after(x, self.dropout(self.ffn(self.ffn_norm.before(x))))
        return x, LayerWeights(self_attn=a.weights, cross_attn=unfold_weights(c.weights, inputs.group))


def fold(x: Tensor, group: int) -> Tensor:
    """(B, T, D) -> (B / group, group * T, D): a group's rows become query positions of one sequence."""
    B, T, D = x.shape
    return x if group == 1 else x.reshape(B // group, group * T, D)


def unfold_weights(weights: Tensor | None, group: int) -> Tensor | None:
    """(B / group, H, group * T, S) -> (B, H, T, S)."""
    if weights is None or group == 1:
        return weights
    N, H, GT, S = weights.shape
    return weights.view(N, H, group, GT // group, S).transpose(1, 2).reshape(N * group, H, GT // group, S)
