"""`prepare`: a DataConfig's training corpus, streamed from its files, as a prepared directory (prepared.py).

Two passes over the text, neither holding the corpus in memory: the first counts the pairs, hashes the
input as read and draws the sample SentencePiece trains on (`data.spm_sample` pairs, a seeded reservoir; all
of them when the corpus is smaller, in corpus order, which is what an in-memory run trains on); the second
encodes chunks in worker processes, cleans on the ids just made (empty side, `data.max_len`, `data.max_ratio`,
as corpus.prepare_corpus does on text) and appends them to the arrays in corpus order, so any number of
workers writes the same bytes. Named datasets (Multi30k, numbers) are small and read whole.
"""
from __future__ import annotations

import hashlib
import multiprocessing
import os
import random
import sys
import time
from collections import deque
from collections.abc import Iterator
from itertools import zip_longest
from dataclasses import asdict, dataclass, field
from pathlib import Path

from xattn.config import DataConfig
from xattn.data.prepared import fill, prepared_dir
from xattn.data.text import FilterStats, Pair
from xattn.errors import XattnError
from xattn.io import decode_line, sha256_file

CHUNK = 2048
"""Pairs a worker encodes at a time."""
SETTINGS = ("dataset", "src_lang", "tgt_lang", "numbers_size", "train_subset", "subset_seed", "vocab_size",
            "joint_vocab", "max_len", "max_ratio", "spm_sample", "dedup")
REPORT_EVERY = 200_000
"""Pairs between two progress lines on stderr."""
"""The data keys that shape the arrays (recorded in the manifest; the others say where files are)."""


@dataclass
class Inputs:
    """The training pairs of a DataConfig, read line by line with the rules of xattn.io.read_lines."""
    cfg: DataConfig
    hashes: dict[str, str] = field(default_factory=dict)   # file (or dataset) -> SHA-256 of its text as read

    def pairs(self) -> Iterator[Pair]:
        cfg = self.cfg
        if cfg.dataset is not None:
            from xattn.corpus import read_all, text_fingerprint

            pairs = read_all(cfg, "train")
            self.hashes = {f"{cfg.dataset} {cfg.src_lang}-{cfg.tgt_lang}": text_fingerprint(pairs)}
            yield from pairs
        elif cfg.train_tsv:
            for n, line in enumerate(self.lines(cfg.train_tsv), start=1):
                fields = line.split("\t")
                if len(fields) != 2:
                    raise XattnError(f"{cfg.train_tsv}: line {n}: expected 2 tab-separated fields, found {len(fields)}")
                yield fields[0].strip(), fields[1].strip()
        else:
            for n, (src, tgt) in enumerate(zip_longest(self.lines(cfg.train_src), self.lines(cfg.train_tgt)), start=1):
                if src is None or tgt is None:
                    longer, shorter = (cfg.train_src, cfg.train_tgt) if tgt is None else (cfg.train_tgt, cfg.train_src)
                    raise XattnError(f"line counts differ: {longer} has more lines than the {n - 1} of {shorter}")
                yield src, tgt

    def lines(self, path: str) -> Iterator[str]:
        """The lines of a plain or `.gz` file, trailing whitespace stripped; its text's SHA-256 into `hashes`."""
        import gzip

        digest, opener = hashlib.sha256(), gzip.open if str(path).endswith(".gz") else open
        try:
            with opener(path, "rb") as f:
                for number, raw in enumerate(f, start=1):
                    digest.update(raw)
                    if number == 1:
                        raw = raw.removeprefix(b"\xef\xbb\xbf")
                    if not raw.endswith(b"\n") and b"\r" in raw.rstrip(b"\r"):
                        raise XattnError(f"{path}: lines end in a carriage return alone (\\r); convert them to \\n")
                    yield decode_line(raw.removesuffix(b"\n"), str(path), number).rstrip()
        except FileNotFoundError:
            raise XattnError(f"{path}: no such file") from None
        except (OSError, EOFError) as e:
            raise XattnError(f"{path}: cannot read ({e})") from None
        self.hashes[str(path)] = digest.hexdigest()


def first_pass(pairs: Iterator[Pair], sample_size: int, seed: int) -> tuple[int, int, list[Pair]]:
    """(pairs, pairs with an empty side, the tokenizer sample): a seeded reservoir of the non-empty pairs,
    kept in corpus order."""
    rng, sample, total, empty, seen = random.Random(seed), [], 0, 0, 0
    for total, (src, tgt) in enumerate(pairs, start=1):
        if not src.strip() or not tgt.strip():
            empty += 1
            continue
        seen += 1
        if len(sample) < sample_size:
            sample.append((seen, (src, tgt)))
        elif (j := rng.randrange(seen)) < sample_size:
            sample[j] = (seen, (src, tgt))
    return total, empty, [pair for _, pair in sorted(sample)]


# ------------------------------------------------------------------------------------------- workers

_TOKENIZERS = None


def _load(folder: str) -> None:
    global _TOKENIZERS
    from xattn.tokenizer import load_tokenizers

    _TOKENIZERS = load_tokenizers(folder)


def encode_chunk(job: tuple[list[Pair], int, float]) -> tuple[list[list[int]], list[list[int]], dict]:
    """(pairs, max_len, max_ratio) -> the kept pairs' ids and what was dropped (FilterStats fields)."""
    pairs, max_len, max_ratio = job
    src = _TOKENIZERS.src.encode_batch([s for s, _ in pairs])
    tgt = _TOKENIZERS.tgt.encode_batch([t for _, t in pairs])
    kept_src, kept_tgt, stats = [], [], FilterStats()
    for s, t in zip(src, tgt):
        n, m = len(s), len(t)
        if max(n, m) > max_len:
            stats.too_long += 1
        elif max(n, m) / max(1, min(n, m)) > max_ratio:
            stats.ratio += 1
        else:
            kept_src.append(s)
            kept_tgt.append(t)
    return kept_src, kept_tgt, asdict(stats)


def ordered_map(fn, jobs: Iterator, workers: int, folder: Path) -> Iterator:
    """fn over jobs in order, in `workers` processes with at most 2 * workers jobs under way (bounded memory)."""
    if workers == 1:
        _load(str(folder))
        yield from map(fn, jobs)
        return
    with multiprocessing.get_context("spawn").Pool(workers, initializer=_load, initargs=(str(folder),)) as pool:
        pending: deque = deque()
        for job in jobs:
            pending.append(pool.apply_async(fn, (job,)))
            if len(pending) >= 2 * workers:
                yield pending.popleft().get()
        while pending:
            yield pending.popleft().get()


# ---------------------------------------------------------------------------------------------- prepare

def prepare(cfg: DataConfig, out: str | Path, workers: int | None = None) -> dict:
    """Prepare the training corpus of `cfg` into the new directory `out` (see the module); returns its manifest.
    `workers`: encoding processes (default: one per core)."""
    from xattn.corpus import describe_split

    workers = workers if workers is not None else os.cpu_count() or 1
    if not 1 <= workers <= 256:
        raise XattnError(f"workers: must be in [1, 256], got {workers}")
    where = describe_split(cfg, "train")
    keep = subset(cfg)
    first, counts = Inputs(cfg), FilterStats()
    total, empty, sample = first_pass(selected(first, keep, cfg.dedup, counts, "counting and sampling"),
                                      cfg.spm_sample, cfg.subset_seed)
    if not sample:
        raise XattnError(f"{where}: the training set is empty (no pair with text on both sides)")
    stats = FilterStats(empty=empty)
    with prepared_dir(Path(out)) as folder:
        tokenizers = train_into(folder, sample, cfg, where)
        pairs = selected(Inputs(cfg), keep, cfg.dedup, stats, "encoding")
        jobs = ((part, cfg.max_len, cfg.max_ratio) for part in chunked(pairs))
        manifest = fill(folder, counted(ordered_map(encode_chunk, jobs, workers, folder), stats),
                        (cfg.vocab_size, cfg.vocab_size),
                        lambda: {"data": {k: getattr(cfg, k) for k in SETTINGS}, "inputs": first.hashes,
                                 "tokenizers": tokenizers, "cleaning": asdict(stats)})
        if stats.kept == 0:
            raise XattnError(f"{where}: no training pairs left after the data.max_len / data.max_ratio filter")
    return manifest


def subset(cfg: DataConfig) -> set[int] | None:
    """With data.train_subset, the pair indices it draws (as corpus.read_split does), after a counting pass."""
    if cfg.train_subset is None:
        return None
    total = sum(1 for _ in Inputs(cfg).pairs())
    if cfg.train_subset > total:
        raise XattnError(f"data.train_subset: {cfg.train_subset} is more than the {total} training pairs")
    return set(random.Random(cfg.subset_seed).sample(range(total), cfg.train_subset))


def selected(inputs: Inputs, keep: set[int] | None, dedup: bool, stats: FilterStats, what: str) -> Iterator[Pair]:
    """The pairs of `inputs` that train_subset keeps (`keep`) and, with `dedup`, the first of each repeated
    pair (stats.duplicate counts the others); a progress line on stderr every REPORT_EVERY pairs."""
    seen: set[bytes] = set()
    start = time.time()
    for i, pair in enumerate(inputs.pairs(), start=1):
        if i % REPORT_EVERY == 0:
            print(f"xattn prepare: {what}: {i:,} pairs read, {i / max(time.time() - start, 1e-9):,.0f} pairs/s",
                  file=sys.stderr, flush=True)
        if keep is not None and i - 1 not in keep:
            continue
        if dedup:
            key = hashlib.blake2b("\t".join(pair).encode("utf-8", "surrogatepass"), digest_size=8).digest()
            if key in seen:
                stats.duplicate += 1
                continue
            seen.add(key)
        yield pair


def chunked(pairs: Iterator[Pair]) -> Iterator[list[Pair]]:
    """The pairs with text on both sides, CHUNK at a time."""
    chunk = []
    for src, tgt in pairs:
        if src.strip() and tgt.strip():
            chunk.append((src, tgt))
            if len(chunk) == CHUNK:
                yield chunk
                chunk = []
    if chunk:
        yield chunk


def counted(results: Iterator, stats: FilterStats) -> Iterator[tuple[list[list[int]], list[list[int]]]]:
    for src, tgt, dropped in results:
        stats.too_long += dropped["too_long"]
        stats.ratio += dropped["ratio"]
        stats.kept += len(src)
        yield src, tgt


def train_into(folder: Path, sample: list[Pair], cfg: DataConfig, where: str) -> dict[str, str]:
    """Train the tokenizers on `sample` into `folder`; their files' SHA-256."""
    from xattn.tokenizer import train_tokenizers

    try:
        train_tokenizers([s for s, _ in sample], [t for _, t in sample], folder, cfg.vocab_size, cfg.joint_vocab)
    except XattnError as e:
        raise XattnError(f"{where}: cannot train the tokenizer on this text ({e})") from None
    return {f.name: sha256_file(f) for f in sorted(folder.glob("spm*.model"))}
