"""The corpus a run trains on: the training pairs a DataConfig names as a memory-mapped prepared directory
(xattn.data.store finds or makes it), the validation pairs in memory, and the tokenizers.

The tokenizers are the prepared directory's: a new run copies them into the model directory, and a resumed
run (or another DDP rank) checks that the ones there are the same, so every process tokenizes alike.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

from xattn.config import DataConfig
from xattn.data import FilterStats, Pair, TokenizedCorpus, tokenize_pairs
from xattn.data.prepared import MappedCorpus
from xattn.data.splits import describe_split, read_all, read_split, text_fingerprint  # noqa: F401 (re-exported)
from xattn.distributed import Context
from xattn.errors import XattnError
from xattn.io import json_text
from xattn.train_state import hold_new_run_dir
from xattn.tokenizer import TokenizerPair, load_tokenizers


@dataclass
class Corpus:
    tokenizers: TokenizerPair
    train: MappedCorpus                 # the prepared directory, mapped
    valid: TokenizedCorpus
    valid_pairs: list[Pair]             # raw text, for BLEU
    stats: FilterStats                  # what cleaning dropped from the training pairs
    fingerprint: str                    # SHA-256 of the training ids (their arrays' hashes) and validation text
    valid_lines: list[int] = field(default_factory=list)  # the line of each validation pair (1-based)


def prepare_corpus(cfg: DataConfig, out_dir: Path, ctx: Context | None = None, new_tokenizers: bool = True,
                   inherit: dict[str, Path] | None = None, workers: int | None = None) -> Corpus:
    """The training corpus prepared (found or made, xattn.data.store) and mapped, the validation pairs read
    and tokenized. With `new_tokenizers` (a new run), rank 0 holds `out_dir` for it (hold_new_run_dir) and copies
    the prepared directory's tokenizers there; otherwise the ones in `out_dir` must be the same. `inherit` {"src"
    or "tgt": a tokenizer file}: that side's tokenizer is a transfer parent's, and only the other side's is trained.
    The fingerprint covers the prepared arrays and tokenizers, so a resumed run whose model directory holds other
    tokenizers than its corpus differs from the run it resumes (train_state.run_identity)."""
    from xattn.checkpoint import copy_tokenizers, tokenizer_hashes
    from xattn.data.store import training_corpus

    ctx = ctx or Context()
    cfg.require_pairs()
    valid_raw = read_split(cfg, "val")
    valid_pairs = [p for p in valid_raw if p[0].strip() and p[1].strip()]
    if not valid_pairs:
        raise XattnError(f"{describe_split(cfg, 'val')}: the validation set is empty (no pair with text on both sides)")
    train = training_corpus(cfg, ctx, inherit, workers)
    prepared = train.manifest.get("tokenizers", {})
    with ctx.first() as mine:  # (the others wait for it)
        if new_tokenizers and mine:  # the new run's first write there
            hold_new_run_dir(out_dir)
            for stale in set(tokenizer_hashes(out_dir)) - set(prepared):
                (out_dir / stale).unlink()
            copy_tokenizers(train.folder, out_dir)
    tokenizers = load_tokenizers(out_dir)
    if tokenizers.joint != cfg.joint_vocab:
        raise XattnError(f"{out_dir}: holds {'a joint' if tokenizers.joint else 'separate'} vocabulary, "
                         f"but data.joint_vocab={cfg.joint_vocab}")
    arrays = {name: spec.get("sha256") for name, spec in sorted(train.manifest["arrays"].items())}
    fingerprint = hashlib.sha256(json_text({"train": arrays, "tokenizers": prepared,
                                               "valid": text_fingerprint(valid_raw)}).encode()).hexdigest()
    valid = tokenize_pairs(valid_pairs, tokenizers)
    lines = [n for n, p in enumerate(valid_raw, 1) if p[0].strip() and p[1].strip()]
    return Corpus(tokenizers, train, valid, valid_pairs, FilterStats(**train.manifest["cleaning"]), fingerprint, lines)


def check_valid_fits(corpus: Corpus, cfg: DataConfig, model) -> None:
    """A validation pair too long for the model's learned positions, named by its line before any step (it
    would fail the first evaluation, after hours of training)."""
    for side in ("src", "tgt"):  # with EOS; BOS and the target's pieces
        ids = [[*tokens, 0] for tokens in getattr(corpus.valid, side)]
        if (long := model.beyond_positions(ids)) is not None:
            line = corpus.valid_lines[long]
            raise XattnError(f"{describe_split(cfg, 'val')}: line {line}: {len(ids[long])} {side} tokens do not fit "
                             f"model.max_positions={model.max_positions} (learned positions); shorten or drop it, or "
                             "raise model.max_positions")
