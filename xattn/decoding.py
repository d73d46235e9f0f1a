"""Greedy and beam search over a step function.

Shapes: B sentences, K beam size, N rows still decoding, V target vocabulary, T generated positions.
A strategy touches the model only through `encode`, `new_cache` and a `Step`:
`step(tokens (N, 1), cache) -> log_probs (N, V)`, which grows the cache by one position.

Lengths: `max_len[b]` bounds the tokens generated for sentence b, EOS excluded; at step `max_len[b]`
only EOS is allowed (with the model's own log-probability for it). Pad and BOS are never generated.
Scores: a hypothesis of `n` tokens plus EOS ranks by `log_prob / lp(n + 1)` with the GNMT length
penalty `lp(len) = ((5 + len) / 6) ** alpha` (Wu et al. 2016); greedy reports the same score, so a beam
of one gives greedy's tokens and score.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor

from xattn.attention import DecoderCache
from xattn.config import DecodeConfig
from xattn.model import Transformer

Step = Callable[[Tensor, DecoderCache], Tensor]
"""(tokens (N, 1), cache) -> log_probs (N, V) float32; the cache grows by one position."""


@dataclass
class Hypothesis:
    tokens: list[int]   # generated ids, EOS excluded
    score: float        # log_prob / lp(len(tokens) + 1), the ranking score
    log_prob: float     # sum of token log-probabilities, EOS included


# ------------------------------------------------------------------------------------- log-prob processors

def forbid(log_probs: Tensor, ids: Tensor) -> Tensor:
    """(N, V), ids (k,) -> (N, V) with the columns `ids` at -inf."""
    return log_probs.index_fill(1, ids, float("-inf"))


def force_eos(log_probs: Tensor, rows: Tensor, eos_id: int) -> Tensor:
    """(N, V), rows (N,) bool -> (N, V) where the chosen rows may only produce EOS."""
    not_eos = torch.ones(log_probs.shape[1], dtype=torch.bool, device=log_probs.device)
    not_eos[eos_id] = False
    return log_probs.masked_fill(rows.unsqueeze(1) & not_eos, float("-inf"))  # (N, V)


def gnmt_penalty(length: Tensor | int, alpha: float) -> Tensor | float:
    """GNMT lp(len) = ((5 + len) / 6) ** alpha; `len` counts EOS."""
    return ((5 + length) / 6) ** alpha


def make_step(model: Transformer) -> Step:
    """A `Step` over `model.decode` that never proposes pad or BOS."""
    specials = torch.tensor([model.cfg.pad_id, model.cfg.bos_id], device=model.generator.weight.device)

    def step(tokens: Tensor, cache: DecoderCache) -> Tensor:
        logits = model.decode(tokens, None, cache=cache).logits[:, -1]  # (N, V)
        return forbid(logits.float().log_softmax(dim=-1), specials)

    return step


def prepare_cache(model: Transformer, src: Tensor, copies: int = 1) -> DecoderCache:
    """Encode src (B, S) and return a cache of B * copies rows, `copies` consecutive rows per sentence."""
    cache = model.new_cache(model.encode(src))
    if copies > 1:
        cache.select(torch.arange(src.shape[0], device=src.device).repeat_interleave(copies))  # (B * K,)
    return cache


def hypothesis(ids: list[int], stop: set[int], log_prob: float, alpha: float) -> Hypothesis:
    """A hypothesis from generated ids, cut at the first `stop` id (EOS or pad), and its log-probability."""
    end = next((i for i, token in enumerate(ids) if token in stop), len(ids))
    return Hypothesis(ids[:end], log_prob / gnmt_penalty(end + 1, alpha), log_prob)


# ------------------------------------------------------------------------------------------------ greedy

@torch.inference_mode()
def greedy(model: Transformer, src: Tensor, max_len: Tensor, length_penalty: float = 1.0) -> list[list[Hypothesis]]:
    """Most probable token at every step. src (B, S), max_len (B,) -> B lists of one Hypothesis.

    Finished rows leave the batch, so each step costs only the sentences still decoding.
    `length_penalty` only scales the reported score, as it would for a beam of one.
    """
    step, cfg = make_step(model), model.cfg
    B, device = src.shape[0], src.device
    max_len = max_len.to(device)
    cache = prepare_cache(model, src)
    out = torch.full((B, int(max_len.max()) + 1), cfg.pad_id, dtype=torch.long, device=device)  # (B, T)
    log_prob = torch.zeros(B, device=device)
    alive = torch.arange(B, device=device)  # (N,) sentence of each row
    last = torch.full((B, 1), cfg.bos_id, dtype=torch.long, device=device)  # (N, 1)
    for t in range(out.shape[1]):
        lp = force_eos(step(last, cache), t >= max_len[alive], cfg.eos_id)  # (N, V)
        best, token = lp.max(dim=-1)  # (N,)
        out[alive, t] = token
        log_prob[alive] += best
        keep = token.ne(cfg.eos_id).nonzero().squeeze(1)  # (N',)
        if keep.numel() == 0:
            break
        if keep.numel() < alive.numel():
            cache.select(keep)
            alive, token = alive[keep], token[keep]
        last = token.unsqueeze(1)
    return [[hypothesis(ids, {cfg.eos_id, cfg.pad_id}, lp, length_penalty)]
            for ids, lp in zip(out.cpu().tolist(), log_prob.cpu().tolist())]


# -------------------------------------------------------------------------------------------------- beam

@dataclass
class Finished:
    """The best K finished hypotheses of every sentence, kept on the device."""
    tokens: Tensor     # (B, K, T) pad after the last token
    score: Tensor      # (B, K) normalised, -inf = empty slot
    log_prob: Tensor   # (B, K)

    @classmethod
    def empty(cls, B: int, K: int, T: int, pad_id: int, device: torch.device) -> Finished:
        score = torch.full((B, K), float("-inf"), device=device)
        return cls(torch.full((B, K, T), pad_id, dtype=torch.long, device=device), score, torch.zeros_like(score))

    def add(self, rows: Tensor, tokens: Tensor, score: Tensor, log_prob: Tensor) -> None:
        """Merge candidates of sentences `rows` (N,): tokens (N, C, T), score and log_prob (N, C)."""
        K = self.score.shape[1]
        score = torch.cat([self.score[rows], score], dim=1)  # (N, K + C)
        best, index = score.topk(K, dim=1)  # (N, K)
        tokens = torch.cat([self.tokens[rows], tokens], dim=1)  # (N, K + C, T)
        self.tokens[rows] = tokens.gather(1, index.unsqueeze(2).expand(-1, -1, tokens.shape[2]))
        self.score[rows] = best
        self.log_prob[rows] = torch.cat([self.log_prob[rows], log_prob], dim=1).gather(1, index)

    def count(self, rows: Tensor) -> Tensor:
        """(N,) number of finished hypotheses of sentences `rows`."""
        return self.score[rows].isfinite().sum(dim=1)


@dataclass
class Beam:
    """The active hypotheses of the N sentences still decoding."""
    sentence: Tensor   # (N,) index into the batch
    log_prob: Tensor   # (N, K) cumulative, -inf = dead slot
    tokens: Tensor     # (N, K, T) generated so far, pad after

    def keep(self, index: Tensor) -> Beam:
        return Beam(self.sentence[index], self.log_prob[index], self.tokens[index])


def expand(beam: Beam, lp: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """The 2K best one-token extensions of each sentence: lp (N, K, V) -> score, parent, token, each (N, 2K).

    Each parent has at most one EOS extension, so at least K of the 2K are not EOS.
    """
    N, K, V = lp.shape
    score, index = (beam.log_prob.unsqueeze(2) + lp).view(N, K * V).topk(2 * K, dim=1)  # (N, 2K)
    return score, index // V, index % V


def advance(beam: Beam, score: Tensor, parent: Tensor, token: Tensor, t: int, eos_id: int) -> tuple[Beam, Tensor]:
    """The K best non-EOS extensions become the new beam; also returns their cache rows (N * K,)."""
    N, K = beam.log_prob.shape
    order = token.eq(eos_id).long() * (2 * K) + torch.arange(2 * K, device=token.device)  # EOS last
    pick = order.topk(K, dim=1, largest=False).indices  # (N, K) best first
    parent, token = parent.gather(1, pick), token.gather(1, pick)
    tokens = beam.tokens.gather(1, parent.unsqueeze(2).expand(-1, -1, beam.tokens.shape[2])).clone()  # (N, K, T)
    tokens[:, :, t] = token
    rows = (torch.arange(N, device=token.device).unsqueeze(1) * K + parent).view(-1)  # (N * K,)
    return Beam(beam.sentence, score.gather(1, pick), tokens), rows


def finish(beam: Beam, finished: Finished, score: Tensor, parent: Tensor, token: Tensor,
           t: int, eos_id: int, alpha: float) -> None:
    """Move EOS extensions ranked among the K best candidates into `finished` (fairseq's rule)."""
    K = beam.log_prob.shape[1]
    score, parent, token = score[:, :K], parent[:, :K], token[:, :K]  # (N, K)
    ended = token.eq(eos_id) & score.isfinite()
    normalised = torch.where(ended, score / gnmt_penalty(t + 1, alpha), float("-inf"))
    tokens = beam.tokens.gather(1, parent.unsqueeze(2).expand(-1, -1, beam.tokens.shape[2]))  # (N, K, T)
    finished.add(beam.sentence, tokens, normalised, score)


@torch.inference_mode()
def beam_search(model: Transformer, src: Tensor, beam_size: int, length_penalty: float, n_best: int,
                max_len: Tensor) -> list[list[Hypothesis]]:
    """Batched beam search. src (B, S), max_len (B,) -> B lists of up to n_best Hypothesis, best first.

    Each step ranks the beam_size * V extensions of a sentence by summed log-probability. An EOS
    extension among the beam_size best finishes a hypothesis; the beam_size best others stay active.
    A sentence is done once it has beam_size finished hypotheses (fairseq's early stopping; unlike a
    bound on the active scores it keeps beam_size 1 exactly greedy under a length penalty) or reaches
    max_len, where every active hypothesis is ended with EOS. Done sentences leave the batch.
    """
    step, cfg, K = make_step(model), model.cfg, beam_size
    B, device = src.shape[0], src.device
    max_len = max_len.to(device)
    T = int(max_len.max()) + 1
    cache = prepare_cache(model, src, K)
    first = torch.tensor([0.0] + [float("-inf")] * (K - 1), device=device)  # one live slot: no duplicates
    beam = Beam(torch.arange(B, device=device), first.repeat(B, 1),
                torch.full((B, K, T), cfg.pad_id, dtype=torch.long, device=device))
    finished = Finished.empty(B, K, T, cfg.pad_id, device)
    last = torch.full((B * K, 1), cfg.bos_id, dtype=torch.long, device=device)  # (N * K, 1)
    for t in range(T):
        at_max = t >= max_len[beam.sentence]  # (N,)
        lp = force_eos(step(last, cache), at_max.repeat_interleave(K), cfg.eos_id)  # (N * K, V)
        score, parent, token = expand(beam, lp.view(len(at_max), K, -1))
        finish(beam, finished, score, parent, token, t, cfg.eos_id, length_penalty)
        beam, rows = advance(beam, score, parent, token, t, cfg.eos_id)
        done = at_max | finished.count(beam.sentence).ge(K) | beam.log_prob.isinf().all(dim=1)  # (N,)
        keep = (~done).nonzero().squeeze(1)  # (N',)
        if keep.numel() == 0:
            break
        beam = beam.keep(keep)
        cache.select(rows.view(-1, K)[keep].view(-1))
        last = beam.tokens[:, :, t].reshape(-1, 1)  # (N' * K, 1)
    return collect(finished, n_best, {cfg.eos_id, cfg.pad_id}, length_penalty)


def collect(finished: Finished, n_best: int, stop: set[int], alpha: float) -> list[list[Hypothesis]]:
    """The n_best finished hypotheses of each sentence as Python objects, best first."""
    tokens, scores, log_probs = (x.cpu().tolist() for x in (finished.tokens, finished.score, finished.log_prob))
    out = []
    for ids, score, log_prob in zip(tokens, scores, log_probs):
        hyps = [hypothesis(i, stop, lp, alpha) for i, s, lp in zip(ids, score, log_prob) if s != float("-inf")]
        out.append(sorted(hyps, key=lambda h: -h.score)[:n_best])
    return out


# ------------------------------------------------------------------------------------------------ search

def max_lengths(src: Tensor, cfg: DecodeConfig, pad_id: int) -> Tensor:
    """(B, S) -> (B,) floor(max_len_a * src_len + max_len_b), src_len counting non-pad tokens (EOS included).

    A source holding nothing but EOS (an empty sentence) gets 0: its translation is empty.
    """
    src_len = src.ne(pad_id).sum(dim=1)  # (B,)
    limit = (cfg.max_len_a * src_len.double() + cfg.max_len_b).floor().long().clamp(min=0)
    return torch.where(src_len > 1, limit, torch.zeros_like(limit))


@torch.inference_mode()
def search(model: Transformer, src: Tensor, cfg: DecodeConfig) -> list[list[Hypothesis]]:
    """src (B, S), each row ending with EOS -> B lists of up to cfg.n_best Hypothesis, best first.

    Greedy search for beam_size 1, beam search otherwise.
    """
    if src.shape[0] == 0:
        return []
    max_len = max_lengths(src, cfg, model.cfg.pad_id)
    if cfg.beam_size == 1:
        return greedy(model, src, max_len, cfg.length_penalty)
    return beam_search(model, src, cfg.beam_size, cfg.length_penalty, cfg.n_best, max_len)
