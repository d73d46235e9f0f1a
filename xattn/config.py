"""Typed configuration: frozen dataclasses built once from YAML plus `section.key=value` overrides.

A run config has four sections, each a dataclass below: `model`, `data`, `train`, `decode`; a fine-tuned
child's (xattn.transfer) has a fifth, `parent` (xattn.parent), naming the model it was made from, and one
trained for alignment an `alignment` section (xattn.guidance).
Every value is checked once, when its dataclass is built (from YAML, overrides or Python): its type,
then its range (each class's CHECKS table), then the rules that tie fields together. A bad value is
a ConfigError naming `section.key`; an unknown key names the nearest valid one.
"""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import yaml

from xattn.checks import FRACTION, NON_NEGATIVE, POSITIVE, Check, ConfigError, build, device_name, nearest, one_of, \
    validate, within
from xattn.corpora import check as check_corpora
from xattn.corpora import check_sources
from xattn.errors import XattnError
from xattn.guidance import AlignmentConfig
from xattn.yamlfile import read_yaml
from xattn.overrides import drop_retired, parse_overrides
from xattn.parent import ParentConfig
from xattn.registry import ACTIVATIONS, NORMS, POSITIONS, SCORES, VARIANTS, per_place_problem
from xattn.search_settings import SearchSettings



def _as_dict(self) -> dict[str, Any]:
    """The fields as plain data, without the LATER keys at their defaults (so configs and fingerprints written
    before those keys existed still compare equal, and older versions read the newer files)."""
    return {k: v for k, v in dataclasses.asdict(self).items() if k not in self.LATER or v != self.LATER[k]}


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
    attention: dict = field(default_factory=dict)  # per place (enc_self, dec_self, cross): a variant of
    #   xattn.variants.VARIANTS (learned | gaussian), or a list with one per layer; places not named: learned
    heads: dict = field(default_factory=dict)      # per place: heads per layer, a number or a list (a pruned
    #   model); places not named: n_heads. Each head has d_model / n_heads dimensions
    length_ratio: float | None = None   # gaussian cross-attention: source / target length (null: measured
    #   on the training data when training starts)
    share_embeddings: bool = False      # one embedding matrix for source and target (joint vocabulary)
    tie_output: bool = False            # output projection reuses the target embedding
    pad_id: int = 0
    bos_id: int = 1
    eos_id: int = 2

    CHECKS: ClassVar[dict[str, Check]] = dict(
        src_vocab_size=POSITIVE, tgt_vocab_size=POSITIVE, d_model=POSITIVE, n_heads=POSITIVE,
        n_encoder_layers=NON_NEGATIVE, n_decoder_layers=POSITIVE, d_ff=POSITIVE, max_positions=POSITIVE,
        dropout=FRACTION, attention_dropout=FRACTION, activation_dropout=FRACTION,
        activation=one_of(*ACTIVATIONS), norm=one_of(*NORMS),
        positions=one_of(*POSITIONS), score=one_of(*SCORES),
        attention=lambda v: per_place_problem(v, lambda x: one_of(*VARIANTS)(x) if isinstance(x, str) else
                                       f"expected a variant name, got {x!r}"),
        heads=lambda v: per_place_problem(v, lambda x: None if isinstance(x, int) and not isinstance(x, bool) and x >= 0
                                   else f"expected a number of heads >= 0, got {x!r}"),
        pad_id=NON_NEGATIVE, bos_id=NON_NEGATIVE, eos_id=NON_NEGATIVE, length_ratio=within(0, lo_open=True))

    def __post_init__(self) -> None:
        validate(self, "model")
        if self.d_model % self.n_heads:
            raise ConfigError("model.n_heads", f"model.d_model ({self.d_model}) must be divisible by "
                              f"model.n_heads ({self.n_heads})")
        if self.share_embeddings and self.src_vocab_size != self.tgt_vocab_size:
            raise ConfigError("model.share_embeddings", "needs src_vocab_size == tgt_vocab_size (a joint vocabulary)")
        for key, default in (("attention", "learned"), ("heads", self.n_heads)):
            object.__setattr__(self, key, self._per_layer(key, default))
        for place in self.heads:  # a layer has model.n_heads heads, or fewer once pruned
            if (most := max(self.heads_of(place, i) for i in range(self.layers_of(place)))) > self.n_heads:
                raise ConfigError("model.heads", f"{place}: {most} heads, more than model.n_heads ({self.n_heads})")
        for name in ("pad_id", "bos_id", "eos_id"):
            if getattr(self, name) >= min(self.src_vocab_size, self.tgt_vocab_size):
                raise ConfigError(f"model.{name}", f"{getattr(self, name)} is outside the vocabulary "
                                  f"({min(self.src_vocab_size, self.tgt_vocab_size)} ids)")

    def _per_layer(self, key: str, default: Any) -> dict:
        """model.attention or model.heads in one canonical form: only places that differ from `default`,
        each as one value when all its layers agree, else a list with one per layer."""
        canonical = {}
        for place, value in getattr(self, key).items():
            layers = self.layers_of(place)
            values = value if isinstance(value, list) else [value] * layers
            if len(values) != layers:
                raise ConfigError(f"model.{key}", f"{place} has {layers} layers, but {len(values)} values are given")
            if any(v != default for v in values):
                canonical[place] = values[0] if len(set(values)) == 1 else list(values)
        return canonical

    def layers_of(self, place: str) -> int:
        return self.n_encoder_layers if place == "enc_self" else self.n_decoder_layers

    def variant(self, place: str, layer: int) -> str:
        """The attention variant (xattn.variants.VARIANTS) of `place` in layer `layer`."""
        value = self.attention.get(place, "learned")
        return value[layer] if isinstance(value, list) else value

    def heads_of(self, place: str, layer: int) -> int:
        value = self.heads.get(place, self.n_heads)
        return value[layer] if isinstance(value, list) else value

    def heads_per_layer(self, place: str) -> list[int]:
        """How many heads each layer of `place` has: model.n_heads, or fewer once pruned (0: none left)."""
        return [self.heads_of(place, i) for i in range(self.layers_of(place))]

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def learned_positions(self) -> int | None:
        """The positions a learned table holds (BOS and the tokens before EOS, on the target side); None for
        sinusoidal positions, which extend as needed."""
        return self.max_positions if self.positions == "learned" else None

    def beyond_positions(self, sequences) -> int | None:
        """The index of the first of `sequences` (token lists) longer than learned positions hold; None when all fit
        (sinusoidal positions extend as needed)."""
        if self.positions != "learned":
            return None
        return next((i for i, s in enumerate(sequences) if len(s) > self.max_positions), None)

    as_dict = _as_dict

    LATER: ClassVar[dict[str, Any]] = {"attention": {}, "heads": {}, "length_ratio": None}
    """Keys added after models were first saved, with their defaults (`as_dict` leaves them out at those)."""



@dataclass(frozen=True)
class DataConfig:
    dataset: str | None = "multi30k"   # multi30k | numbers | None (use the file keys below)
    src_lang: str = "de"
    tgt_lang: str = "en"
    data_dir: str | None = None         # local Multi30k copy; else $XATTN_DATA, else download
    train_src: str | None = None        # own corpus: two line-aligned files (plain or .gz) ...
    train_tgt: str | None = None
    train_tsv: str | None = None        # ... or one TSV file
    train_links: str | None = None      # word links of the training pairs for guided alignment (the alignment
    #   section): Pharaoh i-j per line, 0-based word indices, one line per pair (as xattn align writes them)
    valid_src: str | None = None
    valid_tgt: str | None = None
    valid_tsv: str | None = None
    numbers_size: int = 20000           # training pairs of the numbers dataset
    train_subset: int | None = None     # train on this many training pairs, drawn at random (a low-resource slice)
    subset_seed: int = 1                # which pairs train_subset draws
    vocab_size: int = 8000
    joint_vocab: bool = True            # one SentencePiece model for both sides
    max_len: int = 100                  # training pairs with a side longer than this (tokens) are dropped
    max_ratio: float = 3.0              # training pairs whose token-length ratio exceeds this are dropped
    spm_sample: int = 250_000           # SentencePiece trains on this many training pairs drawn at random
    #   (seeded by subset_seed; all of them when the corpus is smaller), as `xattn prepare` streams the corpus
    dedup: bool = False                 # xattn prepare: drop a training pair that repeats an earlier one exactly
    prepared: str | None = None         # train on this prepared directory (xattn prepare); None: the one made
    #   from the training files (or dataset) and the keys above, found in or added to the cache
    corpora: list = field(default_factory=list)  # more training corpora after this one, each {src, tgt} or {tsv},
    #   with links and upsample or weight (xattn.corpora); this one takes the two keys below
    upsample: float | None = None       # copies of the training corpus an epoch draws (with data.corpora)
    weight: float | None = None         # its share of an epoch, against data.corpora's weights

    CHECKS: ClassVar[dict[str, Check]] = dict(
        dataset=one_of("multi30k", "numbers"), numbers_size=within(1, 800_000), vocab_size=within(8),
        train_subset=POSITIVE, subset_seed=within(0, 2**32 - 1),
        max_len=POSITIVE, max_ratio=within(1), spm_sample=POSITIVE, upsample=within(0, lo_open=True),
        weight=within(0, lo_open=True))
    LANGUAGES: ClassVar[dict[str, tuple[str, ...]]] = {"multi30k": ("en", "de", "fr", "cs"),
                                                      "numbers": ("en", "de", "fr", "cs", "digits")}
    LOCATIONS: ClassVar[tuple[str, ...]] = ("data_dir", "train_src", "train_tgt", "train_tsv", "train_links",
                                            "valid_src", "valid_tgt", "valid_tsv", "prepared")
    """Keys that say where the data is, not what it is: a resumed run may move its files."""

    def __post_init__(self) -> None:
        validate(self, "data")
        if self.dataset is not None:
            for key in ("src_lang", "tgt_lang"):
                problem = one_of(*self.LANGUAGES[self.dataset])(getattr(self, key))
                if problem:
                    raise ConfigError(f"data.{key}", f"{problem} (the languages of {self.dataset})")
        for prefix in ("train", "valid"):
            if bool(getattr(self, f"{prefix}_src")) != bool(getattr(self, f"{prefix}_tgt")):
                raise ConfigError(f"data.{prefix}_src", f"data.{prefix}_src and data.{prefix}_tgt go together")
        if self.train_links and self.dataset is None and not (self.train_tsv or self.train_src):
            raise ConfigError("data.train_links", "goes with the pairs it links: data.dataset, data.train_src + "
                              "data.train_tgt or data.train_tsv (a prepared directory holds its links already)")
        check_corpora(self)

    def require_pairs(self) -> None:
        """Training needs pairs: a dataset, training files or a prepared directory, each named once, so that none is
        silently left unread (files beside a dataset, a TSV beside src/tgt files, a folder for data that is not
        Multi30k). (A model directory's config may name none: an imported model's says only its languages.)"""
        if self.dataset is None and not (self.train_tsv or (self.train_src and self.train_tgt) or self.prepared):
            raise ConfigError("data.dataset", "is null: set data.train_src + data.train_tgt, data.train_tsv or "
                              "data.prepared")
        check_sources(self)

    as_dict = _as_dict
    LATER: ClassVar[dict[str, Any]] = {"train_links": None, "corpora": [], "upsample": None, "weight": None}


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
    device: str = "auto"                # auto | cpu | cuda | cuda:N | mps
    threads: int = 0                    # torch CPU threads (0: torch default)
    ddp_timeout: float = 60.0           # torchrun: minutes a process waits for the others (rank 0 preparing a corpus)

    CHECKS: ClassVar[dict[str, Check]] = dict(
        max_tokens=POSITIVE, accumulate=POSITIVE, lr=within(0, lo_open=True), warmup=NON_NEGATIVE,
        betas=FRACTION, weight_decay=NON_NEGATIVE, label_smoothing=FRACTION, clip_norm=NON_NEGATIVE,
        max_steps=POSITIVE, max_epochs=POSITIVE, max_minutes=NON_NEGATIVE, amp=one_of("auto", "none", "bf16", "fp16"),
        eval_every=POSITIVE, eval_bleu_sentences=NON_NEGATIVE, patience=NON_NEGATIVE, average_last=NON_NEGATIVE,
        log_every=POSITIVE, seed=within(0, 2**32 - 1), device=device_name, threads=within(0, 1024),
        ddp_timeout=within(0, 10**6, lo_open=True))

    def __post_init__(self) -> None:
        validate(self, "train")


@dataclass(frozen=True)
class DecodeConfig(SearchSettings):
    beam_size: int = 5                  # 1: greedy search
    sampling: bool = False              # draw tokens at random instead of searching (beam_size unused)
    temperature: float = 1.0            # sampling: < 1 sharper, > 1 flatter
    top_k: int = 0                      # sampling: keep the k most probable tokens (0: all)
    top_p: float = 1.0                  # sampling: keep the smallest set with this much mass (nucleus)
    num_samples: int = 1                # sampling: samples per input, returned as alternatives
    seed: int | None = None             # sampling: same seed, same samples
    length_penalty: float = 1.0         # GNMT alpha (0..10): score = log p / ((5 + len) / 6) ** alpha
    coverage_penalty: float = 0.0       # GNMT beta (0..10): + beta * sum_j log(min(attention mass on source j, 1))
    n_best: int = 1                     # beam: hypotheses returned per input
    min_len: int = 0                    # no EOS before this many tokens
    max_len_a: float = 1.5              # max target length = a * source length + b
    max_len_b: int = 10
    no_repeat_ngram_size: int = 0       # forbid repeating any n-gram of this size (0: off)
    stopping: str = "exact"             # beam: when a sentence's search ends. exact: once no active hypothesis
    #   can still beat the n_best-th finished one (its score bound: log p only falls as it grows); early: once
    #   beam_size hypotheses have finished (fairseq's, CTranslate2's rule: faster, may return a worse one)
    max_tokens: int = 8000              # token budget of one translation batch
    shortlist: bool = False             # score only the target tokens the model's lexical shortlist lists for
    #   a sentence's source tokens (xattn shortlist; xattn/shortlist.py): faster, may change a few translations

    CHECKS: ClassVar[dict[str, Check]] = dict(
        beam_size=within(1, 1024), temperature=within(0, lo_open=True), top_k=NON_NEGATIVE,
        top_p=within(0, 1, lo_open=True), num_samples=within(1, 1024), seed=within(0, 2**63 - 1),
        length_penalty=within(0, 10), coverage_penalty=within(0, 10), n_best=POSITIVE, min_len=NON_NEGATIVE,
        max_len_a=within(0, 1000), max_len_b=within(0, 100_000), no_repeat_ngram_size=NON_NEGATIVE,
        stopping=one_of("exact", "early"), max_tokens=POSITIVE)

    def __post_init__(self) -> None:
        validate(self, "decode")
        if self.n_best > self.beam_size and not self.sampling:  # (sampling: refuse_unused names n_best, if given)
            raise ConfigError("decode.n_best", f"{self.n_best} is above decode.beam_size ({self.beam_size}); "
                              "raise the beam to at least n_best")
        if self.max_len_a == 0 and self.max_len_b == 0:
            raise ConfigError("decode.max_len_b", "decode.max_len_a and decode.max_len_b are both 0: nothing could "
                              "be generated")

    def max_output_tokens(self, src_len: int) -> int:
        """floor(max_len_a * src_len + max_len_b): the most tokens a search may give before its EOS, for a source
        of `src_len` tokens (its EOS counted); the one rule of the search (max_lengths) and the server's limits."""
        return int(self.max_len_a * src_len + self.max_len_b)  # (int is floor: both are checked non-negative)

    as_dict = _as_dict
    LATER: ClassVar[dict[str, Any]] = {"shortlist": False}
    """Keys added after models were first saved, with their defaults (`as_dict` leaves them out at those)."""

@dataclass(frozen=True)
class RunConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    decode: DecodeConfig = field(default_factory=DecodeConfig)
    parent: ParentConfig = field(default_factory=ParentConfig)
    alignment: AlignmentConfig = field(default_factory=AlignmentConfig)

    def __post_init__(self) -> None:
        self.alignment.check_data(self.data)
        if self.model.positions == "learned" and self.model.max_positions < self.data.max_len + 1:
            raise ConfigError("model.max_positions", f"{self.model.max_positions} learned positions cannot hold "
                              f"training sentences of data.max_len={self.data.max_len} tokens plus EOS")

    def to_dict(self) -> dict[str, Any]:
        """Every section as plain data (the model's and decoding's without their LATER keys at their defaults,
        so older versions read it); `parent` only when the config names one, `alignment` only when it is on."""
        left_out = {"parent": not self.parent.named, "alignment": not self.alignment.on}
        return {f.name: _plain(section.as_dict() if hasattr(section := getattr(self, f.name), "LATER") else
                               dataclasses.asdict(section)) for f in dataclasses.fields(self) if not left_out.get(f.name)}


def _plain(d: dict[str, Any]) -> dict[str, Any]:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in d.items()}


SECTIONS = {"model": ModelConfig, "data": DataConfig, "train": TrainConfig, "decode": DecodeConfig,
            "parent": ParentConfig, "alignment": AlignmentConfig}


def load_config(path: str | Path | None = None, overrides: list[str] | None = None,
                base: RunConfig | None = None) -> RunConfig:
    """Read a YAML run config (sections model/data/train/decode), then apply `section.key=value` overrides."""
    raw: Any = {}
    if path is not None:
        raw = read_yaml(Path(path))
        if raw is None:  # (taken for every default, it trained a Multi30k model from an empty file)
            raise XattnError(f"{path}: empty; expected a mapping with sections {', '.join(SECTIONS)}")
        if not isinstance(raw, dict):
            raise XattnError(f"{path}: expected a mapping with sections {', '.join(SECTIONS)}")
    for name, values in raw.items():
        if name not in SECTIONS:
            raise XattnError(f"{path}: unknown config section {name!r}{nearest(str(name), list(SECTIONS))}")
        if values is not None and not isinstance(values, dict):
            raise XattnError(f"{path}: section {name!r} must be a mapping of keys to values, got {values!r}")
    given = parse_overrides(overrides or [], SECTIONS)
    drop_retired(raw, given)
    merged = {name: dict(raw.get(name) or {}) for name in SECTIONS}
    for name, values in given.items():
        merged[name].update(values)
    base = base or RunConfig()
    parts = {}
    for name, cls in SECTIONS.items():
        try:
            parts[name] = build(cls, merged[name], name, getattr(base, name))
        except ConfigError as e:  # name the file unless the value came from an override
            rest = e.key.partition(".")[2]
            key = re.match(r"[^.\[]*", rest)[0]  # data.corpora[0].upsample: corpora
            if path is None or key in given.get(name, {}) or rest in given.get(name, {}):  # (train.foo.bar=1)
                raise
            raise XattnError(f"{path}: {e}") from None
    return RunConfig(**parts)


def save_config(cfg: RunConfig, path: str | Path) -> None:
    """Write `cfg` as YAML, atomically."""
    from xattn.io import atomic_write_text

    atomic_write_text(Path(path), yaml.safe_dump(cfg.to_dict(), sort_keys=False))
