"""The alignment settings stored in a model directory (`analysis.yaml`, beside the weights, never in config.yaml).

`xattn heads align` writes the layer and heads that align best on gold pairs, and training with guided
alignment (xattn.guidance) the layer and heads it taught the links; `xattn align`, `translate --alignment`,
`attention`, `diagnose` and `serve` read them unless --layer/--heads say otherwise. The file names the weights
it was measured on (or trained into); after the weights change it is ignored with a warning.
"""
from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass
from difflib import get_close_matches as close_matches
from pathlib import Path
from typing import ClassVar

import yaml

from xattn.analysis.alignment import EOS_RULES, METHODS, PUNCT_RULES, AlignSettings
from xattn.analysis.maps import HeadChoice
from xattn.checkpoint import weights_id
from xattn.checks import NON_NEGATIVE, POSITIVE, Check, ConfigError, one_of, read_record, sha256_hex, validate, \
    within
from xattn.errors import XattnError
from xattn.io import atomic_write_text
from xattn.yamlfile import read_yaml

ANALYSIS = "analysis.yaml"
SECTION = "alignment"


def _head(value) -> str | None:
    if value == "mean" or (isinstance(value, int) and value >= 0):
        return None
    return f"expected 'mean' or head numbers >= 0, got {value!r}"


@dataclass(frozen=True)
class AlignmentRecord:
    """The `alignment` section of analysis.yaml, as `xattn heads align` writes it."""
    layer: int                          # decoder layer, 0-based
    heads: list[int] | str              # its heads, 0-based, or "mean" (all of them)
    method: str
    threshold: float | None = None
    eos: str = "drop"
    punct: str = "free"
    weights: str | None = None          # checkpoint.weights_id of the weights it was measured on
    aer: float | None = None            # how it scored, on how many pairs of which gold file
    pairs: int | None = None
    gold: str | None = None
    guided: float | None = None         # trained for alignment with this alignment.weight (xattn.guidance)

    CHECKS: ClassVar[dict[str, Check]] = dict(
        layer=NON_NEGATIVE, heads=_head, method=one_of(*METHODS), threshold=within(0, 1, lo_open=True),
        eos=one_of(*EOS_RULES), punct=one_of(*PUNCT_RULES), weights=sha256_hex, aer=within(0, 1), pairs=POSITIVE,
        guided=within(0, lo_open=True))

    def __post_init__(self) -> None:
        validate(self, SECTION)
        if isinstance(self.heads, list) and (not self.heads or len(set(self.heads)) != len(self.heads)):
            raise ConfigError(f"{SECTION}.heads", f"expected 'mean' or distinct head numbers, got {self.heads}")

    @property
    def settings(self) -> AlignSettings:
        choice = HeadChoice(self.layer, None if self.heads == "mean" else tuple(self.heads))
        return AlignSettings(choice, self.method, self.threshold, self.eos, self.punct)

    @property
    def figures(self) -> dict:
        """Where the choice comes from: how it scored (aer, pairs, gold) or the weight it was trained with
        (guided), those recorded."""
        return {k: v for k in ("aer", "pairs", "gold", "guided") if (v := getattr(self, k)) is not None}


DEFAULT_METHOD = "naive"
"""Without a stored choice, read a target word where it is predicted: at the second-to-last layer naive beat shift
in both directions of benchmarks/alignment.py (Hansards en-fr, Multi30k models); shift did best only at layer 0."""


def default_choice(cfg) -> HeadChoice:
    """Without a stored choice: the mean of the heads of the second-to-last decoder layer (Garg et al. 2019
    found the penultimate layer of a 6-layer Transformer aligns best); in a pruned model, the nearest layer
    below it (else above) with cross-attention heads left. `cfg`: the ModelConfig."""
    return HeadChoice.nearest(cfg.heads_per_layer("cross"), max(cfg.n_decoder_layers - 2, 0), "cross-attention")


def read(model_dir: Path) -> dict:
    """analysis.yaml as a dict of sections ({} without the file)."""
    path = model_dir / ANALYSIS
    if not path.is_file():
        return {}
    data = read_yaml(path)
    if data is not None and not isinstance(data, dict):
        raise XattnError(f"{path}: expected sections such as `alignment:`, found a {type(data).__name__}")
    # other tools' sections are kept; without an `alignment` section, one that reads as a misspelt one would be
    # silently unread (`alignmnet:`, `Alignment:`)
    if SECTION not in (data or {}) and (misspelt := next((key for key in data or {} if close_matches(
            str(key).lower(), [SECTION], 1, 0.85)), None)) is not None:
        raise XattnError(f"{path}: unknown section {misspelt!r} (did you mean {SECTION!r}?)")
    return data or {}


def stored(model_dir: str | Path, cfg) -> AlignmentRecord | None:
    """The `alignment` section of analysis.yaml, checked by the rules of AlignmentRecord and against the model
    of ModelConfig `cfg`; None when there is none, or when it was measured on other weights (with a warning)."""
    model_dir = Path(model_dir)
    path = model_dir / ANALYSIS
    data = read(model_dir)
    if SECTION not in data:
        return None
    again = "(run `xattn heads align` again, or delete the file)"
    try:
        record = read_record(AlignmentRecord, data[SECTION], str(path), SECTION)
    except XattnError as e:
        raise XattnError(f"{e} {again}") from None
    try:
        record.settings.choice.check(cfg.heads_per_layer("cross"), "cross-attention")
    except XattnError as e:
        raise XattnError(f"{path}: {SECTION}: {e} {again}") from None
    if record.weights != weights_id(model_dir):
        print(f"xattn: warning: {path} was measured on other weights; ignored (run `xattn heads align` again)",
              file=sys.stderr)
        return None
    return record


def settings_for(model_dir: str | Path, cfg, layer: int | None = None, heads: str | None = None,
                 method: str | None = None, threshold: float | None = None, eos: str | None = None,
                 punct: str | None = None) -> AlignSettings:
    """AlignSettings for the model of ModelConfig `cfg` from the flags; what a flag leaves unset comes from
    the stored record, else the default (default_choice, DEFAULT_METHOD, argmax, eos drop, punct free)."""
    record = stored(model_dir, cfg)
    base = record.settings if record else AlignSettings(default_choice(cfg), DEFAULT_METHOD)
    choice = base.choice
    if layer is not None or heads is not None:
        choice = HeadChoice.parse(base.choice.layer if layer is None else layer, "mean" if heads is None else heads)
        choice.check_given(cfg.heads_per_layer("cross"), "cross-attention")
    choice.check(cfg.heads_per_layer("cross"), "cross-attention")
    return AlignSettings(choice, method or base.method, base.threshold if threshold is None else threshold,
                         eos or base.eos, punct or base.punct)


def save(model_dir: str | Path, settings: AlignSettings, figures: dict, weights: str | None = None) -> Path:
    """Write analysis.yaml's alignment section (the settings, the weights they were measured on, how they
    scored), keeping its other sections. `weights`: the weights_id of the weights measured, read when they
    were loaded (the file may have changed since: a training still writing there); by default, the file's now."""
    model_dir = Path(model_dir)
    data = read(model_dir)
    record = AlignmentRecord(**settings.choice.to_dict(), method=settings.method, threshold=settings.threshold,
                             eos=settings.eos, punct=settings.punct, weights=weights or weights_id(model_dir),
                             **figures)
    data[SECTION] = {k: v for k, v in dataclasses.asdict(record).items() if v is not None or k == "threshold"}
    text = "# written by xattn analysis verbs; `alignment` by `xattn heads align` or guided training, read by align, " \
           "translate --alignment\n"
    atomic_write_text(model_dir / ANALYSIS, text + yaml.safe_dump(data, sort_keys=False, allow_unicode=True))
    return model_dir / ANALYSIS


GUIDED_METHOD = "naive"
"""Guided training teaches the row that predicts a target piece its word's links, which naive reads."""


def save_guided(model_dir: str | Path, layer: int, heads: tuple[int, ...] | None, weight: float) -> Path:
    """Store the layer and heads (None: all) that guided-alignment training taught the links with `weight`,
    as the model's alignment choice (read where they were taught, by argmax)."""
    return save(model_dir, AlignSettings(HeadChoice(layer, heads), GUIDED_METHOD), {"guided": weight})
