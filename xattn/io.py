"""Files in and out. Atomic writes: a temporary file (or directory) in the target's folder, named after the
target and the writing process, then a rename over the target, so a reader (or a run resumed after a crash)
sees the old file or the new one, never half of one. What a killed process leaves is removed, with a message,
when the same target is next written (`remove_leftovers`).
Text in: one rule for every file and stream, `read_lines`.
"""
from __future__ import annotations

import glob
import gzip
import hashlib
import json
import math
import os
import re
import shutil
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

from xattn.errors import XattnError

TEMP_SUFFIX = ".tmp"


def atomic_write(path: Path, write: Callable[[Path], None]) -> None:
    """Call `write(tmp_path)` and move the result to `path` in one rename. A symbolic link stays a link: the
    file it points to is replaced. What is not a file (a pipe, a terminal, a device such as /dev/stdout, or a
    link to one) is written into as it is, since it cannot be replaced. An error names `path`."""
    given = path = Path(path)
    if path.is_dir():
        raise XattnError(f"{path}: is a directory")
    try:
        if path.exists() and not path.is_file():
            write(path)
            return
        path = Path(os.path.realpath(path)) if path.is_symlink() else path
        make_parent(path, given)
        remove_leftovers(path)
    except OSError as e:
        raise XattnError(f"{given}: cannot write ({e.strerror or e})") from None
    tmp: str | None = None
    try:  # from the temporary's making on: a signal (Ctrl+C, SIGTERM) at any point leaves no temporary behind
        fd, tmp = tempfile.mkstemp(prefix=f"{_temporary(path).name}.", suffix=TEMP_SUFFIX, dir=path.parent)
        os.close(fd)
        write(Path(tmp))
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except OSError as e:
        if tmp is not None:  # (None: mkstemp's own error, which made nothing)
            Path(tmp).unlink(missing_ok=True)
            if e.filename not in (None, tmp, str(path)):  # another file's error (an input read on the way)
                raise
        raise XattnError(f"{given}: cannot write ({e.strerror or e})") from None
    except BaseException:
        _discard(path, tmp)
        raise


def _discard(path: Path, tmp: str | None) -> None:
    """Remove the temporary of `path` this process was writing when stopped: `tmp`, or, before mkstemp handed its
    name back (after it made the file), this process's temporaries of `path` (named after it; no other writer's)."""
    if tmp is not None:
        Path(tmp).unlink(missing_ok=True)
        return
    try:
        for made in path.parent.glob(f"{glob.escape(_temporary(path).name)}.*{TEMP_SUFFIX}"):
            made.unlink(missing_ok=True)
    except OSError:  # (on the way out already: the error that stopped it is the one to tell)
        pass


def make_parent(path: Path, given: Path) -> None:
    """Create the directories `path` goes in; one of them that is a file is an error naming it (mkdir said
    "File exists" of the output `given`)."""
    if file := next((p for p in path.parents if p.exists() and not p.is_dir()), None):
        raise XattnError(f"{given}: {file} is not a directory")
    path.parent.mkdir(parents=True, exist_ok=True)


def is_temporary(path: Path) -> bool:
    """True for a file `atomic_write` left behind when its process died before the rename (`.NAME.tmp-PID.XXXXXXXX.tmp`
    of a process that is gone: a user's `.draft.tmp` is not one, nor a live writer's file)."""
    found = re.fullmatch(rf"\..+\.tmp-(\d+)\..+{re.escape(TEMP_SUFFIX)}", path.name)
    return found is not None and not _alive(int(found[1]))


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def atomic_write_bytes(path: Path, data: bytes) -> None:
    atomic_write(path, lambda tmp: tmp.write_bytes(data))


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


# ------------------------------------------------------------------------------------------ text in

def read_lines(path: str | Path | None) -> list[str]:
    """The lines of a UTF-8 text file (plain or `.gz`), or of stdin for None or "-".

    A line ends at "\\n" and nowhere else; a "\\r" right before it is dropped, as is a leading BOM.
    Form feeds, U+2028 and the other characters that `str.splitlines` also breaks at stay inside
    their line, so N lines in give N lines out. A file whose lines end in "\\r" alone is an error.
    """
    return [line for chunk in read_line_chunks(path) for line in chunk]


COMPRESSED = {b"\xfd7zXZ\x00": "xz", b"\x28\xb5\x2f\xfd": "zstd", b"PK\x03\x04": "zip", b"7z\xbc\xaf\x27\x1c": "7z"}
"""The first bytes of what other compressors write (bzip2's are checked apart: they begin as text could)."""


def open_input(path: str | Path):
    """A file of text to read as bytes: gzip data decompressed (by its first bytes, whatever its name, or by a .gz
    name where it cannot be peeked at: a pipe); another compressor's data is an error naming it, where it would be
    read as text of NUL bytes."""
    if not os.path.isfile(path):
        return (gzip.open if str(path).endswith(".gz") else open)(path, "rb")
    with open(path, "rb") as f:
        head = f.read(10)
    if head.startswith(b"\x1f\x8b"):
        return gzip.open(path, "rb")
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
    count, last, first = 0, b"\n", True
    try:
        with open_input(path) as f:
            while block := f.read(1 << 20):
                block, first = block.removeprefix(BOM) if first else block, False  # (a file of a BOM alone: 0 lines)
                count, last = count + block.count(b"\n"), block[-1:] or last
    except FileNotFoundError:
        raise XattnError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise XattnError(f"{path}: is a directory, not a text file") from None
    except (OSError, EOFError) as e:
        raise XattnError(f"{path}: cannot read ({e})") from None
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
        raise XattnError(f"{where}: lines end in a carriage return alone (\\r, old Mac style); "
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


def read_json(path: Path) -> Any:
    """The JSON document in `path`. Like read_yaml, a key given twice in one object (json.loads would keep
    the last silently) is refused, and so are NaN and Infinity, which are not JSON: a one-line XattnError
    naming the file and, where known, the line."""
    path = Path(path)
    try:
        text = path.read_bytes().decode("utf-8")
    except OSError as e:
        raise XattnError(f"{path}: cannot read ({e.strerror or e})") from None
    except UnicodeDecodeError:
        raise XattnError(f"{path}: not UTF-8 text") from None
    try:
        return json.loads(text, object_pairs_hook=_unique_keys, parse_constant=_not_json)
    except json.JSONDecodeError as e:
        raise XattnError(f"{path}: line {e.lineno}: invalid JSON ({e.msg})") from None
    except ValueError as e:
        raise XattnError(f"{path}: invalid JSON ({e})") from None


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen = {}
    for key, value in pairs:
        if key in seen:
            raise ValueError(f"{key!r} is given twice in one object")
        seen[key] = value
    return seen


def _not_json(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def json_text(value: Any, **kwargs: Any) -> str:
    """`json.dumps(value, **kwargs)` for every JSON xattn writes: NaN and infinities, which JSON does not have
    (Python would write the non-JSON `NaN`, `Infinity`), become null."""
    return json.dumps(_finite(value), allow_nan=False, **kwargs)


def _finite(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def one_line(text: str) -> str:
    """`text` with any "\\n" or "\\r" replaced by a space, so that it prints as exactly one line."""
    return text.replace("\r\n", " ").replace("\n", " ").replace("\r", " ")


@contextmanager
def atomic_dir(path: Path) -> Iterator[Path]:
    """Write a new directory as a whole (prune, compose, export, import): yields a temporary sibling
    `.NAME.tmp-PID` to fill, renamed to `path` at the end (`path` must not exist, or be an empty directory);
    on an error the temporary one is removed and `path` untouched."""
    given = path = Path(path)
    if path.is_symlink():  # a link to an empty directory: that directory is replaced, the link kept
        path = Path(os.path.realpath(path))
    if path.exists() and path.resolve() == Path.cwd().resolve():
        raise XattnError(f"{given}: the current directory, which cannot be replaced; name a new directory")
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise XattnError(f"{given}: already exists and is not an empty directory")
    make_parent(path, given)
    remove_leftovers(path)
    tmp = _temporary(path)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        yield tmp
        if path.exists():
            path.rmdir()
        os.replace(tmp, path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _temporary(path: Path) -> Path:
    """Where this process writes `path` before the rename: `.NAME.tmp-PID`, a directory, or the start of a
    file's temporary name (`.NAME.tmp-PID.XXXXXXXX.tmp`)."""
    return path.parent / f"{_leftover_prefix(path)}{os.getpid()}"


def _leftover_prefix(path: Path) -> str:
    return f".{path.name}.tmp-"


def remove_leftovers(path: Path) -> list[Path]:
    """Remove what a process killed while writing `path` (atomic_write, atomic_dir) left beside it: the
    temporary directory or files named after `path` and the process, if that process is gone; one line on
    stderr for each. Returns what was removed."""
    prefix, removed = _leftover_prefix(path), []
    for entry in path.parent.iterdir() if path.parent.is_dir() else ():
        pid = entry.name[len(prefix):].partition(".")[0] if entry.name.startswith(prefix) else ""
        if not pid.isdigit() or _alive(int(pid)):
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)
        print(f"xattn: removed {entry}, left half-written by process {pid}, which is gone", file=sys.stderr)
        removed.append(entry)
    return removed


def _alive(pid: int) -> bool:
    """Whether process `pid` exists (on this machine). Where that cannot be asked safely (Windows, whose
    os.kill would end it), every process counts as alive, so nothing is removed."""
    if os.name == "nt":
        return True
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):
        return False
    except PermissionError:  # another user's
        return True
    return True
