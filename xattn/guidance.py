"""Guided alignment (Garg et al. 2019): the `alignment` section of a run config, which names the cross-attention
that training teaches the word links of the training pairs (data.train_links, a corpus' `links`), and how much.

The loss is xattn.losses.guided_alignment_loss; the Trainer adds `weight` times it, summed over the target
pieces with links, to the token loss (summed over target tokens) before both are divided by the step's target
tokens, as fairseq's `--alignment-lambda` does. The layer and heads it supervised are stored with the model
(analysis.yaml, xattn.analysis.choice), so the verbs that read links use them by default.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

from xattn.checks import Check, ConfigError, validate, within

SECTION = "alignment"


def heads_problem(value: Any) -> str | None:
    """What is wrong with alignment.heads: "mean", or distinct head numbers >= 0."""
    if value == "mean":
        return None
    if isinstance(value, list) and value and all(isinstance(h, int) and not isinstance(h, bool) and h >= 0
                                                 for h in value) and len(set(value)) == len(value):
        return None
    return f"expected 'mean' or distinct head numbers >= 0 such as [0] or 0,2, got {value!r}"


def parse_heads(value: Any) -> Any:
    """An override's text ("0,2", "[0, 2]", "mean") as the value alignment.heads holds; others as they are."""
    if not isinstance(value, str) or value == "mean":
        return value
    try:
        return [int(h) for h in value.strip("[] ").split(",")]
    except ValueError:
        return value


@dataclass(frozen=True)
class AlignmentConfig:
    weight: float = 0.0                 # lambda: the guided loss joins the token loss with this factor (0: off,
    #   and no attention weights are computed); Garg et al. 2019 used 0.05
    layer: int | None = None            # decoder layer whose cross-attention learns the links, 0-based (null:
    #   the second-to-last, where Garg et al. found attention aligns best)
    heads: list[int] | str = field(default_factory=lambda: [0])  # its heads whose mean learns them, or "mean"
    #   (all of them); Garg et al. supervise a single head and leave the others free

    CHECKS: ClassVar[dict[str, Check]] = dict(weight=within(0), layer=within(0))

    def __post_init__(self) -> None:
        object.__setattr__(self, "heads", parse_heads(self.heads))
        validate(self, SECTION)
        if problem := heads_problem(self.heads):
            raise ConfigError(f"{SECTION}.heads", problem)

    @property
    def on(self) -> bool:
        return self.weight > 0

    def check_data(self, data) -> None:
        """Guidance needs links: data.train_links, or a prepared directory (checked when it is mapped)."""
        if self.on and not (data.train_links or data.prepared):
            raise ConfigError(f"{SECTION}.weight", f"{self.weight:g} needs the links of the training pairs: set "
                              "data.train_links (a Pharaoh file, one line per pair)")

    def resolve(self, model) -> tuple[int, tuple[int, ...] | None]:
        """(layer, heads or None for all) of the model of ModelConfig `model`; a layer it does not have, one
        whose heads were all pruned, or a head it lacks is a ConfigError naming the key."""
        layers = model.heads_per_layer("cross")
        layer = max(len(layers) - 2, 0) if self.layer is None else self.layer
        key = f"{SECTION}.layer"
        if layer >= len(layers):
            raise ConfigError(key, f"{layer} is not a decoder layer of this model (0 to {len(layers) - 1})")
        if layers[layer] == 0:
            with_heads = ", ".join(str(i) for i, n in enumerate(layers) if n)
            raise ConfigError(key, f"layer {layer} has no cross-attention heads left (pruned); layers with heads: "
                              f"{with_heads or 'none'}")
        if self.heads == "mean":
            return layer, None
        if bad := [h for h in self.heads if h >= layers[layer]]:
            raise ConfigError(f"{SECTION}.heads", f"layer {layer} has no head {bad[0]} (its cross-attention heads: "
                              f"0 to {layers[layer] - 1})")
        return layer, tuple(self.heads)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)
