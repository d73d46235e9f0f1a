"""xattn.io: JSON that is JSON (no NaN or Infinity); atomic writes and what a killed writer leaves."""
import json
import math
import os
import re
from pathlib import Path

import pytest

from xattn.errors import XattnError
from xattn.io import atomic_dir, atomic_write_text, json_text


def test_json_text_writes_non_finite_numbers_as_null_and_parses_strictly():
    value = {"coverage": [0.5, math.nan], "over": math.inf, "nested": [{"low": -math.inf}], "pair": (1.0, 2)}
    text = json_text(value)
    strict = json.loads(text, parse_constant=lambda name: (_ for _ in ()).throw(ValueError(name)))
    assert strict == {"coverage": [0.5, None], "over": None, "nested": [{"low": None}], "pair": [1.0, 2]}
    assert "NaN" not in text and "Infinity" not in text


# ------------------------------------------------------------------ what a killed writer leaves behind

def dead_pid() -> int:
    import subprocess
    import sys

    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()  # reaped: no process has this id now
    return child.pid


def test_a_dead_writers_directory_is_removed_with_a_message_and_a_live_ones_kept(tmp_path, capsys):
    from xattn.io import atomic_dir

    dead, live = dead_pid(), os.getppid()
    stale = tmp_path / f".out.tmp-{dead}"
    (stale / "sub").mkdir(parents=True)
    (stale / "sub" / "model.safetensors").write_bytes(b"half")
    busy = tmp_path / f".out.tmp-{live}"
    busy.mkdir()
    other = tmp_path / f".other.tmp-{dead}"  # another target's: left for its own next write
    other.mkdir()
    with atomic_dir(tmp_path / "out") as tmp:
        (tmp / "config.yaml").write_text("x\n")
    err = capsys.readouterr().err
    assert not stale.exists() and busy.is_dir() and other.is_dir()
    assert err == f"xattn: removed {stale}, left half-written by process {dead}, which is gone\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([busy.name, other.name, "out"])
    assert (tmp_path / "out" / "config.yaml").read_text() == "x\n"


def test_a_dead_writers_temporary_file_is_removed_when_the_file_is_written_again(tmp_path, capsys):
    from xattn.io import atomic_write_text, is_temporary

    dead = dead_pid()
    stale = tmp_path / f".out.txt.tmp-{dead}.k2j4h1.tmp"
    stale.write_text("half")
    kept = tmp_path / f".out.txt.tmp-{os.getpid()}.zz.tmp"  # this process is alive
    kept.write_text("mine")
    atomic_write_text(tmp_path / "out.txt", "whole\n")
    assert not stale.exists() and kept.exists()
    assert is_temporary(stale) and not is_temporary(kept)  # a leftover of a writer gone, not of a live one
    assert f"removed {stale}, left half-written by process {dead}" in capsys.readouterr().err
    assert (tmp_path / "out.txt").read_text() == "whole\n"


@pytest.mark.parametrize("where", ["in mkstemp, after it made the file", "as mkstemp returns", "in the write"])
def test_a_signal_at_any_moment_of_a_file_write_leaves_no_temporary(tmp_path, monkeypatch, where):
    """Ctrl+C or SIGTERM (an exception raised wherever the main thread is) while the temporary is being made: a
    SIGTERM that came between mkstemp's making the file and the write's cleanup left it behind (found by the CLI's
    SIGTERM test). Another live writer's temporary of the same file is left alone."""
    import tempfile

    import xattn.io as io

    other = tmp_path / f".out.txt.tmp-{os.getppid()}.zz.tmp"  # a live process's: another writer's
    other.write_text("theirs")
    (tmp_path / "out.txt").write_text("old\n")
    made, close = tempfile.mkstemp, os.close

    def signal_in_mkstemp(**kwargs):
        fd, name = made(**kwargs)
        os.close(fd)
        raise KeyboardInterrupt

    def signal_on_close(fd):
        close(fd)
        raise KeyboardInterrupt

    def signal_in_write(tmp):
        tmp.write_text("half")
        raise KeyboardInterrupt
    write = lambda tmp: tmp.write_text("new\n")  # noqa: E731
    if where == "in mkstemp, after it made the file":
        monkeypatch.setattr(io.tempfile, "mkstemp", signal_in_mkstemp)
    elif where == "as mkstemp returns":
        monkeypatch.setattr(io.os, "close", signal_on_close)
    else:
        write = signal_in_write
    with pytest.raises(KeyboardInterrupt):
        io.atomic_write(tmp_path / "out.txt", write)
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.iterdir()) == [other.name, "out.txt"]
    assert (tmp_path / "out.txt").read_text() == "old\n" and other.read_text() == "theirs"


def test_a_failed_directory_write_leaves_nothing(tmp_path):
    import pytest

    from xattn.io import atomic_dir

    with pytest.raises(RuntimeError):
        with atomic_dir(tmp_path / "out") as tmp:
            (tmp / "half").write_text("x")
            raise RuntimeError("killed")
    assert list(tmp_path.iterdir()) == []


def test_prune_removes_a_dead_prunes_leftover(numbers_model, tmp_path, capsys):
    from xattn.cli.main import main

    dead = dead_pid()
    stale = tmp_path / f".pruned.tmp-{dead}"
    stale.mkdir()
    (stale / "spm.model").write_bytes(b"partial")
    (tmp_path / "mask.yaml").write_text("cross: [[1, 0]]\n")
    code = main(["prune", str(numbers_model), "--heads", str(tmp_path / "mask.yaml"), "--out", str(tmp_path / "pruned")])
    err = capsys.readouterr().err
    assert code == 0 and not stale.exists() and (tmp_path / "pruned" / "config.yaml").is_file()
    assert f"xattn: removed {stale}, left half-written by process {dead}, which is gone" in err.splitlines()


def test_json_files_refuse_a_key_given_twice_and_non_json_numbers(tmp_path):
    import pytest

    from xattn.errors import XattnError
    from xattn.io import read_json

    cases = {'{"a": 1,\n "a": 2}': "'a' is given twice", '{"a": NaN}': "NaN is not a JSON number",
             '{"a": -Infinity}': "-Infinity is not a JSON number", '{"a": 1,\n}': "line 2: invalid JSON"}
    for text, message in cases.items():
        (tmp_path / "v.json").write_text(text)
        with pytest.raises(XattnError, match=message) as e:
            read_json(tmp_path / "v.json")
        assert str(e.value).startswith(str(tmp_path / "v.json")) and "\n" not in str(e.value)
    (tmp_path / "v.json").write_text('{"a": [1, {"b": null}]}')
    assert read_json(tmp_path / "v.json") == {"a": [1, {"b": None}]}


def test_a_link_stays_a_link_and_what_is_not_a_file_is_written_into(tmp_path):
    import threading

    import pytest

    from xattn.errors import XattnError
    from xattn.io import atomic_write_text

    (tmp_path / "real.txt").write_text("old")
    (tmp_path / "link.txt").symlink_to("real.txt")
    atomic_write_text(tmp_path / "link.txt", "new")
    assert (tmp_path / "link.txt").is_symlink() and (tmp_path / "real.txt").read_text() == "new"
    (tmp_path / "dangling.txt").symlink_to("made.txt")
    atomic_write_text(tmp_path / "dangling.txt", "made")
    assert (tmp_path / "dangling.txt").is_symlink() and (tmp_path / "made.txt").read_text() == "made"
    fifo, got = tmp_path / "pipe", []
    os.mkfifo(fifo)
    reader = threading.Thread(target=lambda: got.append(fifo.read_text()))
    reader.start()
    atomic_write_text(fifo, "through the pipe\n")
    reader.join(timeout=10)
    assert got == ["through the pipe\n"] and fifo.is_fifo()
    if os.path.exists("/dev/full"):
        with pytest.raises(XattnError, match=r"^/dev/full: cannot write \(No space left on device\)$"):
            atomic_write_text("/dev/full", "x")
        assert Path("/dev/full").is_char_device()
    (tmp_path / "file").write_text("")
    with pytest.raises(XattnError, match=rf"^{tmp_path}/file/x.txt: {tmp_path}/file is not a directory$"):
        atomic_write_text(tmp_path / "file" / "x.txt", "x")
    (tmp_path / "to-nowhere").symlink_to(tmp_path / "file" / "x.txt")
    with pytest.raises(XattnError, match=rf"^{tmp_path}/to-nowhere: {tmp_path}/file is not a directory$"):  # the name
        atomic_write_text(tmp_path / "to-nowhere", "x")


def test_a_directory_written_through_a_link_keeps_the_link_and_the_current_one_is_refused(tmp_path, monkeypatch):
    import pytest

    from xattn.errors import XattnError
    from xattn.io import atomic_dir

    (tmp_path / "empty").mkdir()
    (tmp_path / "link").symlink_to("empty")
    with atomic_dir(tmp_path / "link") as tmp:
        (tmp / "a.txt").write_text("a")
    assert (tmp_path / "link").is_symlink() and (tmp_path / "empty" / "a.txt").read_text() == "a"
    (tmp_path / "here").mkdir()
    monkeypatch.chdir(tmp_path / "here")
    with pytest.raises(XattnError, match=r"^\.: the current directory, which cannot be replaced"):
        with atomic_dir(Path(".")):
            raise AssertionError("refused before any work")


def test_yaml_merge_keys_are_read_and_a_key_given_twice_is_still_refused(tmp_path):
    import pytest

    from xattn.errors import XattnError
    from xattn.yamlfile import read_yaml

    path = tmp_path / "c.yaml"
    path.write_text("base: &b {tsv: x.tsv, upsample: 2}\ncorpora:\n  - {<<: *b, upsample: 3}\n  - <<: *b\n")
    assert read_yaml(path)["corpora"] == [{"tsv": "x.tsv", "upsample": 3}, {"tsv": "x.tsv", "upsample": 2}]
    path.write_text("corpora:\n  - {tsv: a, tsv: b}\n")
    with pytest.raises(XattnError, match="'tsv' is given twice"):
        read_yaml(path)


def test_an_output_inside_a_file_names_that_file(tmp_path):
    """-o notes.txt/out.txt said `notes.txt/out.txt: cannot write (File exists)`; it names the file in the way."""
    (tmp_path / "notes.txt").write_text("kept\n")
    for out in (tmp_path / "notes.txt" / "out.txt", tmp_path / "notes.txt" / "deeper" / "out.txt"):
        with pytest.raises(XattnError, match=rf"^{re.escape(str(out))}: {re.escape(str(tmp_path / 'notes.txt'))} "
                                             "is not a directory$"):
            atomic_write_text(out, "x")
    with pytest.raises(XattnError, match="notes.txt is not a directory"):
        with atomic_dir(tmp_path / "notes.txt" / "model"):
            pass
    assert (tmp_path / "notes.txt").read_text() == "kept\n"


def test_a_write_reaches_the_disk_before_its_rename_and_the_rename_before_it_returns(tmp_path, monkeypatch):
    """Atomic by rename holds against a killed process; against a power loss the new bytes must be on the disk
    before the rename, and the rename itself (the folder's entry) before the write is reported done: fsync, file then
    folder, for a file and for a directory written as a whole."""
    import xattn.io as io

    synced, fsync = [], os.fsync

    def noted(fd):
        path = Path(os.readlink(f"/proc/self/fd/{fd}"))
        synced.append((path.name if path != tmp_path else ".", (tmp_path / "out.txt").exists()))
        fsync(fd)
    monkeypatch.setattr(io.os, "fsync", noted)
    io.atomic_write_text(tmp_path / "out.txt", "new\n")
    assert len(synced) == 2 and synced[0][0].startswith(".out.txt.tmp-") and not synced[0][1]  # the bytes, then
    assert synced[1] == (".", True)                                                            # the rename
    synced.clear()
    with io.atomic_dir(tmp_path / "model") as folder:
        (folder / "sub").mkdir()
        (folder / "a.txt").write_text("a")
        (folder / "sub" / "b.txt").write_text("b")
    names = [name for name, _ in synced]
    assert {"a.txt", "b.txt", "sub"} <= set(names) and names[-1] == "."
    assert names.index("b.txt") < names.index("sub") and names.index("a.txt") < names.index(".")


def test_a_file_written_again_keeps_its_permissions(tmp_path):
    """The rename gave the new file the default's permissions: a private file became readable by all, a read-only
    one writable (a link's target keeps its own, a new file gets 0666 less the umask)."""
    import stat

    from xattn.io import atomic_write_text

    mode = lambda p: stat.S_IMODE(os.stat(p).st_mode)  # noqa: E731
    private, frozen, fresh = tmp_path / "private.txt", tmp_path / "frozen.txt", tmp_path / "fresh.txt"
    for path, bits in ((private, 0o600), (frozen, 0o444)):
        path.write_text("old")
        path.chmod(bits)
        atomic_write_text(path, "new")
        assert path.read_text() == "new" and mode(path) == bits
    (tmp_path / "link.txt").symlink_to("private.txt")
    atomic_write_text(tmp_path / "link.txt", "newer")
    assert private.read_text() == "newer" and mode(private) == 0o600
    umask = os.umask(0o027)
    try:
        atomic_write_text(fresh, "x")
    finally:
        os.umask(umask)
    assert mode(fresh) == 0o640
