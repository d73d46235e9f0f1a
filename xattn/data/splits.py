"""The pairs a DataConfig names, read as text: a split of a named dataset or of the configured files, where
it comes from (for messages), and a fingerprint of the text. Without torch, for `xattn prepare`."""
from __future__ import annotations

import hashlib
import random

from xattn.config import DataConfig
from xattn.data.text import Pair, read_parallel, read_tsv
from xattn.datasets import load_pairs
from xattn.errors import XattnError


def read_split(cfg: DataConfig, split: str) -> list[Pair]:
    """The "train" or "val" pairs of a named dataset or of the configured files; with data.train_subset,
    that many training pairs drawn at random (data.subset_seed), in their order in the corpus."""
    pairs = read_all(cfg, split)
    if split != "train" or cfg.train_subset is None:
        return pairs
    if cfg.train_subset > len(pairs):
        raise XattnError(f"data.train_subset: {cfg.train_subset} is more than the {len(pairs)} pairs of "
                         f"{describe_split(cfg, 'train')}")
    keep = sorted(random.Random(cfg.subset_seed).sample(range(len(pairs)), cfg.train_subset))
    return [pairs[i] for i in keep]


def read_all(cfg: DataConfig, split: str) -> list[Pair]:
    if cfg.dataset is not None:
        size = cfg.numbers_size if cfg.dataset == "numbers" and split == "train" else None
        return load_pairs(cfg.dataset, cfg.src_lang, cfg.tgt_lang, split, cfg.data_dir, size=size)
    prefix = "train" if split == "train" else "valid"
    tsv, src, tgt = (getattr(cfg, f"{prefix}_{k}") for k in ("tsv", "src", "tgt"))
    if tsv:
        return read_tsv(tsv)
    if src and tgt:
        return read_parallel(src, tgt)
    raise XattnError(f"data: no {prefix} set; give data.{prefix}_src + data.{prefix}_tgt or data.{prefix}_tsv")


def describe_split(cfg: DataConfig, split: str) -> str:
    """Where a split comes from, for messages: the files, or the named dataset."""
    if cfg.dataset is not None:
        return f"{cfg.dataset} {cfg.src_lang}-{cfg.tgt_lang} {split}"
    prefix = "train" if split == "train" else "valid"
    tsv, src, tgt = (getattr(cfg, f"{prefix}_{k}") for k in ("tsv", "src", "tgt"))
    return tsv or f"{src} + {tgt}"


def text_fingerprint(*splits: list[Pair]) -> str:
    """SHA-256 of the pairs of each split, as read: whether a resumed run trains on the same text."""
    digest = hashlib.sha256()
    for pairs in splits:
        for src, tgt in pairs:
            digest.update(f"{src}\t{tgt}\n".encode("utf-8", "surrogatepass"))
        digest.update(b"\0")
    return digest.hexdigest()
