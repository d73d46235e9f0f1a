"""Decoding strategies over a step function: greedy, sampling (temperature, top-k, top-p) and beam search.

Shapes: B sentences, K beam size, N rows still decoding, V target vocabulary, T generated positions,
L decoder layers, H heads, S source length.
A strategy touches the model only through `encode`, `new_cache` and a `Step`:
`step(tokens (N, 1), cache) -> (log_probs (N, V), cross-attention (N, L, H, S) or None)`.
Every strategy applies the same constraints (processors.py) to the model's log-probabilities.

Lengths: `max_len[b]` bounds the tokens generated for sentence b, EOS excluded (never below its forced
prefix); at that length only EOS is allowed. Scores: a hypothesis of n tokens plus EOS ranks by
log p / lp(n + 1), lp(len) = ((5 + len) / 6) ** alpha (GNMT, Wu et al. 2016), plus, in beam search,
the coverage penalty beta * sum_j log(min(sum_i a_ij, 1)) over the source tokens j, where a is the
last decoder layer's cross-attention averaged over heads (in a pruned model, the last layer with heads).
Greedy reports the same normalised score, so a beam of one gives greedy's tokens and score.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor

from xattn.attention import DecoderCache, stack_layers
from xattn.config import DecodeConfig
from xattn.model import EncoderOutput, Transformer
from xattn.processors import Constraints, Processor, StepState, apply_all, constraints, warpers

Step = Callable[[Tensor, DecoderCache], tuple[Tensor, Tensor | None]]


SAMPLING_ONLY = frozenset({"temperature", "top_k", "top_p", "num_samples", "seed"})
BEAM_ONLY = frozenset({"beam_size", "n_best", "coverage_penalty", "stopping"})


GREEDY_IGNORES = frozenset({"coverage_penalty", "stopping"})


def ignored_settings(given, sampling: bool, beam_size: int) -> list[str]:
    """Of the DecodeConfig fields a user set (`given`), those a search of that kind would ignore: the beam's
    when sampling, the sampler's when searching by beam, and the coverage penalty and stopping rule when
    the beam is 1 (greedy search). Every front end refuses them."""
    ignored = BEAM_ONLY if sampling else SAMPLING_ONLY | (GREEDY_IGNORES if beam_size == 1 else frozenset())
    return sorted(set(given) & ignored)


@dataclass
class Hypothesis:
    tokens: list[int]                       # generated ids, EOS excluded
    score: float                            # the ranking score (normalised, penalties included)
    log_prob: float                         # sum of token log-probabilities, EOS included
    cross_attention: Tensor | None = None   # (L, H, len(tokens) + 1, S) when tracked during search
    relaxed: bool = False                   # ended early: the constraints left no token but EOS (processors.py)


def gnmt_penalty(length: Tensor | int, alpha: float) -> Tensor | float:
    """GNMT lp(len) = ((5 + len) / 6) ** alpha; `len` counts EOS."""
    return ((5 + length) / 6) ** alpha


def make_step(model: Transformer, need_weights: bool = False) -> Step:
    """A `Step` over `model.decode`; with `need_weights` it also returns this step's cross-attention."""
    def step(tokens: Tensor, cache: DecoderCache) -> tuple[Tensor, Tensor | None]:
        out = model.decode(tokens, None, cache=cache, need_weights=need_weights)
        logits = out.logits[:, -1].float()  # (N, V), this step's own tensor
        log_probs = torch.log_softmax(logits, dim=-1, out=logits)  # in place: no N x V allocation per step
        if not need_weights:
            return log_probs, None
        return log_probs, stack_layers(out.cross_attn)[:, :, :, -1].float()  # (N, L, H, S)
    return step


def prepare_cache(model: Transformer, src: Tensor, copies: int = 1,
                  enc: EncoderOutput | None = None) -> DecoderCache:
    """Encode src (B, S) (unless `enc` is its encoding already) and return a cache of B * copies rows,
    `copies` consecutive rows per sentence."""
    cache = model.new_cache(enc if enc is not None else model.encode(src))
    if copies > 1:
        cache.expand(copies, grouped=False)
    return cache


def hypothesis(ids: list[int], stop: set[int], log_prob: float, alpha: float, penalty: float = 0.0,
               attention: Tensor | None = None, relaxed: bool = False) -> Hypothesis:
    """A Hypothesis from generated ids, cut at the first `stop` id (EOS or pad); score = log p / lp + penalty."""
    end = next((i for i, token in enumerate(ids) if token in stop), len(ids))
    score = log_prob / gnmt_penalty(end + 1, alpha) + penalty
    if attention is not None:
        attention = attention[:end + 1].permute(1, 2, 0, 3).contiguous()  # (L, H, T, S)
    return Hypothesis(ids[:end], score, log_prob, attention, relaxed)


# ---------------------------------------------------------------------------------- greedy and sampling

Pick = Callable[[Tensor, StepState], Tensor]
"""(constrained log-probs (N, V), state) -> chosen token (N,)."""


def argmax(lp: Tensor, state: StepState) -> Tensor:
    return lp.argmax(dim=-1)


def sampler(warps: list[Processor], generator: torch.Generator) -> Pick:
    """Draw from the warped distribution (temperature, top-k, top-p)."""
    def pick(lp: Tensor, state: StepState) -> Tensor:
        probs = apply_all(warps, lp, state).softmax(dim=-1)  # (N, V)
        return torch.multinomial(probs, 1, generator=generator).squeeze(1)
    return pick


@torch.inference_mode()
def ancestral(model: Transformer, src: Tensor, max_len: Tensor, rules: Constraints, pick: Pick,
              copies: int = 1, prefix: Tensor | None = None, alpha: float = 1.0,
              need_attention: bool = False, enc: EncoderOutput | None = None) -> list[list[Hypothesis]]:
    """One token per step for each of `copies` rows per sentence: greedy with `argmax`, sampling with `sampler`.

    src (B, S), max_len (B,), prefix (B, P) or None -> B lists of `copies` hypotheses. Finished rows
    leave the batch, so each step costs only the rows still decoding.
    """
    cfg, device = model.cfg, src.device
    step = make_step(model, need_attention)
    R = src.shape[0] * copies
    max_len = max_len.to(device).repeat_interleave(copies)  # (R,)
    prefix = prefix.repeat_interleave(copies, dim=0) if prefix is not None else None  # (R, P)
    cache = prepare_cache(model, src, copies, enc)
    T = int(max_len.max()) + 1
    out = torch.full((R, T), cfg.pad_id, dtype=torch.long, device=device)  # (R, T)
    log_prob = torch.zeros(R, device=device)
    relaxed = torch.zeros(R, dtype=torch.bool, device=device)  # (R,) ended by the constraints' last resort
    attention: Tensor | None = None
    alive = torch.arange(R, device=device)  # (N,) row of each live hypothesis
    last = torch.full((R, 1), cfg.bos_id, dtype=torch.long, device=device)  # (N, 1)
    for t in range(T):
        raw, attn = step(last, cache)
        state = StepState(t, out[alive, :t], max_len[alive], prefix[alive] if prefix is not None else None)
        lp, exhausted = rules(raw, state)  # (N, V), (N,) or None
        if exhausted is not None:
            relaxed[alive] |= exhausted
        token = pick(lp, state)  # (N,)
        out[alive, t] = token
        log_prob[alive] += lp.gather(1, token.unsqueeze(1)).squeeze(1)
        if attn is not None:
            attention = attention if attention is not None else attn.new_zeros(R, T, *attn.shape[1:])
            attention[alive, t] = attn  # (R, T, L, H, S)
        keep = token.ne(cfg.eos_id).nonzero().squeeze(1)  # (N',)
        if keep.numel() == 0:
            break
        if keep.numel() < alive.numel():
            cache.select(keep)
            alive, token = alive[keep], token[keep]
        last = token.unsqueeze(1)
    stop = {cfg.eos_id, cfg.pad_id}
    hyps = [hypothesis(ids, stop, lp, alpha, 0.0, attention[r].cpu() if attention is not None else None, cut)
            for r, (ids, lp, cut) in enumerate(zip(out.cpu().tolist(), log_prob.cpu().tolist(), relaxed.tolist()))]
    return [hyps[b * copies:(b + 1) * copies] for b in range(src.shape[0])]


def greedy(model: Transformer, src: Tensor, max_len: Tensor, length_penalty: float = 1.0) -> list[list[Hypothesis]]:
    """Plain greedy search under the default constraints: src (B, S), max_len (B,) -> B lists of one."""
    return ancestral(model, src, max_len, constraints(DecodeConfig(), model.cfg), argmax, alpha=length_penalty)


# ------------------------------------------------------------------------------------------- search

def max_lengths(src: Tensor, cfg: DecodeConfig, pad_id: int, prefix: Tensor | None = None) -> Tensor:
    """(B, S) -> (B,) floor(max_len_a * src_len + max_len_b), src_len counting non-pad tokens (EOS included).

    A source holding nothing but EOS (an empty sentence) gets 0: its translation is empty, unless a
    forced prefix is longer; the limit never cuts a prefix.
    """
    src_len = src.ne(pad_id).sum(dim=1)  # (B,)
    limit = (cfg.max_len_a * src_len.double() + cfg.max_len_b).floor().long().clamp(min=0)
    limit = torch.where(src_len > 1, limit, torch.zeros_like(limit))
    if prefix is not None:
        limit = torch.maximum(limit, prefix.ne(pad_id).sum(dim=1).to(limit.device))
    return limit


@torch.inference_mode()
def search(model: Transformer, src: Tensor, cfg: DecodeConfig, prefix: Tensor | None = None,
           need_attention: bool = False, enc: EncoderOutput | None = None) -> list[list[Hypothesis]]:
    """src (B, S), each row ending with EOS; prefix (B, P) forced first target tokens (pad-padded) or None;
    enc: model.encode(src) when the caller has it already.

    Returns B lists of hypotheses, best first: cfg.num_samples samples when cfg.sampling, else one
    greedy hypothesis (beam_size 1) or the cfg.n_best of beam search. With `need_attention` each
    hypothesis carries the cross-attention that produced it, tracked along the search.
    """
    from xattn.beam import beam_search

    if src.shape[0] == 0:
        return []
    max_len = max_lengths(src, cfg, model.cfg.pad_id, prefix)
    if model.cfg.positions == "learned":  # BOS + max_len tokens must fit the position table
        max_len = max_len.clamp(max=model.cfg.max_positions - 1)
    rules = constraints(cfg, model.cfg)
    if cfg.sampling:
        generator = torch.Generator(device=src.device)
        generator.manual_seed(cfg.seed if cfg.seed is not None else int(torch.randint(2 ** 62, (1,))))
        pick = sampler(warpers(cfg), generator)
        return ancestral(model, src, max_len, rules, pick, cfg.num_samples, prefix, cfg.length_penalty,
                         need_attention, enc)
    if cfg.beam_size == 1:
        return ancestral(model, src, max_len, rules, argmax, 1, prefix, cfg.length_penalty, need_attention, enc)
    return beam_search(model, src, cfg, max_len, rules, prefix, need_attention, enc)
