"""The names of every choice a config makes, without torch: configs check against them, builders build them
(a test checks that each builder builds exactly these)."""
from __future__ import annotations

PLACES = ("enc_self", "dec_self", "cross")
"""Where attention sits: encoder self-attention, decoder (masked) self-attention, cross-attention."""


def place_problem(name: object) -> str | None:
    """What is wrong with `name` as a place (None: nothing). Every check of a place name says it so."""
    return None if name in PLACES else f"{name!r} is not a place; one of {', '.join(PLACES)}"


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
