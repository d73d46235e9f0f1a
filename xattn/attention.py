"""Attention as a key-value memory: masks, score functions, multi-head attention (its KV cache: xattn/cache.py).

Shapes: B batch, S source (key) length, T target (query) length, D model dim, H heads, Dh = D / H.
Masks are boolean with True = may attend. They become -inf-like scores only inside `attend`;
a query row with no key to attend gets all-zero weights (and a zero output), never NaN.
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from xattn.cache import LayerCache


# ---------------------------------------------------------------------------------------------- masks

def padding_mask(ids: Tensor, pad_id: int) -> Tensor:
    """(B, S) token ids -> (B, S) bool, True = a real token."""
    return ids.ne(pad_id)


def causal_mask(n_queries: int, n_keys: int, device: torch.device | None = None) -> Tensor:
    """(T, T_all) bool look-ahead mask for the last `n_queries` of `n_keys` positions.

    Query i sits at absolute position n_keys - n_queries + i and may attend keys 0..that position.
    """
    offset = n_keys - n_queries
    q = torch.arange(n_queries, device=device).unsqueeze(1) + offset
    return torch.arange(n_keys, device=device).unsqueeze(0) <= q


# -------------------------------------------------------------------------------------- score functions

class DotScore(nn.Module):
    """score(q, k) = q . k (Luong et al. 2015)."""

    sdpa_scale: float | None = 1.0

    def prune_heads(self, keep: list[int]) -> None:
        """Keep only heads `keep` of any per-head parameters (this score has none)."""

    def forward(self, q: Tensor, k: Tensor) -> Tensor:
        return q @ k.transpose(-2, -1)  # (B, H, T, S)


class ScaledDotScore(nn.Module):
    """score(q, k) = q . k / sqrt(Dh) (Vaswani et al. 2017)."""

    def __init__(self, head_dim: int):
        super().__init__()
        self.sdpa_scale = 1.0 / math.sqrt(head_dim)

    def prune_heads(self, keep: list[int]) -> None:
        """No per-head parameters."""

    def forward(self, q: Tensor, k: Tensor) -> Tensor:
        return (q @ k.transpose(-2, -1)) * self.sdpa_scale  # (B, H, T, S)


class GeneralScore(nn.Module):
    """score(q, k) = q W k, one bilinear W (Dh, Dh) per head (Luong et al. 2015, "general")."""

    sdpa_scale: float | None = None

    def __init__(self, n_heads: int, head_dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.eye(head_dim).repeat(n_heads, 1, 1) / math.sqrt(head_dim))  # (H, Dh, Dh)

    def prune_heads(self, keep: list[int]) -> None:
        self.weight = nn.Parameter(self.weight.data[keep].clone())

    def forward(self, q: Tensor, k: Tensor) -> Tensor:
        return (q @ self.weight.unsqueeze(0)) @ k.transpose(-2, -1)  # (B, H, T, S)


class AdditiveScore(nn.Module):
    """score(q, k) = v . tanh(Wq q + Wk k), per head (Bahdanau et al. 2015)."""

    sdpa_scale: float | None = None

    def __init__(self, n_heads: int, head_dim: int):
        super().__init__()
        self.query = nn.Parameter(torch.empty(n_heads, head_dim, head_dim))  # (H, Dh, Dh)
        self.key = nn.Parameter(torch.empty(n_heads, head_dim, head_dim))
        self.v = nn.Parameter(torch.empty(n_heads, head_dim))  # (H, Dh)
        bound = 1.0 / math.sqrt(head_dim)
        for p in (self.query, self.key, self.v):
            nn.init.uniform_(p, -bound, bound)

    def prune_heads(self, keep: list[int]) -> None:
        for name in ("query", "key", "v"):
            setattr(self, name, nn.Parameter(getattr(self, name).data[keep].clone()))

    def forward(self, q: Tensor, k: Tensor) -> Tensor:
        wq = (q @ self.query.unsqueeze(0)).unsqueeze(3)  # (B, H, T, 1, Dh)
        wk = (k @ self.key.unsqueeze(0)).unsqueeze(2)  # (B, H, 1, S, Dh)
        return (torch.tanh(wq + wk) @ self.v[None, :, None, :, None]).squeeze(-1)  # (B, H, T, S)


# ------------------------------------------------------------------------------------------ attention

def attend(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, score: nn.Module,
           dropout: float = 0.0, need_weights: bool = False) -> tuple[Tensor, Tensor | None]:
    """Weighted sum of values under softmax(score(q, k)) restricted to `mask`.

    q (B, H, T, Dh), k and v (B, H, S, Dh), mask broadcastable to (B, H, T, S), True = may attend.
    Returns the output (B, H, T, Dh) and, if `need_weights`, the weights (B, H, T, S) before dropout.
    Without weights and with a dot-product score this runs through `F.scaled_dot_product_attention`,
    except where that fused kernel is the slower one (see `_fused_is_slower`).
    """
    if not need_weights and score.sdpa_scale is not None and not _fused_is_slower(q, k, v):
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout, scale=score.sdpa_scale)
        return out, None
    weights = masked_softmax(score(q, k), mask).to(v.dtype)  # (B, H, T, S)
    dropped = F.dropout(weights, dropout) if dropout > 0 else weights
    return dropped @ v, (weights if need_weights else None)  # (B, H, T, Dh)


def masked_softmax(scores: Tensor, mask: Tensor | None) -> Tensor:
    """Softmax over the last axis of `scores` (float32) among the keys `mask` allows (True); a row with no
    allowed key gets weights of exactly 0."""
    scores = scores.float()
    if mask is not None:
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    weights = scores.softmax(dim=-1)
    return weights * mask if mask is not None else weights  # rows with no allowed key: uniform -> exactly 0


DECODE_QUERIES, DECODE_ROWS = 8, 32
"""The decoding calls `_fused_is_slower` sends down the explicit path: at most DECODE_QUERIES queries per row
(one a step, or a beam's folded into one sequence) and at least DECODE_ROWS query rows in all."""


def _fused_is_slower(q: Tensor, k: Tensor, v: Tensor) -> bool:
    """True where PyTorch's fused CPU attention is the slower path:
    - reduced-precision training, whose fused backward is much slower than the explicit path;
    - decoding many rows at once (beam or batch steps: DECODE_QUERIES, DECODE_ROWS), when each of k and v is
      one stack of (S, Dh) matrices (batch and heads fold into one stride, as in the decoder caches), so the
      explicit path is two batched matrix products with no copy of k and v.
    Elsewhere (one row, an encoder pass, float32 training, CUDA) the fused kernel wins (the figures:
    benchmarks/README.md, Translation speed and Training throughput).
    """
    if q.device.type != "cpu":
        return False
    if torch.is_grad_enabled() and any(x.requires_grad for x in (q, k, v)):  # training
        return q.dtype in (torch.bfloat16, torch.float16)
    return q.shape[-2] <= DECODE_QUERIES and q.shape[0] * q.shape[-2] >= DECODE_ROWS and _one_stack(k) and _one_stack(v)


def _one_stack(x: Tensor) -> bool:
    """Whether x (B, H, S, Dh) views as (B * H, S, Dh) with no copy."""
    return x.shape[0] == 1 or x.shape[1] == 1 or x.stride(0) == x.shape[1] * x.stride(1)


@dataclass(frozen=True)
class AttentionContext:
    """What an attention module may need besides its queries, keys/values and mask (one per call)."""
    need_weights: bool = False      # return the weights (B, H, T, S)
    positions: Tensor | None = None  # (T,) absolute positions of the queries (of each folded query, see fold)
    head_mask: Tensor | None = None  # (H,) factors on each head's output before the heads are merged


@dataclass
class AttentionOutput:
    out: Tensor                     # (B, T, D)
    weights: Tensor | None = None   # (B, H, T, S), only when asked for


def linear(n_in: int, n_out: int) -> nn.Linear:
    """nn.Linear, also with a side of 0 (every head of a layer pruned), which PyTorch warns about initialising."""
    if n_in and n_out:
        return nn.Linear(n_in, n_out)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return nn.Linear(n_in, n_out)


def head_rows(keep: list[int], head_dim: int) -> Tensor:
    """The rows of a (H * head_dim, D) projection that belong to heads `keep`."""
    return torch.tensor([h * head_dim + i for h in keep for i in range(head_dim)], dtype=torch.long)


def sliced(lin: nn.Linear, rows: Tensor | None = None, cols: Tensor | None = None) -> nn.Linear:
    """A copy of `lin` with only output features `rows` and input features `cols` (None: all)."""
    weight = lin.weight.data
    weight = weight[rows] if rows is not None else weight
    weight = weight[:, cols] if cols is not None else weight
    out = linear(weight.shape[1], weight.shape[0]).to(weight.device, weight.dtype)
    with torch.no_grad():
        out.weight.copy_(weight)
        out.bias.copy_(lin.bias.data[rows] if rows is not None else lin.bias.data)
    out.weight.requires_grad_(lin.weight.requires_grad)
    out.bias.requires_grad_(lin.bias.requires_grad)
    return out


def merge_heads(out: Tensor, head_mask: Tensor | None) -> Tensor:
    """(B, H, T, Dh) per-head outputs, each scaled by its entry of `head_mask` (H,) -> (B, T, H * Dh)."""
    if head_mask is not None:
        out = out * head_mask.to(out.device, out.dtype).view(1, -1, 1, 1)
    B, H, T, Dh = out.shape
    return out.transpose(1, 2).reshape(B, T, H * Dh)


class MultiHeadAttention(nn.Module):
    """Multi-head attention over a key-value memory: project, attend per head, concatenate, project.

    The same module serves encoder self-attention, decoder masked self-attention (`attend_self`) and cross-attention;
    what differs is where keys/values come from (`project_kv`) and the mask. Each of the H heads has `head_dim`
    dimensions (D / H unless the model was pruned: then H * head_dim < D, and H may be 0).
    """

    def __init__(self, d_model: int, n_heads: int, score: nn.Module, dropout: float = 0.0,
                 head_dim: int | None = None):
        super().__init__()
        self.n_heads, self.head_dim = n_heads, head_dim or d_model // n_heads
        inner = n_heads * self.head_dim
        self.q_proj, self.k_proj, self.v_proj = linear(d_model, inner), linear(d_model, inner), linear(d_model, inner)
        self.out_proj = linear(inner, d_model)
        self.score = score
        self.dropout = dropout
        self.qkv: nn.Module | None = None  # q, k and v projections in one (the decoding copy's: inference.py)

    def _split(self, x: Tensor) -> Tensor:
        B, L, _ = x.shape
        return x.view(B, L, self.n_heads, self.head_dim).transpose(1, 2)  # (B, H, L, Dh)

    def prune_heads(self, keep: list[int]) -> None:
        """Keep only heads `keep` (in that order): shrink the projections and the score's per-head parameters."""
        rows = head_rows(keep, self.head_dim)
        self.q_proj, self.k_proj, self.v_proj = (sliced(lin, rows=rows) for lin in (self.q_proj, self.k_proj, self.v_proj))
        self.out_proj, self.qkv = sliced(self.out_proj, cols=rows), None
        self.score.prune_heads(keep)
        self.n_heads = len(keep)

    def project_kv(self, memory: Tensor) -> tuple[Tensor, Tensor]:
        """(B, S, D) memory -> keys and values, each (B, H, S, Dh)."""
        return self._split(self.k_proj(memory)), self._split(self.v_proj(memory))

    def forward(self, query: Tensor, kv: tuple[Tensor, Tensor], *, mask: Tensor | None = None,
                ctx: AttentionContext = AttentionContext()) -> AttentionOutput:
        """query (B, T, D); kv from `project_kv`; mask (B, T or 1, S) bool -> AttentionOutput."""
        return self._attend(self._split(self.q_proj(query)), kv, mask, ctx)

    def attend_self(self, x: Tensor, *, mask: Tensor | None = None, ctx: AttentionContext = AttentionContext(),
                    cache: LayerCache | None = None) -> AttentionOutput:
        """Self-attention of x (B, T, D): queries, keys and values all from x, by one matrix product when `qkv`
        is set (never in training). With `cache`, x's keys and values are appended to it and the queries attend
        to all it holds."""
        if self.qkv is not None and not self.training:
            q, k, v = (self._split(y) for y in self.qkv(x).split(self.n_heads * self.head_dim, dim=-1))
        else:
            q, (k, v) = self._split(self.q_proj(x)), self.project_kv(x)
        return self._attend(q, cache.append(k, v) if cache is not None else (k, v), mask, ctx)

    def _attend(self, q: Tensor, kv: tuple[Tensor, Tensor], mask: Tensor | None,
                ctx: AttentionContext) -> AttentionOutput:
        """q (B, H, T, Dh) projected queries; the rest as `forward`."""
        if self.n_heads == 0:  # every head pruned: only the output bias is left
            B, T, S = q.shape[0], q.shape[2], kv[0].shape[2]
            weights = q.new_zeros(B, 0, T, S) if ctx.need_weights else None
            return AttentionOutput(self.out_proj(merge_heads(q, None)), weights)
        if mask is not None:
            mask = mask.unsqueeze(1)  # (B, 1, T or 1, S)
        p = self.dropout if self.training else 0.0
        out, weights = attend(q, kv[0], kv[1], mask, self.score, p, ctx.need_weights)
        return AttentionOutput(self.out_proj(merge_heads(out, ctx.head_mask)), weights)
