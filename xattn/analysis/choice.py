"""The alignment settings stored in a model directory (`analysis.yaml`, beside the weights, never in config.yaml).

`xattn heads align` writes the layer and heads that align best on gold pairs; `xattn align` and
`translate --alignment` read them unless --layer/--heads say otherwise. The file names the weights it was
measured on; after the weights change it is ignored with a warning.
"""
from __future__ import annotations

import sys
from pathlib import Path

import yaml

from xattn.analysis.alignment import AlignSettings
from xattn.analysis.maps import HeadChoice
from xattn.errors import XattnError
from xattn.io import atomic_write_text, sha256_file

ANALYSIS = "analysis.yaml"


def weights_id(model_dir: Path) -> str:
    """The weights' tensor SHA-256 from their fingerprint, else the file's SHA-256."""
    from safetensors import safe_open

    from xattn.checkpoint import WEIGHTS

    with safe_open(str(model_dir / WEIGHTS), "np") as f:
        meta = f.metadata() or {}
    return meta.get("tensors") or sha256_file(model_dir / WEIGHTS)


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
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise XattnError(f"{path}: not readable YAML ({' '.join(str(e).split())[:120]}); delete it or run "
                         "`xattn heads align` again") from None
    if data is not None and not isinstance(data, dict):
        raise XattnError(f"{path}: expected sections such as `alignment:`, found a {type(data).__name__}")
    return data or {}


def stored(model_dir: str | Path, cfg) -> dict | None:
    """The `alignment` section of analysis.yaml, checked, with its HeadChoice as "choice"; None when there is
    none, or when it was measured on other weights (with a warning)."""
    model_dir = Path(model_dir)
    path = model_dir / ANALYSIS
    record = read(model_dir).get("alignment")
    if record is None:
        return None
    try:
        heads = record["heads"]
        choice = HeadChoice(int(record["layer"]), None if heads == "mean" else tuple(int(h) for h in heads))
        choice.check(cfg.heads_per_layer("cross"), "cross-attention")
        settings = AlignSettings(choice, record["method"], record.get("threshold"), record.get("eos", "drop"),
                                 record.get("punct", "free"))
    except (TypeError, KeyError, ValueError, XattnError) as e:
        raise XattnError(f"{path}: the alignment record is not one `xattn heads align` writes "
                         f"({' '.join(str(e).split())}); delete it or run `xattn heads align` again") from None
    if record.get("weights") != weights_id(model_dir):
        print(f"xattn: warning: {path} was measured on other weights; ignored (run `xattn heads align` again)",
              file=sys.stderr)
        return None
    return {**record, "settings": settings}


def settings_for(model_dir: str | Path, cfg, layer: int | None = None, heads: str | None = None,
                 method: str | None = None, threshold: float | None = None, eos: str | None = None,
                 punct: str | None = None) -> AlignSettings:
    """AlignSettings for the model of ModelConfig `cfg` from the flags; what a flag leaves unset comes from
    the stored record, else the default (default_choice, DEFAULT_METHOD, argmax, eos drop, punct free)."""
    record = stored(model_dir, cfg)
    base = record["settings"] if record else AlignSettings(default_choice(cfg), DEFAULT_METHOD)
    choice = base.choice
    if layer is not None or heads is not None:
        choice = HeadChoice.parse(base.choice.layer if layer is None else layer, "mean" if heads is None else heads)
    choice.check(cfg.heads_per_layer("cross"), "cross-attention")
    return AlignSettings(choice, method or base.method, base.threshold if threshold is None else threshold,
                         eos or base.eos, punct or base.punct)


def save(model_dir: str | Path, settings: AlignSettings, figures: dict) -> Path:
    """Write analysis.yaml's alignment section (the settings, the weights they were measured on, how they
    scored), keeping its other sections."""
    model_dir = Path(model_dir)
    data = read(model_dir)
    data["alignment"] = {**settings.choice.to_dict(), "method": settings.method, "threshold": settings.threshold,
                         "eos": settings.eos, "punct": settings.punct, "weights": weights_id(model_dir), **figures}
    text = "# written by xattn analysis verbs; `alignment` by `xattn heads align`, read by align, translate --alignment\n"
    atomic_write_text(model_dir / ANALYSIS, text + yaml.safe_dump(data, sort_keys=False, allow_unicode=True))
    return model_dir / ANALYSIS
