"""The training corpora of a DataConfig as text: their pairs read a block at a time, with the line rules of
xattn.lines.read_lines, each pair with its line of word links, and a record of every file read (its SHA-256 as
read, size and time), which the prepared directory's manifest keeps and data.prepared is checked against."""
from __future__ import annotations

import dataclasses
import hashlib
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import zip_longest
from pathlib import Path

from xattn import corpora
from xattn.config import DataConfig
from xattn.data.text import Pair
from xattn.errors import XattnError
from xattn.lines import BOM, decode_line, open_input

BLOCK = 1 << 20
"""Bytes read from an input file at a time."""

Row = tuple[str, str, "str | None", int, int]
"""A training pair as read: (source, target, its line of links or None, its line number, its corpus)."""


def parts(cfg: DataConfig) -> list[tuple[DataConfig, str]]:
    """Each training corpus of `cfg` (xattn.corpora) as a DataConfig of its own, with the prefix of its files'
    keys in the manifest's records: "" for data.dataset or data.train_*, "corpora[k]." for data.corpora[k]."""
    return [(cfg, "")] + [(dataclasses.replace(cfg, dataset=None, train_src=spec.src, train_tgt=spec.tgt,
                                               train_tsv=spec.tsv, train_links=spec.links, corpora=[], upsample=None,
                                               weight=None), f"corpora[{k}].")
                          for k, spec in enumerate(corpora.specs(cfg.corpora))]


@dataclass
class Inputs:
    """The training pairs of a DataConfig, read line by line with the rules of xattn.lines.read_lines."""
    cfg: DataConfig
    read: int = 0  # rows read in all, once prepare.selected has read them
    records: dict[str, dict] = field(default_factory=dict)  # config key of a file (its path inside: one file may play
    #   two parts, two references of one source), or dataset -> its SHA-256 as read, size, mtime

    def rows(self) -> Iterator[Row]:
        """Every training corpus' pairs in turn (Row), corpus 0 first, then data.corpora."""
        for k, (part, prefix) in enumerate(parts(self.cfg)):
            for n, (src, tgt, links) in enumerate(self.linked(part, prefix), start=1):
                yield src, tgt, links, n, k

    def pairs(self, cfg: DataConfig, prefix: str = "") -> Iterator[Pair]:
        """The pairs of one corpus (a part, as `parts` makes them)."""
        if cfg.dataset is not None:
            from xattn.data.splits import read_all, text_fingerprint

            pairs = read_all(cfg, "train")
            self.records[dataset_name(cfg)] = {"sha256": text_fingerprint(pairs)}
            yield from pairs
        elif cfg.train_tsv:
            for n, line in enumerate(self.lines(cfg.train_tsv, f"{prefix}train_tsv", tsv=True), start=1):
                fields = line.split("\t")
                if len(fields) != 2:
                    raise XattnError(f"{cfg.train_tsv}: line {n}: expected 2 tab-separated fields, found {len(fields)}")
                yield fields[0].strip(), fields[1].strip()
        else:
            lines = zip_longest(self.lines(cfg.train_src, f"{prefix}train_src"),
                                self.lines(cfg.train_tgt, f"{prefix}train_tgt"))
            for n, (src, tgt) in enumerate(lines, start=1):
                if src is None or tgt is None:
                    longer, shorter = (cfg.train_src, cfg.train_tgt) if tgt is None else (cfg.train_tgt, cfg.train_src)
                    raise XattnError(f"line counts differ: {longer} has {n + sum(1 for _ in lines)} lines, {shorter} "
                                     f"has {n - 1}")  # (the longer one read on to its end: only on this error)
                yield src, tgt

    def linked(self, cfg: DataConfig, prefix: str) -> Iterator[tuple[str, str, str | None]]:
        """The pairs of one corpus, each with its line of links (None without a links file). A links file with
        another number of lines than there are pairs is an error naming it and the first line that does not match."""
        path = cfg.train_links
        if not path:
            yield from ((src, tgt, None) for src, tgt in self.pairs(cfg, prefix))
            return
        links, n = self.lines(path, f"{prefix}train_links"), 0
        for n, (src, tgt) in enumerate(self.pairs(cfg, prefix), start=1):
            if (line := next(links, None)) is None:
                raise XattnError(f"{path}: line {n}: missing; the links file has {n - 1} lines, but the training "
                                 f"corpus ({describe(cfg)}) has more pairs (one line of links per pair)")
            yield src, tgt, line
        if next(links, None) is not None:
            raise XattnError(f"{path}: line {n + 1}: one line more than the {n} pairs of the training corpus "
                             f"({describe(cfg)}); the links file has one line per pair")

    @staticmethod
    def dataset_digest(cfg: DataConfig) -> str:
        """The SHA-256 of a named dataset's training text (small; read whole)."""
        from xattn.data.splits import read_all, text_fingerprint

        return text_fingerprint(read_all(cfg, "train"))

    def lines(self, path: str, key: str, tsv: bool = False) -> Iterator[str]:
        """The lines of a plain or gzip file (config key `key`), trailing whitespace stripped, read a block at
        a time; its record into `records`: the key, the SHA-256 of its text as read (decompressed), the
        file's size and time. The rules and messages are xattn.lines.read_lines'."""
        if os.path.exists(path) and not os.path.isfile(path) and not os.path.isdir(path):  # a pipe, a device
            raise XattnError(f"data.{key.replace('.train_', '.')}: {path} is not a regular file; a corpus is read "
                             "twice (counted, then encoded), so give a file (for a pipe or <(...), save its lines to "
                             "one first)")
        digest, number, rest = hashlib.sha256(), 0, b""
        try:
            with open_input(path) as f:
                while block := f.read(BLOCK):
                    digest.update(block)
                    block, cut = rest + block, block.rfind(b"\n") + len(rest) + 1
                    if cut == len(rest):  # no newline in this block
                        rest = block
                        continue
                    rest = block[cut:]
                    yield from self.decoded(block[:cut - 1], str(path), number, tsv)
                    number += block.count(b"\n", 0, cut)
                if rest and (number or rest != BOM):  # (a file of a BOM alone has no line, as read_lines counts it)
                    if number == 0 and b"\r" in rest.rstrip(b"\r"):  # no "\n" at all (read_lines' rule)
                        raise XattnError(f"{path}: lines end in a carriage return alone (\\r); convert them to \\n")
                    yield from self.decoded(rest, str(path), number, tsv)
        except FileNotFoundError:
            raise XattnError(f"{path}: no such file") from None
        except (OSError, EOFError) as e:
            raise XattnError(f"{path}: cannot read ({e})") from None
        self.records[key] = {"key": key, "path": str(path), "sha256": digest.hexdigest(), **file_stamp(path)}

    @staticmethod
    def decoded(data: bytes, path: str, before: int, tsv: bool = False) -> list[str]:
        """Lines `before` + 1, ... (`data`: their bytes joined by newlines), decoded and stripped (in a TSV file,
        a tab among the trailing whitespace stays: it ends an empty last field, `src<TAB>`)."""
        if before == 0:
            data = data.removeprefix(BOM)
        try:
            if b"\0" in data:  # refused by decode_line, with its line, as every reader refuses it
                raise UnicodeDecodeError("utf-8", data, 0, 1, "NUL")
            lines = data.decode("utf-8").split("\n")
        except UnicodeDecodeError:  # find the line, for the message
            lines = [decode_line(raw, path, n) for n, raw in enumerate(data.split(b"\n"), start=before + 1)]
        if not tsv:  # (the common case, a line at a time over millions: no call per line)
            return [line.rstrip() for line in lines]
        return [_stripped(line) for line in lines]


def _stripped(line: str) -> str:
    """A TSV `line` without trailing whitespace, but the tabs that were part of it (empty last fields), so that it
    has the fields text.read_tsv finds in it: `zwei<TAB><TAB>` is three, refused as in validation (one tab kept made
    it an empty pair, dropped silently)."""
    stripped = line.rstrip()
    return stripped + "\t" * line.count("\t", len(stripped))


def file_stamp(path: str | Path) -> dict:
    """What tells, without reading it, whether a file changed: its size and modification time."""
    stat = os.stat(path)
    return {"bytes": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def dataset_name(cfg: DataConfig) -> str:
    return f"{cfg.dataset} {cfg.src_lang}-{cfg.tgt_lang}"


def describe(cfg: DataConfig) -> str:
    from xattn.data.splits import describe_split

    return describe_split(cfg, "train")
