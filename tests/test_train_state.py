"""train_state/: a checkpoint becomes visible whole or not at all; a resume continues the same run exactly."""
import json

import pytest

import xattn.train_state as train_state
from tests.test_training import _cfg, _losses
from xattn.errors import XattnError
from xattn.tokenizer import train_sentencepiece
from xattn.train_state import TrainStateDir, differences
from xattn.training import train


class Killed(BaseException):
    """Stands for the process dying: nothing after the raise runs, nothing catches it."""


def die_at_manifest(monkeypatch, nth: int) -> None:
    """Make the nth manifest write die after the checkpoint's other files are written."""
    real, calls = train_state.atomic_write_text, []

    def write(path, text):
        calls.append(path)
        if len(calls) == nth:
            raise Killed
        real(path, text)
    monkeypatch.setattr(train_state, "atomic_write_text", write)


def steps_logged(out) -> list[int]:
    return [json.loads(line)["step"] for line in (out / "log.jsonl").read_text().splitlines()
            if "loss" in json.loads(line)]


def test_a_run_killed_before_the_manifest_resumes_exactly(tmp_path, monkeypatch, capsys):
    full, killed = tmp_path / "full", tmp_path / "killed"
    train(_cfg("train.max_steps=8"), full, quiet=True)
    die_at_manifest(monkeypatch, nth=3)  # step 0, step 3, then the checkpoint of step 6 dies
    with pytest.raises(Killed):
        train(_cfg("train.max_steps=8"), killed, quiet=True)
    monkeypatch.undo()
    assert TrainStateDir(killed / "train_state").read().step == 3
    assert len(list((killed / "train_state").iterdir())) == 5  # manifest, 2 files of step 3, 2 orphans of step 6
    assert steps_logged(killed) == list(range(1, 7))
    train(_cfg("train.max_steps=8"), killed)
    assert "removed 2 half-written file(s)" in capsys.readouterr().out
    assert steps_logged(killed) == list(range(1, 9))  # steps 4-6 were cut from the log and logged once again
    assert _losses(killed) == _losses(full)  # exactly, not approximately
    manifest = TrainStateDir(killed / "train_state").read()
    assert sorted(p.name for p in (killed / "train_state").iterdir()) == sorted(["manifest.json", *manifest.files])


def test_a_run_killed_in_its_first_checkpoint_starts_over(tmp_path, monkeypatch, capsys):
    die_at_manifest(monkeypatch, nth=1)
    with pytest.raises(Killed):
        train(_cfg("train.max_steps=4"), tmp_path, quiet=True)
    monkeypatch.undo()
    assert TrainStateDir(tmp_path / "train_state").read() is None
    assert train(_cfg("train.max_steps=4"), tmp_path).step == 4
    assert "half-written" in capsys.readouterr().out


def test_a_damaged_checkpoint_is_refused_not_skipped(tmp_path):
    train(_cfg("train.max_steps=3"), tmp_path, quiet=True)
    state = TrainStateDir(tmp_path / "train_state")
    weights = tmp_path / "train_state" / state.read().weights
    weights.write_bytes(weights.read_bytes()[:-1] + b"\0")
    with pytest.raises(XattnError, match=f"{weights.name}: does not match its checksum"):
        TrainStateDir(tmp_path / "train_state").read()
    weights.unlink()
    with pytest.raises(XattnError, match=f"{weights.name}: is missing"):
        train(_cfg("train.max_steps=4"), tmp_path, quiet=True)


def test_a_train_state_of_an_older_xattn_is_refused(tmp_path):
    (tmp_path / "state.pt").write_bytes(b"old")
    with pytest.raises(XattnError, match="older xattn"):
        TrainStateDir(tmp_path).read()


@pytest.mark.parametrize("change, message", [
    (lambda d: (d / "a.en").write_text("one\ntwo\nthree!\nfour\n"),
     "data.corpus_sha256: .*; that is, the text of the training or validation files, or the tokenizers made from it"),
    (lambda d: train_sentencepiece(["fünf sechs", "five six"] * 20, d / "m" / "spm.model", 20), "tokenizers.spm.model"),
])
def test_a_resume_refuses_other_text_or_tokenizer_and_writes_nothing(tmp_path, change, message):
    (tmp_path / "a.de").write_text("eins\nzwei\ndrei\nvier\n")
    (tmp_path / "a.en").write_text("one\ntwo\nthree\nfour\n")
    files = [f"data.{k}={tmp_path}/a.{lang}" for k, lang in (("train_src", "de"), ("train_tgt", "en"),
                                                           ("valid_src", "de"), ("valid_tgt", "en"))]
    cfg = _cfg("data.dataset=null", "data.vocab_size=20", *files, "train.max_steps=2")
    train(cfg, tmp_path / "m", quiet=True)
    change(tmp_path)
    before = {p: p.read_bytes() for p in (tmp_path / "m").rglob("*") if p.is_file()}
    with pytest.raises(XattnError, match=message):
        train(cfg, tmp_path / "m", quiet=True)
    assert {p: p.read_bytes() for p in (tmp_path / "m").rglob("*") if p.is_file()} == before


def test_differences_name_each_changed_key_in_order():
    saved = {"tokenizers": {"spm.model": "aa"}, "model": {"d_ff": 32, "n_heads": 2}}
    now = {"tokenizers": {"spm.model": "bb"}, "model": {"d_ff": 64, "n_heads": 2}}
    assert differences(saved, now) == ["tokenizers.spm.model: 'aa' -> 'bb'", "model.d_ff: 32 -> 64"]
    assert differences(saved, saved) == []


def test_a_full_disk_while_a_checkpoint_state_is_written_is_one_line_naming_it(tmp_path, monkeypatch):
    """torch.save makes a failed write a RuntimeError ("unexpected pos 85888 vs 85776"): a full disk during a
    checkpoint was a traceback (a helper's probe, on a small tmpfs); the previous checkpoint stayed, as it does."""
    import errno
    import io

    import torch

    from xattn.io import atomic_write

    class Full(io.FileIO):
        def write(self, data):
            raise OSError(errno.ENOSPC, "No space left on device")

    class Noted(train_state._Noted, Full):  # (the disk fills beneath the file that notes the error)
        pass
    monkeypatch.setattr(train_state, "_Noted", Noted)
    with pytest.raises(XattnError, match=r"state-000012.pt: cannot write \(No space left on device\)$"):
        atomic_write(tmp_path / "state-000012.pt", lambda tmp: train_state.save_torch({"a": torch.zeros(9)}, tmp))
    assert list(tmp_path.iterdir()) == []


def test_a_checkpoint_state_is_written_whole_however_short_each_write(tmp_path, monkeypatch):
    """torch's writer ignores the count a write returns: a short write (Linux cuts one of over 2 GiB) dropped the
    rest of its bytes, and the checkpoint could not be loaded (a review's probe)."""
    import io

    import torch

    class Short(io.FileIO):
        def write(self, data):
            return super().write(memoryview(data).cast("B")[:7])

    class Noted(train_state._Noted, Short):
        pass
    monkeypatch.setattr(train_state, "_Noted", Noted)
    train_state.save_torch({"a": torch.arange(1000)}, tmp_path / "state.pt")
    assert torch.equal(torch.load(tmp_path / "state.pt")["a"], torch.arange(1000))


def test_a_run_directory_on_a_filesystem_without_locks_is_trained_into_all_the_same(tmp_path, monkeypatch):
    """Only a lock held elsewhere refuses: ENOLCK (NFS without its lock daemon, say) said "another training (process
    ?) is writing there" (a review)."""
    import errno

    def no_locks(*args):
        raise OSError(errno.ENOLCK, "No locks available")
    monkeypatch.setattr(train_state.fcntl, "flock", no_locks)
    train_state.lock_run_dir(tmp_path / "run", make=True)
    assert str((tmp_path / "run").resolve()) not in train_state._HELD


def test_the_subset_seed_is_part_of_a_runs_identity_unless_at_its_default():
    """With the whole corpus the seed still draws SentencePiece's sample of a corpus over data.spm_sample pairs: a
    resume with another seed passed the early check, prepared a new corpus, then was refused naming the corpus."""
    from xattn.config import load_config
    from xattn.train_state import data_identity
    assert "subset_seed" not in data_identity(load_config(None, ["data.dataset=numbers"]).data)
    assert data_identity(load_config(None, ["data.dataset=numbers", "data.subset_seed=2"]).data)["subset_seed"] == 2
