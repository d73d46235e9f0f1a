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
last decoder layer's cross-attention averaged over heads (in a pruned model, the last layer with heads; heads a
head mask switches off are left out, as pruned ones: beam.coverage_reading).
Greedy reports the same normalised score, so a beam of one gives greedy's tokens and score.
"""
from __future__ import annotations

import torch
from torch import Tensor

from xattn.config import DecodeConfig
from xattn.errors import ParameterError
from xattn.decoding.ancestral import ancestral, argmax, greedy, sampler
from xattn.decoding.beam import beam_search
from xattn.decoding.step import (Hypothesis, Step, Steps, Tracked, done, encode_in_parts, finish, gnmt_penalty,
                                 hypothesis, make_step, max_lengths, prepare_cache)
from xattn.model import EncoderOutput, HeadMask, Transformer, check_ids
from xattn.decoding.processors import Vocab, constraints, warpers

__all__ = ["Hypothesis", "Step", "Steps", "Tracked", "ancestral", "argmax", "beam_search", "done", "encode_in_parts",
           "finish", "gnmt_penalty", "greedy", "hypothesis", "make_step", "max_lengths", "prepare_cache", "sampler",
           "search", "search_steps", "seeded", "Vocab"]


def search(model: Transformer, src: Tensor, cfg: DecodeConfig, prefix: Tensor | None = None, *,
           need_attention: bool = False, enc: EncoderOutput | None = None,
           head_mask: HeadMask | None = None, vocab: Vocab | None = None,
           track: Tracked | None = None) -> list[list[Hypothesis]]:
    """search_steps run to its end, its arguments checked first (a Translator makes its own, and checks its head
    mask once, when it is set): ParameterErrors naming `cfg`, `src`, `prefix`, `enc` or `head_mask`."""
    check_arguments(model, src, cfg, prefix, enc)
    if head_mask is not None:
        try:
            model.check_head_mask(head_mask)
        except ValueError as e:
            raise ParameterError("head_mask", str(e).removeprefix("head_mask: ")) from None
    return finish(search_steps(model, src, cfg, prefix, need_attention=need_attention, enc=enc, head_mask=head_mask,
                               vocab=vocab, track=track))


def check_arguments(model: Transformer, src: Tensor, cfg: DecodeConfig, prefix: Tensor | None,
                    enc: EncoderOutput | None) -> None:
    """What `search` takes, checked: a DecodeConfig; src (B, S) ids of the source vocabulary; prefix (B, P) ids of
    the target vocabulary, one row per sentence, without BOS (a prefix is the start of the output, which the search
    never lets hold BOS or pad but as padding); an EncoderOutput of src's B sentences."""
    if not isinstance(cfg, DecodeConfig):
        raise ParameterError("cfg", f"expected a DecodeConfig, got {type(cfg).__name__}")
    check_ids("src", src, model.cfg.src_vocab_size)
    if prefix is not None:
        check_ids("prefix", prefix, model.cfg.tgt_vocab_size)
        if prefix.shape[0] != src.shape[0]:
            raise ParameterError("prefix", f"{prefix.shape[0]} rows for the {src.shape[0]} sentences of src")
        if model.cfg.bos_id != model.cfg.pad_id and bool(prefix.eq(model.cfg.bos_id).any()):  # (Marian's: one id)
            raise ParameterError("prefix", f"holds the BOS id {model.cfg.bos_id}; a prefix is the first tokens of "
                                 "the output, after BOS (pad it with the pad id)")
    if enc is not None and (not isinstance(enc, EncoderOutput) or enc.states.shape[0] != src.shape[0]):
        got = f"one of {enc.states.shape[0]} sentences" if isinstance(enc, EncoderOutput) else type(enc).__name__
        raise ParameterError("enc", f"expected the EncoderOutput of src's {src.shape[0]} sentences, got {got}")


def seeded(cfg: DecodeConfig, device: torch.device | str) -> torch.Generator:
    """The random numbers of one sampling call: seeded from cfg.seed, or at random without one."""
    generator = torch.Generator(device=device)
    return generator.manual_seed(cfg.seed if cfg.seed is not None else int(torch.randint(2 ** 62, (1,))))


def search_steps(model: Transformer, src: Tensor, cfg: DecodeConfig, prefix: Tensor | None = None, *,
                 need_attention: bool = False, enc: EncoderOutput | None = None,
                 head_mask: HeadMask | None = None, vocab: Vocab | None = None,
                 track: Tracked | None = None, generator: torch.Generator | None = None) -> Steps[list[list[Hypothesis]]]:
    """The search as Steps (one decoder step per `next()`). src (B, S), each row ending with EOS; prefix (B, P)
    forced first target tokens (pad-padded) or None;
    enc: model.encode(src, head_mask=head_mask) when the caller has it already; head_mask: factors on the
    heads' outputs (Transformer.encode), applied at every step; vocab: the only target ids the search may
    produce, each sentence its own (a shortlist's candidates, processors.Vocab), or None for the whole vocabulary;
    generator: sampling's random numbers, when a call samples several batches (one seeded generator a call, so
    that its batches do not draw the same numbers: `seeded`); by default one seeded from cfg.seed.

    Returns B lists of hypotheses, best first: cfg.num_samples samples when cfg.sampling, else one
    greedy hypothesis (beam_size 1) or the cfg.n_best of beam search. With `need_attention` each
    hypothesis carries the cross-attention that produced it, tracked along the search: every layer's, or
    with `track` only the mean of one layer's chosen heads (computed only for that layer), as (1, 1, T, S).
    It is the attention a teacher-forced pass over the hypothesis gives (up to float rounding): each step's
    attention depends only on the tokens before it, which the hypothesis keeps.
    """
    if src.shape[0] == 0:
        return done([])
    max_len = max_lengths(src, cfg, model.cfg, prefix)
    rules = constraints(cfg, model.cfg)
    options = dict(prefix=prefix, need_attention=need_attention, enc=enc, head_mask=head_mask, vocab=vocab, track=track)
    if cfg.beam_size > 1 and not cfg.sampling:
        return beam_search(model, src, cfg, max_len, rules, **options)
    pick = sampler(warpers(cfg), generator or seeded(cfg, src.device)) if cfg.sampling else argmax
    return ancestral(model, src, max_len, rules, pick, copies=cfg.hypotheses,
                     alpha=cfg.length_penalty, **options)
