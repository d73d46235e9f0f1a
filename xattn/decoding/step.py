"""What every decoding strategy shares: the step function over the model, hypotheses and their scores (GNMT
length penalty), the decoder cache of a batch and the maximum lengths. See xattn/decoding/__init__.py for the
shapes, lengths and scores.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Generator, TypeVar

import torch
from torch import Tensor

from xattn.attention import padding_mask
from xattn.cache import DecoderCache
from xattn.checks import head_problem
from xattn.config import DecodeConfig, ModelConfig
from xattn.errors import ParameterError
from xattn.inference import linear_rows
from xattn.decoding.processors import NEG_INF, Vocab
from xattn.model import EncoderOutput, HeadMask, Transformer, stack_layers

Step = Callable[..., tuple[Tensor, Tensor | None]]
"""(tokens (N, 1), cache[, the sentence of each row or group of rows]) -> this step's log-probabilities (N, V)
and cross-attention (or None): make_step."""
R = TypeVar("R")
Steps = Generator[int, None, R]
"""A computation run one decoder step per `next()`: it yields between two steps (the rows of the step it took:
serve/backlog.py's rate) and returns its result.
Searches are written this way (search_steps) so that a server can run several in turns on one thread and
drop one between steps (serve/engine.py); `finish` runs one to its end."""


def finish(steps: Steps[R]) -> R:
    """Run `steps` to its end and return its result."""
    while True:
        try:
            next(steps)
        except StopIteration as end:
            return end.value


def done(value: R) -> Steps[R]:
    """Steps that take none: `value` at once."""
    return value
    yield 0  # a generator function: the first next() returns `value`


@dataclass(frozen=True)
class Tracked:
    """The cross-attention a search tracks for its hypotheses: the mean of `heads` (None: all it has) of decoder
    layer `layer`, kept as one layer of one head, so only that layer's weights are computed and carried."""
    layer: int
    heads: tuple[int, ...] | None = None

    def checked(self, cfg: ModelConfig) -> Tracked:
        """Itself, if the model of `cfg` has that layer and those heads; else a ParameterError."""
        heads = cfg.heads_per_layer("cross")
        whole = lambda x: isinstance(x, int) and not isinstance(x, bool)  # noqa: E731
        if not whole(self.layer) or not (self.heads is None or isinstance(self.heads, (tuple, list))
                                         and all(map(whole, self.heads))):
            raise ParameterError("attention_heads", f"(layer, heads): a layer number and a tuple of head numbers or "
                                 f"None, got ({self.layer!r}, {self.heads!r})")
        if self.heads is not None and not self.heads:  # their mean would be NaN everywhere
            raise ParameterError("attention_heads", "no heads given; give some, or None for all of the layer's")
        if problem := head_problem(heads, self.layer, self.heads, "cross-attention"):
            raise ParameterError("attention_heads", problem)
        return self

    def mean(self, weights: Tensor) -> Tensor:
        """(..., H, S) the heads of layer `layer` (NaN for heads a pruned layer lacks) -> (..., 1, 1, S)."""
        if self.heads is not None and len(self.heads) == 1:  # its row, a view: no nanmean's several passes a step
            return weights.narrow(-2, self.heads[0], 1).float().unsqueeze(-2)
        chosen = weights if self.heads is None else weights[..., list(self.heads), :]
        return chosen.float().nanmean(dim=-2).unsqueeze(-2).unsqueeze(-2)


@dataclass
class Hypothesis:
    tokens: list[int]                       # generated ids, EOS excluded
    score: float                            # the ranking score (normalised, penalties included)
    log_prob: float                         # sum of token log-probabilities, EOS included
    cross_attention: Tensor | None = None   # (L, H, len(tokens) + 1, S) when tracked during search ((1, 1, ...)
    #   with Tracked)
    relaxed: bool = False                   # ended early: the constraints left no token but EOS (processors.py)


def gnmt_penalty(length: Tensor | int, alpha: float) -> Tensor | float:
    """GNMT lp(len) = ((5 + len) / 6) ** alpha; `len` counts EOS."""
    return ((5 + length) / 6) ** alpha


def first_argmax(x: Tensor, block: int = 64) -> Tensor:
    """x.argmax(dim=-1) of (N, V): the first column holding a row's maximum (NaN counting as the maximum), found
    by the maxima of blocks of `block` columns and then one block per row: PyTorch's argmax over a long last axis
    takes several times its amax. For fewer than 4 rows, and for any other shape than (N, V), its own argmax is the
    quicker (the figures: benchmarks/README.md, Translation speed, session 29)."""
    if x.dim() != 2 or x.shape[0] < 4 or x.shape[1] <= block:
        return x.argmax(dim=-1)
    N, V = x.shape
    x = x.contiguous()
    whole = V - V % block
    best = x[:, :whole].view(N, whole // block, block).amax(dim=-1)  # (N, V // block)
    if whole < V:
        best = torch.cat([best, x[:, whole:].amax(dim=-1, keepdim=True)], dim=1)
    start = best.argmax(dim=-1, keepdim=True) * block  # (N, 1) the first block holding the maximum
    columns = (start + torch.arange(block, device=x.device)).clamp_(max=V - 1)  # (N, block); a last short
    #   block repeats column V - 1 after itself, so the first maximum stays the first
    return columns.gather(1, x.gather(1, columns).argmax(dim=-1, keepdim=True)).squeeze(1)


def make_step(model: Transformer, *, need_weights: bool = False, head_mask: HeadMask | None = None,
              vocab: Vocab | None = None, track: Tracked | None = None) -> Step:
    """A `Step` over the model's decoder (with `head_mask`, see Transformer.encode); with `need_weights` it
    also returns this step's cross-attention, every layer's (N, L, H, S) or, with `track`, the mean of its
    heads (N, 1, 1, S). `vocab` (a shortlist's): the only target ids the step scores, its log-probabilities
    then having one column per id of vocab.ids (processors.Columns); each row's distribution is over its own
    sentence's ids, vocab.allowed[sentences] (the step's third argument: the sentence of each row, or of each
    group of cache.group rows), as if that sentence were decoded alone."""
    output = restricted(model.generator, vocab.ids) if vocab is not None else None
    layers = (track.layer,) if need_weights and track is not None else ()
    every = need_weights and not layers
    one_layer = {"cross_layers": layers} if layers else {}  # the decoder's own call otherwise
    unlisted = None  # (B, W): 0 where a sentence's list has the id, -inf where not; added to its rows' logits
    if vocab is not None and vocab.allowed is not None:  # (added: a step's masked_fill_ was far slower; benchmarks/README)
        unlisted = torch.zeros(vocab.allowed.shape, device=vocab.allowed.device).masked_fill_(~vocab.allowed, NEG_INF)
    rows: list = [None, None]  # the last step's `sentences` and their rows of `unlisted`: the rows change only when
    #                            a sentence leaves, and the search passes the same tensor until then

    def step(tokens: Tensor, cache: DecoderCache, sentences: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        if output is None:
            out = model.decode(tokens, None, cache=cache, need_weights=every, head_mask=head_mask, **one_layer)
            logits = out.logits[:, -1].float()  # (N, V), this step's own tensor
        else:
            out = model.decode_states(tokens, None, cache=cache, need_weights=every, head_mask=head_mask, **one_layer)
            logits = output(out.states[:, -1]).float()  # (N, len(vocab))
            if unlisted is not None:  # other sentences' ids out of this row's softmax
                if rows[0] is not sentences:
                    rows[:] = sentences, unlisted.index_select(0, sentences).unsqueeze(1)  # (N / group, 1, W)
                logits.view(rows[1].shape[0], -1, logits.shape[1]).add_(rows[1])
        log_probs = torch.log_softmax(logits, dim=-1, out=logits)  # in place: no N x V allocation per step
        if not need_weights:
            return log_probs, None
        if layers:
            return log_probs, track.mean(out.cross_attn[track.layer][:, :, -1])  # (N, 1, 1, S)
        return log_probs, stack_layers(out.cross_attn)[:, :, :, -1].float()  # (N, L, H, S)
    return step


def restricted(generator: torch.nn.Module, vocab: Tensor) -> torch.nn.Module:
    """The output projection `generator` for the target ids `vocab` only: its rows `vocab` (an inference
    copy's projection, xattn.inference.FastOutput, makes its own rewritten form of them)."""
    return generator.restrict(vocab) if hasattr(generator, "restrict") else linear_rows(generator, vocab)


PART_POSITIONS, PART_SAVING = 1024, 1 / 8
"""encode_in_parts: a part ends at the first longer source once it holds PART_POSITIONS positions, padding
included; a batch is split only where its parts leave out at least PART_SAVING of its positions (beam search's
batches, a fifth as wide, mostly save less, and their extra passes then cost what they save)."""


@torch.inference_mode()
def encode_in_parts(model: Transformer, src: Tensor, head_mask: HeadMask | None = None) -> EncoderOutput:
    """model.encode(src, head_mask=head_mask) of src (B, S), on the CPU in parts of sources of near-equal length,
    each padded only to its own longest: a batch cut by a token budget (Translator) pads its shorter sources to
    its longest, which a whole-batch pass encodes too (the figures: benchmarks/README.md, session 29). Each
    source's states are those of its own part (zeros past its part's longest: padding, which the mask hides); the
    mask is the batch's, as is the states' shape. Only right-padded sources (pad_batch's) are encoded in parts; a
    batch with padding before a token is encoded whole."""
    if src.device.type != "cpu" or src.numel() <= PART_POSITIONS:  # (no first part could close: one pass)
        return model.encode(src, head_mask=head_mask)
    mask = padding_mask(src, model.cfg.pad_id)
    counts = mask.sum(dim=1)
    if not torch.equal(mask, torch.arange(src.shape[1], device=src.device) < counts.unsqueeze(1)):
        return model.encode(src, head_mask=head_mask)
    lengths = counts.tolist()
    order = sorted(range(len(lengths)), key=lengths.__getitem__)
    parts: list[list[int]] = [[]]
    for i in order:
        part = parts[-1]
        if part and len(part) * lengths[part[-1]] >= PART_POSITIONS and lengths[i] > lengths[part[-1]]:
            parts.append(part := [])
        part.append(i)
    if sum(len(part) * lengths[part[-1]] for part in parts) > (1 - PART_SAVING) * src.shape[0] * max(lengths):
        return model.encode(src, head_mask=head_mask)
    states = None
    for part in parts:
        rows, n = torch.tensor(part, device=src.device), lengths[part[-1]]
        encoded = model.encode(src[rows, :n], head_mask=head_mask).states  # (rows, n, D)
        if states is None:
            states = encoded.new_zeros(src.shape[0], src.shape[1], encoded.shape[-1])
        states[rows, :n] = encoded
    return EncoderOutput(states, mask)


def prepare_cache(model: Transformer, src: Tensor, copies: int = 1, enc: EncoderOutput | None = None,
                  head_mask: HeadMask | None = None) -> DecoderCache:
    """Encode src (B, S) (unless `enc` is its encoding already; in parts, encode_in_parts) and return a cache of
    B * copies rows, `copies` consecutive rows per sentence."""
    cache = model.new_cache(enc if enc is not None else encode_in_parts(model, src, head_mask))
    if copies > 1:
        cache.expand(copies, grouped=False)
    return cache


def hypothesis(ids: list[int], stop: set[int], log_prob: float, alpha: float, penalty: float = 0.0,
               attention: Tensor | None = None, relaxed: bool = False) -> Hypothesis:
    """A Hypothesis from generated ids, cut at the first `stop` id (EOS or pad); score = log p / lp + penalty."""
    end = next((i for i, token in enumerate(ids) if token in stop), len(ids))
    score = log_prob / gnmt_penalty(end + 1, alpha) + penalty
    attention = in_steps(attention, end + 1) if attention is not None else None
    return Hypothesis(ids[:end], score, log_prob, attention, relaxed)


def in_steps(attention: Tensor, steps: int) -> Tensor:
    """A hypothesis' tracked cross-attention (T, L, H, S) -> its first `steps` positions as (L, H, steps, S)."""
    return attention[:steps].permute(1, 2, 0, 3).contiguous()


def length_problem(cfg: DecodeConfig, src_len: int, prefix_len: int = 0) -> ParameterError | None:
    """What `cfg`'s lengths cannot do for a source of `src_len` tokens (its </s> included) whose translation is
    forced to start with `prefix_len` tokens: leave it no output token (max_len_b), or fewer than min_len (either
    would be a silently empty or short translation); None if they can. A source of </s> alone (an empty sentence)
    has no problem: its translation is empty, and the limit never cuts a prefix. (What a model's learned positions
    hold, whatever the source: positions_problem.)"""
    if src_len <= 1:
        return None
    limit = max(cfg.max_output_tokens(src_len), prefix_len)
    if limit < 1:
        return ParameterError("max_len_b", f"the maximum output length leaves a sentence of {src_len} source tokens "
                              "(</s> included) no token; raise it")
    if limit < cfg.min_len:
        return ParameterError("min_len", f"{cfg.min_len} is above the {limit} output tokens the maximum output length "
                              f"allows a sentence of {src_len} source tokens (</s> included); lower it or raise the "
                              "maximum")
    return None


def positions_problem(cfg: DecodeConfig, max_positions: int | None) -> ParameterError | None:
    """min_len above the max_positions - 1 output tokens a model's learned positions hold (with BOS), which would cut
    every translation short of it silently; None if it is not, or the positions are sinusoidal (None)."""
    if max_positions is not None and max_positions - 1 < cfg.min_len:
        return ParameterError("min_len", f"{cfg.min_len} is above the {max_positions - 1} output tokens the model's "
                              f"{max_positions} learned positions hold (BOS and the tokens before </s>); lower it")
    return None


def max_lengths(src: Tensor, cfg: DecodeConfig, model_cfg: ModelConfig, prefix: Tensor | None = None) -> Tensor:
    """(B, S) -> (B,) cfg.max_output_tokens(src_len), src_len counting non-pad tokens (EOS included), within what
    the model's learned positions hold (BOS and the tokens before EOS).

    A source holding nothing but EOS (an empty sentence) gets 0: its translation is empty, unless a
    forced prefix is longer; the limit never cuts a prefix. Settings that leave any other source no output token,
    or fewer than min_len, are a ParameterError naming max_len_b or min_len.
    """
    pad_id = model_cfg.pad_id
    src_len = src.ne(pad_id).sum(dim=1)  # (B,)
    limit = torch.tensor([cfg.max_output_tokens(n) for n in src_len.tolist()], dtype=torch.long, device=src.device)
    limit = torch.where(src_len > 1, limit, torch.zeros_like(limit))
    if prefix is not None:
        limit = torch.maximum(limit, prefix.ne(pad_id).sum(dim=1).to(limit.device))
    if bool(((src_len > 1) & (limit < max(1, cfg.min_len))).any()):  # (length_problem names it)
        forced = prefix.ne(pad_id).sum(dim=1).tolist() if prefix is not None else [0] * len(src)
        raise next(problem for n, p in zip(src_len.tolist(), forced) if (problem := length_problem(cfg, n, p)))
    if bool((src_len > 1).any()) and (problem := positions_problem(cfg, model_cfg.learned_positions)):
        raise problem
    if model_cfg.positions == "learned":  # BOS + the tokens before EOS must fit the position table
        limit = limit.clamp(max=model_cfg.max_positions - 1)
    return limit
