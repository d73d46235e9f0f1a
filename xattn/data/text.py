"""Parallel text: reading and validation, cleaning (named datasets: xattn/datasets.py)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from xattn.lines import read_lines as read_text_lines
from xattn.errors import XattnError
from xattn.words import split_words

Pair = tuple[str, str]


def read_lines(path: str | Path) -> list[str]:
    """Lines of a plain or `.gz` UTF-8 corpus file (see `xattn.lines.read_lines`), trailing whitespace stripped."""
    return [line.rstrip() for line in read_text_lines(path)]


def read_parallel(src_path: str | Path, tgt_path: str | Path) -> list[Pair]:
    """Two line-aligned files (plain or `.gz`) -> [(src, tgt), ...]."""
    src, tgt = read_lines(src_path), read_lines(tgt_path)
    if len(src) != len(tgt):
        raise XattnError(
            f"line counts differ: {src_path} has {len(src)} lines, {tgt_path} has {len(tgt)}"
        )
    return list(zip(src, tgt))


def read_tsv(path: str | Path) -> list[Pair]:
    """A file with one `src<TAB>tgt` pair per line -> [(src, tgt), ...]."""
    pairs = []
    for n, line in enumerate(read_text_lines(path), start=1):  # unstripped: "src<TAB>" is two fields, one empty
        fields = line.split("\t")
        if len(fields) != 2:
            raise XattnError(f"{path}: line {n}: expected 2 tab-separated fields, found {len(fields)}")
        pairs.append((fields[0].strip(), fields[1].strip()))
    return pairs


@dataclass
class FilterStats:
    """How many pairs `clean_pairs` kept, and why it dropped the others."""

    kept: int = 0
    empty: int = 0
    too_long: int = 0
    ratio: int = 0
    duplicate: int = 0                  # xattn prepare with data.dedup: repeats of an earlier pair


def _word_count(text: str) -> int:
    return len(split_words(text))


def clean_pairs(
    pairs: Sequence[Pair],
    max_len: int | None = None,
    max_ratio: float | None = None,
    length: Callable[[str], int] = _word_count,
    tgt_length: Callable[[str], int] | None = None,
) -> tuple[list[Pair], FilterStats]:
    """Drop pairs with an empty side, a side longer than `max_len`, or a longer/shorter ratio above `max_ratio`.

    `length` measures a sentence (default: words, xattn.words; pass e.g. a tokenizer's
    `lambda s: len(tok.encode(s))` for tokens); `tgt_length`, if given, measures the target side. Checks apply in that order; each dropped pair is counted once.
    """
    kept, stats = [], FilterStats()
    for src, tgt in pairs:
        if not src.strip() or not tgt.strip():
            stats.empty += 1
            continue
        n_src, n_tgt = length(src), (tgt_length or length)(tgt)
        if max_len is not None and max(n_src, n_tgt) > max_len:
            stats.too_long += 1
        elif max_ratio is not None and max(n_src, n_tgt) / max(1, min(n_src, n_tgt)) > max_ratio:
            stats.ratio += 1
        else:
            kept.append((src, tgt))
    stats.kept = len(kept)
    return kept, stats


