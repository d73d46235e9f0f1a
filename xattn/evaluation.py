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


class Scorer:
    """Cased BLEU, lowercased BLEU and chrF of pairs given a chunk at a time: each metric's sufficient
    statistics (integer counts) are summed as they come, so a test set of any length is scored in bounded
    memory, with the score sacreBLEU's corpus_score gives on the whole."""

    def __init__(self, names: Sequence[str] = ("bleu", "bleu_lc", "chrf")) -> None:
        made = {"bleu": lambda: BLEU(), "bleu_lc": lambda: BLEU(lowercase=True), "chrf": lambda: CHRF()}
        self.metrics: dict[str, Metric] = {name: made[name]() for name in names}
        self.totals: dict[str, list] = {}
        self.count = 0

    def add(self, hyps: Sequence[str], refs: Sequence[str]) -> None:
        if len(hyps) != len(refs):
            raise XattnError(f"{len(hyps)} hypotheses but {len(refs)} references; they must pair up line by line")
        for name, metric in self.metrics.items():
            stats = metric._extract_corpus_statistics(list(hyps), [list(refs)])
            sums = [sum(column) for column in zip(*stats)]
            self.totals[name] = [a + b for a, b in zip(self.totals[name], sums)] if name in self.totals else sums
        self.count += len(hyps)

    def scores(self) -> dict[str, Score]:
        if not self.count:
            raise XattnError("no hypotheses to score")
        return {name: Score(name, float(metric._aggregate_and_compute([self.totals[name]]).score),
                            str(metric.get_signature())) for name, metric in self.metrics.items()}


def scored(hyps: Sequence[str], refs: Sequence[str], name: str) -> Score:
    scorer = Scorer([name])
    scorer.add(hyps, refs)
    return scorer.scores()[name]


def bleu(hyps: Sequence[str], refs: Sequence[str], lowercase: bool = False) -> Score:
    """sacreBLEU with its default 13a tokenizer; `lowercase=True` ignores case."""
    return scored(hyps, refs, "bleu_lc" if lowercase else "bleu")


def chrf(hyps: Sequence[str], refs: Sequence[str]) -> Score:
    """chrF2 (character 6-grams, beta 2) as sacreBLEU computes it."""
    return scored(hyps, refs, "chrf")


def evaluate(hyps: Sequence[str], refs: Sequence[str]) -> dict[str, Score]:
    """Cased BLEU, lowercased BLEU and chrF, keyed "bleu", "bleu_lc", "chrf"."""
    scorer = Scorer()
    scorer.add(hyps, refs)
    return scorer.scores()
