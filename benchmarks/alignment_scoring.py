"""How the alignment benchmark scores links on the Hansards en-fr gold (alignment.py, alignment_guided.py).

Never tune on what is reported: every choice is made on the first TUNE pairs, AER is reported on the others.
All links are (English word, French word).
"""
from __future__ import annotations

from pathlib import Path

import xattn
from xattn.analysis.aer import score
from xattn.analysis.alignment import (SYMMETRISATIONS, AlignSettings, flip, links_from_weights, symmetrise,
                                      word_attention)
from xattn.analysis.maps import PairAttention, teacher_forced

TUNE = 100
THRESHOLDS = (None, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5)


def aer(links, gold, part: slice) -> dict:
    s = score(links[part], gold[part])
    return {"aer": round(100 * s.aer, 2), "precision": round(100 * s.precision, 2), "recall": round(100 * s.recall, 2)}


def both(links, gold) -> dict:
    """AER on the tuning pairs and on the reported pairs."""
    return {"tune": aer(links, gold, slice(0, TUNE)), "test": aer(links, gold, slice(TUNE, None))}


def tune_aer(links, gold) -> float:
    return aer(links, gold, slice(0, TUNE))["aer"]


class Direction:
    """One model reading the pairs in its own direction, with its links turned to (English, French)."""

    def __init__(self, name: str, model_dir: Path, src: list[str], tgt: list[str], english_first: bool):
        self.name, self.model_dir, self.flip = name, model_dir, not english_first
        self.translator = xattn.load(model_dir)
        self.pairs: list[PairAttention] = teacher_forced(self.translator, src, tgt, ("cross",))
        self.words = {m: [word_attention(p, m) for p in self.pairs] for m in ("shift", "naive")}

    def links(self, settings: AlignSettings) -> list[set]:
        out = []
        for pair, weights in zip(self.pairs, self.words[settings.method]):
            links = links_from_weights(settings.choice.select(weights), pair.src_words, pair.tgt_words, settings)
            out.append(flip(links) if self.flip else links)
        return out

    def best(self, grid, gold) -> tuple[AlignSettings, dict]:
        """The settings of `grid` with the lowest AER on the tuning pairs."""
        scored = [(tune_aer(self.links(s), gold), i, s) for i, s in enumerate(grid)]
        _, _, settings = min(scored, key=lambda x: (x[0], x[1]))
        return settings, both(self.links(settings), gold)


def describe(s: AlignSettings) -> dict:
    return {"method": s.method, **s.choice.to_dict(), "threshold": s.threshold, "eos": s.eos, "punct": s.punct}


def symmetrised(forward: list, backward: list, en: list[str], fr: list[str]) -> dict[str, list]:
    """Every symmetrisation of (English, French) forward and backward links of the pairs (en, fr)."""
    return {m: [symmetrise(f, b, m, len(e.split()), len(r.split())) for f, b, e, r in zip(forward, backward, en, fr)]
            for m in SYMMETRISATIONS}


def symmetrised_rows(sym: dict[str, list], gold) -> dict:
    """AER of each symmetrisation, and the one chosen on the tuning pairs."""
    best = min(SYMMETRISATIONS, key=lambda m: (tune_aer(sym[m], gold), m))
    return {**{m: both(sym[m], gold) for m in SYMMETRISATIONS}, "chosen_symmetrisation": best}
