"""The corpus a run trains on: the training pairs a DataConfig names as a memory-mapped prepared directory
(xattn.data.store finds or makes it), the validation pairs in memory, and the tokenizers.

The tokenizers are the prepared directory's: a new run copies them into the model directory, and a resumed
run (or another DDP rank) checks that the ones there are the same, so every process tokenizes alike.
"""
from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass
from pathlib import Path

from xattn.config import DataConfig
from xattn.data import FilterStats, Pair, TokenizedCorpus, read_parallel, read_tsv, tokenize_pairs
from xattn.data.prepared import MappedCorpus
from xattn.datasets import load_pairs
from xattn.distributed import Context
from xattn.errors import XattnError
from xattn.io import json_text
from xattn.tokenizer import TokenizerPair, load_tokenizers


@dataclass
class Corpus:
    tokenizers: TokenizerPair
    train: MappedCorpus                 # the prepared directory, mapped
    valid: TokenizedCorpus
    valid_pairs: list[Pair]             # raw text, for BLEU
    stats: FilterStats                  # what cleaning dropped from the training pairs
    fingerprint: str                    # SHA-256 of the training ids (their arrays' hashes) and validation text


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


def prepare_corpus(cfg: DataConfig, out_dir: Path, ctx: Context | None = None, new_tokenizers: bool = True,
                   inherit: dict[str, Path] | None = None, workers: int | None = None) -> Corpus:
    """The training corpus prepared (found or made, xattn.data.store) and mapped, the validation pairs read
    and tokenized. With `new_tokenizers` (a new run), rank 0 copies the prepared directory's tokenizers into
    `out_dir`; otherwise the ones in `out_dir` must be the same. `inherit` {"src" or "tgt": a tokenizer file}:
    that side's tokenizer is a transfer parent's, and only the other side's is trained. The fingerprint
    covers the prepared arrays and tokenizers, so a resumed run whose model directory holds other tokenizers
    than its corpus differs from the run it resumes (train_state.run_identity)."""
    from xattn.checkpoint import copy_tokenizers, tokenizer_hashes
    from xattn.data.store import training_corpus

    ctx = ctx or Context()
    valid_raw = read_split(cfg, "val")
    valid_pairs = [p for p in valid_raw if p[0].strip() and p[1].strip()]
    if not valid_pairs:
        raise XattnError(f"{describe_split(cfg, 'val')}: the validation set is empty (no pair with text on both sides)")
    train = training_corpus(cfg, ctx, inherit, workers)
    prepared = train.manifest.get("tokenizers", {})
    if new_tokenizers and ctx.rank == 0:
        out_dir.mkdir(parents=True, exist_ok=True)
        for stale in set(tokenizer_hashes(out_dir)) - set(prepared):
            (out_dir / stale).unlink()
        copy_tokenizers(train.folder, out_dir)
    ctx.barrier()
    tokenizers = load_tokenizers(out_dir)
    if tokenizers.joint != cfg.joint_vocab:
        raise XattnError(f"{out_dir}: holds {'a joint' if tokenizers.joint else 'separate'} vocabulary, "
                         f"but data.joint_vocab={cfg.joint_vocab}")
    arrays = {name: spec.get("sha256") for name, spec in sorted(train.manifest["arrays"].items())}
    fingerprint = hashlib.sha256(json_text({"train": arrays, "tokenizers": prepared,
                                               "valid": text_fingerprint(valid_raw)}).encode()).hexdigest()
    return Corpus(tokenizers, train, tokenize_pairs(valid_pairs, tokenizers), valid_pairs,
                  FilterStats(**train.manifest["cleaning"]), fingerprint)
