"""A prepared corpus: the token ids of every training pair in one flat array per side, which every process
memory-maps instead of holding its own copy.

A prepared directory holds, per side s in (src, tgt): `s.bin` (the ids of every sentence, one after another,
without BOS/EOS; uint16 when the vocabulary has at most 65,536 pieces, else uint32), `s.lengths` (each
sentence's token count; uint16 when every count is below 65,535, else uint32) and `s.blocks` (int64: where
sentences 0, BLOCK, 2 * BLOCK, ... start, and the id count at the end), so a sentence's start is its block's
plus the lengths before it in the block; about 2.1 bytes a sentence besides its ids, where an offset per
sentence would take 8. With alignment links (data.train_links), a third "side", `links`, holds each pair's
piece links the same way, flat as source position, target position, source position, ... (uint16 while
data.max_len is below 65,536). And `manifest.json`: the format
version, what the corpus was made from (the caller's fields: input and tokenizer hashes, data settings,
cleaning statistics), the counts, and each array's dtype, size in bytes and SHA-256. It is written into a
temporary sibling and renamed into place (xattn.io.atomic_dir), so a killed writer leaves nothing that
`MappedCorpus.open` accepts.

Shapes: N pairs, n ids of one side in all.
"""
from __future__ import annotations

import errno
from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import chain
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from xattn.errors import XattnError
from xattn.io import atomic_dir, json_text, read_json, sha256_file

if TYPE_CHECKING:
    from xattn.data.batching import Batch

FORMAT = 2
BLOCK = 64
"""Sentences per entry of `s.blocks`."""
MANIFEST = "manifest.json"
SIDES = ("src", "tgt")
LINKS = "links"
"""The optional array set of piece links: (source piece, target piece) pairs, 0-based, without BOS or EOS."""
Sentences = "Sequence[Sequence[int]] | Flat"
Chunk = tuple[Sentences, Sentences]
"""Some pairs' ids: (source sentences, target sentences), as many on each side; each side id lists or Flat."""


@dataclass
class Flat:
    """Sentences' ids one after another (int64) and their lengths: what a worker process sends back."""
    ids: np.ndarray
    lengths: np.ndarray

    @classmethod
    def of(cls, sentences: Sequence[Sequence[int]]) -> Flat:
        lengths = np.fromiter(map(len, sentences), dtype=np.int64, count=len(sentences))
        return cls(np.fromiter(chain.from_iterable(sentences), dtype=np.int64, count=int(lengths.sum())), lengths)

    def __len__(self) -> int:
        return len(self.lengths)


def id_dtype(vocab_size: int) -> np.dtype:
    """The narrowest dtype that holds every id of a vocabulary of `vocab_size` pieces."""
    return np.dtype(np.uint16 if vocab_size <= 1 << 16 else np.uint32)


class SideWriter:
    """Appends one side's sentences to `s.bin`; keeps their lengths (4 bytes a sentence) for close()."""

    def __init__(self, folder: Path, side: str, dtype: np.dtype):
        self.folder, self.side, self.dtype = folder, side, dtype
        self.file = open(folder / f"{side}.bin", "wb")
        self.lengths = array("I")

    def add(self, sentences: Sentences) -> None:
        flat = sentences if isinstance(sentences, Flat) else Flat.of(sentences)
        if flat.ids.size and (flat.ids.min() < 0 or flat.ids.max() > np.iinfo(self.dtype).max):
            raise ValueError(f"an id outside {self.dtype} for the {self.side} side")
        self.file.write(flat.ids.astype(self.dtype).tobytes())
        self.lengths.frombytes(flat.lengths.astype(np.uint32).tobytes())

    def close(self) -> int:
        """Write the lengths and blocks; returns the side's id count."""
        self.file.close()
        lengths = np.frombuffer(self.lengths, dtype=np.uint32)
        self.lengths_dtype = np.dtype(np.uint16 if len(lengths) == 0 or lengths.max() < (1 << 16) - 1 else np.uint32)
        offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        (self.folder / f"{self.side}.lengths").write_bytes(lengths.astype(self.lengths_dtype).tobytes())
        (self.folder / f"{self.side}.blocks").write_bytes(offsets[np.r_[0:len(lengths):BLOCK, len(lengths)]].tobytes())
        return int(offsets[-1])


def write_prepared(out: Path, chunks: Iterable[Chunk], vocab_sizes: tuple[int, int], fields: dict) -> dict:
    """Write the pairs of `chunks` as a prepared directory `out` (which must not exist, or be empty); `fields`
    (JSON) go into the manifest as they are. Returns the manifest."""
    with prepared_dir(out) as folder:
        return fill(folder, chunks, vocab_sizes, lambda: fields)


@contextmanager
def prepared_dir(out: Path) -> Iterator[Path]:
    """atomic_dir for a prepared corpus: a disk that fills up is one line saying how much was written."""
    out = Path(out)
    with atomic_dir(out) as folder:
        try:
            yield folder
        except OSError as e:
            if e.errno != errno.ENOSPC:
                raise
            written = sum(f.stat().st_size for f in folder.iterdir())
            raise XattnError(f"{out}: the disk filled up after {written} bytes of the prepared corpus; nothing was "
                             "kept. It needs about 2 (vocabulary up to 65,536) or 4 bytes a token and 2 to 4 bytes a "
                             "pair per side: free that much and run again") from None


def fill(folder: Path, chunks: Iterable[Chunk], vocab_sizes: tuple[int, int], fields: Callable[[], dict],
         max_len: int | None = None) -> dict:
    """Write the arrays of `chunks` and the manifest into `folder`; `fields()` is read once every chunk is in.
    With `max_len` (the longest sentence, in pieces), each chunk also holds its pairs' piece links, flat
    (source piece, target piece, ...), a third element."""
    writers = [SideWriter(folder, side, id_dtype(v)) for side, v in zip(SIDES, vocab_sizes)]
    if max_len is not None:
        writers.append(SideWriter(folder, LINKS, id_dtype(max_len)))
    pairs = 0
    for chunk in chunks:
        if len(chunk) != len(writers) or len({len(part) for part in chunk}) != 1:
            raise ValueError(f"a chunk of {[len(part) for part in chunk]} sentences for {len(writers)} arrays")
        for writer, part in zip(writers, chunk):
            writer.add(part)
        pairs += len(chunk[0])
    tokens = [w.close() for w in writers][:2]
    manifest = {"format": FORMAT, **fields(), "pairs": pairs, "tokens": dict(zip(SIDES, tokens)),
                "arrays": {f.name: describe(f, dtype) for f, dtype in files(folder, writers)}}
    (folder / MANIFEST).write_text(json_text(manifest, indent=2) + "\n", encoding="utf-8")
    return manifest


def files(folder: Path, writers: list[SideWriter]) -> list[tuple[Path, np.dtype]]:
    return [(folder / f"{w.side}{suffix}", dtype) for w in writers
            for suffix, dtype in ((".bin", w.dtype), (".lengths", w.lengths_dtype), (".blocks", np.dtype(np.int64)))]


def describe(path: Path, dtype: np.dtype) -> dict:
    return {"dtype": dtype.name, "bytes": path.stat().st_size, "sha256": sha256_file(path)}


@dataclass
class MappedCorpus:
    """A prepared directory, memory-mapped: the interface of batching.TokenizedCorpus (len, src_lengths,
    tgt_lengths, collate) without a copy of the corpus in this process. The ids are mapped (read when a batch
    is collated); the row lengths, which batching reads whole, are held in the narrowest dtype (2 bytes a
    pair and side for sentences under 65,535 tokens), and the blocks (1/8 byte a pair and side)."""
    folder: Path
    manifest: dict
    ids: dict[str, np.ndarray]          # side -> (n,) every sentence's ids (LINKS: its piece links, flat)
    blocks: dict[str, np.ndarray]       # side -> (ceil(N / BLOCK) + 1,) where every BLOCK-th sentence starts
    rows: dict[str, np.ndarray]         # side -> (N,) tokens + 1: the length of its row in a Batch

    @classmethod
    def open(cls, folder: str | Path, expect: dict | None = None, verify: bool = True) -> MappedCorpus:
        """Map `folder`. Refused in one line: no prepared directory there, another format, a manifest whose
        counts or array descriptions are not what `fill` writes, a missing or short array, one whose SHA-256
        (and a tokenizer file whose SHA-256) differs from the manifest's (with `verify`: every file is read once
        for it; ids out of the vocabulary would fail the first step), or a manifest whose `expect` fields differ
        (naming the first that does). Without `verify`: what another process has just checked, or written."""
        folder = Path(folder)
        if not (folder / MANIFEST).is_file():
            raise XattnError(f"{folder}: not a prepared corpus (no {MANIFEST}); make one with `xattn prepare`")
        manifest = read_json(folder / MANIFEST)
        if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
            raise XattnError(f"{folder}: a prepared corpus of another format ({MANIFEST}: format "
                             f"{manifest.get('format') if isinstance(manifest, dict) else manifest!r}, expected "
                             f"{FORMAT}); prepare it again")
        for key, value in (expect or {}).items():
            if manifest.get(key) != value:
                raise XattnError(f"{folder}: prepared for other {key} ({json_text(manifest.get(key))}, this run "
                                 f"has {json_text(value)}); prepare again into another directory")
        pairs, arrays = manifest.get("pairs"), manifest.get("arrays")
        if type(pairs) is not int or pairs < 0:
            raise XattnError(f"{folder / MANIFEST}: pairs: expected a whole number >= 0, got {json_text(pairs)}; "
                             "prepare it again")
        if not isinstance(arrays, dict):
            raise XattnError(f"{folder / MANIFEST}: arrays: expected an object describing each array, got "
                             f"{json_text(arrays)}; prepare it again")
        maps = {name: check_array(folder, name, spec, verify) for name, spec in arrays.items()}
        if verify:
            check_tokenizers(folder, manifest.get("tokenizers", {}))
        sides = SIDES + ((LINKS,) if f"{LINKS}.bin" in maps else ())
        if missing := [f"{s}{x}" for s in sides for x in (".bin", ".lengths", ".blocks") if f"{s}{x}" not in maps]:
            raise XattnError(f"{folder}: {MANIFEST} lists no {missing[0]}; prepare it again")
        blocks = {s: np.array(maps.pop(f"{s}.blocks"), dtype=np.int64) for s in sides}
        rows = {s: row_lengths(maps.pop(f"{s}.lengths")) for s in sides}
        corpus = cls(folder, manifest, {s: maps[f"{s}.bin"] for s in sides}, blocks, rows)
        corpus.check_counts()
        return corpus

    def check_counts(self) -> None:
        """That each side's lengths, blocks and ids agree with each other and with the manifest's count."""
        n = self.manifest["pairs"]
        for side in self.ids:
            rows, blocks = self.rows[side], self.blocks[side]
            sums = np.add.reduceat(rows.astype(np.int64) - 1, np.arange(0, n, BLOCK)) if 0 < n == len(rows) \
                else np.zeros(0, np.int64)  # (rows of another count: refused below, not an IndexError here)
            if len(rows) != n or len(blocks) != len(sums) + 1 or blocks[0] != 0 \
                    or not np.array_equal(np.diff(blocks), sums) or int(blocks[-1]) != len(self.ids[side]):
                raise XattnError(f"{self.folder}: the {side} arrays do not agree with each other or with {MANIFEST}; "
                                 "prepare it again")

    def __len__(self) -> int:
        return int(self.manifest["pairs"])

    @property
    def has_links(self) -> bool:
        """Whether it holds alignment links (data.train_links), for guided alignment."""
        return LINKS in self.ids

    def sentence(self, side: str, i: int) -> np.ndarray:
        """The ids of sentence i of `side` (a view into the map)."""
        rows, first = self.rows[side], i - i % BLOCK
        start = int(self.blocks[side][i // BLOCK]) + int(rows[first:i].sum(dtype=np.int64)) - (i - first)
        return self.ids[side][start:start + int(rows[i]) - 1]

    def src_lengths(self) -> np.ndarray:
        """Length of each source row in a Batch (tokens + eos)."""
        return self.rows["src"]

    def tgt_lengths(self) -> np.ndarray:
        """Length of each target row in a Batch (tokens + bos or eos)."""
        return self.rows["tgt"]

    def collate(self, indices: Sequence[int]) -> Batch:
        """A Batch of pairs `indices`; only their ids are read from the map."""
        from xattn.data.batching import collate

        links = [self.sentence(LINKS, i) for i in indices] if self.has_links else None
        batch = collate([self.sentence("src", i).tolist() for i in indices],
                        [self.sentence("tgt", i).tolist() for i in indices], indices, links=links)
        for ids in self.ids.values():
            let_go(ids)
        return batch


def row_lengths(lengths: np.ndarray) -> np.ndarray:
    """Token counts + 1 in the narrowest unsigned dtype (2 bytes a sentence under 65,535 tokens), a block at
    a time."""
    dtype = np.uint16 if len(lengths) == 0 or int(np.max(lengths)) < (1 << 16) - 1 else np.uint32
    rows, block = np.empty(len(lengths), dtype=dtype), 1 << 22
    for start in range(0, len(lengths), block):
        np.add(lengths[start:start + block], 1, out=rows[start:start + block], casting="unsafe")
    return rows


def check_array(folder: Path, name: str, spec: dict, verify: bool) -> np.ndarray:
    """The array `name` of a prepared directory as its manifest `spec` describes it: the ids mapped read-only,
    the lengths and blocks (a few bytes a sentence, read whole) in memory."""
    path, where = folder / name, f"{folder / MANIFEST}: arrays.{name}"
    if not isinstance(spec, dict) or type(spec.get("bytes")) is not int:
        raise XattnError(f"{where}: expected its dtype, bytes and sha256, got {json_text(spec)}; prepare it again")
    try:
        dtype = np.dtype(spec.get("dtype"))
    except TypeError:
        raise XattnError(f"{where}.dtype: not a dtype ({spec.get('dtype')!r}); prepare it again") from None
    if dtype.kind not in "iu" or spec["bytes"] % dtype.itemsize:
        raise XattnError(f"{where}: {spec['bytes']} bytes of {dtype}, not whole ids, lengths or offsets; prepare "
                         "it again")
    if not path.is_file():
        raise XattnError(f"{path}: missing from the prepared corpus; prepare it again")
    if path.stat().st_size != spec["bytes"]:
        raise XattnError(f"{path}: {path.stat().st_size} bytes where {MANIFEST} says {spec['bytes']} (cut short "
                         "or changed); prepare it again")
    if verify and sha256_file(path) != spec.get("sha256"):
        raise XattnError(f"{path}: its SHA-256 differs from the one in {MANIFEST} (damaged or changed); prepare it "
                         "again")
    if spec["bytes"] == 0:
        return np.zeros(0, dtype=dtype)
    return mapped(path, dtype) if name.endswith(".bin") else np.fromfile(path, dtype=dtype)


def check_tokenizers(folder: Path, hashes: object) -> None:
    """That the tokenizer files the manifest lists are there as prepared (a damaged one was named only once
    training had copied it into the model directory)."""
    if not isinstance(hashes, dict):
        raise XattnError(f"{folder / MANIFEST}: tokenizers: expected an object of SHA-256 by file name, got "
                         f"{json_text(hashes)}; prepare it again")
    for name, digest in hashes.items():
        path = folder / name
        if not path.is_file():
            raise XattnError(f"{path}: missing from the prepared corpus; prepare it again")
        if sha256_file(path) != digest:
            raise XattnError(f"{path}: its SHA-256 differs from the one in {MANIFEST} (damaged or changed); prepare "
                             "it again")


def let_go(ids: np.ndarray) -> None:
    """Unmap the pages of a mapped array from this process (they stay in the page cache, shared with every
    other process, and map again when read): however many batches it reads, its RSS holds at most one
    batch's pages. The kernel maps the pages around each one read (fault-around) whatever the advice, so
    without this a process' RSS would grow by some 64 KB per sentence read until it held the whole file."""
    import mmap

    region = getattr(ids.base, "obj", None)
    if isinstance(region, mmap.mmap) and hasattr(mmap, "MADV_DONTNEED"):
        region.madvise(mmap.MADV_DONTNEED)


def mapped(path: Path, dtype: np.dtype) -> np.ndarray:
    """`path` mapped read-only as a flat array, marked for random access: a batch reads scattered sentences,
    so read-ahead around them would only fill the page cache with pages no batch asked for (let_go keeps
    them out of this process' RSS)."""
    import mmap

    with open(path, "rb") as f:
        region = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    if hasattr(region, "madvise") and hasattr(mmap, "MADV_RANDOM"):
        region.madvise(mmap.MADV_RANDOM)
    return np.frombuffer(region, dtype=dtype)
