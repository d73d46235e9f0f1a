"""The alignment settings stored in a model directory (`analysis.yaml`, beside the weights, never in config.yaml).

`xattn heads align` writes the layer and heads that align best on gold pairs; `xattn align` and
`translate --alignment` read them unless --layer/--heads say otherwise. The file names the weights it was
measured on; after the weights change it is ignored with a warning.
"""
from __future__ import annotations

import sys
from pathlib import Path

import yaml

from xattn.analysis.alignment import METHODS, AlignSettings
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


def default_choice(n_layers: int) -> HeadChoice:
    """Without a stored choice: the mean of the heads of the second-to-last decoder layer (Garg et al. 2019
    found the penultimate layer of a 6-layer Transformer aligns best)."""
    return HeadChoice(max(n_layers - 2, 0))


def stored(model_dir: str | Path) -> dict | None:
    """The `alignment` record of analysis.yaml, or None (absent, or made for other weights: warned)."""
    model_dir = Path(model_dir)
    path = model_dir / ANALYSIS
    if not path.is_file():
        return None
    try:
        record = (yaml.safe_load(path.read_text(encoding="utf-8")) or {}).get("alignment")
        choice = HeadChoice.parse(record["layer"], record["heads"] if record["heads"] == "mean"
                                  else [int(h) for h in record["heads"]])
        if record.get("method") not in METHODS:
            raise KeyError("method")
    except (yaml.YAMLError, AttributeError, TypeError, KeyError, XattnError) as e:
        raise XattnError(f"{path}: not an alignment record written by `xattn heads align` ({e}); "
                         "delete it or run `xattn heads align` again") from None
    if record.get("weights") != weights_id(model_dir):
        print(f"xattn: warning: {path} was measured on other weights; ignored (run `xattn heads align` again)",
              file=sys.stderr)
        return None
    return {**record, "choice": choice}


def settings_for(model_dir: str | Path, n_layers: int, layer: int | None = None, heads: str | None = None,
                 method: str | None = None, **rest) -> AlignSettings:
    """AlignSettings from the flags, falling back on the stored choice, then on default_choice."""
    record = stored(model_dir)
    base = record["choice"] if record else default_choice(n_layers)
    if layer is not None or heads is not None:
        base = HeadChoice.parse(base.layer if layer is None else layer, heads or "mean")
    method = method or (record["method"] if record else "shift")
    return AlignSettings(base, method, **rest)


def save(model_dir: str | Path, choice: HeadChoice, method: str, figures: dict) -> Path:
    """Write analysis.yaml's alignment record (the choice, the weights it was measured on, how it scored)."""
    model_dir = Path(model_dir)
    record = {"alignment": {**choice.to_dict(), "method": method, "weights": weights_id(model_dir), **figures}}
    text = "# written by `xattn heads align`; read by `xattn align` and `xattn translate --alignment`\n"
    atomic_write_text(model_dir / ANALYSIS, text + yaml.safe_dump(record, sort_keys=False))
    return model_dir / ANALYSIS
