"""`prepare`: a DataConfig's training corpus, streamed from its files, as a prepared directory (prepared.py).

Two passes over the text, neither holding the corpus in memory: the first counts the pairs, hashes the
input as read and draws the sample SentencePiece trains on (`data.spm_sample` pairs, a seeded reservoir; all
of them when the corpus is smaller, in corpus order, which is what an in-memory run trains on); the second
encodes chunks in worker processes, cleans on the ids just made (empty side, `data.max_len`, `data.max_ratio`,
as corpus.prepare_corpus does on text) and appends them to the arrays in corpus order, so any number of
workers writes the same bytes. Named datasets (Multi30k, numbers) are small and read whole. Several corpora
(data.corpora, xattn.corpora) are read one after another (xattn.data.inputs) into one directory, whose
manifest counts the pairs each kept. With links (data.train_links, a corpus' `links`), each pair's word links
(a Pharaoh line) are read beside it and stored as piece links (xattn.links.corpus_piece_links), which drop
with their pair.
"""
from __future__ import annotations

import contextlib
import hashlib
import multiprocessing
import os
import random
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path

import numpy as np

from xattn.config import DataConfig
from xattn.corpora import mixture
from xattn.data.inputs import Inputs, Row, parts
from xattn.data.prepared import Flat, fill, prepared_dir
from xattn.data.text import FilterStats, Pair
from xattn.errors import XattnError
from xattn.links import corpus_piece_links
from xattn.tokenizer import load_tokenizers

CHUNK = 2048
"""Pairs a worker encodes at a time."""
SETTINGS = ("dataset", "src_lang", "tgt_lang", "numbers_size", "train_subset", "subset_seed", "vocab_size",
            "joint_vocab", "max_len", "max_ratio", "spm_sample", "dedup")
"""The data keys that shape the arrays (recorded in the manifest; the others say where files are)."""
REPORT_EVERY = 200_000
"""Pairs between two progress lines on stderr, when it is not a terminal (a terminal gets a bar)."""
PAIRS_PER_WORKER = 100_000
"""A corpus gets one encoding process per this many pairs at most, by default."""


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


def encode_chunk(job: tuple[list[Row], int, float, str | None, bool]) -> tuple[Flat, Flat, Flat | None, dict]:
    """(rows of one corpus, max_len, max_ratio, its links file or None, whether the corpus is stored with links)
    -> the kept pairs' ids and piece links (flat arrays, quick to send back; None without links; empty for a
    corpus without a links file), what was dropped (FilterStats fields), the link counts and the corpus."""
    rows, max_len, max_ratio, links_path, linked = job
    src = _TOKENIZERS.src.encode_batch([r[0] for r in rows])
    tgt = _TOKENIZERS.tgt.encode_batch([r[1] for r in rows])
    n, m = (np.fromiter(map(len, side), dtype=np.int64, count=len(side)) for side in (src, tgt))
    empty = np.minimum(n, m) == 0  # a side of text that encodes to no piece (U+200B, a lone BOM, control bytes)
    too_long = ~empty & (np.maximum(n, m) > max_len)
    ratio = ~empty & ~too_long & (np.maximum(n, m) / np.maximum(1, np.minimum(n, m)) > max_ratio)
    keep = np.flatnonzero(~(empty | too_long | ratio)).tolist()
    counts = asdict(FilterStats(empty=int(empty.sum()), too_long=int(too_long.sum()), ratio=int(ratio.sum())))
    src, tgt, links = [src[i] for i in keep], [tgt[i] for i in keep], None
    counts["corpus"] = rows[0][4] if rows else 0
    if links_path:
        pieces, counts["links"] = corpus_piece_links([rows[i] for i in keep], src, tgt, _TOKENIZERS, links_path)
        links = Flat.of(pieces)
    elif linked:
        links = Flat.of([[] for _ in keep])
    return Flat.of(src), Flat.of(tgt), links, counts


def ordered_map(fn, jobs: Iterator, workers: int, folder: Path) -> Iterator:
    """fn over jobs in order, in `workers` processes with at most 2 * workers jobs under way (bounded memory)."""
    if workers == 1:
        _load(str(folder))
        yield from map(fn, jobs)
        return
    with worker_processes(workers, _load, (str(folder),)) as pool:
        pending: deque = deque()
        for job in jobs:
            pending.append(pool.submit(fn, job))
            if len(pending) >= 2 * workers:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()


@contextmanager
def worker_processes(workers: int, initializer=None, initargs: tuple = ()) -> Iterator[ProcessPoolExecutor]:
    """`workers` spawned processes that leave Ctrl+C to this one and are killed when it stops early (Ctrl+C,
    SIGTERM, an error, one of them dying). multiprocessing.Pool's workers died of the terminal's Ctrl+C holding its
    queue's lock, and the pool's shutdown then hung for good. A worker that dies (killed for memory, say) is one
    line; a SIGTERM of the whole group ends them with this one."""
    pool = ProcessPoolExecutor(workers, mp_context=_Quiet(), initializer=initializer, initargs=initargs)
    try:
        yield pool
    except BaseException as e:  # (no public way to do this before Python 3.14)
        if (jobs := getattr(pool, "_call_queue", None)) is not None:  # its feeder, writing to workers that will not
            jobs.cancel_join_thread()                                  # read, is waited for by nobody
        for process in list(getattr(pool, "_processes", {}).values()):  # (the others, blocked writing results, kept
            process.kill()                                               # a dead one's pool waiting)
        if (manager := getattr(pool, "_executor_manager_thread", None)) is not None:  # a Ctrl+C inside submit() may
            manager._started.wait(1)  # cut the wait for this thread's start, which shutdown's join then refused
        with contextlib.suppress(RuntimeError):  # ("cannot join thread before it is started": it never ran)
            pool.shutdown(wait=True, cancel_futures=True)
        if isinstance(e, BrokenProcessPool):
            raise XattnError("a worker process of this one ended abruptly (killed, perhaps for memory); run "
                             "again with more memory free") from None
        raise
    pool.shutdown(wait=True)


class _QuietProcess(multiprocessing.context.SpawnProcess):
    """A spawned process that never sees SIGINT: a terminal's Ctrl+C reaches every process of the command, and the
    one that started it stops it instead. SIGINT is blocked while it starts, as a new process inherits it blocked.
    (SIGTERM stays: it is how a pool ends its workers.) This process' own SIGINT or SIGTERM waits till the start
    is done, where the main thread can hold it: one inside it left a child half started, whose traceback reached
    the terminal; the child, not yet among the processes its pool's stopping kills, is killed, and the signal
    goes on. It ends itself once the process that started it is gone (_end_with_parent)."""

    def start(self) -> None:
        if not hasattr(signal, "pthread_sigmask"):  # (Windows)
            return super().start()
        got: list[int] = []
        here = threading.current_thread() is threading.main_thread()
        found = {s: signal.signal(s, lambda signum, _: got.append(signum))
                 for s in (signal.SIGINT, signal.SIGTERM)} if here else {}
        held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            super().start()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)
            for stop, handler in found.items():
                signal.signal(stop, handler)
        if got:
            self.kill()
            signal.raise_signal(got[0])


    def run(self) -> None:  # (in the child)
        threading.Thread(target=_end_with_parent, name="xattn-parent", daemon=True).start()
        super().run()


def _end_with_parent() -> None:
    """End this worker, quietly, once the process that started it is gone (by the pipe that closes as it ends, so
    also if it went before this worker ran): killed by SIGKILL (the system's OOM killer, say), it left its workers
    blocked for good on queues whose other ends they hold themselves."""
    if (parent := multiprocessing.parent_process()) is not None:
        parent.join()
        os._exit(1)


class _Quiet(multiprocessing.context.SpawnContext):
    Process = _QuietProcess


# ---------------------------------------------------------------------------------------------- prepare

def prepare(cfg: DataConfig, out: str | Path, workers: int | None = None, inherit: dict[str, Path] | None = None) -> dict:
    """Prepare the training corpus of `cfg` into the new directory `out` (see the module); returns its manifest.
    `workers`: encoding processes (default: one per core, and one per PAIRS_PER_WORKER pairs at most, as a
    process takes a second or two to start). `inherit` {"src" or "tgt": a tokenizer file}: that side's
    tokenizer is copied (a transfer parent's) and only the other side's is trained."""
    from xattn.data.splits import describe_split

    if workers is not None and not 1 <= workers <= 256:
        raise XattnError(f"workers: must be in [1, 256], got {workers}")
    cfg.require_pairs()
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
        # (its progress counts the rows read, which the first pass read too: `total` is those kept)
        pairs = selected(Inputs(cfg), keep, cfg.dedup, stats, "encoding", first.read)
        files = [part.train_links for part, _ in parts(cfg)]
        links = {"pairs": 0, "links": 0, "unmatched": 0} if any(files) else None
        jobs = ((chunk, cfg.max_len, cfg.max_ratio, files[chunk[0][4]], bool(links)) for chunk in chunked(pairs))
        kept = [0] * len(files)  # per corpus
        manifest = fill(folder, counted(ordered_map(encode_chunk, jobs, workers, folder), stats, links, kept),
                        (made.src.vocab_size, made.tgt.vocab_size),
                        lambda: {"data": {k: getattr(cfg, k) for k in SETTINGS}, "inputs": first.records,
                                 "tokenizers": tokenizers, "cleaning": asdict(stats)} | ({"links": links} if links else {})
                        | ({"corpora": kept} if len(kept) > 1 else {}),
                        cfg.max_len if links else None)
        if stats.kept == 0:
            raise XattnError(f"{where}: no training pairs left after cleaning (sides of no piece, data.max_len, "
                             "data.max_ratio)")
        if len(kept) > 1:  # a weighted corpus that cleaning emptied is refused now, not when training starts
            mixture(cfg, kept)
    return manifest


def subset(cfg: DataConfig) -> set[int] | None:
    """With data.train_subset, the pair indices it draws (as corpus.read_split does), after a counting pass."""
    if cfg.train_subset is None:
        return None
    total = sum(1 for _ in Inputs(cfg).rows())
    if cfg.train_subset > total:
        raise XattnError(f"data.train_subset: {cfg.train_subset} is more than the {total} training pairs")
    return set(random.Random(cfg.subset_seed).sample(range(total), cfg.train_subset))


def selected(inputs: Inputs, keep: set[int] | None, dedup: bool, stats: FilterStats, what: str,
             total: int | None = None) -> Iterator[Row]:
    """The rows of `inputs` that train_subset keeps (`keep`, over all corpora in turn) and, with `dedup`, the
    first of each repeated pair (stats.duplicate counts the others); progress on stderr (Progress). The rows read,
    once all are, go to `inputs.read`."""
    seen: set[bytes] = set()
    i = -1
    with Progress(what, total, stats) as progress:
        for i, row in enumerate(inputs.rows()):
            src, tgt = row[0], row[1]
            progress.update(i + 1)
            if keep is not None and i not in keep:
                continue
            if dedup:
                key = hashlib.blake2b(f"{len(src)}:{src}{tgt}".encode("utf-8", "surrogatepass"), digest_size=8).digest()
                if key in seen:
                    stats.duplicate += 1
                    continue
                seen.add(key)
            yield row
    inputs.read = i + 1


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


def chunked(rows: Iterator[Row]) -> Iterator[list[Row]]:
    """The rows with text on both sides, CHUNK at a time, a chunk never spanning two corpora."""
    chunk = []
    for row in rows:
        if chunk and row[4] != chunk[-1][4]:
            yield chunk
            chunk = []
        if row[0].strip() and row[1].strip():
            chunk.append(row)
            if len(chunk) == CHUNK:
                yield chunk
                chunk = []
    if chunk:
        yield chunk


def counted(results: Iterator, stats: FilterStats, links: dict | None, kept: list[int]) -> Iterator[tuple]:
    """The chunks of encode_chunk, their counts added to `stats`, (with links) to `links` and to the pairs
    `kept` of their corpus."""
    for src, tgt, pieces, counts in results:
        stats.empty += counts["empty"]
        stats.too_long += counts["too_long"]
        stats.ratio += counts["ratio"]
        stats.kept += len(src)
        kept[counts["corpus"]] += len(src)
        if links is None:
            yield src, tgt
            continue
        for key, n in counts.get("links", {}).items():
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
        with worker_processes(1) as pool:
            pool.submit(train_from_files, str(folder), [str(f) for f in files], cfg.vocab_size, cfg.joint_vocab,
                        {side: str(path) for side, path in inherit.items()}).result()
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
