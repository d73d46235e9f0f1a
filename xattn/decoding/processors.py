"""Logit processors: small functions `(log_probs (N, V), state) -> log_probs (N, V)` that every
decoding strategy applies in the same order (STYLE.md rule 8). The constraints write into the
log-probabilities they are given (a fresh tensor each step) instead of copying N x V values.

Shapes: N rows being decoded, V target vocabulary, t tokens generated so far, P forced prefix length.
Under a shortlist (xattn/shortlist.py) a search scores only some ids: the log-probabilities then have one
column per listed id (`Columns`), and processors find an id's column with `StepState.column`.
A processor only ever lowers entries to -inf, except the sampling warpers (temperature, top-k,
top-p), which reshape the distribution a sample is drawn from and never touch search scores.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor

from xattn.config import DecodeConfig, ModelConfig

NEG_INF = float("-inf")


@dataclass(frozen=True)
class Columns:
    """The target ids a search scores, when not all of them: column j of the log-probabilities is id ids[j]."""
    ids: Tensor                     # (W,) sorted target ids
    where: Tensor                   # (V,) the column of each id; W (one past the last column) for unlisted ids

    @classmethod
    def of(cls, ids: Tensor, vocab_size: int) -> Columns:
        where = torch.full((vocab_size,), len(ids), dtype=torch.long, device=ids.device)
        return cls(ids, where.index_copy_(0, ids, torch.arange(len(ids), device=ids.device)))


@dataclass(frozen=True)
class Vocab:
    """The target ids a search may produce, when not all of them (a shortlist's, xattn/shortlist.py): the
    output projection scores `ids`, and each sentence then only the ids its own list has (`allowed`), so that
    what a sentence gets does not depend on the other sentences of its batch."""
    ids: Tensor                     # (W,) sorted target ids: every sentence's list together
    allowed: Tensor | None = None   # (B, W) bool: the ids of each sentence's list; None: all W for every one


@dataclass
class StepState:
    t: int                          # index of the token being chosen (0 = first after BOS)
    tokens: Tensor                  # (N, t) tokens chosen so far, forced prefix included
    max_len: Tensor                 # (N,) tokens allowed before EOS is forced
    prefix: Tensor | None = None    # (N, P) forced tokens, pad where a row's prefix has ended
    columns: Columns | None = None  # the ids scored, when a shortlist restricts them (None: every id)

    def column(self, ids: Tensor) -> Tensor:
        """The columns of target `ids` in this step's log-probabilities (W, past the last, for unlisted ids)."""
        return ids if self.columns is None else self.columns.where[ids]

    def column_of(self, id_: int) -> int:
        """The column of one target id (W for an unlisted one)."""
        return id_ if self.columns is None else int(self.columns.where[id_])

    def token(self, columns: Tensor) -> Tensor:
        """The target ids of log-probability `columns`."""
        return columns if self.columns is None else self.columns.ids[columns]


Processor = Callable[[Tensor, StepState], Tensor]


def forbid(ids: list[int]) -> Processor:
    """Never produce `ids` (pad and BOS)."""
    def apply(lp: Tensor, state: StepState) -> Tensor:
        columns = [c for c in map(state.column_of, ids) if c < lp.shape[1]]
        lp[:, columns] = NEG_INF
        return lp
    return apply


def min_length(n: int, eos_id: int) -> Processor:
    """No EOS before `n` tokens, unless the row has reached its maximum length (which wins)."""
    def apply(lp: Tensor, state: StepState) -> Tensor:
        if state.t < n:
            rows = state.max_len > state.t  # (N,)
            eos = state.column_of(eos_id)
            lp[:, eos] = torch.where(rows, NEG_INF, lp[:, eos])
        return lp
    return apply


def only(lp: Tensor, rows: Tensor, token: Tensor, state: StepState, values: Tensor | None = None) -> Tensor:
    """(N, V), rows (N,) bool, token (N,) ids (listed ones) -> rows that may produce nothing but their `token`,
    in place, at its log-probability in `lp` (or at `values`, (n,), one per row of `rows`)."""
    index = rows.nonzero().squeeze(1)  # (n,)
    if index.numel():
        token = state.column(token[index]).unsqueeze(1)  # (n, 1)
        kept = lp[index].gather(1, token) if values is None else values.unsqueeze(1)
        lp[index] = NEG_INF
        lp[index.unsqueeze(1), token] = kept
    return lp


def prefix_due(state: StepState, pad_id: int) -> tuple[Tensor, Tensor] | None:
    """(rows (N,) bool whose forced prefix reaches position t, the prefix tokens there (N,)); None past every
    prefix."""
    if state.prefix is None or state.t >= state.prefix.shape[1]:
        return None
    token = state.prefix[:, state.t]  # (N,)
    return token.ne(pad_id), token


def max_length(eos_id: int) -> Processor:
    """EOS, and nothing else, once a row has max_len tokens."""
    def apply(lp: Tensor, state: StepState) -> Tensor:
        rows = state.max_len <= state.t  # (N,)
        return only(lp, rows, torch.full_like(rows, eos_id, dtype=torch.long), state)
    return apply


def no_repeat_ngram(n: int) -> Processor:
    """Forbid any token that would repeat an n-gram already in the row (Paulus et al. 2018)."""
    def apply(lp: Tensor, state: StepState) -> Tensor:
        tokens = state.tokens
        if tokens.shape[1] < n:
            return lp
        grams = tokens.unfold(1, n, 1)  # (N, G, n)
        seen = grams[:, :, :-1].eq(tokens[:, -(n - 1):].unsqueeze(1)).all(dim=2) if n > 1 \
            else torch.ones(grams.shape[:2], dtype=torch.bool, device=lp.device)  # (N, G)
        V = lp.shape[1]
        banned = state.column(grams[:, :, -1]).masked_fill(~seen, V)  # (N, G), V = a spare column (unlisted ids too)
        padded = torch.cat([lp, lp.new_zeros(lp.shape[0], 1)], dim=1)  # (N, V + 1)
        return padded.scatter(1, banned, NEG_INF)[:, :V]
    return apply


# ------------------------------------------------------------------------------------- sampling warpers

def temperature(value: float) -> Processor:
    """Sharpen (< 1) or flatten (> 1) the distribution: log p / T, renormalised.

    1 / T is kept within the dtype's finite normal range, so that an extreme T (1e-300, 3.5e38) means
    "greedy" or "uniform over the allowed tokens" rather than 0 * inf = NaN.
    """
    def apply(lp: Tensor, state: StepState) -> Tensor:
        info = torch.finfo(lp.dtype)
        top = lp.max(dim=-1, keepdim=True).values  # (N, 1): the best token stays finite however sharp
        return ((lp - top) * min(max(1.0 / value, info.tiny), info.max)).log_softmax(dim=-1)
    return apply


def top_k(k: int) -> Processor:
    """Keep the k most probable tokens (Fan et al. 2018)."""
    def apply(lp: Tensor, state: StepState) -> Tensor:
        kth = lp.topk(min(k, lp.shape[1]), dim=-1).values[:, -1:]  # (N, 1)
        return lp.masked_fill(lp < kth, NEG_INF)
    return apply


def top_p(p: float) -> Processor:
    """Keep the smallest set of most probable tokens whose mass reaches p (Holtzman et al. 2020)."""
    def apply(lp: Tensor, state: StepState) -> Tensor:
        sorted_lp, order = lp.sort(dim=-1, descending=True)  # (N, V)
        before = sorted_lp.softmax(dim=-1).cumsum(dim=-1) - sorted_lp.softmax(dim=-1)  # mass of better tokens
        beyond = before >= p
        beyond[:, 0] = False  # the most probable token always stays (a p that rounds to 0 in float32)
        drop = torch.zeros_like(lp, dtype=torch.bool).scatter(1, order, beyond)
        return lp.masked_fill(drop, NEG_INF)
    return apply


@dataclass(frozen=True)
class Constraints:
    """The hard rules every strategy obeys, in the order they apply; scores are taken after these. Then a row whose
    forced prefix reaches this step produces its prefix token, at the model's log-probability, whatever the rules
    said of it: a prefix is the caller's (no_repeat_ngram_size 2 banned the second "a dog" of the prefix "a dog and
    a dog", which ended there, cut short).

    Settings that are each in range can together forbid every token of a row (no_repeat_ngram_size 1 with
    a min_len beyond what the vocabulary can fill). Such a row keeps end-of-sentence as a last resort, at
    its model log-probability, and is reported as relaxed; every strategy treats it alike. Only rule sets
    that can exhaust a row (`can_exhaust`) pay for the check.
    """
    rules: tuple[Processor, ...]
    eos_id: int
    pad_id: int
    can_exhaust: bool

    def __call__(self, raw: Tensor, state: StepState) -> tuple[Tensor, Tensor | None]:
        """raw (N, V) log-probs, overwritten -> (constrained (N, V), relaxed (N,) bool or None)."""
        column = state.column_of(self.eos_id)
        eos = raw[:, column].clone() if self.can_exhaust else None  # (N,) before any rule
        if (due := prefix_due(state, self.pad_id)) is not None:
            index = due[0].nonzero().squeeze(1)
            forced = raw[index, state.column(due[1][index])]  # (n,) their model log-probabilities, before any rule
        lp = apply_all(list(self.rules), raw, state)
        if due is not None:
            lp = only(lp, *due, state, forced)
        if eos is None:
            return lp, None
        relaxed = lp.amax(dim=1).isneginf()  # (N,) rows with nothing allowed
        if relaxed.any():
            lp[relaxed, column] = eos[relaxed].clamp(min=torch.finfo(eos.dtype).min)
        return lp, relaxed


def constraints(cfg: DecodeConfig, model: ModelConfig) -> Constraints:
    """The constraints of `cfg` for a model with `model`'s special ids."""
    out = [forbid([model.pad_id, model.bos_id])]
    if cfg.no_repeat_ngram_size:
        out.append(no_repeat_ngram(cfg.no_repeat_ngram_size))
    if cfg.min_len:
        out.append(min_length(cfg.min_len, model.eos_id))
    out.append(max_length(model.eos_id))
    return Constraints(tuple(out), model.eos_id, model.pad_id,
                       can_exhaust=bool(cfg.no_repeat_ngram_size or cfg.min_len))


def warpers(cfg: DecodeConfig) -> list[Processor]:
    """What sampling draws from, on top of the constraints: top-k, then temperature, then top-p (on the tempered
    distribution, as in Hugging Face). The k most probable tokens are the same at any temperature, so taking them
    before it draws from the same distribution; taken after, a very flat temperature rounded their log-probabilities
    into ties in float32 (from T = 1e8 all came out equal, and top-k 1 drew from the whole vocabulary)."""
    out = [top_k(cfg.top_k)] if cfg.top_k else []
    out += [temperature(cfg.temperature)] if cfg.temperature != 1.0 else []
    return out + ([top_p(cfg.top_p)] if cfg.top_p < 1.0 else [])


def apply_all(processors: list[Processor], lp: Tensor, state: StepState) -> Tensor:
    for processor in processors:
        lp = processor(lp, state)
    return lp
