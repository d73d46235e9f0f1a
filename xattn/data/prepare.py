"""`prepare`: a DataConfig's training corpus, streamed from its files, as a prepared directory (prepared.py).

Two passes over the text, neither holding the corpus in memory: the first counts the pairs, hashes the
input as read and draws the sample SentencePiece trains on (`data.spm_sample` pairs, a seeded reservoir; all
of them when the corpus is smaller, in corpus order, which is what an in-memory run trains on); the second
encodes chunks in worker processes, cleans on the ids just made (empty side, `data.max_len`, `data.max_ratio`,
as corpus.prepare_corpus does on text) and appends them to the arrays in corpus order, so any number of
workers writes the same bytes. Named datasets (Multi30k, numbers) are small and read whole. With
`data.train_links`, each pair's word links (a Pharaoh line) are read beside it and stored as piece links
(xattn.links.corpus_piece_links), which drop with their pair.
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
from dataclasses import asdict, dataclass, field
from itertools import zip_longest
from pathlib import Path

import numpy as np

from xattn.config import DataConfig
from xattn.data.prepared import Flat, fill, prepared_dir
from xattn.data.text import FilterStats, Pair
from xattn.errors import XattnError
from xattn.io import decode_line
from xattn.links import corpus_piece_links
from xattn.tokenizer import load_tokenizers

CHUNK = 2048
"""Pairs a worker encodes at a time."""
BLOCK = 1 << 20
"""Bytes read from an input file at a time."""
SETTINGS = ("dataset", "src_lang", "tgt_lang", "numbers_size", "train_subset", "subset_seed", "vocab_size",
            "joint_vocab", "max_len", "max_ratio", "spm_sample", "dedup")
"""The data keys that shape the arrays (recorded in the manifest; the others say where files are)."""
REPORT_EVERY = 200_000
"""Pairs between two progress lines on stderr, when it is not a terminal (a terminal gets a bar)."""
PAIRS_PER_WORKER = 100_000
"""A corpus gets one encoding process per this many pairs at most, by default."""


@dataclass
class Inputs:
    """The training pairs of a DataConfig, read line by line with the rules of xattn.io.read_lines."""
    cfg: DataConfig
    records: dict[str, dict] = field(default_factory=dict)  # file (or dataset) -> its SHA-256 as read, size, mtime

    def pairs(self) -> Iterator[Pair]:
        cfg = self.cfg
        if cfg.dataset is not None:
            from xattn.data.splits import read_all, text_fingerprint

            pairs = read_all(cfg, "train")
            self.records = {dataset_name(cfg): {"sha256": text_fingerprint(pairs)}}
            yield from pairs
        elif cfg.train_tsv:
            for n, line in enumerate(self.lines(cfg.train_tsv, "train_tsv"), start=1):
                fields = line.split("\t")
                if len(fields) != 2:
                    raise XattnError(f"{cfg.train_tsv}: line {n}: expected 2 tab-separated fields, found {len(fields)}")
                yield fields[0].strip(), fields[1].strip()
        else:
            lines = zip_longest(self.lines(cfg.train_src, "train_src"), self.lines(cfg.train_tgt, "train_tgt"))
            for n, (src, tgt) in enumerate(lines, start=1):
                if src is None or tgt is None:
                    longer, shorter = (cfg.train_src, cfg.train_tgt) if tgt is None else (cfg.train_tgt, cfg.train_src)
                    raise XattnError(f"line counts differ: {longer} has more lines than the {n - 1} of {shorter}")
                yield src, tgt

    def rows(self) -> Iterator[tuple[str, str, str | None]]:
        """The pairs, each with its line of data.train_links (None without that file). A links file with another
        number of lines than there are pairs is an error naming it and the first line that does not match."""
        path = self.cfg.train_links
        if not path:
            yield from ((src, tgt, None) for src, tgt in self.pairs())
            return
        links, n = self.lines(path, "train_links"), 0
        for n, (src, tgt) in enumerate(self.pairs(), start=1):
            if (line := next(links, None)) is None:
                raise XattnError(f"{path}: line {n}: missing; the links file has {n - 1} lines, but the training "
                                 f"corpus ({describe(self.cfg)}) has more pairs (one line of links per pair)")
            yield src, tgt, line
        if next(links, None) is not None:
            raise XattnError(f"{path}: line {n + 1}: one line more than the {n} pairs of the training corpus "
                             f"({describe(self.cfg)}); the links file has one line per pair")

    @staticmethod
    def dataset_digest(cfg: DataConfig) -> str:
        """The SHA-256 of a named dataset's training text (small; read whole)."""
        from xattn.data.splits import read_all, text_fingerprint

        return text_fingerprint(read_all(cfg, "train"))

    def lines(self, path: str, key: str) -> Iterator[str]:
        """The lines of a plain or `.gz` file (config key `key`), trailing whitespace stripped, read a block at
        a time; its record into `records`: the key, the SHA-256 of its text as read (decompressed), the
        file's size and time. The rules and messages are xattn.io.read_lines'."""
        import gzip

        digest, opener, number, rest = hashlib.sha256(), gzip.open if str(path).endswith(".gz") else open, 0, b""
        try:
            with opener(path, "rb") as f:
                while block := f.read(BLOCK):
                    digest.update(block)
                    block, cut = rest + block, block.rfind(b"\n") + len(rest) + 1
                    if cut == len(rest):  # no newline in this block
                        rest = block
                        continue
                    rest = block[cut:]
                    yield from self.decoded(block[:cut - 1], str(path), number)
                    number += block.count(b"\n", 0, cut)
                if rest:
                    if b"\r" in rest.rstrip(b"\r"):
                        raise XattnError(f"{path}: lines end in a carriage return alone (\\r); convert them to \\n")
                    yield from self.decoded(rest, str(path), number)
        except FileNotFoundError:
            raise XattnError(f"{path}: no such file") from None
        except (OSError, EOFError) as e:
            raise XattnError(f"{path}: cannot read ({e})") from None
        self.records[str(path)] = {"key": key, "sha256": digest.hexdigest(), **file_stamp(path)}

    @staticmethod
    def decoded(data: bytes, path: str, before: int) -> list[str]:
        """Lines `before` + 1, ... (`data`: their bytes joined by newlines), decoded and stripped."""
        if before == 0:
            data = data.removeprefix(b"\xef\xbb\xbf")
        try:
            return [line.rstrip() for line in data.decode("utf-8").split("\n")]
        except UnicodeDecodeError:  # find the line, for the message
            return [decode_line(raw, path, n).rstrip() for n, raw in enumerate(data.split(b"\n"), start=before + 1)]


def file_stamp(path: str | Path) -> dict:
    """What tells, without reading it, whether a file changed: its size and modification time."""
    stat = os.stat(path)
    return {"bytes": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def dataset_name(cfg: DataConfig) -> str:
    return f"{cfg.dataset} {cfg.src_lang}-{cfg.tgt_lang}"


def describe(cfg: DataConfig) -> str:
    from xattn.data.splits import describe_split

    return describe_split(cfg, "train")


def first_pass(pairs: Iterator[tuple], sample_size: int, seed: int) -> tuple[int, int, list[Pair]]:
    """(pairs, pairs with an empty side, the tokenizer sample): a seeded reservoir of the non-empty pairs,
    kept in corpus order. `pairs`: tuples that start with the source and the target."""
    rng, sample, total, empty, seen = random.Random(seed), [], 0, 0, 0
    for total, (src, tgt, *_) in enumerate(pairs, start=1):
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


def encode_chunk(job: tuple[list[tuple], int, float, str | None]) -> tuple[Flat, Flat, Flat | None, dict]:
    """(rows, max_len, max_ratio, the links file or None) -> the kept pairs' ids and piece links (flat arrays,
    quick to send back; None without links), what was dropped (FilterStats fields) and the link counts.
    A row: (source, target, its links line or None, its line number)."""
    rows, max_len, max_ratio, links_path = job
    src = _TOKENIZERS.src.encode_batch([r[0] for r in rows])
    tgt = _TOKENIZERS.tgt.encode_batch([r[1] for r in rows])
    n, m = (np.fromiter(map(len, side), dtype=np.int64, count=len(side)) for side in (src, tgt))
    too_long = np.maximum(n, m) > max_len
    ratio = ~too_long & (np.maximum(n, m) / np.maximum(1, np.minimum(n, m)) > max_ratio)
    keep = np.flatnonzero(~(too_long | ratio)).tolist()
    counts = asdict(FilterStats(too_long=int(too_long.sum()), ratio=int(ratio.sum())))
    src, tgt, links = [src[i] for i in keep], [tgt[i] for i in keep], None
    if links_path:
        pieces, counts["links"] = corpus_piece_links([rows[i] for i in keep], src, tgt, _TOKENIZERS, links_path)
        links = Flat.of(pieces)
    return Flat.of(src), Flat.of(tgt), links, counts


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

def prepare(cfg: DataConfig, out: str | Path, workers: int | None = None, inherit: dict[str, Path] | None = None) -> dict:
    """Prepare the training corpus of `cfg` into the new directory `out` (see the module); returns its manifest.
    `workers`: encoding processes (default: one per core, and one per PAIRS_PER_WORKER pairs at most, as a
    process takes a second or two to start). `inherit` {"src" or "tgt": a tokenizer file}: that side's
    tokenizer is copied (a transfer parent's) and only the other side's is trained."""
    from xattn.data.splits import describe_split

    if workers is not None and not 1 <= workers <= 256:
        raise XattnError(f"workers: must be in [1, 256], got {workers}")
    where = describe_split(cfg, "train")
    keep = subset(cfg)
    first, counts = Inputs(cfg), FilterStats()
    total, empty, sample = first_pass(selected(first, keep, cfg.dedup, counts, "counting and sampling"),
                                      cfg.spm_sample, cfg.subset_seed)
    if not sample:
        raise XattnError(f"{where}: the training set is empty (no pair with text on both sides)")
    if workers is None:
        workers = max(1, min(os.cpu_count() or 1, (total - empty) // PAIRS_PER_WORKER + 1))
    stats = FilterStats(empty=empty)
    with prepared_dir(Path(out)) as folder:
        tokenizers = train_into(folder, sample, cfg, where, inherit or {})
        made = load_tokenizers(folder)
        pairs = selected(Inputs(cfg), keep, cfg.dedup, stats, "encoding", total)
        jobs = ((part, cfg.max_len, cfg.max_ratio, cfg.train_links) for part in chunked(pairs))
        links = {"pairs": 0, "links": 0, "unmatched": 0} if cfg.train_links else None
        manifest = fill(folder, counted(ordered_map(encode_chunk, jobs, workers, folder), stats, links),
                        (made.src.vocab_size, made.tgt.vocab_size),
                        lambda: {"data": {k: getattr(cfg, k) for k in SETTINGS}, "inputs": first.records,
                                 "tokenizers": tokenizers, "cleaning": asdict(stats)} | ({"links": links} if links else {}),
                        cfg.max_len if links else None)
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


def selected(inputs: Inputs, keep: set[int] | None, dedup: bool, stats: FilterStats, what: str,
             total: int | None = None) -> Iterator[tuple[str, str, str | None, int]]:
    """The pairs of `inputs` that train_subset keeps (`keep`) and, with `dedup`, the first of each repeated
    pair (stats.duplicate counts the others), each as (source, target, its links line or None, its number,
    1-based); progress on stderr (Progress)."""
    seen: set[bytes] = set()
    with Progress(what, total, stats) as progress:
        for i, (src, tgt, links) in enumerate(inputs.rows()):
            progress.update(i + 1)
            if keep is not None and i not in keep:
                continue
            if dedup:
                key = hashlib.blake2b(f"{src}\t{tgt}".encode("utf-8", "surrogatepass"), digest_size=8).digest()
                if key in seen:
                    stats.duplicate += 1
                    continue
                seen.add(key)
            yield src, tgt, links, i + 1


class Progress:
    """Lines read, pairs kept so far, rate and time left: a bar on a terminal, else a line on stderr every
    REPORT_EVERY pairs."""

    def __init__(self, what: str, total: int | None, stats: FilterStats):
        self.what, self.total, self.stats, self.start = what, total, stats, time.time()
        self.bar = None
        if sys.stderr.isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc=f"xattn prepare: {what}", unit=" pairs", unit_scale=True,
                            mininterval=0.5, leave=False)

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc) -> None:
        if self.bar is not None:
            self.bar.close()

    def update(self, read: int) -> None:
        if read % 4096 and read % REPORT_EVERY:
            return
        if self.bar is not None:
            self.bar.update(read - self.bar.n)
            if self.stats.kept:
                self.bar.set_postfix(kept=f"{self.stats.kept:,}", refresh=False)
        elif read % REPORT_EVERY == 0:
            rate = read / max(time.time() - self.start, 1e-9)
            left = f", {(self.total - read) / rate:,.0f} s left" if self.total else ""
            kept = f", {self.stats.kept:,} kept" if self.stats.kept else ""
            print(f"xattn prepare: {self.what}: {read:,} pairs read{kept}, {rate:,.0f} pairs/s{left}",
                  file=sys.stderr, flush=True)


def chunked(rows: Iterator[tuple]) -> Iterator[list[tuple]]:
    """The rows (source, target, ...) with text on both sides, CHUNK at a time."""
    chunk = []
    for row in rows:
        if row[0].strip() and row[1].strip():
            chunk.append(row)
            if len(chunk) == CHUNK:
                yield chunk
                chunk = []
    if chunk:
        yield chunk


def counted(results: Iterator, stats: FilterStats, links: dict | None) -> Iterator[tuple]:
    """The chunks of encode_chunk, their counts added to `stats` and (with links) to `links`."""
    for src, tgt, pieces, counts in results:
        stats.too_long += counts["too_long"]
        stats.ratio += counts["ratio"]
        stats.kept += len(src)
        if links is None:
            yield src, tgt
            continue
        for key, n in counts["links"].items():
            links[key] += n
        yield src, tgt, pieces


def train_into(folder: Path, sample: list[Pair], cfg: DataConfig, where: str, inherit: dict[str, Path]) -> dict[str, str]:
    """Train the tokenizers on `sample` into `folder`, the sides in `inherit` copied from their files instead
    (always separate vocabularies then); the tokenizer files' SHA-256. SentencePiece runs in a child process
    that streams the sample from files into it (no Python copy beside SentencePiece's own), so its memory
    (gigabytes for a large sample) is the system's again before the encoding workers start. `sample` is
    emptied."""
    from xattn.tokenizer import tokenizer_hashes

    files = [folder / f".sample.{side}" for side in ("src", "tgt")]
    for k, path in enumerate(files):
        path.write_text("\n".join(pair[k] for pair in sample), encoding="utf-8")
    sample.clear()
    try:
        with multiprocessing.get_context("spawn").Pool(1) as pool:
            pool.apply(train_from_files, (str(folder), [str(f) for f in files], cfg.vocab_size, cfg.joint_vocab,
                                          {side: str(path) for side, path in inherit.items()}))
    except XattnError as e:
        raise XattnError(f"{where}: cannot train the tokenizer on this text ({e})") from None
    for path in files:
        path.unlink()
    return tokenizer_hashes(folder)


def lines_of(path: str) -> Iterator[str]:
    """The lines of a sample file, one at a time (split at "\\n" only)."""
    with open(path, encoding="utf-8", newline="\n") as f:
        for line in f:
            yield line.removesuffix("\n")


def train_from_files(folder: str, files: list[str], vocab_size: int, joint: bool, inherit: dict[str, str]) -> None:
    """train_into's child process: the sample's two sides from `files`, one sentence a line."""
    from xattn.io import atomic_write_bytes
    from xattn.tokenizer import SRC_MODEL, TGT_MODEL, train_sentencepiece, train_tokenizers

    src, tgt = (lines_of(f) for f in files)
    if not inherit:
        train_tokenizers(src, tgt, folder, vocab_size, joint)
    for side, name, texts in (("src", SRC_MODEL, src), ("tgt", TGT_MODEL, tgt)) if inherit else ():
        if side in inherit:
            atomic_write_bytes(Path(folder) / name, Path(inherit[side]).read_bytes())
        else:
            train_sentencepiece(texts, Path(folder) / name, vocab_size)
