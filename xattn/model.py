"""The encoder-decoder Transformer: embeddings + positions, encoder, decoder with cross-attention, generator.

Shapes: B batch, S source length, T target length, D model dim, H heads, L layers, V vocabulary.
Public API: `encode`, `decode`, `forward` (teacher forcing), `new_cache`, `parameter_groups`.
Parameter names are public API (transfer and partial checkpoints rely on them); tests pin them.
"""
from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor, nn

from xattn.attention import AttentionContext, causal_mask, padding_mask
from xattn.cache import DecoderCache, LayerCache
from xattn.config import ModelConfig
from xattn.errors import ParameterError, XattnError
from xattn.layers import DecoderInputs, DecoderLayer, EncoderLayer, FeedForward, PostNorm, PreNorm
from xattn.registry import place_problem
from xattn.variants import build_attention


@dataclass
class EncoderOutput:
    states: Tensor                              # (B, S, D)
    mask: Tensor                                # (B, S) bool, True = token
    self_attn: tuple[Tensor, ...] | None = None  # L x (B, H, S, S), only when asked for


@dataclass
class DecoderStates:
    states: Tensor                               # (B, T, D), after the final LayerNorm (pre-LN)
    cross_attn: tuple[Tensor, ...] | None = None  # L x (B, H, T, S), only with need_weights (or cross_layers)
    self_attn: tuple[Tensor, ...] | None = None   # L x (B, H, T, T_all), only with need_weights


@dataclass
class DecoderOutput:
    logits: Tensor                               # (B, T, V)
    cross_attn: tuple[Tensor, ...] | None = None  # L x (B, H, T, S), only with need_weights (or cross_layers)
    self_attn: tuple[Tensor, ...] | None = None   # L x (B, H, T, T_all), only with need_weights


# ---------------------------------------------------------------- the attention weights of several layers

def stack_layers(per_layer: Sequence[Tensor]) -> Tensor:
    """L weights (B, H_l, ...) -> (B, L, H, ...) with H the most heads of any layer; a layer with fewer heads
    (a pruned model) has NaN in the places of the heads it lacks, so an average over heads is a nanmean."""
    most = max(w.shape[1] for w in per_layer)
    if all(w.shape[1] == most for w in per_layer):
        return torch.stack(tuple(per_layer), dim=1)
    padded = [torch.cat([w, w.new_full((w.shape[0], most - w.shape[1], *w.shape[2:]), float("nan"))], dim=1)
              for w in per_layer]
    return torch.stack(padded, dim=1)


def check_ids(name: str, ids: Tensor, vocab: int) -> None:
    """A ParameterError naming `name` unless `ids` is a (batch, length) integer tensor of ids below `vocab`."""
    if not isinstance(ids, Tensor) or ids.dim() != 2 or ids.dtype not in (torch.long, torch.int):
        got = f"a {ids.dtype} tensor of shape {tuple(ids.shape)}" if isinstance(ids, Tensor) else type(ids).__name__
        raise ParameterError(name, f"expected a 2-D (batch, length) tensor of integer token ids, got {got}")
    if ids.numel() and bool(((outside := (ids < 0) | (ids >= vocab))).any()):
        raise ParameterError(name, f"token id {int(ids[outside][0])} is outside this model's vocabulary of {vocab}")


def nearest_with_heads(heads: Sequence[int], layer: int) -> int | None:
    """Of layers with `heads[i]` heads each (a pruned layer may have none), the one nearest to `layer` that has
    any: `layer` itself, else the nearest below it, else the nearest above; None when no layer has heads."""
    order = sorted(range(len(heads)), key=lambda i: (i > layer, abs(i - layer)))
    return next((i for i in order if heads[i] > 0), None)


class SinusoidalPositions(nn.Module):
    """Fixed position encodings (Vaswani et al. 2017): sines in the first half of D, cosines in the second
    (the layout of tensor2tensor, fairseq and Marian, so weights carry over); the table grows on demand."""

    def __init__(self, d_model: int):
        super().__init__()
        self.d_model = d_model
        self.register_buffer("table", self._table(256), persistent=False)

    def _table(self, n: int) -> Tensor:
        half = (self.d_model + 1) // 2
        pos = torch.arange(n, dtype=torch.float64).unsqueeze(1)  # (n, 1)
        freq = torch.exp(torch.arange(half, dtype=torch.float64) * (-2.0 * math.log(10000.0) / self.d_model))
        angles = pos * freq  # (n, ceil(D/2))
        return torch.cat([angles.sin(), angles.cos()[:, : self.d_model // 2]], dim=1).float()  # (n, D)

    def forward(self, offset: int, length: int) -> Tensor:
        table = self.table  # read once: a call on another thread (Translator.workers) may replace it meanwhile
        if offset + length > table.shape[0]:
            table = self._table(2 * (offset + length)).to(table.device)
            self.table = table
        return table[offset: offset + length]  # (T, D)

    def at(self, positions: Tensor) -> Tensor:
        """The encodings of any positions (..., ) -> (..., D)."""
        return self.forward(0, int(positions.max()) + 1)[positions]  # grows the table when needed


class LearnedPositions(nn.Embedding):
    """One trained vector per position, up to ModelConfig.max_positions."""

    def forward(self, offset: int, length: int) -> Tensor:  # type: ignore[override]
        if offset + length > self.num_embeddings:
            raise XattnError(f"a sequence of {offset + length} positions is longer than model.max_positions="
                             f"{self.num_embeddings} (learned positions); shorten the input or raise model.max_positions")
        return self.weight[offset: offset + length]  # (T, D)

    def at(self, positions: Tensor) -> Tensor:
        """The vectors of any positions (..., ) -> (..., D)."""
        self.forward(0, int(positions.max()) + 1)  # refuses positions past the table
        return self.weight[positions]


AttentionBuilder = Callable[[str, int], nn.Module]
"""(place, layer index) -> attention module; place is "enc_self", "dec_self" or "cross"."""

NORMS = {"post": PostNorm, "pre": PreNorm}
"""The LayerNorm placements of xattn.registry.NORMS."""
POSITIONS: dict[str, Callable[[ModelConfig], nn.Module]] = {
    "sinusoidal": lambda cfg: SinusoidalPositions(cfg.d_model),
    "learned": lambda cfg: LearnedPositions(cfg.max_positions, cfg.d_model)}
"""The position encodings of xattn.registry.POSITIONS."""

HeadMask = dict[str, list[Tensor | None]]
"""Per place (enc_self, dec_self, cross), per layer: a (H_l,) tensor of factors in [0, 1] on each head's
output (None: that layer unmasked); an argument of encode, decode and forward (Transformer.check_head_mask)."""


def layout_problem(cfg: ModelConfig, place: str, layers: list) -> str | None:
    """What keeps `layers` (per layer of `place`: None, or one value per head) from fitting a model of `cfg`;
    a head mask in memory (Transformer.check_head_mask) or in a file (analysis/pruning.py) is checked by it."""
    if problem := place_problem(place):
        return problem
    if len(layers) != cfg.layers_of(place):
        return f"{place}: expected a list of {cfg.layers_of(place)} layers (a list of factors or null each), got {len(layers)}"
    for i, factors in enumerate(layers):
        if factors is not None and len(factors) != cfg.heads_of(place, i):
            return f"{place} layer {i}: expected {cfg.heads_of(place, i)} factors (one per head), got {len(factors)}"
    return None


def context(place: str, layer: int, need_weights: bool, positions: Tensor, head_mask: HeadMask | None) -> AttentionContext:
    """The AttentionContext of `place` in layer `layer`: its factors of `head_mask`, if any."""
    mask = head_mask.get(place, [None] * (layer + 1))[layer] if head_mask is not None else None
    return AttentionContext(need_weights, positions, mask)


def default_attention(cfg: ModelConfig) -> AttentionBuilder:
    """The variant the config names for each place and layer (xattn.variants; learned by default)."""
    return lambda place, layer: build_attention(cfg, place, layer)


class Stack(nn.Module):
    """Layers plus the final LayerNorm that pre-LN needs (identity for post-LN)."""

    def __init__(self, layers: list[nn.Module], norm: nn.Module):
        super().__init__()
        self.layers = nn.ModuleList(layers)
        self.norm = norm


class Transformer(nn.Module):
    """Encoder-decoder Transformer whose cross-attention weights are a first-class output."""

    def __init__(self, cfg: ModelConfig, attention: AttentionBuilder | None = None):
        super().__init__()
        self.cfg = cfg
        attention = attention or default_attention(cfg)
        D, norm = cfg.d_model, NORMS[cfg.norm]
        ffn = lambda: FeedForward(D, cfg.d_ff, cfg.activation, cfg.activation_dropout)  # noqa: E731
        self.src_embed = nn.Embedding(cfg.src_vocab_size, D, padding_idx=cfg.pad_id)
        self.tgt_embed = self.src_embed if cfg.share_embeddings else nn.Embedding(cfg.tgt_vocab_size, D, padding_idx=cfg.pad_id)
        positions = lambda: POSITIONS[cfg.positions](cfg)  # noqa: E731
        self.src_pos, self.tgt_pos = positions(), positions()
        final_norm = (lambda: nn.LayerNorm(D)) if cfg.norm == "pre" else nn.Identity
        self.encoder = Stack([EncoderLayer(attention("enc_self", i), ffn(), norm, D, cfg.dropout)
                              for i in range(cfg.n_encoder_layers)], final_norm())
        self.decoder = Stack([DecoderLayer(attention("dec_self", i), attention("cross", i), ffn(), norm, D, cfg.dropout)
                              for i in range(cfg.n_decoder_layers)], final_norm())
        self.generator = nn.Linear(D, cfg.tgt_vocab_size)
        self.dropout = nn.Dropout(cfg.dropout)
        self.embed_scale = math.sqrt(D)
        self._init_weights()
        if cfg.tie_output:
            self.generator.weight = self.tgt_embed.weight

    def _init_weights(self) -> None:
        for name, p in self.named_parameters():
            if name.endswith(("embed.weight", "pos.weight")):
                nn.init.normal_(p, 0.0, self.cfg.d_model ** -0.5)
                if "embed" in name:
                    with torch.no_grad():
                        p[self.cfg.pad_id].zero_()
            elif p.dim() == 2 and name.endswith("weight"):
                nn.init.xavier_uniform_(p)
            elif name.endswith("bias") and "norm" not in name:
                nn.init.zeros_(p)

    # ------------------------------------------------------------------------------------ encode

    def encode(self, src: Tensor, *, need_weights: bool = False, head_mask: HeadMask | None = None) -> EncoderOutput:
        """src (B, S) int64 -> EncoderOutput(states (B, S, D), mask (B, S) True = token). `head_mask` (checked
        by check_head_mask): factors on each head's output, e.g. 0 to switch a head off."""
        check_ids("src", src, self.cfg.src_vocab_size)
        mask = padding_mask(src, self.cfg.pad_id)
        x = self.dropout(self.src_embed(src) * self.embed_scale + self.src_pos(0, src.shape[1]))
        weights, positions = [], torch.arange(src.shape[1], device=src.device)
        for i, layer in enumerate(self.encoder.layers):
            ctx = context("enc_self", i, need_weights, positions, head_mask)
            x, w = layer(x, mask=mask.unsqueeze(1), ctx=ctx)  # mask (B, 1, S)
            weights.append(w.self_attn)
        return EncoderOutput(self.encoder.norm(x), mask, tuple(weights) if need_weights else None)

    # ------------------------------------------------------------------------------------ decode

    def new_cache(self, enc: EncoderOutput) -> DecoderCache:
        """An empty incremental-decoding cache; cross-attention K/V are computed here, once, and stored
        head-major, (B, H, S, Dh) contiguous, so that attention steps read them as one stack of matrices."""
        layers = [LayerCache(*(x.contiguous() for x in layer.cross_attn.project_kv(enc.states)))
                  for layer in self.decoder.layers]
        return DecoderCache(layers, enc.mask)

    def decode(self, tgt: Tensor, enc: EncoderOutput | None, cache: DecoderCache | None = None, *,
               need_weights: bool = False, head_mask: HeadMask | None = None,
               cross_layers: Sequence[int] = ()) -> DecoderOutput:
        """tgt (B, T) int64 (starting with BOS) -> DecoderOutput(logits (B, T, V), ...).

        Without a cache, T positions are decoded at once under a look-ahead mask. With a cache,
        `tgt` holds only the new positions (usually T = 1); the cache grows by T and `enc` may be None.
        `head_mask`: as in `encode`. `cross_layers`: without need_weights, the cross-attention weights of
        these layers only (cross_attn holds None for the others, self_attn is None), so the other layers
        keep the fused attention (guided-alignment training, links read during search).
        """
        hidden = self.decode_states(tgt, enc, cache, need_weights=need_weights, head_mask=head_mask,
                                    cross_layers=cross_layers)
        return DecoderOutput(self.generator(hidden.states), hidden.cross_attn, hidden.self_attn)

    def decode_states(self, tgt: Tensor, enc: EncoderOutput | None, cache: DecoderCache | None = None, *,
                      need_weights: bool = False, head_mask: HeadMask | None = None,
                      cross_layers: Sequence[int] = ()) -> DecoderStates:
        """`decode` without the output projection: the decoder's states (B, T, D) and its attention (what
        analysis reads from a teacher-forced pass, where logits over the vocabulary would be wasted work)."""
        if cache is None:  # teacher forcing (the search's steps, with a cache, give the ids they chose)
            check_ids("tgt", tgt, self.cfg.tgt_vocab_size)
            if not isinstance(enc, EncoderOutput):
                raise ParameterError("enc", f"decoding without a cache needs the encoder output (encode's), got "
                                     f"{type(enc).__name__}")
            if enc.states.shape[0] != tgt.shape[0]:
                raise ParameterError("tgt", f"{tgt.shape[0]} rows against the {enc.states.shape[0]} sentences encoded")
        T = tgt.shape[1]
        rows = cache.positions if cache is not None else None  # (B,): rows at positions of their own (a stream's)
        offset = 0 if cache is None or rows is not None else cache.length
        where = self.tgt_pos.at(rows).unsqueeze(1) if rows is not None else self.tgt_pos(offset, T)
        x = self.dropout(self.tgt_embed(tgt) * self.embed_scale + where)
        if cache is None:  # teacher forcing: no cache; the cross-attention K/V of this call
            cross_kv, src_mask = [l.cross_attn.project_kv(enc.states) for l in self.decoder.layers], enc.mask
        else:
            cross_kv, src_mask = [(lc.cross_k, lc.cross_v) for lc in cache.layers], cache.src_mask
        if rows is not None:  # one new position per row; each row sees its own filled positions
            self_mask = cache.self_mask()  # (B, 1, T_all); None for a lone row, which sees every position
        else:
            self_mask = None if T == 1 else causal_mask(T, offset + T, tgt.device).unsqueeze(0)  # (1, T, T_all)
        cross_mask = src_mask.unsqueeze(1)  # (B, 1, S)
        cross, selfw = [], []
        group = cache.group if cache is not None else 1
        positions = rows if rows is not None else torch.arange(offset, offset + T, device=tgt.device)
        folded = positions.repeat(group) if group > 1 else positions  # of the cross-attention's folded queries
        for i, layer in enumerate(self.decoder.layers):
            x, w = layer(x, inputs=DecoderInputs(
                cross_kv=cross_kv[i], cross_mask=cross_mask, self_mask=self_mask,
                cache=cache.layers[i] if cache is not None else None, group=group,
                self_ctx=context("dec_self", i, need_weights, positions, head_mask),
                cross_ctx=context("cross", i, need_weights or i in cross_layers, folded, head_mask)))
            cross.append(w.cross_attn)
            selfw.append(w.self_attn)
        if cache is not None:
            cache.advance(T)
        states = self.decoder.norm(x)
        if need_weights:
            return DecoderStates(states, tuple(cross), tuple(selfw))
        return DecoderStates(states, tuple(cross) if cross_layers else None)

    def check_head_mask(self, mask: HeadMask | None, unit: bool = False) -> HeadMask | None:
        """`mask` if it fits this model: per place, one entry per layer, None or a (heads of that layer,)
        tensor of finite factors (0 switches a head off, 1 leaves it as trained; others scale it, as a gradient
        check does; with `unit`, as a Translator and a mask file take them, only 0 to 1); places left out are
        unmasked. A ValueError names what does not fit."""
        if mask is not None and not isinstance(mask, dict):
            raise ValueError(f"head_mask: a dict of places to lists of per-layer factors, got {type(mask).__name__}")
        for place, layers in (mask or {}).items():
            if problem := layout_problem(self.cfg, place, list(layers)):
                raise ValueError(f"head_mask: {problem}")
            for i, f in enumerate(layers):
                if f is not None and (not isinstance(f, Tensor) or f.dim() != 1 or not f.is_floating_point()):
                    got = type(f).__name__ if not isinstance(f, Tensor) else f"{f.dtype} {tuple(f.shape)}"
                    raise ValueError(f"head_mask: {place} layer {i}: expected a 1-D float tensor of factors, got {got}")
                if f is not None and not bool(f.isfinite().all()):
                    raise ValueError(f"head_mask: {place} layer {i}: factors must be finite, got {f.tolist()}")
                if f is not None and unit and not bool(((f >= 0) & (f <= 1)).all()):
                    raise ValueError(f"head_mask: {place} layer {i}: factors must be in [0, 1], got {f.tolist()}")
        return mask

    def forward(self, src: Tensor, tgt: Tensor, need_weights: bool = False,
                head_mask: HeadMask | None = None, *, cross_layers: Sequence[int] = ()) -> DecoderOutput:
        """Teacher forcing: src (B, S), tgt (B, T) (BOS + target) -> logits (B, T, V) predicting the next token.
        `head_mask` (a differentiable one gives its gradient, see analysis/importance.py), `cross_layers`: as
        in `encode` and `decode`."""
        self.check_head_mask(head_mask)
        return self.decode(tgt, self.encode(src, head_mask=head_mask), need_weights=need_weights, head_mask=head_mask,
                           cross_layers=cross_layers)

    # ------------------------------------------------------------------------------ parameter groups

    GROUP_PATTERNS = (
        ("xattn", re.compile(r"decoder\.layers\.\d+\.cross_attn(_norm)?\.")),
        ("enc", re.compile(r"encoder\.")),
        ("dec", re.compile(r"decoder\.")),
        ("src", re.compile(r"src_(embed|pos)\.")),
        ("tgt", re.compile(r"(tgt_(embed|pos)|generator)\.")),
    )

    def parameter_groups(self) -> dict[str, list[str]]:
        """Partition of all parameter names into src, tgt, enc, dec, xattn (Gheini et al. 2021).

        xattn is every decoder layer's cross-attention and its LayerNorm. A parameter shared by
        two names (tied embeddings) appears once, under the first name PyTorch reports.
        """
        groups: dict[str, list[str]] = {name: [] for name in ("src", "tgt", "enc", "dec", "xattn")}
        for name, _ in self.named_parameters():
            groups[self.group_of(name)].append(name)
        return groups

    def group_of(self, name: str) -> str:
        """The group of a parameter or persistent buffer name (a hard-coded head's centres go with its module)."""
        group = next((g for g, pattern in self.GROUP_PATTERNS if pattern.match(name)), None)
        if group is None:
            raise RuntimeError(f"{name} belongs to no group")
        return group
