"""Text in: one rule for every file and stream, `read_lines`. A line ends at "\n" and nowhere else (a "\r"
before it dropped, as is a leading BOM); UTF-8 is checked with the file and line; a file of any length is read in
bounded memory (`read_line_chunks`), two line-aligned inputs side by side, each read once (`paired_line_chunks`),
and a terminal or pipe as lines arrive (`stream_lines`).
"""
from __future__ import annotations

import gzip
import os
import re
import sys
import zlib
from pathlib import Path
from typing import Iterator

from xattn.errors import XattnError

def read_lines(path: str | Path | None) -> list[str]:
    """The lines of a UTF-8 text file (plain or `.gz`), or of stdin for None or "-".

    A line ends at "\\n" and nowhere else; a "\\r" right before it is dropped, as is a leading BOM.
    Form feeds, U+2028 and the other characters that `str.splitlines` also breaks at stay inside
    their line, so N lines in give N lines out. A file whose lines end in "\\r" alone is an error.
    """
    return [line for chunk in read_line_chunks(path) for line in chunk]


COMPRESSED = {b"\xfd7zXZ\x00": "xz", b"\x28\xb5\x2f\xfd": "zstd", b"PK\x03\x04": "zip", b"7z\xbc\xaf\x27\x1c": "7z"}
"""The first bytes of what other compressors write (bzip2's are checked apart: they begin as text could)."""


class GzipInput(gzip.GzipFile):
    """A gzip file read as bytes, whose corrupt data is an OSError (gzip.BadGzipFile), as every reader here catches
    it with a truncated file's EOFError: zlib's own error, which gzip lets through (an invalid block, a bad
    distance), came out as a traceback."""

    def read(self, size: int = -1) -> bytes:
        try:
            return super().read(size)
        except zlib.error as e:
            raise gzip.BadGzipFile(f"corrupt gzip data: {e}") from None


def open_input(path: str | Path):
    """A file of text to read as bytes: gzip data decompressed (by its first bytes, whatever its name, or by a .gz
    name where it cannot be peeked at: a pipe); another compressor's data is an error naming it, where it would be
    read as text of NUL bytes."""
    if not os.path.isfile(path):
        return (GzipInput if str(path).endswith(".gz") else open)(path, "rb")
    with open(path, "rb") as f:
        head = f.read(10)
    if head.startswith(b"\x1f\x8b"):
        return GzipInput(path, "rb")
    kind = "bzip2" if re.fullmatch(rb"BZh[1-9](1AY&SY|\x17rE8P\x90)", head) else \
        next((name for magic, name in COMPRESSED.items() if head.startswith(magic)), None)
    if kind is not None:
        raise XattnError(f"{path}: {kind}-compressed, which xattn does not read; decompress it, or compress it with "
                         "gzip")
    return open(path, "rb")


BOM = b"\xef\xbb\xbf"
"""UTF-8's byte order mark, dropped at the start of a text."""
CHUNK_LINES = 10_000
"""Lines of a file that translate -i and evaluate read, translate and write at a time: bounded memory."""


def read_line_chunks(path: str | Path | None, size: int | None = None, block: int = 1 << 20) -> Iterator[list[str]]:
    """The lines of `read_lines(path)`, by its rule and with its errors, `size` (default CHUNK_LINES) at a
    time, the file read `block` bytes at a time: a file of any length in bounded memory."""
    size = size or CHUNK_LINES
    if path in (None, "-"):
        yield from _line_chunks(sys.stdin.buffer, "stdin", size, block)
        return
    path = Path(path)
    if path.is_dir():
        raise XattnError(f"{path}: is a directory, not a text file")
    try:
        with open_input(path) as f:
            yield from _line_chunks(f, str(path), size, block)
    except FileNotFoundError:
        raise XattnError(f"{path}: no such file") from None
    except (OSError, EOFError) as e:
        raise XattnError(f"{path}: cannot read ({e})") from None


def count_lines(path: str | Path | None) -> int | None:
    """How many lines `read_lines(path)` gives, counted without decoding them (a quick first pass); None for an
    input that a first pass would use up (stdin, a pipe or FIFO, a process substitution such as <(cmd)): read
    twice, its second reading found nothing, and a translation of it came out empty with exit 0."""
    if path in (None, "-") or (os.path.exists(path) and not os.path.isfile(path) and not os.path.isdir(path)):
        return None
    count, last, first, inside = 0, b"\n", True, False  # inside: a "\r" with more after it (_refuse_cr_only)
    try:
        with open_input(path) as f:
            while block := f.read(1 << 20):
                block, first = block.removeprefix(BOM) if first else block, False  # (a file of a BOM alone: 0 lines)
                inside = inside or not count and (last == b"\r" or b"\r" in block.rstrip(b"\r"))
                count, last = count + block.count(b"\n"), block[-1:] or last
    except FileNotFoundError:
        raise XattnError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise XattnError(f"{path}: is a directory, not a text file") from None
    except (OSError, EOFError) as e:
        raise XattnError(f"{path}: cannot read ({e})") from None
    if count == 0 and inside:  # (refused here as when read: a count of 1 made a count mismatch the error)
        raise _cr_only(str(path))
    return count + (last != b"\n")


def paired_line_chunks(first: str | Path | None, second: str | Path | None, names: tuple[str, str] | None = None
                       ) -> Iterator[tuple[list[str], list[str]]]:
    """The chunks of two line-aligned inputs side by side (read_line_chunks of each, so bounded in memory). Lines
    that do not pair up are an XattnError naming both counts (`names`: how it names the inputs, default their
    paths): before anything is read when both can be counted first (count_lines), else once one runs out, the
    other then read to its end for its count. Each input is read once, so either may be stdin or a pipe (not
    both stdin)."""
    names = names or tuple("stdin" if path in (None, "-") else str(path) for path in (first, second))
    if first in (None, "-") and second in (None, "-"):
        raise XattnError(f"{names[0]} and {names[1]}: both read stdin; give one of them as a file")
    counts = (count_lines(first), count_lines(second))
    if None not in counts and counts[0] != counts[1]:
        raise XattnError(f"line counts differ: {names[0]} has {counts[0]} lines, {names[1]} has {counts[1]}")
    ones, others, done = read_line_chunks(first), read_line_chunks(second), 0
    for one in ones:
        other = next(others, [])
        if len(other) != len(one):  # (both chunk alike: only the last chunks may be shorter)
            rest = (sum(map(len, ones)), sum(map(len, others)))
            raise XattnError(f"line counts differ: {names[0]} has {done + len(one) + rest[0]} lines, {names[1]} has "
                             f"{done + len(other) + rest[1]}")
        yield one, other
        done += len(one)
    if more := sum(map(len, others)):
        raise XattnError(f"line counts differ: {names[0]} has {done} lines, {names[1]} has {done + more}")


def _line_chunks(f, where: str, size: int, block_size: int) -> Iterator[list[str]]:
    lines = Lines(where)
    while block := f.read(block_size):
        lines.feed(block)
        while len(lines.ready) >= size:
            yield lines.take(size)
    lines.finish()
    if lines.ready:
        yield lines.take(len(lines.ready))


class Lines:
    """Bytes in, lines out, by the rule of `read_lines` (a leading BOM dropped, "\\n" only, "\\r" before it
    dropped, UTF-8 checked with the line number, lines ending in "\\r" alone refused)."""

    def __init__(self, where: str):
        self.where, self.pending, self.number, self.ready = where, b"", 0, []

    def feed(self, data: bytes) -> None:
        data = self.pending + data
        if self.number == 0:
            data = data.removeprefix(BOM)
        *complete, self.pending = data.split(b"\n")
        for line in complete:
            self.number += 1
            self.ready.append(decode_line(line, self.where, self.number))

    def finish(self) -> None:
        """The end of the input: its last line, if it has no newline."""
        if self.number == 0:
            _refuse_cr_only(self.pending, self.where)
        if self.pending:
            self.number += 1
            self.ready.append(decode_line(self.pending, self.where, self.number))
            self.pending = b""

    def take(self, n: int) -> list[str]:
        taken, self.ready = self.ready[:n], self.ready[n:]
        return taken


def decode_line(line: bytes, where: str, number: int) -> str:
    """One line's bytes (its "\n" removed) -> text: a trailing "\r" dropped, UTF-8 checked, a NUL refused (as the
    server refuses it: binary data, or UTF-16 text, whose ASCII letters are valid UTF-8 with a NUL after each)."""
    if b"\0" in line:
        raise XattnError(f"{where}: line {number}: holds a NUL byte: binary data, or UTF-16 text; give UTF-8 text "
                         "(iconv -f UTF-16 -t UTF-8 converts it)")
    try:
        return line.removesuffix(b"\r").decode("utf-8")
    except UnicodeDecodeError:
        raise XattnError(f"{where}: line {number}: invalid UTF-8") from None


def _refuse_cr_only(raw: bytes, where: str) -> None:
    """Text without a "\n" but with a "\r" inside: lines ending in "\r" alone."""
    if b"\r" in raw.rstrip(b"\r"):
        raise _cr_only(where)


def _cr_only(where: str) -> XattnError:
    return XattnError(f"{where}: lines end in a carriage return alone (\\r, old Mac style); "
                      "convert them to \\n, e.g. tr '\\r' '\\n'")


def is_interactive(stream) -> bool:
    """Whether `stream` (stdin) is a terminal or a pipe rather than a file: its lines may arrive one by one."""
    import stat

    try:
        return not stat.S_ISREG(os.fstat(stream.fileno()).st_mode)
    except (OSError, ValueError, AttributeError):  # no file descriptor (a test's StringIO): read it whole
        return False


STREAM_BATCH = 4096
"""Lines at most in one batch of `stream_lines`."""


def stream_lines(stream, where: str = "stdin") -> Iterator[list[str]]:
    """The lines of a terminal or a pipe, by the rule of `read_lines`, in batches as they arrive: each batch
    holds every complete line that is there when it is asked for (up to STREAM_BATCH), so a person typing
    gets each line at once and a fast pipe still gives large batches."""
    import select

    fd, lines = stream.fileno(), Lines(where)
    while True:
        if not lines.ready or select.select([fd], [], [], 0)[0]:  # block only when there is nothing to hand out
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                break
            lines.feed(chunk)
            if len(lines.ready) < STREAM_BATCH:
                continue
        yield lines.take(STREAM_BATCH)
    lines.finish()
    while lines.ready:
        yield lines.take(STREAM_BATCH)
