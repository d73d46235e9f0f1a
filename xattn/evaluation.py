"""Corpus-level sacreBLEU and chrF on detokenised text, each with its sacreBLEU signature."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sacrebleu.metrics import BLEU, CHRF
from sacrebleu.metrics.base import Metric

from xattn.errors import XattnError


@dataclass(frozen=True)
class Score:
    """One corpus score, e.g. Score("bleu", 35.2, "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0")."""

    name: str
    score: float
    signature: str

    def __str__(self) -> str:
        return f"{self.name} = {self.score:.2f} ({self.signature})"


def _score(name: str, metric: Metric, hyps: Sequence[str], refs: Sequence[str]) -> Score:
    if len(hyps) != len(refs):
        raise XattnError(f"{len(hyps)} hypotheses but {len(refs)} references; they must pair up line by line")
    if not hyps:
        raise XattnError("no hypotheses to score")
    result = metric.corpus_score(list(hyps), [list(refs)])
    return Score(name, float(result.score), str(metric.get_signature()))


def bleu(hyps: Sequence[str], refs: Sequence[str], lowercase: bool = False) -> Score:
    """sacreBLEU with its default 13a tokenizer; `lowercase=True` ignores case."""
    return _score("bleu_lc" if lowercase else "bleu", BLEU(lowercase=lowercase), hyps, refs)


def chrf(hyps: Sequence[str], refs: Sequence[str]) -> Score:
    """chrF2 (character 6-grams, beta 2) as sacreBLEU computes it."""
    return _score("chrf", CHRF(), hyps, refs)


def evaluate(hyps: Sequence[str], refs: Sequence[str]) -> dict[str, Score]:
    """Cased BLEU, lowercased BLEU and chrF, keyed "bleu", "bleu_lc", "chrf"."""
    scores = (bleu(hyps, refs), bleu(hyps, refs, lowercase=True), chrf(hyps, refs))
    return {s.name: s for s in scores}
