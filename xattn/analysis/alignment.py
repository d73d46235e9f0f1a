"""Word alignment from cross-attention (naive, shift), symmetrisation, Pharaoh I/O.

Links are sets of (i, j): source word i, target word j, 0-based, whitespace tokens of each side.
"""
from __future__ import annotations

import unicodedata
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from xattn.analysis.maps import HeadChoice, PairAttention
from xattn.errors import XattnError

Links = set[tuple[int, int]]

# ---------------------------------------------------------------------------------------- attention -> links

METHODS = ("shift", "naive")
EOS_RULES = ("drop", "keep")
PUNCT_RULES = ("free", "match")


@dataclass(frozen=True)
class AlignSettings:
    """How links are read from the cross-attention of a sentence pair.

    method: "shift" reads target word j where it is the decoder's *input* (the step after it is predicted;
      Chen et al. 2020), "naive" where it is predicted.
    threshold: link every source word with at least this weight; None: the one with the most (argmax).
    eos: "drop" leaves </s> out and renormalises each row over the words; "keep": a target word that
      looks at </s> most stays unaligned.
    punct: "free" treats punctuation like any word; "match" links punctuation only to punctuation
      (attention from a word to a punctuation sink is ignored).
    """
    choice: HeadChoice
    method: str = "shift"
    threshold: float | None = None
    eos: str = "drop"
    punct: str = "free"

    def __post_init__(self):
        for name, value, valid in (("method", self.method, METHODS), ("eos", self.eos, EOS_RULES),
                                   ("punct", self.punct, PUNCT_RULES)):
            if value not in valid:
                raise XattnError(f"--{name}: expected one of {', '.join(valid)}, got {value!r}")
        if self.threshold is not None and not 0.0 < self.threshold <= 1.0:
            raise XattnError(f"--threshold: must be in (0, 1], got {self.threshold:g}")


def word_attention(pair: PairAttention, method: str = "shift") -> np.ndarray:
    """(L, H, T_w, S_w + 1): each target word's attention over the source words and </s> (the last column).

    A target word averages the rows of its pieces (row t for the piece it predicts, naive; row t + 1, where the
    piece is the decoder's input, shift); a source word sums its pieces' columns, so rows still sum to 1.
    Linear in the weights, so a HeadChoice may select (average) layers and heads before or after.
    """
    rows = pair.cross[:, :, 1:] if method == "shift" else pair.cross[:, :, :-1]  # (L, H, n, S), n target pieces
    n_tgt, n_src = len(pair.tgt_words), len(pair.src_words)
    tgt_member = np.zeros((n_tgt, rows.shape[2]), dtype=np.float32)
    for t, w in enumerate(pair.tgt_word_of[:-1]):
        if w >= 0:
            tgt_member[w, t] = 1.0
    src_member = np.zeros((n_src + 1, rows.shape[3]), dtype=np.float32)
    for s, w in enumerate(pair.src_word_of):
        src_member[w if w >= 0 else n_src, s] = 1.0
    average = tgt_member / np.maximum(tgt_member.sum(axis=1, keepdims=True), 1.0)
    return np.einsum("wn,lhns,vs->lhwv", average, rows, src_member)


def is_punctuation(word: str) -> bool:
    return bool(word) and all(unicodedata.category(c)[0] in "PS" for c in word)


def links_from_weights(weights: np.ndarray, src_words: Sequence[str], tgt_words: Sequence[str],
                       settings: AlignSettings) -> Links:
    """(T_w, S_w + 1) word attention (word_attention) -> links (i, j) by argmax or threshold per target word."""
    n_src = len(src_words)
    allowed = np.ones_like(weights, dtype=bool)  # (T_w, S_w + 1)
    if settings.eos == "drop":
        allowed[:, n_src] = False
    if settings.punct == "match":
        src_punct = np.array([is_punctuation(w) for w in src_words] + [False])
        for j, word in enumerate(tgt_words):
            allowed[j, :n_src] = src_punct[:n_src] if is_punctuation(word) else ~src_punct[:n_src]
            if settings.eos == "keep":
                allowed[j, n_src] = True
    scores = np.where(allowed, weights, 0.0)
    links: Links = set()
    for j in range(len(tgt_words)):
        total = scores[j].sum()
        if total <= 0:
            continue
        row = scores[j] / total if settings.eos == "drop" or settings.punct == "match" else scores[j]
        chosen = np.flatnonzero(row >= settings.threshold) if settings.threshold is not None else [int(row.argmax())]
        links.update((int(i), j) for i in chosen if i < n_src)
    return links


def attention_links(pair: PairAttention, settings: AlignSettings) -> Links:
    """Word links of one sentence pair from its cross-attention."""
    weights = settings.choice.select(word_attention(pair, settings.method))
    return links_from_weights(weights, pair.src_words, pair.tgt_words, settings)


def flip(links: Links) -> Links:
    """(i, j) -> (j, i): the links of the opposite direction."""
    return {(j, i) for i, j in links}


def align_pairs(translator, sources: Sequence[str], targets: Sequence[str], settings: AlignSettings,
                max_tokens: int = 4096, progress: str | None = None) -> list[Links]:
    """Links of each given pair (whitespace-tokenised), teacher-forced in batches; `progress`: a bar label
    (shown on a terminal only)."""
    from tqdm import tqdm

    from xattn.analysis.maps import iter_teacher_forced

    settings.choice.check(translator.model.cfg.n_decoder_layers, translator.model.cfg.n_heads)
    links: list[Links] = [set() for _ in sources]
    with tqdm(total=len(sources), desc=progress, unit="pairs", disable=None if progress else True,
              leave=False) as bar:
        for i, pair in iter_teacher_forced(translator, sources, targets, ("cross",), max_tokens, bar.update):
            links[i] = attention_links(pair, settings)
    return links
