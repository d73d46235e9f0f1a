"""Batched beam search with GNMT length and coverage penalties, n-best lists and attention that follows
the beam's back-pointers.

Shapes: B sentences, K beam size, N sentences still decoding, V vocabulary, T positions,
L layers, H heads, S source length. See xattn/decoding/__init__.py for lengths and scores.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from xattn.cache import filling
from xattn.config import DecodeConfig, ModelConfig
from xattn.decoding.step import Hypothesis, Steps, Tracked, gnmt_penalty, hypothesis, in_steps, make_step, prepare_cache
from xattn.errors import ParameterError
from xattn.model import EncoderOutput, HeadMask, Transformer, nearest_with_heads
from xattn.decoding.processors import NEG_INF, Columns, Constraints, StepState, Vocab


def gather_slots(x: Tensor | None, index: Tensor, rows: Tensor | None = None) -> Tensor | None:
    """x (N, K, ...), index (M, K') -> (M, K', ...): per sentence, the slots `index` (`rows`: slot_rows of it, when
    several tensors take the same slots, or when its M sentences are some of the N). Whole rows of the flattened
    (N * K, ...) are copied (index_select), quicker than an element-wise gather over rows of tokens or attention
    (benchmarks/README.md)."""
    if x is None:
        return None
    N, K = x.shape[:2]
    rows = slot_rows(index, K) if rows is None else rows
    return x.reshape(N * K, *x.shape[2:]).index_select(0, rows).view(*index.shape, *x.shape[2:])


def slot_rows(index: Tensor, k: int, sentences: Tensor | None = None) -> Tensor:
    """index (M, K') of slots among `k` per sentence -> (M * K',) their rows in the flattened (N * k, ...): of
    sentences 0..M-1, or of `sentences` (M,)."""
    if sentences is None:
        sentences = torch.arange(index.shape[0], device=index.device)
    return (sentences.unsqueeze(1) * k + index).view(-1)


@dataclass
class Beam:
    """The active hypotheses of the N sentences still decoding. While a sentence's greedy path is active it
    holds slot 0, so the search always finishes the greedy hypothesis and never returns a worse one."""
    sentence: Tensor                # (N,) index into the batch
    log_prob: Tensor                # (N, K) cumulative, -inf = dead slot
    tokens: Tensor                  # (N, K, T) generated so far, pad after
    coverage: Tensor | None         # (N, K, S) attention mass per source token, with a coverage penalty
    greedy: Tensor                  # (N,) bool: slot 0 is the greedy path, still active

    def keep(self, index: Tensor) -> Beam:
        pick = lambda x: x[index] if x is not None else None  # noqa: E731
        return Beam(self.sentence[index], self.log_prob[index], self.tokens[index], pick(self.coverage),
                    self.greedy[index])

    def stepped(self, cover: Tensor | None) -> Beam:
        """The same slots with this step's attention mass (N, K, S) added to the coverage: what both the finished
        and the continuing children of a step extend (made once a step)."""
        coverage = self.coverage + cover if self.coverage is not None else None
        return Beam(self.sentence, self.log_prob, self.tokens, coverage, self.greedy)

    def extend(self, parent: Tensor, token: Tensor, log_prob: Tensor, t: int, greedy: Tensor,
               sentences: Tensor | None = None) -> Beam:
        """Children of slots `parent` (N, C) adding `token` at position t (of a `stepped` beam: the coverage
        already holds this step's); with `sentences` (M,), of those sentences only (parent (M, C))."""
        rows = slot_rows(parent, self.log_prob.shape[1], sentences)
        tokens = gather_slots(self.tokens, parent, rows)  # a new tensor
        tokens[:, :, t] = token
        sentence = self.sentence if sentences is None else self.sentence[sentences]
        return Beam(sentence, log_prob, tokens, gather_slots(self.coverage, parent, rows), greedy)


def in_parents_slots(pick: Tensor, parent: Tensor) -> Tensor:
    """pick (N, K): the candidates kept, by rank; parent (N, C): every candidate's parent slot -> the same
    candidates by slot: each parent's first child by rank takes its parent's slot, the other children the slots of
    parents left without a child, by rank. The beam holds the same hypotheses as in rank order, but most of them
    in their parents' rows, which the cache then need not copy (DecoderCache.select; benchmarks/README.md). The
    greedy path's continuation, first by rank and a child of slot 0, stays in slot 0."""
    parents = parent.gather(1, pick)  # (N, K)
    later = parents.unsqueeze(2).eq(parents.unsqueeze(1)).tril(diagonal=-1).any(dim=2)  # (N, K) a sibling ranks above
    childless = torch.ones_like(later).scatter_(1, parents, False)  # (N, K) slots no kept candidate descends from
    free = (~childless).long().argsort(dim=1, stable=True)  # those slots first, in order
    slot = torch.where(later, free.gather(1, (later.long().cumsum(dim=1) - 1).clamp(min=0)), parents)
    return torch.empty_like(pick).scatter_(1, slot, pick)


@dataclass
class Finished:
    """The best K finished hypotheses of every sentence, kept on the device."""
    tokens: Tensor                  # (B, K, T) pad after the last token
    score: Tensor                   # (B, K) ranking score, -inf = empty slot
    log_prob: Tensor                # (B, K)
    penalty: Tensor                 # (B, K) coverage penalty included in the score
    relaxed: Tensor                 # (B, K) bool: ended by the constraints' last resort
    end: Tensor | None              # (B, K) with tracked attention: the step at which each hypothesis ended, and
    slot: Tensor | None             # (B, K) the slot it ended from then (its attention: Trail.trace)

    def add(self, candidates: Beam, score: Tensor, penalty: Tensor, relaxed: Tensor, slot: Tensor, t: int) -> None:
        """Merge finished candidates (their sentences' rows of `candidates`, which ended at step t from the slots
        `slot`) ranked by score (N, C); on equal scores the ones kept already come first."""
        rows, K = candidates.sentence, self.score.shape[1]
        merged = torch.cat([self.score[rows], score], dim=1)  # (N, K + C)
        index = merged.sort(dim=1, descending=True, stable=True).indices[:, :K]  # (N, K)
        self.score[rows] = merged.gather(1, index)
        self.log_prob[rows] = torch.cat([self.log_prob[rows], candidates.log_prob], 1).gather(1, index)
        self.penalty[rows] = torch.cat([self.penalty[rows], penalty], 1).gather(1, index)
        self.relaxed[rows] = torch.cat([self.relaxed[rows], relaxed], 1).gather(1, index)
        self.tokens[rows] = gather_slots(torch.cat([self.tokens[rows], candidates.tokens], 1), index)
        if self.end is not None:
            self.end[rows] = torch.cat([self.end[rows], torch.full_like(slot, t)], 1).gather(1, index)
            self.slot[rows] = torch.cat([self.slot[rows], slot], 1).gather(1, index)

    def kth(self, rows: Tensor, k: int) -> Tensor:
        """(N,) the k-th best kept score of sentences `rows` (-inf while fewer than k have finished)."""
        return self.score[rows].topk(k, dim=1).values[:, -1]

    def count(self, rows: Tensor) -> Tensor:
        """(N,) number of finished hypotheses of sentences `rows`."""
        return self.score[rows].isfinite().sum(dim=1)


@dataclass
class Trail:
    """The tracked cross-attention of a search, a step at a time: each slot's attention at step t and the slot at
    step t - 1 it extends. A hypothesis' attention is read once, at the end, by following its parents back
    (`trace`): copying every slot's whole history at each step instead cost a time growing with the square of the
    steps, which long inputs felt (benchmarks/README.md, Decoding speed against an earlier version)."""
    attention: Tensor               # (B, K, T, L, H, S): step t's of slot k of sentence b
    parent: Tensor                  # (B, K, T): the slot at step t - 1 that slot k at step t extends (t >= 1)

    def trace(self, sentence: Tensor, slot: Tensor, end: Tensor) -> Tensor:
        """sentence, slot, end (M,): hypotheses that ended at step `end` from `slot` -> (M, T, L, H, S) their
        attention at each step (zeros past their end)."""
        out = self.attention.new_zeros(sentence.shape[0], *self.attention.shape[2:])
        for t in range(int(end.max()), -1, -1):  # slot (M,): each one's at step t, where it has got that far
            live = end >= t
            out[live, t] = self.attention[sentence[live], slot[live], t]
            slot = torch.where(live, self.parent[sentence, slot, t], slot)
        return out


CHUNK = 32  # vocabulary entries per chunk in best_extensions


def best_extensions(lp: Tensor, log_prob: Tensor, n: int) -> tuple[Tensor, Tensor, Tensor]:
    """lp (N * K, V) next-token log-probs, log_prob (N, K) -> the n best extensions of each sentence
    by summed log-probability: score, parent slot and token, each (N, n), best first.

    Equal to a top-n over all K * V sums, in fewer passes over the vocabulary: every row is cut into
    chunks of CHUNK entries, and only the n chunks with the largest maxima can hold a row's n best
    entries (a chunk outside them has a maximum no larger than the n-th best), so one max per chunk
    and a top-n over those few chunks replace a top-n over V. Ties may resolve to other indices.
    """
    R, V = lp.shape
    N, K = log_prob.shape
    main = V - V % CHUNK
    if main < 4 * n * CHUNK:  # a small vocabulary: every entry is a candidate
        candidates, ids = lp, torch.arange(V, device=lp.device).expand(R, V)
    else:
        chunks = lp[:, :main].view(R, main // CHUNK, CHUNK)
        best = chunks.amax(dim=2).topk(n, dim=1).indices  # (R, n) chunks holding the row's n best
        candidates = chunks.gather(1, best.unsqueeze(2).expand(-1, -1, CHUNK)).flatten(1)  # (R, n * CHUNK)
        ids = (best.unsqueeze(2) * CHUNK + torch.arange(CHUNK, device=lp.device)).flatten(1)
        if main < V:  # the last, shorter chunk always takes part
            candidates = torch.cat([candidates, lp[:, main:]], dim=1)
            ids = torch.cat([ids, torch.arange(main, V, device=lp.device).expand(R, -1)], dim=1)
    M = candidates.shape[1]
    score, index = (log_prob.view(R, 1) + candidates).view(N, K * M).topk(n, dim=1)  # (N, n)
    return score, index // M, ids.reshape(N, K * M).gather(1, index)


def coverage_penalty(coverage: Tensor, src_mask: Tensor, beta: float) -> Tensor:
    """coverage (N, C, S), src_mask (N, S) -> (N, C): beta * sum over source tokens of log(min(mass, 1))."""
    mass = coverage.clamp(min=1e-10, max=1.0).log() * src_mask.unsqueeze(1)
    return beta * mass.sum(dim=-1)


def coverage_reading(cfg: ModelConfig, head_mask: HeadMask | None = None) -> tuple[int, Tensor | None]:
    """The decoder layer whose cross-attention the coverage penalty reads, the last one with heads (a pruned
    model's last layer may have none), and how its heads weigh in its mean (None: alike). A head that `head_mask`
    switches off (0) is left out as a pruned one is, since the translation no longer uses it (a layer whose every head
    it switches off gives way as a pruned layer does), so a mask and the model pruned by it score alike; a head it
    scales weighs by its factor."""
    factors = (head_mask or {}).get("cross") or [None] * cfg.n_decoder_layers
    heads = [h if f is None else int((f > 0).sum()) for h, f in zip(cfg.heads_per_layer("cross"), factors)]
    layer = nearest_with_heads(heads, cfg.n_decoder_layers - 1)
    if layer is None:
        raise ParameterError("coverage_penalty", "every cross-attention head of this model was pruned, or is masked "
                             "to 0, so there is no coverage to penalise; leave it at 0")
    if (f := factors[layer]) is None:
        return layer, None
    weights = torch.zeros(max(cfg.heads_per_layer("cross")))  # (H,): a head the layer lacks weighs nothing
    weights[:f.numel()] = f.detach().float().cpu().clamp(min=0)  # (Transformer.encode takes any finite factor)
    return layer, weights / weights.sum()


def start(model: Transformer, src: Tensor, K: int, T: int, *, track: bool, cover: bool,
          tracked: Tracked | None = None) -> tuple[Beam, Finished, Trail | None]:
    B, device, pad = src.shape[0], src.device, model.cfg.pad_id
    first = torch.tensor([0.0] + [NEG_INF] * (K - 1), device=device)  # one live slot: no duplicates
    L, H = model.cfg.n_decoder_layers, max(model.cfg.heads_per_layer("cross"))  # H: as model.stack_layers
    if tracked is not None:  # one layer's heads' mean
        L, H = 1, 1
    coverage = torch.zeros(B, K, src.shape[1], device=device) if cover else None
    tokens = torch.full((B, K, T), pad, dtype=torch.long, device=device)
    greedy = torch.ones(B, dtype=torch.bool, device=device)
    beam = Beam(torch.arange(B, device=device), first.repeat(B, 1), tokens, coverage, greedy)
    end = torch.zeros(B, K, dtype=torch.long, device=device) if track else None  # (and slot: alike)
    finished = Finished(tokens.clone(), torch.full((B, K), NEG_INF, device=device), torch.zeros(B, K, device=device),
                        torch.zeros(B, K, device=device), torch.zeros(B, K, dtype=torch.bool, device=device),
                        end, None if end is None else end.clone())
    trail = Trail(torch.zeros(B, K, T, L, H, src.shape[1], device=device),
                  torch.zeros(B, K, T, dtype=torch.long, device=device)) if track else None
    return beam, finished, trail


@dataclass
class Candidates:
    """A step's extensions of each sentence's beam, best first: the 2K best by summed log-probability, then
    the greedy path's own extension when it is not among them."""
    score: Tensor                   # (N, C) summed log-probability
    parent: Tensor                  # (N, C) slot extended
    token: Tensor                   # (N, C)
    greedy: Tensor                  # (N, C) bool: the greedy path's extension (at most one per sentence)
    listed: Tensor                  # (N, C) bool: a real candidate (the extra column only when needed)


def candidates(lp: Tensor, beam: Beam, K: int, state: StepState) -> Candidates:
    """lp (N * K, V) constrained next-token log-probs -> the candidates of this step."""
    N, V = beam.log_prob.shape[0], lp.shape[1]
    score, parent, column = best_extensions(lp, beam.log_prob, 2 * K)  # (N, 2K) each
    g_lp, g_column = lp.view(N, K, V)[:, 0].max(dim=1)  # (N,): the greedy path's best next token
    token, g_token = state.token(column), state.token(g_column)  # ids (a shortlist's columns are not)
    is_greedy = beam.greedy.unsqueeze(1) & parent.eq(0) & token.eq(g_token.unsqueeze(1))  # (N, 2K)
    missing = beam.greedy & ~is_greedy.any(dim=1)  # (N,) its extension ranks below the 2K best
    return Candidates(torch.cat([score, (beam.log_prob[:, 0] + g_lp).unsqueeze(1)], dim=1),
                      torch.cat([parent, torch.zeros_like(parent[:, :1])], dim=1),
                      torch.cat([token, g_token.unsqueeze(1)], dim=1),
                      torch.cat([is_greedy, missing.unsqueeze(1)], dim=1),
                      torch.cat([torch.ones_like(is_greedy), missing.unsqueeze(1)], dim=1))


@torch.inference_mode()
def beam_search(model: Transformer, src: Tensor, cfg: DecodeConfig, max_len: Tensor, rules: Constraints, *,
                prefix: Tensor | None = None, need_attention: bool = False, enc: EncoderOutput | None = None,
                head_mask: HeadMask | None = None, vocab: Vocab | None = None,
                track: Tracked | None = None) -> Steps[list[list[Hypothesis]]]:
    """src (B, S), max_len (B,) -> B lists of up to cfg.n_best hypotheses, best first, one step per `next()`
    (step.Steps).

    Each step ranks the K * V extensions of a sentence by summed log-probability. An EOS extension
    among the K best finishes a hypothesis; the K best others stay active. The greedy path keeps
    slot 0 while active, and its EOS always finishes it, so the best hypothesis returned scores at
    least as well as greedy search. A sentence is done when its stopping rule says so (stopped);
    at max_len every active hypothesis ends with EOS. Done sentences leave the batch. `vocab`, `track`: as in
    `search`.
    """
    K, alpha, beta, eos = cfg.beam_size, cfg.length_penalty, cfg.coverage_penalty, model.cfg.eos_id
    device, max_len = src.device, max_len.to(src.device)
    T = int(max_len.max()) + 1
    step = make_step(model, need_weights=need_attention or beta > 0, head_mask=head_mask, vocab=vocab,
                     track=track if beta == 0 else None)
    cache = prepare_cache(model, src, enc=enc, head_mask=head_mask)  # one row per sentence for the first step, where all K are alike
    src_mask = src.ne(model.cfg.pad_id)  # (B, S)
    beam, finished, trail = start(model, src, K, T, track=need_attention, cover=beta > 0, tracked=track)
    read, weights = coverage_reading(model.cfg, head_mask) if beta > 0 else (None, None)
    weights = weights.to(device).view(1, 1, -1, 1) if weights is not None else None  # (1, 1, H, 1)
    last = torch.full((src.shape[0], 1), model.cfg.bos_id, dtype=torch.long, device=device)  # (B, 1), then (N * K, 1)
    columns = Columns.of(vocab.ids, model.cfg.tgt_vocab_size) if vocab is not None else None
    for t in range(T):
        N = beam.sentence.shape[0]
        raw, attn = step(last, cache, beam.sentence if vocab is not None else None)  # (one row per sentence at t 0)
        if t == 0:  # now give each sentence its K rows
            cache.expand(K, grouped=True)
            raw = raw.repeat_interleave(K, dim=0)
            attn = attn.repeat_interleave(K, dim=0) if attn is not None else None
        rows = beam.sentence.repeat_interleave(K)  # (N * K,)
        state = StepState(t, beam.tokens[:, :, :t].reshape(N * K, t), max_len[rows],
                          prefix[rows] if prefix is not None else None, columns)
        lp, exhausted = rules(raw, state)  # (N * K, V), (N * K,) or None
        attn = attn.view(N, K, *attn.shape[1:]) if attn is not None else None  # (N, K, L, H, S)
        cover = None if beta == 0 else attn[:, :, read].nanmean(dim=2) if weights is None else \
            (attn[:, :, read] * weights).nansum(dim=2)  # (N, K, S); NaN: heads the layer lacks
        if beta > 0 and track is not None:  # the step returned every layer, for the coverage
            attn = track.mean(attn[:, :, track.layer])  # (N, K, 1, 1, S)
        c = candidates(lp, beam, K, state)  # (N, C) each
        is_eos = c.token.eq(eos)
        ended = is_eos & c.score.isfinite() & c.listed
        ended[:, K:2 * K] = False  # an EOS finishes a hypothesis only when it ranks among the K best
        ended |= is_eos & c.greedy  # or ends the greedy path
        if trail is not None:
            trail.attention[beam.sentence, :, t] = attn
        stepped = beam.stepped(cover)
        if ended.any():
            finish_ended(finished, stepped, c, ended, exhausted=exhausted, t=t, alpha=alpha, beta=beta,
                         src_mask=src_mask)
        beam, parent = going_on(stepped, c, is_eos, K, t)
        if trail is not None and t + 1 < T:
            trail.parent[beam.sentence, :, t + 1] = parent
        done = (max_len[beam.sentence] <= t) | beam.log_prob.isinf().all(dim=1) | stopped(beam, finished, cfg, max_len)
        keep = filling(done)  # (N',) the sentences that go on, those that move last
        if keep.numel() == 0:
            break
        cache.select((keep.unsqueeze(1) * K + parent[keep]).view(-1))
        beam = beam.keep(keep)
        last = beam.tokens[:, :, t].reshape(-1, 1)  # (N' * K, 1)
        yield N * K
    return collect(finished, cfg.n_best, {eos, model.cfg.pad_id}, alpha, trail)


def going_on(stepped: Beam, c: Candidates, is_eos: Tensor, K: int, t: int) -> tuple[Beam, Tensor]:
    """The beam after step t: the K candidates (N, C) that go on, in their parents' slots where they can
    (in_parents_slots), and their parents (N, K). Their order: the greedy path's continuation (in slot 0), the others
    best first, EOS and unlisted candidates last."""
    C = c.score.shape[1]
    order = torch.arange(C, device=c.score.device) + (is_eos | ~c.listed).long() * C
    order = order.masked_fill(c.greedy & ~is_eos, -1)
    pick = in_parents_slots(order.topk(K, dim=1, largest=False).indices, c.parent)  # (N, K)
    greedy = (c.greedy & ~is_eos).any(dim=1)  # (N,) the greedy path goes on, in slot 0
    parent = c.parent.gather(1, pick)  # (N, K)
    return stepped.extend(parent, c.token.gather(1, pick), c.score.gather(1, pick), t, greedy), parent


def finish_ended(finished: Finished, stepped: Beam, c: Candidates, ended: Tensor, *, exhausted: Tensor | None,
                 t: int, alpha: float, beta: float, src_mask: Tensor) -> None:
    """Add the candidates `ended` (N, C) at step t to `finished`, scored with the length and coverage penalties.
    Only the sentences where one ended take part: for the others `add` would change nothing, at the cost of
    copying their tokens all the same."""
    some = ended.any(dim=1).nonzero().squeeze(1)  # (M,)
    N, K = stepped.log_prob.shape
    parent, score = c.parent[some], c.score[some]
    done = stepped.extend(parent, c.token[some], score, t, stepped.greedy[some], sentences=some)
    cp = coverage_penalty(done.coverage, src_mask[done.sentence], beta) if beta > 0 else torch.zeros_like(score)
    cut = exhausted.view(N, K)[some].gather(1, parent) if exhausted is not None else torch.zeros_like(ended[some])
    finished.add(done, torch.where(ended[some], score / gnmt_penalty(t + 1, alpha) + cp, NEG_INF), cp, cut, parent, t)


def stopped(beam: Beam, finished: Finished, cfg: DecodeConfig, max_len: Tensor) -> Tensor:
    """(N,) sentences whose search is over.

    exact: no active hypothesis can still beat the n_best-th finished one. A hypothesis' log-probability
    only falls as it grows and the coverage penalty is at most 0, so its score can reach at most
    log p / lp(longest), the length penalty growing with length (alpha >= 0). The first hypothesis is
    then final, whatever n_best. early: beam_size hypotheses have finished.
    """
    if cfg.stopping == "early":
        return finished.count(beam.sentence).ge(cfg.beam_size)
    longest = max_len[beam.sentence] + 1  # (N,) tokens of the longest hypothesis, EOS included
    bound = beam.log_prob.max(dim=1).values / gnmt_penalty(longest, cfg.length_penalty)  # (N,)
    return bound <= finished.kth(beam.sentence, cfg.n_best)


def collect(finished: Finished, n_best: int, stop: set[int], alpha: float,
            trail: Trail | None = None) -> list[list[Hypothesis]]:
    """The n_best finished hypotheses of each sentence as Python objects, best first (with `trail`, each with its
    cross-attention, traced for the hypotheses returned only)."""
    tokens, scores, log_probs, penalties, relaxed = (x.cpu().tolist() for x in (
        finished.tokens, finished.score, finished.log_prob, finished.penalty, finished.relaxed))
    out, returned = [], []
    for b, row in enumerate(zip(tokens, scores, log_probs, penalties, relaxed)):
        slots = [(hypothesis(i, stop, lp, alpha, cp, None, cut), k)
                 for k, (i, s, lp, cp, cut) in enumerate(zip(*row)) if s != NEG_INF]
        kept = sorted(slots, key=lambda slot: -slot[0].score)[:n_best]
        returned += [(b, k, hyp) for hyp, k in kept]
        out.append([hyp for hyp, _ in kept])
    if trail is not None and returned:
        device = finished.score.device
        b, k = torch.tensor([b for b, _, _ in returned], device=device), torch.tensor([k for _, k, _ in returned],
                                                                                       device=device)
        attention = trail.trace(b, finished.slot[b, k], finished.end[b, k]).cpu()  # (M, T, L, H, S)
        for m, (_, _, hyp) in enumerate(returned):
            hyp.cross_attention = in_steps(attention[m], len(hyp.tokens) + 1)
    return out
