"""One token per step and row: greedy search (the argmax) and sampling (temperature, top-k, top-p), over
`copies` rows per sentence; finished rows leave the batch. See xattn/decoding/__init__.py for the shapes."""
from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

from xattn.config import DecodeConfig
from xattn.decoding.step import (Hypothesis, Steps, Tracked, finish, first_argmax, hypothesis, make_step,
                                 prepare_cache)
from xattn.model import EncoderOutput, HeadMask, Transformer
from xattn.decoding.processors import Columns, Constraints, Processor, StepState, Vocab, apply_all, constraints

Pick = Callable[[Tensor, StepState], Tensor]
"""(constrained log-probs (N, V), state) -> chosen token (N,)."""


def argmax(lp: Tensor, state: StepState) -> Tensor:
    return first_argmax(lp)


def sampler(warps: list[Processor], generator: torch.Generator) -> Pick:
    """Draw from the warped distribution (temperature, top-k, top-p)."""
    def pick(lp: Tensor, state: StepState) -> Tensor:
        probs = apply_all(warps, lp, state).softmax(dim=-1)  # (N, V)
        return torch.multinomial(probs, 1, generator=generator).squeeze(1)
    return pick


@torch.inference_mode()
def ancestral(model: Transformer, src: Tensor, max_len: Tensor, rules: Constraints, pick: Pick, *,
              copies: int = 1, prefix: Tensor | None = None, alpha: float = 1.0,
              need_attention: bool = False, enc: EncoderOutput | None = None,
              head_mask: HeadMask | None = None, vocab: Vocab | None = None,
              track: Tracked | None = None) -> Steps[list[list[Hypothesis]]]:
    """One token per step for each of `copies` rows per sentence: greedy with `argmax`, sampling with `sampler`.

    src (B, S), max_len (B,), prefix (B, P) or None -> B lists of `copies` hypotheses, one step per `next()`
    (step.Steps). Finished rows leave the batch, so each step costs only the rows still decoding. `vocab`,
    `track`: as in `search`.
    """
    cfg, device = model.cfg, src.device
    step = make_step(model, need_weights=need_attention, head_mask=head_mask, vocab=vocab, track=track)
    R = src.shape[0] * copies
    max_len = max_len.to(device).repeat_interleave(copies)  # (R,)
    prefix = prefix.repeat_interleave(copies, dim=0) if prefix is not None else None  # (R, P)
    cache = prepare_cache(model, src, copies, enc, head_mask)
    T = int(max_len.max()) + 1
    out = torch.full((R, T), cfg.pad_id, dtype=torch.long, device=device)  # (R, T)
    log_prob = torch.zeros(R, device=device)
    relaxed = torch.zeros(R, dtype=torch.bool, device=device)  # (R,) ended by the constraints' last resort
    attention: Tensor | None = None
    alive = torch.arange(R, device=device)  # (N,) row of each live hypothesis
    last = torch.full((R, 1), cfg.bos_id, dtype=torch.long, device=device)  # (N, 1)
    columns = Columns.of(vocab.ids, cfg.tgt_vocab_size) if vocab is not None else None
    sentences = alive // copies if vocab is not None else None  # (N,) the sentence of each row: a new tensor
    for t in range(T):                                          # only when rows leave (make_step keeps its mask)
        raw, attn = step(last, cache, sentences)
        state = StepState(t, out[alive, :t], max_len[alive], prefix[alive] if prefix is not None else None, columns)
        lp, exhausted = rules(raw, state)  # (N, V), (N,) or None
        if exhausted is not None:
            relaxed[alive] |= exhausted
        column = pick(lp, state)  # (N,)
        log_prob[alive] += lp.gather(1, column.unsqueeze(1)).squeeze(1)
        token = state.token(column)
        out[alive, t] = token
        if attn is not None:
            attention = attention if attention is not None else attn.new_zeros(R, T, *attn.shape[1:])
            attention[alive, t] = attn  # (R, T, L, H, S)
        ended = token.eq(cfg.eos_id).nonzero().squeeze(1)  # (N_e,)
        if ended.numel() == alive.numel():
            break
        if ended.numel():
            keep = cache.remove(ended)  # (N',) the rows kept, in their new order
            alive, token = alive[keep], token[keep]
            sentences = alive // copies if vocab is not None else None
        last = token.unsqueeze(1)
        yield raw.shape[0]
    stop = {cfg.eos_id, cfg.pad_id}
    hyps = [hypothesis(ids, stop, lp, alpha, 0.0, attention[r].cpu() if attention is not None else None, cut)
            for r, (ids, lp, cut) in enumerate(zip(out.cpu().tolist(), log_prob.cpu().tolist(), relaxed.tolist()))]
    return [hyps[b * copies:(b + 1) * copies] for b in range(src.shape[0])]


def greedy(model: Transformer, src: Tensor, max_len: Tensor, length_penalty: float = 1.0) -> list[list[Hypothesis]]:
    """Plain greedy search under the default constraints: src (B, S), max_len (B,) -> B lists of one."""
    return finish(ancestral(model, src, max_len, constraints(DecodeConfig(), model.cfg), argmax, alpha=length_penalty))
