"""Named datasets: Multi30k (a local copy, or downloaded into the user cache) and the offline numbers task.

Both return sentence pairs (src, tgt); `load_pairs` picks one by name, as DataConfig.dataset does.
"""

from __future__ import annotations

import copy
import functools
import http.client
import os
import urllib.error
import urllib.request
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

import num2words
import numpy as np

from xattn.data import Pair, read_parallel
from xattn.errors import ParameterError, XattnError
from xattn.io import atomic_write_bytes


MULTI30K_SPLITS = ("train", "val", "test_2016_flickr")
MULTI30K_ALIASES = {"test": "test_2016_flickr"}
MULTI30K_LANGS = ("en", "de", "fr", "cs")
MULTI30K_URL = "https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw/{name}"


def multi30k_files(split: str, lang: str, data_dir: str | Path | None = None) -> Path:
    """Path of Multi30k `{split}.{lang}.gz` (split "test" means "test_2016_flickr").

    Looks in `data_dir`, else in $XATTN_DATA (the multi30k folder or its parent), else in
    the user cache (~/.cache/xattn/multi30k, honouring $XDG_CACHE_HOME), downloading what is missing.
    """
    split = MULTI30K_ALIASES.get(split, split)
    if split not in MULTI30K_SPLITS:
        raise ParameterError("split", f"unknown Multi30k split {split!r}; valid: {', '.join(MULTI30K_SPLITS)} "
                             "(or test)")
    if lang not in MULTI30K_LANGS:
        raise XattnError(f"unknown Multi30k language {lang!r}; valid: {', '.join(MULTI30K_LANGS)}")
    name = f"{split}.{lang}.gz"
    if data_dir:
        return _find_local(Path(data_dir), name, lambda problem: ParameterError("data_dir", problem))
    if folder := os.environ.get("XATTN_DATA"):
        return _find_local(Path(folder), name, lambda problem: XattnError(f"XATTN_DATA={problem}"))
    path = _cache_dir() / name
    if not path.is_file():
        _download(MULTI30K_URL.format(name=name), path)
    return path


def _find_local(folder: Path, name: str, error: Callable[[str], XattnError]) -> Path:
    """`folder`/`name`, or `folder`/multi30k/`name`; else the error `error` makes of what is missing (a
    ParameterError naming data_dir, which the CLI names as --data-dir or the config key that gave it)."""
    for candidate in (folder / name, folder / "multi30k" / name):
        if candidate.is_file():
            return candidate
    if not folder.is_dir():  # (a file said "no val.de.gz there")
        raise error(f"{folder}: {'not a folder' if folder.exists() else 'no such folder'} (the Multi30k folder, or "
                    "the one that holds it)")
    raise error(f"{folder}: no {name} there or in {folder / 'multi30k'}")


def _cache_dir() -> Path:
    cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(cache) / "xattn" / "multi30k"


def _download(url: str, path: Path) -> None:
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            data = response.read()
    except (OSError, http.client.HTTPException) as e:
        reason = e.reason if isinstance(e, urllib.error.URLError) else e
        raise ParameterError("data_dir", f"cannot download Multi30k {path.name} from {url} ({reason}; offline?); "
                             f"give a folder that holds {path.name}, or set XATTN_DATA to one") from e
    if not data.startswith(b"\x1f\x8b"):
        raise XattnError(f"{url}: downloaded file is not gzip data")
    atomic_write_bytes(path, data)


def multi30k(src_lang: str, tgt_lang: str, split: str, data_dir: str | Path | None = None) -> list[Pair]:
    """Multi30k task 1 sentence pairs of one split, e.g. multi30k("de", "en", "train")."""
    return read_parallel(multi30k_files(split, src_lang, data_dir), multi30k_files(split, tgt_lang, data_dir))


NUMBERS_LANGS = ("en", "de", "fr", "cs", "digits")
NUMBERS_SIZES = {"train": 20000, "val": 500, "test": 500}
NUMBERS_MAX = 1_000_000
NUMBERS_HELD_OUT = 0.1


def numbers(src_lang: str, tgt_lang: str, split: str, size: int | None = None, seed: int = 0) -> list[Pair]:
    """Cardinal numbers 0..999,999 written out by num2words, lowercased.

    e.g. numbers("de", "en", ...) holds ("siebenhundertdreiundzwanzig", "seven hundred and twenty-three").
    "digits" as a language gives "723". For one seed the splits use disjoint numbers (0..99 are
    always in train), and every magnitude (1 to 6 digits) gets an equal share where the split has enough.
    """
    for lang in (src_lang, tgt_lang):
        if lang not in NUMBERS_LANGS:
            raise XattnError(f"unknown numbers language {lang!r}; valid: {', '.join(NUMBERS_LANGS)}")
    if split not in NUMBERS_SIZES:
        raise ParameterError("split", f"unknown numbers split {split!r}; valid: {', '.join(NUMBERS_SIZES)}")
    values = _sample_numbers(split, NUMBERS_SIZES[split] if size is None else size, seed)
    src_words, tgt_words = _number_words(src_lang), _number_words(tgt_lang)
    return [(src_words(v), tgt_words(v)) for v in values]


def _sample_numbers(split: str, size: int, seed: int) -> list[int]:
    split_index = list(NUMBERS_SIZES).index(split)
    u = np.random.default_rng([seed, 0]).random(NUMBERS_MAX)
    assigned = np.where(u < NUMBERS_HELD_OUT, 2, np.where(u < 2 * NUMBERS_HELD_OUT, 1, 0))
    assigned[:100] = 0
    in_split = assigned == split_index
    bounds = [(0 if d == 1 else 10 ** (d - 1), 10**d) for d in range(1, 7)]
    buckets = [np.flatnonzero(in_split[lo:hi]) + lo for lo, hi in bounds]
    quotas = _equal_shares([len(b) for b in buckets], size)
    if quotas is None:
        raise XattnError(f"numbers split {split!r} has {int(in_split.sum())} numbers, {size} requested")
    rng = np.random.default_rng([seed, 1 + split_index])
    chosen = np.concatenate([rng.choice(b, q, replace=False) for b, q in zip(buckets, quotas)])
    rng.shuffle(chosen)
    return chosen.tolist()


def _equal_shares(capacities: list[int], total: int) -> list[int] | None:
    """Split `total` as evenly as the capacities allow; None if they cannot hold it."""
    if total > sum(capacities):
        return None
    shares, remaining = [0] * len(capacities), total
    order = sorted(range(len(capacities)), key=capacities.__getitem__)
    for k, i in enumerate(order):
        shares[i] = min(capacities[i], remaining // (len(order) - k))
        remaining -= shares[i]
    return shares


def _number_words(lang: str) -> Callable[[int], str]:
    """num2words' cardinal for `lang`, lowercased."""
    if lang == "digits":
        return str
    converter = _converter(lang)
    return lambda n: converter.to_cardinal(n).lower()


@functools.cache
def _converter(lang: str) -> num2words.base.Num2Word_Base:
    """num2words' converter for `lang`, its table of number words cut to our range.

    num2words scans its whole table of number words (up to 10**600) at every step; a copy of the
    converter restricted to words below our range gives identical output, faster.
    """
    converter = copy.copy(num2words.CONVERTER_CLASSES[lang])
    if isinstance(getattr(converter, "cards", None), dict):
        converter.cards = OrderedDict((k, v) for k, v in converter.cards.items() if k <= NUMBERS_MAX)
    return converter


DATASETS = ("multi30k", "numbers")


def load_pairs(
    dataset: str,
    src_lang: str,
    tgt_lang: str,
    split: str,
    data_dir: str | Path | None = None,
    size: int | None = None,
    seed: int = 0,
) -> list[Pair]:
    """Sentence pairs of a named dataset.

    `size` keeps the first `size` pairs of Multi30k, or generates that many numbers; `seed` is for numbers.
    """
    if dataset == "multi30k":
        pairs = multi30k(src_lang, tgt_lang, split, data_dir)
        return pairs if size is None else pairs[:size]
    if dataset == "numbers":
        return numbers(src_lang, tgt_lang, split, size, seed)
    raise XattnError(f"unknown dataset {dataset!r}; valid: {', '.join(DATASETS)}")
