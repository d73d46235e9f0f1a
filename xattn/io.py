"""Files in and out. Atomic writes: a temporary file (or directory) in the target's folder, named after the
target and the writing process, then a rename over the target, so a reader (or a run resumed after a crash)
sees the old file or the new one, never half of one. The new file's bytes reach the disk before the rename, and
the rename before the write returns (fsync), so a power loss too leaves the old file or the new one. The new file
keeps the permissions of the one it replaces. What a killed
process leaves is removed, with a message, when the same target is next written (`remove_leftovers`). JSON in and
out. Text in: xattn/lines.py.
"""
from __future__ import annotations

import errno
import glob
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
        _sync(tmp)
        os.chmod(tmp, _mode_for(path))
        os.replace(tmp, path)
        _sync(path.parent, folder=True)
    except OSError as e:
        if tmp is not None:  # (None: mkstemp's own error, which made nothing)
            Path(tmp).unlink(missing_ok=True)
            if e.filename not in (None, tmp, str(path)):  # another file's error (an input read on the way)
                raise
        raise XattnError(f"{given}: cannot write ({e.strerror or e})") from None
    except BaseException:
        _discard(path, tmp)
        raise


def _sync(path: str | Path, folder: bool = False) -> None:
    """fsync a file's bytes (on Windows opened for writing: it flushes no read-only handle), or with `folder` a
    folder's entries, to the disk. A filesystem without fsync leaves it as it is; a folder's is done where it can be
    (Windows opens none; the rename is made by then, and one that fails is not an error of the write)."""
    try:
        fd = os.open(path, os.O_RDWR if os.name == "nt" and not folder else os.O_RDONLY)
    except OSError:
        if folder:
            return
        raise
    try:
        os.fsync(fd)
    except OSError as e:
        if not folder and e.errno not in UNSYNCABLE:
            raise
    finally:
        os.close(fd)


UNSYNCABLE = {errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS}
"""What fsync says on a filesystem (or a file) that has no such thing."""


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


def _mode_for(path: Path) -> int:
    """The permissions of a file written at `path`: those of the file it replaces (a private file stays private,
    a read-only one read-only: the rename would otherwise give the new file the default's), else what opening a
    new file gives, 0666 less the umask."""
    try:
        return os.stat(path).st_mode & 0o777
    except FileNotFoundError:
        return 0o666 & ~_umask()


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
    if path.exists() and not path.is_dir():
        raise XattnError(f"{given}: a file of that name exists; name a new directory")
    if path.exists() and any(path.iterdir()):
        raise XattnError(f"{given}: already exists and is not an empty directory")
    make_parent(path, given)
    remove_leftovers(path)
    tmp = _temporary(path)
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir()
        yield tmp
        for folder, _, files in os.walk(tmp):
            for name in files:
                if not os.path.islink(file := os.path.join(folder, name)):
                    _sync(file)
            _sync(folder, folder=True)
        if path.exists():
            path.rmdir()
        os.replace(tmp, path)
        _sync(path.parent, folder=True)
    except OSError as e:  # named by what the user named, not by the temporary sibling (`/proc/.x.tmp-4711`)
        name = os.fspath(e.filename) if isinstance(e.filename, (str, os.PathLike)) else None
        if not isinstance(name, str) or not name.startswith(str(tmp)):
            raise
        raise type(e)(e.errno, e.strerror, str(given) + name[len(str(tmp)):]) from None
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
