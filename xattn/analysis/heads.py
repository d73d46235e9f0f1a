"""Per-head analysis: which layer and heads of the cross-attention align best with gold word alignments."""
from __future__ import annotations

from typing import Sequence

from xattn.analysis.aer import score
from xattn.analysis.alignment import METHODS, AlignSettings, Links, flip, links_from_weights, word_attention
from xattn.analysis.maps import HeadChoice, iter_teacher_forced, require_heads


def candidates(heads: Sequence[int]) -> list[HeadChoice]:
    """Every layer's mean of heads, then every single head; `heads`: how many each layer has (a pruned layer
    may have none, and then no candidate)."""
    require_heads(heads, "cross-attention")
    return [HeadChoice(layer) for layer, n in enumerate(heads) if n] + \
           [HeadChoice(layer, (head,)) for layer, n in enumerate(heads) for head in range(n)]


def rank_alignment_heads(translator, sources: Sequence[str], targets: Sequence[str],
                         gold: Sequence[tuple[Links, Links]], methods: Sequence[str] = METHODS,
                         reverse: bool = False, eos: str = "drop", punct: str = "free",
                         max_tokens: int = 4096) -> list[dict]:
    """AER of every (method, layer mean or single head) on gold (sure, possible) links, best first.

    `gold[k]` indexes (source word, target word) of pair k, or (target, source) with `reverse`.
    """
    cfg = translator.model.cfg
    choices = candidates(cfg.heads_per_layer("cross"))
    hyps: dict[tuple[str, HeadChoice], list[Links]] = {(m, c): [set() for _ in sources] for m in methods for c in choices}
    for k, pair in iter_teacher_forced(translator, sources, targets, ("cross",), max_tokens):
        for method in methods:
            weights = word_attention(pair, method)  # (L, H, T_w, S_w + 1)
            for choice in choices:
                settings = AlignSettings(choice, method, None, eos, punct)
                links = links_from_weights(choice.select(weights), pair.src_words, pair.tgt_words, settings)
                hyps[method, choice][k] = flip(links) if reverse else links
    rows = []
    for (method, choice), links in hyps.items():
        s = score(links, gold)
        rows.append({"method": method, **choice.to_dict(), "aer": s.aer, "precision": s.precision,
                     "recall": s.recall})
    return sorted(rows, key=lambda r: (r["aer"], r["method"] != "shift", isinstance(r["heads"], list), r["layer"]))
