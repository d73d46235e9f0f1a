"""Which prepared directory a run trains on: the one `data.prepared` names, checked against the config, or
the one made from the same inputs and settings in the cache (~/.cache/xattn/prepared, honouring
$XDG_CACHE_HOME), prepared there when it is missing, by rank 0 while the other DDP processes wait.

A cached directory is named by a key over the settings that shape the arrays (prepare.SETTINGS), the input
files' paths, sizes and modification times (a named dataset's: its text's SHA-256, as it is small) and the
inherited tokenizers, so finding it reads no corpus. Every process then maps the same files.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import sys
from pathlib import Path

from xattn.config import DataConfig
from xattn.data.inputs import Inputs, dataset_name, file_stamp, parts
from xattn.data.prepare import SETTINGS, prepare
from xattn.data.prepared import MappedCorpus
from xattn.distributed import Context
from xattn.errors import XattnError
from xattn.io import json_text, sha256_file
from xattn.lines import open_input

SHAPING = ("vocab_size", "joint_vocab", "max_len", "max_ratio", "spm_sample", "dedup", "train_subset", "subset_seed")
"""Settings a prepared directory must share with the config that trains on it, whatever names its inputs."""


def cache_root() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "xattn" / "prepared"


def training_corpus(cfg: DataConfig, ctx: Context | None = None, inherit: dict[str, Path] | None = None,
                    workers: int | None = None) -> MappedCorpus:
    """The prepared training corpus of `cfg`, memory-mapped (see the module)."""
    ctx, inherit = ctx or Context(), inherit or {}
    prepared = Path(cfg.prepared) if cfg.prepared else None
    folder = prepared or cache_root() / f"{slug(cfg)}-{cache_key(cfg, inherit)}"
    with ctx.first() as mine:  # (rank 0 reads it through or makes it; its refusal is every rank's)
        corpus = (MappedCorpus.open(folder) if prepared else make(folder, cfg, inherit, workers)) if mine else None
    corpus = corpus if corpus is not None else MappedCorpus.open(folder, verify=False)  # (rank 0 checked it)
    if prepared:
        check_matches(corpus, cfg, inherit)
    return corpus


def make(folder: Path, cfg: DataConfig, inherit: dict[str, Path], workers: int | None) -> MappedCorpus:
    """`folder` opened, prepared first unless a complete one is there; a damaged one is prepared again."""
    if (folder / "manifest.json").is_file():
        try:
            return MappedCorpus.open(folder)
        except XattnError as e:
            print(f"xattn: {e}; preparing it again", file=sys.stderr)
            shutil.rmtree(folder)
    try:
        prepare(cfg, folder, workers, inherit)
    except (OSError, XattnError):
        if not (folder / "manifest.json").is_file():  # (else another run prepared the same corpus meanwhile)
            raise
        return MappedCorpus.open(folder)
    return MappedCorpus.open(folder, verify=False)  # (just written, and hashed as it was)


def slug(cfg: DataConfig) -> str:
    """A readable start of a cached directory's name: the dataset, or the training file's name."""
    if cfg.dataset is not None:
        return f"{cfg.dataset}-{cfg.src_lang}-{cfg.tgt_lang}"
    name = Path(cfg.train_tsv or cfg.train_src).name
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in name)[:40]


def cache_key(cfg: DataConfig, inherit: dict[str, Path]) -> str:
    """16 hex digits over what the arrays are made from (see the module)."""
    inputs = {dataset_name(cfg): Inputs.dataset_digest(cfg)} if cfg.dataset is not None else {}
    inputs |= {str(Path(f).resolve()): stamp(f) for f in input_files(cfg)}
    body = {"data": {k: getattr(cfg, k) for k in SETTINGS}, "inputs": inputs,
            "inherit": {side: sha256_file(path) for side, path in sorted(inherit.items())}}
    if cfg.corpora:  # which file plays which part
        body["corpora"] = [[str(Path(f).resolve()) for f in corpus_files(part)] for part, _ in parts(cfg)]
    return hashlib.sha256(json_text(body).encode()).hexdigest()[:16]


FILE_KEYS = ("train_src", "train_tgt", "train_tsv", "train_links")


def corpus_files(cfg: DataConfig) -> dict[str, str]:
    """{key: file} of one corpus (a part, xattn.data.inputs.parts): its training files and links file."""
    keys = FILE_KEYS if cfg.dataset is None else ("train_links",)
    return {key: getattr(cfg, key) for key in keys if getattr(cfg, key)}


def input_files(cfg: DataConfig) -> list[str]:
    """The training files of every corpus the config names (of a named dataset, its links file alone)."""
    return [path for part, _ in parts(cfg) for path in corpus_files(part).values()]


def stamp(path: str) -> dict:
    try:
        return file_stamp(path)
    except FileNotFoundError:
        raise XattnError(f"{path}: no such file") from None


def check_matches(corpus: MappedCorpus, cfg: DataConfig, inherit: dict[str, Path]) -> None:
    """That the prepared directory `data.prepared` names was made from what `cfg` says: the shaping settings,
    the dataset, the training files the config names (by size and time, else by their SHA-256) and the
    inherited tokenizers. One line naming the first key or file that differs."""
    made, where = corpus.manifest.get("data", {}), f"data.prepared={corpus.folder}"
    keys = SHAPING + (("dataset", "src_lang", "tgt_lang") + (("numbers_size",) if cfg.dataset == "numbers" else ())
                      if cfg.dataset is not None else ())
    for key in keys:
        if made.get(key) != getattr(cfg, key):
            raise XattnError(f"data.{key}: {where} was prepared with {json_text(made.get(key))}, this run has "
                             f"{json_text(getattr(cfg, key))}; set data.{key} to match or prepare again")
    records = corpus.manifest.get("inputs", {})
    if cfg.dataset is None and (cfg.train_tsv or cfg.train_src) and made.get("dataset") is not None:
        raise XattnError(f"data.prepared: {corpus.folder} was prepared from the {made['dataset']} dataset, not "
                         f"from the training files this config names")
    if cfg.dataset is not None and records.get(dataset_name(cfg), {}).get("sha256") != Inputs.dataset_digest(cfg):
        raise XattnError(f"data.prepared: {corpus.folder} was not prepared from the {dataset_name(cfg)} text this "
                         "run reads; prepare again")
    held = len(corpus.manifest.get("corpora", [len(corpus)]))
    if held != len(cfg.corpora) + 1:  # (a corpus more than the config names would be trained on, unweighted)
        raise XattnError(f"data.corpora: {corpus.folder} was prepared from {held} corpora, this run names "
                         f"{len(cfg.corpora) + 1}; prepare again")
    by_key = {record.get("key"): record for record in records.values() if isinstance(record, dict)}
    for part, prefix in parts(cfg):
        for key, path in corpus_files(part).items():
            name = f"data.{key}" if not prefix else f"data.{prefix}{key.removeprefix('train_')}"
            if f"{prefix}{key}" not in by_key or not same_file(path, by_key[f"{prefix}{key}"]):
                raise XattnError(f"{name}: {path} is not the file {corpus.folder} was prepared from ("
                                 f"{'its text differs' if f'{prefix}{key}' in by_key else f'it was made without {name}'}"
                                 "); prepare again")
    for side, path in inherit.items():
        name = f"spm.{side}.model"
        if corpus.manifest.get("tokenizers", {}).get(name) != sha256_file(path):
            raise XattnError(f"data.prepared: {corpus.folder}/{name} is not the parent's {side} tokenizer ({path}); "
                             "prepare the child's corpus again (xattn finetune does when data.prepared is unset)")


def same_file(path: str, record: dict) -> bool:
    """Whether `path` holds the text `record` (prepare's) was made from: the same size and time, or the same
    SHA-256 of its text as read (the file was copied or touched)."""
    now = stamp(path)
    if now == {"bytes": record.get("bytes"), "mtime_ns": record.get("mtime_ns")}:
        return True
    digest = hashlib.sha256()
    try:
        with open_input(path) as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    except (OSError, EOFError) as e:  # (changed since, and unreadable now)
        raise XattnError(f"{path}: cannot read ({e})") from None
    return digest.hexdigest() == record.get("sha256")
