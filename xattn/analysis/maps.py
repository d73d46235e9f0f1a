"""Attention maps of sentence pairs: from a Translation, or teacher-forced for a given pair; pieces -> words.

Shapes: L layers, H heads, S source positions (pieces + </s>), T target positions (pieces + </s>: position t
predicts tgt_tokens[t]); R rows (queries) and C columns (keys) of a drawn map.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np
import torch

from xattn.errors import XattnError

if TYPE_CHECKING:
    from xattn.translator import Translation, Translator

KINDS = ("cross", "decoder-self", "encoder-self")
EOS, BOS = "</s>", "<s>"
WORD_START = "\u2581"  # SentencePiece's mark of a piece that starts a word
UNK_PIECE, UNK_SURFACE = "<unk>", "\u2047"  # what SentencePiece prints for an unknown piece, without its spaces


# ---------------------------------------------------------------------------------------- layers and heads

@dataclass(frozen=True)
class HeadChoice:
    """Which attention to read: one layer (0-based) and a list of its heads (0-based), or their mean (heads=None)."""
    layer: int
    heads: tuple[int, ...] | None = None

    @classmethod
    def parse(cls, layer: int | str, heads: str | Sequence[int] | None = "mean") -> HeadChoice:
        """`--layer N --heads 0,3,5 | mean`; errors name the flag."""
        try:
            layer = int(layer)
        except (TypeError, ValueError):
            raise XattnError(f"--layer: expected a layer number (0-based), got {layer!r}") from None
        if heads is None or heads == "mean":
            return cls(layer, None)
        if isinstance(heads, str):
            try:
                heads = [int(h) for h in heads.split(",")]
            except ValueError:
                raise XattnError(f"--heads: expected 'mean' or head numbers such as 0,3,5, got {heads!r}") from None
        if not heads or len(set(heads)) != len(heads):
            raise XattnError(f"--heads: expected distinct head numbers, got {','.join(map(str, heads))}")
        return cls(layer, tuple(int(h) for h in heads))

    def check(self, n_layers: int, n_heads: int) -> None:
        if not 0 <= self.layer < n_layers:
            raise XattnError(f"--layer: {self.layer} is not a layer of this model (0 to {n_layers - 1})")
        for h in self.heads or ():
            if not 0 <= h < n_heads:
                raise XattnError(f"--heads: {h} is not a head of this model (0 to {n_heads - 1})")

    def select(self, weights: np.ndarray) -> np.ndarray:
        """(L, H, R, C) -> (R, C): the chosen heads of the chosen layer, averaged."""
        self.check(weights.shape[0], weights.shape[1])
        layer = weights[self.layer]  # (H, R, C)
        return (layer if self.heads is None else layer[list(self.heads)]).mean(axis=0)

    def __str__(self) -> str:
        return f"layer {self.layer}, " + ("mean of heads" if self.heads is None else
                                            "head " + ",".join(map(str, self.heads)))

    def to_dict(self) -> dict:
        return {"layer": self.layer, "heads": "mean" if self.heads is None else list(self.heads)}


# ---------------------------------------------------------------------------------------- what is drawn

@dataclass
class AttentionMaps:
    """The attention of one sentence pair in one place, every layer and head: what plots and the HTML view draw.

    Each row is a query token's weights over the columns (key tokens); rows sum to 1 over unmasked cells.
    """
    weights: np.ndarray                 # (L, H, R, C) float32
    rows: list[str]                     # R labels: target tokens (cross, decoder-self) or source tokens (encoder-self)
    cols: list[str]                     # C labels: source tokens (cross, encoder-self) or target tokens (decoder-self)
    kind: str = "cross"                 # one of KINDS
    masked: np.ndarray | None = None    # (R, C) bool, True = the query may not look there (the decoder's future)
    links: list[tuple[int, int]] = field(default_factory=list)  # (col, row) cells that are alignment links
    words: bool = False                 # rows and columns are words (pieces merged) rather than pieces

    def __post_init__(self):
        L, H, R, C = self.weights.shape
        if (R, C) != (len(self.rows), len(self.cols)):
            raise ValueError(f"weights {self.weights.shape} do not match {len(self.rows)} rows x {len(self.cols)} columns")
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
