"""Word alignments: symmetrisation, and links read from cross-attention (naive, shift).

A link (i, j) joins source word i and target word j, both 0-based; an alignment is a `set[tuple[int, int]]`
(xattn.links, which reads and writes the Pharaoh format).
"""
from __future__ import annotations

import unicodedata
from dataclasses import dataclass
from typing import Sequence

import numpy as np
from tqdm import tqdm

from xattn.analysis.maps import HeadChoice, PairAttention, iter_teacher_forced
from xattn.errors import ParameterError, XattnError
from xattn.links import Links, format_links, parse_alignments, parse_links, read_alignments  # noqa: F401 (re-exported)

# ------------------------------------------------------------------------------------------- symmetrisation

SYMMETRISATIONS = ("intersect", "union", "grow-diag", "grow-diag-final", "grow-diag-final-and")
# The order matters (see `symmetrise`): left, up, right, down, then the diagonals; (di, dj) in (source, target).
NEIGHBOURS = ((-1, 0), (0, -1), (1, 0), (0, 1), (-1, -1), (-1, 1), (1, -1), (1, 1))


def symmetrise(forward: Links, backward: Links, method: str, src_len: int, tgt_len: int) -> Links:
    """Combine a source->target (`forward`) and a target->source (`backward`) alignment, both as (i, j) links.

    The heuristics of Koehn et al. (2003) as the Moses manual writes them, with i = source, j = target:
      intersect  forward ∩ backward;  union  forward ∪ backward.
      grow-diag  start from the intersection A. Sweep: for i = 0..src_len-1, for j = 0..tgt_len-1, if (i, j)
                 is in A (points added earlier in the same sweep count), visit its neighbours (i+di, j+dj) in
                 the order of NEIGHBOURS; add a neighbour to A at once if it is in the union and its source
                 word or its target word is not yet aligned in A. Repeat sweeps until one adds nothing.
      grow-diag-final  grow-diag, then FINAL(forward), then FINAL(backward), where FINAL(X): for the links
                 (i, j) of X in sorted order, add (i, j) to A at once if word i or word j is not yet aligned.
      grow-diag-final-and  the same, except that FINAL adds (i, j) only if both words are unaligned.
    Adding at once makes the result depend on these orders; they are fixed, so the result is deterministic.
    Moses' symal program visits points and directions in orders of its own, so its output may differ on a
    few points. intersect, union and grow-diag are symmetric in `forward` and `backward`; the FINAL
    variants are not. Links outside src_len x tgt_len are an error.
    """
    if method not in SYMMETRISATIONS:
        raise XattnError(f"unknown symmetrisation {method!r}; choose one of {', '.join(SYMMETRISATIONS)}")
    for name, links in (("forward", forward), ("backward", backward)):
        bad = [(i, j) for i, j in links if not (0 <= i < src_len and 0 <= j < tgt_len)]
        if bad:
            raise XattnError(f"{name} alignment: link {min(bad)} is outside a {src_len}x{tgt_len} sentence pair")
    if method == "intersect":
        return set(forward) & set(backward)
    if method == "union":
        return set(forward) | set(backward)
    grid = _Grid(set(forward) & set(backward))
    grid.grow_diag(set(forward) | set(backward), src_len, tgt_len)
    if method != "grow-diag":
        for links in (forward, backward):
            grid.final(links, both_unaligned=method == "grow-diag-final-and")
    return grid.links


class _Grid:
    """An alignment being grown, with the words it aligns on each side."""

    def __init__(self, links: Links):
        self.links = set(links)
        self.src = {i for i, _ in links}
        self.tgt = {j for _, j in links}

    def add(self, i: int, j: int) -> None:
        self.links.add((i, j))
        self.src.add(i)
        self.tgt.add(j)

    def grow_diag(self, union: Links, src_len: int, tgt_len: int) -> None:
        added = True
        while added:
            added = False
            for i in range(src_len):
                for j in range(tgt_len):
                    if (i, j) not in self.links:
                        continue
                    for di, dj in NEIGHBOURS:
                        n = (i + di, j + dj)
                        if n in union and n not in self.links and (n[0] not in self.src or n[1] not in self.tgt):
                            self.add(*n)
                            added = True

    def final(self, links: Links, both_unaligned: bool) -> None:
        for i, j in sorted(links):
            free_i, free_j = i not in self.src, j not in self.tgt
            if (free_i and free_j) if both_unaligned else (free_i or free_j):
                self.add(i, j)


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
                raise ParameterError(name, f"expected one of {', '.join(valid)}, got {value!r}")
        if self.threshold is not None and not 0.0 < self.threshold <= 1.0:
            raise ParameterError("threshold", f"must be in (0, 1], got {self.threshold:g}")


def word_attention(pair: PairAttention, method: str = "shift", choice: HeadChoice | None = None) -> np.ndarray:
    """(L, H, T_w, S_w + 1): each target word's attention over the source words and </s> (the last column);
    (T_w, S_w + 1) for one `choice` of layer and heads.

    A target word averages the rows of its pieces (row t for the piece it predicts, naive; row t + 1, where the
    piece is the decoder's input, shift); a source word sums its pieces' columns, so rows still sum to 1.
    Linear in the weights, so choosing (averaging) layers and heads before or after gives the same.
    """
    weights = pair.cross if choice is None else choice.select(pair.cross)  # (L, H, T, S) or (T, S)
    rows = weights[..., 1:, :] if method == "shift" else weights[..., :-1, :]  # (..., n, S), n target pieces
    n_tgt, n_src = len(pair.tgt_words), len(pair.src_words)
    tgt_member = np.zeros((n_tgt, rows.shape[-2]), dtype=np.float32)
    for t, w in enumerate(pair.tgt_word_of[:-1]):
        if w >= 0:
            tgt_member[w, t] = 1.0
    src_member = np.zeros((n_src + 1, rows.shape[-1]), dtype=np.float32)
    for s, w in enumerate(pair.src_word_of):
        src_member[w if w >= 0 else n_src, s] = 1.0
    average = tgt_member / np.maximum(tgt_member.sum(axis=1, keepdims=True), 1.0)
    return average @ rows @ src_member.T  # (..., T_w, S_w + 1)


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
    total = scores.sum(axis=1, keepdims=True)  # (T_w, 1)
    live = total[:, 0] > 0  # target words with some allowed mass
    if settings.eos == "drop" or settings.punct == "match":  # the allowed mass, renormalised
        scores = scores / np.where(total > 0, total, 1.0)
    if settings.threshold is None:
        tgt = np.flatnonzero(live)
        src = scores[tgt].argmax(axis=1)
    else:
        tgt, src = np.nonzero((scores >= settings.threshold) & live[:, None])
    return {(int(i), int(j)) for i, j in zip(src.tolist(), tgt.tolist()) if i < n_src}


def attention_links(pair: PairAttention, settings: AlignSettings) -> Links:
    """Word links of one sentence pair from its cross-attention."""
    weights = word_attention(pair, settings.method, settings.choice)  # (T_w, S_w + 1)
    return links_from_weights(weights, pair.src_words, pair.tgt_words, settings)


def flip(links: Links) -> Links:
    """(i, j) -> (j, i): the links of the opposite direction."""
    return {(j, i) for i, j in links}


def align_pairs(translator, sources: Sequence[str], targets: Sequence[str], settings: AlignSettings,
                max_tokens: int = 4096, progress: str | None = None) -> list[Links]:
    """Links of each given pair (words as xattn.words splits them), teacher-forced in batches; `progress`: a bar label
    (shown on a terminal only)."""
    settings.choice.check(translator.model.cfg.heads_per_layer("cross"), "cross-attention")
    links: list[Links] = [set() for _ in sources]
    with tqdm(total=len(sources), desc=progress, unit="pairs", disable=None if progress else True,
              leave=False) as bar:
        for i, pair in iter_teacher_forced(translator, sources, targets, ("cross",), max_tokens, bar.update):
            links[i] = attention_links(pair, settings)
    return links
