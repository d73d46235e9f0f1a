"""Alignment quality against gold sure/possible links: precision, recall and AER (Och & Ney 2003)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from xattn.analysis.alignment import Links
from xattn.errors import XattnError


@dataclass(frozen=True)
class AERScore:
    """Corpus-level scores as fractions in [0, 1], and the link counts they come from.

    n_links = |A| (hypothesis), n_sure = |S|, n_possible = |P| (sure links included), summed over sentences.
    """
    precision: float
    recall: float
    aer: float
    n_links: int
    n_sure: int
    n_possible: int


def score(hyps: Sequence[Links], golds: Sequence[tuple[Links, Links]]) -> AERScore:
    """Hypothesis links A against gold (sure S, possible P) per sentence, pooled over the corpus:

        precision = |A∩P| / |A|,   recall = |A∩S| / |S|,   AER = 1 - (|A∩S| + |A∩P|) / (|A| + |S|),

    where P counts the sure links too (P := P ∪ S, whether or not the gold's possible set held them).
    Empty sets, by convention: with no hypothesis links precision is 1 (no wrong link was proposed), with
    no sure links recall is 1 (none was missed), and with neither AER is 0.
    """
    if len(hyps) != len(golds):
        raise XattnError(f"{len(hyps)} hypothesis alignments but {len(golds)} gold alignments")
    n_a = n_s = n_p = a_s = a_p = 0
    for a, (sure, possible) in zip(hyps, golds):
        a, sure = set(a), set(sure)
        possible = set(possible) | sure
        n_a, n_s, n_p = n_a + len(a), n_s + len(sure), n_p + len(possible)
        a_s, a_p = a_s + len(a & sure), a_p + len(a & possible)
    return AERScore(precision=a_p / n_a if n_a else 1.0, recall=a_s / n_s if n_s else 1.0,
                    aer=1 - (a_s + a_p) / (n_a + n_s) if n_a + n_s else 0.0,
                    n_links=n_a, n_sure=n_s, n_possible=n_p)
