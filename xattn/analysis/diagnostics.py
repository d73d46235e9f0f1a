"""What a translation's cross-attention says about it: source coverage, entropy, mass on </s>, and flags.

Per sentence, from one layer's heads (the stored alignment choice by default), over every decoding step
(every target piece and the final </s>):
- coverage of source word i: the attention mass it receives, summed over the steps and over its pieces;
- entropy: the mean over steps of each step's attention entropy over the source positions (nats);
- eos_mass: the mean over steps of the weight on the source </s>;
- flags: `under` (a source word, not punctuation, covered less than `under`), `over` (a source word covered
  more than `over`), `detached` (more than a share `detached` of the target words look at </s> most).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import ClassVar

import numpy as np

from xattn.analysis.alignment import is_punctuation, word_attention
from xattn.analysis.maps import HeadChoice, PairAttention
from xattn.checks import FRACTION, NON_NEGATIVE, Check, ConfigError, validate


@dataclass(frozen=True)
class Thresholds:
    """When a sentence is flagged. Defaults fixed on Multi30k val 2016 de->en (benchmarks/diagnostics.py)."""
    under: float = 0.2      # coverage below this: the word may be left untranslated
    over: float = 4.0       # coverage above this: the word may be translated repeatedly
    detached: float = 0.5   # share of target words attending </s> most: output detached from the source

    CHECKS: ClassVar[dict[str, Check]] = dict(under=NON_NEGATIVE, over=NON_NEGATIVE, detached=FRACTION)
    # (detached: a share above it is flagged, so one of 1 or more would flag nothing, silently)

    def __post_init__(self) -> None:
        validate(self, "")
        if self.under >= self.over:  # (every word between them flagged both ways)
            raise ConfigError("under", f"{self.under:g} is not below the over threshold ({self.over:g}): a word "
                              "is flagged as covered too little below one and too much above the other")


@dataclass
class Diagnosis:
    coverage: list[float]             # per source word
    least_covered: str | None
    most_covered: str | None
    entropy: float                    # nats, mean over decoding steps
    eos_mass: float                   # mean over decoding steps
    eos_share: float                  # share of target words whose strongest source position is </s>
    flags: list[str]                  # of "under", "over", "detached"

    def to_dict(self) -> dict:
        return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in asdict(self).items()} | \
               {"coverage": [round(c, 4) for c in self.coverage]}


def diagnose(pair: PairAttention, choice: HeadChoice, thresholds: Thresholds = Thresholds()) -> Diagnosis:
    """The diagnosis of one pair from its cross-attention at `choice`."""
    weights = choice.select(pair.cross)  # (T, S): every decoding step over the source pieces + </s>
    n_src = len(pair.src_words)
    member = np.zeros((n_src, weights.shape[1]), dtype=np.float32)
    for s, w in enumerate(pair.src_word_of):
        if w >= 0:
            member[w, s] = 1.0
    coverage = (weights @ member.T).sum(axis=0)  # (S_w,)
    eos = np.array([w < 0 for w in pair.src_word_of])
    p = np.clip(weights, 1e-12, 1.0)
    entropy = max(0.0, float(-(weights * np.log(p)).sum(axis=1).mean()))  # a one-hot map's is -0.0, printed so
    eos_mass = float(weights[:, eos].sum(axis=1).mean())
    words = word_attention(pair, "naive", choice)  # (T_w, S_w + 1)
    eos_share = float((words.argmax(axis=1) == n_src).mean()) if len(words) else 0.0
    content = [i for i, w in enumerate(pair.src_words) if not is_punctuation(w)] or list(range(n_src))
    flags = []
    if content and coverage[content].min() < thresholds.under:
        flags.append("under")
    if n_src and coverage.max() > thresholds.over:
        flags.append("over")
    if eos_share > thresholds.detached:
        flags.append("detached")
    least = min(content, key=lambda i: coverage[i]) if content else None
    most = int(coverage.argmax()) if n_src else None
    return Diagnosis([float(c) for c in coverage], pair.src_words[least] if least is not None else None,
                     pair.src_words[most] if most is not None else None, entropy, eos_mass, eos_share, flags)


def summary(diagnoses: list[Diagnosis]) -> dict:
    """Corpus figures: sentences, how many carry each flag, mean entropy and mass on </s> (over sentences
    with a source word: an empty one looks only at </s>)."""
    n = len(diagnoses)
    worded = [d for d in diagnoses if d.coverage]
    flagged = {f: sum(f in d.flags for d in diagnoses) for f in ("under", "over", "detached")}
    return {"sentences": n, "flagged": sum(bool(d.flags) for d in diagnoses), **{f"flag_{k}": v for k, v in flagged.items()},
            "mean_entropy": round(float(np.mean([d.entropy for d in worded])), 4) if worded else None,
            "mean_eos_mass": round(float(np.mean([d.eos_mass for d in worded])), 4) if worded else None}
