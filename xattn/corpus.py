"""The corpus a run trains on: the pairs a DataConfig names, cleaned and tokenized, with its tokenizers.

Tokenizers are trained into the model directory on the first run and loaded from it afterwards,
so a resumed run (or another DDP rank) tokenizes exactly as the first one did.
"""
from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass
from pathlib import Path

from xattn.config import DataConfig
from xattn.data import FilterStats, Pair, TokenizedCorpus, clean_pairs, read_parallel, read_tsv, tokenize_pairs
from xattn.datasets import load_pairs
from xattn.distributed import Context
from xattn.errors import XattnError
from xattn.tokenizer import TokenizerPair, load_tokenizers, train_tokenizers


@dataclass
class Corpus:
    tokenizers: TokenizerPair
    train: TokenizedCorpus
    valid: TokenizedCorpus
    valid_pairs: list[Pair]             # raw text, for BLEU
    stats: FilterStats                  # what cleaning dropped from the training pairs
    fingerprint: str                    # SHA-256 of the training and validation text as read


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


def train_side_tokenizers(pairs: list[Pair], out_dir: Path, vocab_size: int, inherit: dict[str, Path]) -> None:
    """Separate tokenizers: the sides in `inherit` copied from their files, the others trained on `pairs`."""
    from xattn.io import atomic_write_bytes
    from xattn.tokenizer import JOINT_MODEL, SRC_MODEL, TGT_MODEL, train_sentencepiece

    for k, (side, name) in enumerate((("src", SRC_MODEL), ("tgt", TGT_MODEL))):
        if side in inherit:
            atomic_write_bytes(out_dir / name, Path(inherit[side]).read_bytes())
        else:
            train_sentencepiece([pair[k] for pair in pairs], out_dir / name, vocab_size)
    (out_dir / JOINT_MODEL).unlink(missing_ok=True)


def prepare_corpus(cfg: DataConfig, out_dir: Path, ctx: Context | None = None, new_tokenizers: bool = True,
                   inherit: dict[str, Path] | None = None) -> Corpus:
    """Read, clean and tokenize; with `new_tokenizers`, train the tokenizers into `out_dir` first
    (rank 0), otherwise load the ones there. `inherit` {"src" or "tgt": a tokenizer file}: that side's
    tokenizer is copied from another model (a transfer parent) and only the other side's is trained."""
    ctx = ctx or Context()
    train_raw, valid_raw = read_split(cfg, "train"), read_split(cfg, "val")
    train_pairs, empties = clean_pairs(train_raw)
    valid_pairs = [p for p in valid_raw if p[0].strip() and p[1].strip()]
    for pairs, split in ((train_pairs, "train"), (valid_pairs, "val")):
        if not pairs:
            raise XattnError(f"{describe_split(cfg, split)}: the {'training' if split == 'train' else 'validation'} "
                             "set is empty (no pair with text on both sides)")
    if new_tokenizers and ctx.rank == 0:
        out_dir.mkdir(parents=True, exist_ok=True)
        try:
            if inherit:
                train_side_tokenizers(train_pairs, out_dir, cfg.vocab_size, inherit)
            else:
                train_tokenizers([s for s, _ in train_pairs], [t for _, t in train_pairs], out_dir,
                                 cfg.vocab_size, cfg.joint_vocab)
        except XattnError as e:
            raise XattnError(f"{describe_split(cfg, 'train')}: cannot train the tokenizer on this text ({e})") from None
    ctx.barrier()
    tokenizers = load_tokenizers(out_dir)
    if tokenizers.joint != cfg.joint_vocab:
        raise XattnError(f"{out_dir}: holds {'a joint' if tokenizers.joint else 'separate'} vocabulary, "
                         f"but data.joint_vocab={cfg.joint_vocab}")
    train_pairs, stats = clean_pairs(train_pairs, cfg.max_len, cfg.max_ratio,
                                     length=lambda s: len(tokenizers.src.encode(s)),
                                     tgt_length=lambda t: len(tokenizers.tgt.encode(t)))
    stats.empty = empties.empty
    if not train_pairs:
        raise XattnError(f"{describe_split(cfg, 'train')}: no training pairs left after the data.max_len / "
                         "data.max_ratio filter")
    return Corpus(tokenizers, tokenize_pairs(train_pairs, tokenizers), tokenize_pairs(valid_pairs, tokenizers),
                  valid_pairs, stats, text_fingerprint(train_raw, valid_raw))
