"""A translation as the Translator returns it: its text, score, tokens of both sides, attention and alternatives
(without torch, for the front ends that only read them)."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class Translation:
    text: str
    score: float                                  # the hypothesis' ranking score (normalised log-probability;
    #   with a shortlist, over the sentence's list)
    src_tokens: list[str]                         # source pieces + "</s>": the S axis of cross_attention
    tgt_tokens: list[str]                         # target pieces + "</s>": the T axis (position predicting it)
    cross_attention: np.ndarray | None = None     # (L, H, T, S) float32, with return_attention ((1, 1, T, S):
    #   the mean of the chosen heads, with attention_heads)
    self_attention: np.ndarray | None = None      # (L, H, T, T) float32, with return_self_attention
    relaxed: bool = False                         # the decoding constraints left no token but end of sentence
    #   here, so the translation ends early (e.g. min_len with no_repeat_ngram_size 1 on a small vocabulary)
    alternatives: list[Translation] = field(default_factory=list)  # the n-best, best first; or the samples, in
    #   the order drawn (the first is the translation)


def distinct(translation: Translation, others: list[Translation]) -> list[Translation]:
    """Of `others` (best first), those whose texts differ from `translation`'s and from each other's: samples
    repeat, and two hypotheses of a beam can print the same text (▁a + b and ▁ab)."""
    seen = {translation.text}
    return [a for a in others if a.text not in seen and not seen.add(a.text)]
