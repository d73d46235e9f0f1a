"""Typed configuration: frozen dataclasses built once from YAML plus `section.key=value` overrides.

A run config has four sections, each a dataclass below: `model`, `data`, `train`, `decode`.
Unknown keys are errors that name the key and the nearest valid one.
"""
from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from xattn.errors import XattnError


@dataclass(frozen=True)
class ModelConfig:
    src_vocab_size: int = 8000
    tgt_vocab_size: int = 8000
    d_model: int = 256
    n_heads: int = 4
    n_encoder_layers: int = 3
    n_decoder_layers: int = 3
    d_ff: int = 1024
    dropout: float = 0.1
    attention_dropout: float = 0.0      # on attention weights
    activation_dropout: float = 0.0     # on the FFN hidden layer (fairseq's activation_dropout)
    activation: str = "relu"            # relu | gelu | swish (SiLU, as in opus-mt models)
    norm: str = "post"                  # post (Vaswani et al. 2017) | pre (Xiong et al. 2020)
    positions: str = "sinusoidal"       # sinusoidal | learned
    max_positions: int = 1024           # learned positions only; sinusoidal ones extend as needed
    score: str = "scaled_dot"           # dot | scaled_dot | general | additive
    share_embeddings: bool = False      # one embedding matrix for source and target (joint vocabulary)
    tie_output: bool = False            # output projection reuses the target embedding
    pad_id: int = 0
    bos_id: int = 1
    eos_id: int = 2

    def __post_init__(self) -> None:
        _check_choice("model.activation", self.activation, ("relu", "gelu", "swish"))
        _check_choice("model.norm", self.norm, ("post", "pre"))
        _check_choice("model.positions", self.positions, ("sinusoidal", "learned"))
        _check_choice("model.score", self.score, ("dot", "scaled_dot", "general", "additive"))
        if self.d_model % self.n_heads:
            raise XattnError(f"model.d_model ({self.d_model}) must be divisible by model.n_heads ({self.n_heads})")
        if self.share_embeddings and self.src_vocab_size != self.tgt_vocab_size:
            raise XattnError("model.share_embeddings needs src_vocab_size == tgt_vocab_size (a joint vocabulary)")
        for name in ("src_vocab_size", "tgt_vocab_size", "d_model", "n_heads", "d_ff"):
            if getattr(self, name) <= 0:
                raise XattnError(f"model.{name} must be positive, got {getattr(self, name)}")
        if not 0.0 <= self.dropout < 1.0:
            raise XattnError(f"model.dropout must be in [0, 1), got {self.dropout}")


@dataclass(frozen=True)
class DataConfig:
    dataset: str | None = "multi30k"   # multi30k | numbers | None (use the file keys below)
    src_lang: str = "de"
    tgt_lang: str = "en"
    data_dir: str | None = None         # local Multi30k copy; else $XATTN_DATA, else download
    train_src: str | None = None        # own corpus: two line-aligned files (plain or .gz) ...
    train_tgt: str | None = None
    train_tsv: str | None = None        # ... or one TSV file
    valid_src: str | None = None
    valid_tgt: str | None = None
    valid_tsv: str | None = None
    numbers_size: int = 20000           # training pairs of the numbers dataset
    vocab_size: int = 8000
    joint_vocab: bool = True            # one SentencePiece model for both sides
    max_len: int = 100                  # training pairs with a side longer than this (tokens) are dropped
    max_ratio: float = 3.0              # training pairs whose token-length ratio exceeds this are dropped

    def __post_init__(self) -> None:
        if self.dataset is not None:
            _check_choice("data.dataset", self.dataset, ("multi30k", "numbers"))
        elif not (self.train_tsv or (self.train_src and self.train_tgt)):
            raise XattnError("data: set data.dataset, or data.train_src + data.train_tgt, or data.train_tsv")


@dataclass(frozen=True)
class TrainConfig:
    max_tokens: int = 4096              # token budget of one batch (padded source or target positions)
    accumulate: int = 1                 # batches per optimizer step
    lr: float = 1e-3                    # peak learning rate, reached after `warmup` steps
    warmup: int = 1000
    betas: tuple[float, float] = (0.9, 0.98)
    weight_decay: float = 0.0001
    label_smoothing: float = 0.1
    clip_norm: float = 1.0              # 0 disables gradient clipping
    max_steps: int = 20000
    max_epochs: int = 1000
    max_minutes: float = 0.0            # stop after this much wall time (0: no limit)
    amp: str = "auto"                   # auto | none | bf16 | fp16 (fp16 only on CUDA)
    eval_every: int = 1000              # validate (loss and BLEU) every N optimizer steps
    eval_bleu_sentences: int = 0        # 0: whole validation set
    patience: int = 0                   # early stopping after N validations without improvement (0: off)
    average_last: int = 0               # average the weights of the last N checkpoints at the end (0: off)
    log_every: int = 100
    seed: int = 1
    device: str = "auto"                # auto | cpu | cuda | cuda:N
    threads: int = 0                    # torch CPU threads (0: torch default)

    def __post_init__(self) -> None:
        _check_choice("train.amp", self.amp, ("auto", "none", "bf16", "fp16"))
        if self.max_tokens <= 0 or self.accumulate <= 0 or self.lr <= 0:
            raise XattnError("train.max_tokens, train.accumulate and train.lr must be positive")


@dataclass(frozen=True)
class DecodeConfig:
    beam_size: int = 5                  # 1: greedy search
    sampling: bool = False              # draw tokens at random instead of searching (beam_size unused)
    temperature: float = 1.0            # sampling: < 1 sharper, > 1 flatter
    top_k: int = 0                      # sampling: keep the k most probable tokens (0: all)
    top_p: float = 1.0                  # sampling: keep the smallest set with this much mass (nucleus)
    num_samples: int = 1                # sampling: samples per input, returned as alternatives
    seed: int | None = None             # sampling: same seed, same samples
    length_penalty: float = 1.0         # GNMT alpha: score = log p / ((5 + len) / 6) ** alpha
    coverage_penalty: float = 0.0       # GNMT beta: + beta * sum_j log(min(attention mass on source j, 1))
    n_best: int = 1                     # beam: hypotheses returned per input
    min_len: int = 0                    # no EOS before this many tokens
    max_len_a: float = 1.5              # max target length = a * source length + b
    max_len_b: int = 10
    no_repeat_ngram_size: int = 0       # forbid repeating any n-gram of this size (0: off)
    early_stopping: bool = True         # beam: a sentence ends once beam_size hypotheses have finished
    max_tokens: int = 8000              # token budget of one translation batch

    def __post_init__(self) -> None:
        checks = [
            (self.beam_size >= 1, f"decode.beam_size must be >= 1, got {self.beam_size}"),
            (1 <= self.n_best <= self.beam_size, f"decode.n_best must be in [1, beam_size={self.beam_size}], got {self.n_best}"),
            (self.temperature > 0, f"decode.temperature must be > 0, got {self.temperature}"),
            (0 < self.top_p <= 1, f"decode.top_p must be in (0, 1], got {self.top_p}"),
            (self.top_k >= 0, f"decode.top_k must be >= 0, got {self.top_k}"),
            (self.num_samples >= 1, f"decode.num_samples must be >= 1, got {self.num_samples}"),
            (self.length_penalty >= 0, f"decode.length_penalty must be >= 0, got {self.length_penalty}"),
            (self.coverage_penalty >= 0, f"decode.coverage_penalty must be >= 0, got {self.coverage_penalty}"),
            (self.min_len >= 0 and self.no_repeat_ngram_size >= 0, "decode.min_len and decode.no_repeat_ngram_size must be >= 0"),
            (self.max_tokens > 0, f"decode.max_tokens must be positive, got {self.max_tokens}"),
        ]
        for ok, message in checks:
            if not ok:
                raise XattnError(message)

    @property
    def hypotheses(self) -> int:
        """Rows decoded per input: samples when sampling, else the beam."""
        return self.num_samples if self.sampling else self.beam_size


@dataclass(frozen=True)
class RunConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    decode: DecodeConfig = field(default_factory=DecodeConfig)

    def to_dict(self) -> dict[str, Any]:
        return {f.name: _plain(dataclasses.asdict(getattr(self, f.name))) for f in dataclasses.fields(self)}


def _plain(d: dict[str, Any]) -> dict[str, Any]:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in d.items()}


def _check_choice(key: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise XattnError(f"{key}: {value!r} is not one of {', '.join(choices)}")


def _nearest(key: str, valid: list[str]) -> str:
    close = difflib.get_close_matches(key, valid, n=1, cutoff=0.5)
    return f" (did you mean {close[0]!r}?)" if close else f" (valid: {', '.join(valid)})"


def _coerce(value: Any, hint: Any, where: str) -> Any:
    """Convert a YAML or command-line value to the field's declared type."""
    if hint is Any:
        return value
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if value is None or (isinstance(value, str) and value.lower() in ("null", "none")):
            return None
        return _coerce(value, args[0], where)
    if origin is tuple:
        items = value if isinstance(value, (list, tuple)) else str(value).strip("()[]").split(",")
        return tuple(_coerce(v, a, where) for v, a in zip(items, typing.get_args(hint)))
    if hint is bool:
        if isinstance(value, bool):
            return value
        if str(value).lower() in ("true", "yes", "1"):
            return True
        if str(value).lower() in ("false", "no", "0"):
            return False
        raise XattnError(f"{where}: expected true or false, got {value!r}")
    try:
        if hint is int and isinstance(value, str):
            return int(float(value)) if "e" in value.lower() else int(value)
        return hint(value)
    except (TypeError, ValueError):
        raise XattnError(f"{where}: expected {hint.__name__}, got {value!r}") from None


def build(cls: type, values: dict[str, Any], section: str, base: Any = None) -> Any:
    """Build dataclass `cls` from `values`, on top of `base` (an instance) if given."""
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs = dataclasses.asdict(base) if base is not None else {}
    for key, value in values.items():
        if key not in names:
            raise XattnError(f"unknown config key {section}.{key}{_nearest(key, names)}")
        kwargs[key] = _coerce(value, hints[key], f"{section}.{key}")
    return cls(**kwargs)


SECTIONS = {"model": ModelConfig, "data": DataConfig, "train": TrainConfig, "decode": DecodeConfig}


def parse_overrides(items: list[str]) -> dict[str, dict[str, str]]:
    """`["train.lr=1e-3", "model.d_model=128"]` -> {"train": {"lr": "1e-3"}, "model": {"d_model": "128"}}."""
    out: dict[str, dict[str, str]] = {}
    for item in items:
        key, sep, value = item.partition("=")
        section, dot, name = key.partition(".")
        if not sep or not dot or not name:
            raise XattnError(f"override {item!r}: expected section.key=value, e.g. train.lr=5e-4")
        if section not in SECTIONS:
            raise XattnError(f"override {item!r}: unknown section {section!r}{_nearest(section, list(SECTIONS))}")
        out.setdefault(section, {})[name] = value
    return out


PRESET_DIR = Path(__file__).resolve().parent / "configs"


def presets() -> list[str]:
    """Names of the run configs shipped inside the package (xattn/configs/NAME.yaml)."""
    return sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))


def resolve_config(arg: str | Path) -> Path:
    """A run config: `arg` itself if it is a file, else the packaged preset it names (`numbers-de-en[.yaml]`)."""
    path = Path(arg)
    if path.is_file():
        return path
    preset = PRESET_DIR / f"{path.name.removesuffix('.yaml')}.yaml"
    if len(path.parts) == 1 and preset.is_file():
        return preset
    raise XattnError(f"{arg}: config file not found, and no preset of that name "
                     f"(presets: {', '.join(presets())})")


def load_config(path: str | Path | None = None, overrides: list[str] | None = None,
                base: RunConfig | None = None) -> RunConfig:
    """Read a YAML run config (sections model/data/train/decode), then apply `section.key=value` overrides."""
    raw: dict[str, Any] = {}
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise XattnError(f"{path}: config file not found")
        try:
            raw = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            where = f"{path}: line {mark.line + 1}" if mark else str(path)
            raise XattnError(f"{where}: invalid YAML ({getattr(e, 'problem', e)})") from None
        if not isinstance(raw, dict):
            raise XattnError(f"{path}: expected a mapping with sections {', '.join(SECTIONS)}")
    base = base or RunConfig()
    merged = {name: dict(raw.get(name) or {}) for name in SECTIONS}
    for name in raw:
        if name not in SECTIONS:
            raise XattnError(f"unknown config section {name!r}{_nearest(name, list(SECTIONS))}")
    for name, values in parse_overrides(overrides or []).items():
        merged[name].update(values)
    parts = {name: build(cls, merged[name], name, getattr(base, name)) for name, cls in SECTIONS.items()}
    return RunConfig(**parts)


def save_config(cfg: RunConfig, path: str | Path, extra: dict[str, Any] | None = None) -> None:
    """Write `cfg` (plus `extra` top-level keys, e.g. tokenizer files) as YAML, atomically."""
    from xattn.io import atomic_write_text

    body = cfg.to_dict() | (extra or {})
    atomic_write_text(Path(path), yaml.safe_dump(body, sort_keys=False))
