"""The names of every choice a config makes, without torch: configs check against them, builders build them
(a test checks that each builder builds exactly these)."""
from __future__ import annotations

from typing import Callable

PLACES = ("enc_self", "dec_self", "cross")
"""Where attention sits: encoder self-attention, decoder (masked) self-attention, cross-attention."""


def place_problem(name: object) -> str | None:
    """What is wrong with `name` as a place (None: nothing). Every check of a place name says it so."""
    return None if name in PLACES else f"{name!r} is not a place; one of {', '.join(PLACES)}"


def per_place_problem(value: dict, check: Callable[[object], str | None]) -> str | None:
    """What is wrong with a mapping from places to a value or a list of values, each judged by `check`."""
    for place, item in value.items():
        if problem := place_problem(place):
            return problem
        for x in item if isinstance(item, list) else [item]:
            if problem := check(x):
                return f"{place}: {problem}"
    return None


SCORES = ("dot", "scaled_dot", "general", "additive")
"""Attention score functions (xattn.variants.SCORES builds them)."""
VARIANTS = ("learned", "gaussian")
"""Attention variants (xattn.variants.VARIANTS builds them)."""
ACTIVATIONS = ("relu", "gelu", "swish")
"""Feed-forward activations (xattn.layers.ACTIVATIONS applies them)."""
NORMS = ("post", "pre")
"""Where the LayerNorm sits (xattn.model.NORMS builds them): after the residual (Vaswani et al.) or before."""
POSITIONS = ("sinusoidal", "learned")
"""Position encodings (xattn.model.POSITIONS builds them)."""
IMPORTANCE_METHODS = ("gradient", "confidence")
"""How `xattn heads importance` scores heads (xattn.analysis.importance)."""
IMPORTANCE_FILE = "head_importance.tsv"
"""Where in a model directory `xattn heads importance` saves its table, and `xattn prune --fraction` reads it."""
ATTENTION_KINDS = ("cross", "decoder-self", "encoder-self")
"""The attention maps a teacher-forced pass reads (Translator.forced_attention, xattn.analysis.maps)."""


def kind_problem(name: object) -> str | None:
    """What is wrong with `name` as an attention kind (None: nothing). Every check of a kind says it so."""
    return None if name in ATTENTION_KINDS else f"{name!r} is not one of {', '.join(ATTENTION_KINDS)}"
