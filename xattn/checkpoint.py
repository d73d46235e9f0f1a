"""The model directory: config.yaml, model.safetensors, tokenizer model file(s), train_state/, log.jsonl.

Weights are stored under their public parameter names; a tied parameter is stored once, under the
first name PyTorch reports. Loading checks that exactly the expected names arrived.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from xattn.config import RunConfig, load_config, save_config
from xattn.errors import XattnError
from xattn.io import atomic_write
from xattn.model import Transformer
from xattn.tokenizer import TokenizerPair, load_tokenizers

WEIGHTS = "model.safetensors"
CONFIG = "config.yaml"


def weights_of(model: Transformer) -> dict[str, torch.Tensor]:
    """Unique parameters and persistent buffers by public name, detached, contiguous, on the CPU."""
    tensors = {name: p for name, p in model.named_parameters()}
    tensors.update(model.named_buffers())
    return {name: t.detach().to("cpu").contiguous() for name, t in tensors.items()
            if name in model.state_dict()}


def save_weights(model: Transformer, path: Path) -> None:
    atomic_write(path, lambda tmp: save_file(weights_of(model), str(tmp)))


def load_weights(model: Transformer, path: Path) -> None:
    """Load `path` into `model`; every expected name must be present, and nothing else."""
    try:
        tensors = load_file(str(path))
    except (SafetensorError, OSError) as e:
        raise XattnError(f"{path}: cannot read weights ({e})") from None
    expected = set(weights_of(model))
    missing, unexpected = sorted(expected - set(tensors)), sorted(set(tensors) - expected)
    if missing or unexpected:
        raise XattnError(f"{path}: weights do not fit the config: missing {missing[:5]}, unexpected {unexpected[:5]}")
    result = model.load_state_dict(tensors, strict=False)
    aliases = set(model.state_dict()) - expected
    if set(result.missing_keys) - aliases or result.unexpected_keys:
        raise XattnError(f"{path}: weights did not load cleanly: {result}")


def save_model_dir(out_dir: Path, model: Transformer, cfg: RunConfig, weights_name: str = WEIGHTS) -> None:
    """Write config.yaml and the weights into `out_dir` (the tokenizer files are written by training)."""
    out_dir = Path(out_dir)
    save_config(cfg, out_dir / CONFIG)
    save_weights(model, out_dir / weights_name)


@dataclass
class LoadedModel:
    model: Transformer
    config: RunConfig
    tokenizers: TokenizerPair


def load_model_dir(path: str | Path, device: str | torch.device = "cpu", weights_name: str = WEIGHTS) -> LoadedModel:
    """Read a model directory into an eval-mode Transformer on `device`, its config and tokenizers."""
    path = Path(path)
    if not (path / CONFIG).is_file():
        raise XattnError(f"{path}: not a model directory (no {CONFIG})")
    if not (path / weights_name).is_file():
        raise XattnError(f"{path}: no {weights_name} (has training written a checkpoint yet?)")
    cfg = load_config(path / CONFIG)
    model = Transformer(cfg.model)
    load_weights(model, path / weights_name)
    return LoadedModel(model.to(device).eval(), cfg, load_tokenizers(path))
