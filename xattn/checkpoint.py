"""The model directory: config.yaml, model.safetensors, tokenizer model file(s), train_state/, log.jsonl.

Weights are stored under their public parameter names; a tied parameter is stored once, under the
first name PyTorch reports. Each weights file carries in its safetensors metadata a fingerprint of
what it was saved with: the config's model section, the SHA-256 of every tokenizer file, and a
SHA-256 of the tensors themselves. Loading checks the fingerprint, that every tensor is finite, that
the tokenizers' vocabularies fit the embeddings, and that exactly the expected names and shapes
arrived; any mismatch is a one-line XattnError that names the file, key or tensor. Choices made
later by analysis tools live in files of their own, so storing them never makes a model unloadable.

A fine-tuned child (xattn.transfer) may store a delta: only the tensors that differ from its parent's,
with `parent:` in config.yaml naming the parent's directory and the SHA-256 of the parent's full weights.
Loading rebuilds the full weights from the parent (itself possibly a delta) and refuses a parent that is
missing or whose weights are not the ones the child was made from.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save

from xattn.config import ModelConfig, ParentConfig, RunConfig, load_config, save_config
from xattn.errors import XattnError
from xattn.io import atomic_write_bytes, json_text, sha256_file
from xattn.model import Transformer
from xattn.tokenizer import TokenizerPair, copy_tokenizers, load_tokenizers, tokenizer_hashes  # noqa: F401 (re-exported)

WEIGHTS = "model.safetensors"
CONFIG = "config.yaml"
FORMAT = "xattn.weights/1"


@dataclass(frozen=True)
class Fingerprint:
    """What a weights file was saved with; stored as strings in its safetensors metadata."""
    model: dict            # the ModelConfig, as a dict
    tokenizers: dict       # tokenizer file name -> SHA-256
    tensors: str           # SHA-256 of the tensors (`tensors_digest`)

    def metadata(self) -> dict[str, str]:
        return {"format": FORMAT, "model": json_text(self.model, sort_keys=True),
                "tokenizers": json_text(self.tokenizers, sort_keys=True), "tensors": self.tensors}

    @classmethod
    def from_metadata(cls, meta: dict[str, str] | None, path: Path) -> Fingerprint | None:
        """None for a file saved before fingerprints existed."""
        if not meta or meta.get("format") != FORMAT:
            return None
        try:
            return cls(json.loads(meta["model"]), json.loads(meta["tokenizers"]), meta["tensors"])
        except (KeyError, json.JSONDecodeError):
            raise XattnError(f"{path}: its fingerprint (safetensors metadata) is damaged") from None


def tensors_digest(tensors: dict[str, torch.Tensor]) -> str:
    """SHA-256 over names, dtypes, shapes and bytes of `tensors`, in name order."""
    digest = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name].detach().to("cpu").contiguous()
        digest.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        digest.update(t.reshape(-1).view(torch.uint8).numpy())
    return digest.hexdigest()


def weights_of(model: Transformer) -> dict[str, torch.Tensor]:
    """Unique parameters and persistent buffers by public name, detached, contiguous, on the CPU."""
    tensors = {name: p for name, p in model.named_parameters()}
    tensors.update(model.named_buffers())
    return {name: t.detach().to("cpu").contiguous() for name, t in tensors.items()
            if name in model.state_dict()}


def save_weights(model: Transformer, path: Path, tokenizers: dict[str, str], names: set[str] | None = None) -> None:
    """Write the weights (only `names` when given) with their fingerprint; `tokenizers` from `tokenizer_hashes`."""
    tensors = weights_of(model)
    if names is not None:
        tensors = {name: t for name, t in tensors.items() if name in names}
    fingerprint = Fingerprint(model.cfg.as_dict(), tokenizers, tensors_digest(tensors))
    # to bytes first: safetensors' own save_file writes through a temporary file of its own, which a
    # killed process would leave behind under a name that xattn does not know
    atomic_write_bytes(path, save(tensors, metadata=fingerprint.metadata()))


def weights_id(model_dir: Path) -> str:
    """What analysis files (analysis.yaml, importance tables) record of the weights they were measured on:
    the tensors' SHA-256 from the fingerprint, else the weights file's SHA-256."""
    path = Path(model_dir) / WEIGHTS
    if not path.is_file():
        raise XattnError(f"{model_dir}: no {WEIGHTS}")
    try:
        with safe_open(str(path), "np") as f:
            meta = f.metadata() or {}
    except (SafetensorError, OSError) as e:
        raise XattnError(f"{path}: cannot read weights ({e})") from None
    return meta.get("tensors") or sha256_file(path)


def read_weights(path: Path) -> tuple[dict[str, torch.Tensor], Fingerprint | None]:
    """The tensors of a weights file and its fingerprint; a damaged tensor or checksum is an XattnError."""
    try:
        with safe_open(str(path), "pt") as f:
            meta = f.metadata()
        tensors = load_file(str(path))
    except (SafetensorError, OSError, ValueError) as e:
        raise XattnError(f"{path}: cannot read weights ({e})") from None
    if (name := non_finite(tensors)) is not None:
        raise XattnError(f"{path}: tensor {name} holds NaN or infinite values")
    fingerprint = Fingerprint.from_metadata(meta, path)
    if fingerprint is not None and tensors_digest(tensors) != fingerprint.tensors:
        raise XattnError(f"{path}: the tensors do not match their checksum (the file is damaged)")
    return tensors, fingerprint


def non_finite(tensors: dict[str, torch.Tensor]) -> str | None:
    """The name of the first floating-point tensor that holds NaN or an infinity, or None."""
    return next((name for name, t in tensors.items() if t.is_floating_point() and not torch.isfinite(t).all()), None)


def check_fingerprint(fingerprint: Fingerprint | None, cfg: ModelConfig, tokenizers: dict[str, str] | None,
                      path: Path, config_name: str = CONFIG) -> None:
    """The model config and tokenizer files must be the ones `path` was saved with."""
    if fingerprint is None:
        return
    now = cfg.as_dict()
    changed = [k for k in sorted(set(now) | set(fingerprint.model)) if now.get(k) != fingerprint.model.get(k)]
    if changed:
        k = changed[0]
        raise XattnError(f"{config_name}: model.{k} is {now.get(k)!r}, but {path.name} was saved with "
                         f"{fingerprint.model.get(k)!r}; restore it (the weights only fit the config they were trained with)")
    if tokenizers is not None and tokenizers != fingerprint.tokenizers:
        name = next(n for n in sorted(set(tokenizers) | set(fingerprint.tokenizers))
                    if tokenizers.get(n) != fingerprint.tokenizers.get(n))
        state = "is missing" if name not in tokenizers else "is not the tokenizer" if name in fingerprint.tokenizers \
            else "was not there"
        raise XattnError(f"{path.parent / name}: {state} when {path.name} was saved; restore the original tokenizer")


def load_weights(model: Transformer, path: Path, tokenizers: dict[str, str] | None = None) -> None:
    """Load `path` into `model` after `read_weights` and `check_fingerprint`."""
    tensors, fingerprint = read_weights(path)
    check_fingerprint(fingerprint, model.cfg, tokenizers, path)
    apply_weights(model, tensors, path)


def apply_weights(model: Transformer, tensors: dict[str, torch.Tensor], path: Path) -> None:
    """Copy `tensors` (read from `path`) into `model`; names and shapes must fit exactly."""
    expected = weights_of(model)
    missing, unexpected = sorted(set(expected) - set(tensors)), sorted(set(tensors) - set(expected))
    if missing or unexpected:
        raise XattnError(f"{path}: weights do not fit the config: missing {missing[:5]}, unexpected {unexpected[:5]}")
    for name, t in tensors.items():
        if t.shape != expected[name].shape:
            raise XattnError(f"{path}: tensor {name} has shape {tuple(t.shape)}, but the model config "
                             f"({CONFIG}) gives {tuple(expected[name].shape)}")
    result = model.load_state_dict(tensors, strict=False)
    aliases = set(model.state_dict()) - set(expected)
    if set(result.missing_keys) - aliases or result.unexpected_keys:
        raise XattnError(f"{path}: weights did not load cleanly: {result}")


def check_vocabularies(cfg: ModelConfig, tokenizers: TokenizerPair) -> None:
    """Each tokenizer must have exactly as many ids as its embedding has rows."""
    for side, tok, size in (("src", tokenizers.src, cfg.src_vocab_size), ("tgt", tokenizers.tgt, cfg.tgt_vocab_size)):
        if tok.vocab_size != size:
            raise XattnError(f"{tok.path}: has {tok.vocab_size} ids, but the {side} embedding has {size} rows "
                             f"(model.{side}_vocab_size); the tokenizer and the weights do not belong together")


def save_model_dir(out_dir: Path, model: Transformer, cfg: RunConfig, weights_name: str = WEIGHTS,
                   base: dict[str, torch.Tensor] | None = None) -> None:
    """Write config.yaml and the weights into `out_dir`, whose tokenizer files must already be there.
    With `base` (the full weights of the parent that cfg.parent names), only the tensors that differ from
    it, in shape or in any bit, are written: a delta."""
    out_dir = Path(out_dir)
    if (base is not None) != cfg.parent.needed:
        raise ValueError("a delta needs both the parent's weights and cfg.parent (with parent.delta true)")
    save_config(cfg, out_dir / CONFIG)
    keep = None if base is None else changed_names(weights_of(model), base)
    save_weights(model, out_dir / weights_name, tokenizer_hashes(out_dir), keep)


def changed_names(tensors: dict[str, torch.Tensor], base: dict[str, torch.Tensor]) -> set[str]:
    """Names in `tensors` that `base` lacks or holds with another dtype, shape or value (bit for bit)."""
    def bits(t: torch.Tensor) -> torch.Tensor:
        return t.contiguous().reshape(-1).view(torch.uint8)

    def same(a: torch.Tensor, b: torch.Tensor) -> bool:
        return a.dtype == b.dtype and a.shape == b.shape and torch.equal(bits(a), bits(b))
    return {name for name, t in tensors.items() if name not in base or not same(t, base[name])}


def parent_dir(child: Path, parent: ParentConfig) -> Path:
    """The parent directory that `parent.path` names, relative to the child's directory unless absolute."""
    return Path(os.path.normpath(Path(child).resolve() / parent.path))  # relative to where the child really is


def parent_link(child: Path, parent: Path, tensors: str, delta: bool = True) -> ParentConfig:
    """The `parent:` section of a child in `child` made from the model in `parent` (full weights `tensors`)."""
    return ParentConfig(os.path.relpath(Path(parent).resolve(), Path(child).resolve()), tensors, delta)


MAX_PARENTS = 16


def check_model_dir(path: str | Path, weights_name: str = WEIGHTS) -> Path:
    """`path` as a Path, if it is a directory with a config and weights; else a one-line XattnError."""
    path = Path(path)
    if not path.is_dir():
        raise XattnError(f"{path}: {'is a file, ' if path.exists() else ''}not a model directory")
    if not (path / CONFIG).is_file():
        raise XattnError(f"{path}: not a model directory (no {CONFIG})")
    if not (path / weights_name).is_file():
        raise XattnError(f"{path}: no {weights_name} (has training written a checkpoint yet?)")
    return path


def read_model(path: str | Path, weights_name: str = WEIGHTS, _depth: int = 0) -> tuple[RunConfig, dict[str, torch.Tensor]]:
    """The config and the full weights of a model directory, checked against their fingerprint; a delta is
    completed from its parent, which must hold the weights the child was made from."""
    path = check_model_dir(path, weights_name)
    cfg = load_config(path / CONFIG)
    tensors, fingerprint = read_weights(path / weights_name)
    check_fingerprint(fingerprint, cfg.model, tokenizer_hashes(path), path / weights_name, str(path / CONFIG))
    if not cfg.parent.needed:
        return cfg, tensors
    parent = parent_dir(path, cfg.parent)
    if _depth >= MAX_PARENTS:
        raise XattnError(f"{path / CONFIG}: parent.path: more than {MAX_PARENTS} parents in a row (a loop?)")
    if not (parent / CONFIG).is_file() or not (parent / WEIGHTS).is_file():
        raise XattnError(f"{path}: stores only what it changed from its parent {parent}, which is missing; put the "
                         f"parent back there or set parent.path in {path / CONFIG}")
    _, base = read_model(parent, WEIGHTS, _depth + 1)
    if (digest := tensors_digest(base)) != cfg.parent.tensors:
        raise XattnError(f"{path}: its parent {parent} holds other weights (SHA-256 {digest[:12]}) than the ones it "
                         f"was made from ({cfg.parent.tensors[:12]}); restore that parent model")
    return cfg, base | tensors


@dataclass
class LoadedModel:
    model: Transformer
    config: RunConfig
    tokenizers: TokenizerPair


def load_model_dir(path: str | Path, device: str | torch.device = "cpu", weights_name: str = WEIGHTS) -> LoadedModel:
    """Read a model directory into an eval-mode Transformer on `device`, its config and tokenizers, checked."""
    path = check_model_dir(path, weights_name)
    tokenizers = load_tokenizers(path)
    cfg, tensors = read_model(path, weights_name)
    check_vocabularies(cfg.model, tokenizers)
    model = Transformer(cfg.model)
    apply_weights(model, tensors, path / weights_name)
    return LoadedModel(model.to(device).eval(), cfg, tokenizers)
