"""Training reads prepared corpora (xattn/data/store.py): the one data.prepared names, checked against the
config, or the one found in (or added to) the cache; resumed bit for bit; a kill during prepare leaves nothing
that training accepts."""
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from tests.conftest import NUMBERS_TINY
from xattn.config import load_config
from xattn.presets import resolve_config
from xattn.data.prepare import prepare
from xattn.data.prepared import MappedCorpus
from xattn.data.store import cache_root, training_corpus
from xattn.errors import XattnError
from xattn.training import train


def config(*extra):
    return load_config(resolve_config("numbers-de-en"), NUMBERS_TINY + list(extra))


def last_weights(model_dir):
    """The weights of the run's last checkpoint (model.safetensors is the best one's)."""
    from safetensors.torch import load_file

    from xattn.train_state import TrainStateDir

    state = TrainStateDir(model_dir / "train_state")
    return state.read().step, load_file(state.dir / state.manifest.weights)


def cached() -> set[str]:
    return {p.name for p in cache_root().iterdir()} if cache_root().is_dir() else set()


def test_training_from_a_named_prepared_directory_resumes_bit_for_bit(tmp_path):
    prepare(config().data, tmp_path / "prepared", workers=1)
    before = cached()
    named = [f"data.prepared={tmp_path / 'prepared'}", "train.log_every=1"]
    train(config("train.max_steps=6", *named), tmp_path / "whole", quiet=True)
    train(config("train.max_steps=2", *named), tmp_path / "cut", quiet=True)
    train(config("train.max_steps=6", *named), tmp_path / "cut", quiet=True)
    (step, whole), (again, cut) = last_weights(tmp_path / "whole"), last_weights(tmp_path / "cut")
    assert step == again == 6 and whole.keys() == cut.keys() and all(torch.equal(whole[k], cut[k]) for k in whole)
    assert cached() == before  # nothing went to the cache
    assert (tmp_path / "whole" / "spm.model").read_bytes() == (tmp_path / "prepared" / "spm.model").read_bytes()


def test_the_cache_is_found_by_inputs_and_settings(tmp_path, capsys):
    (tmp_path / "a.de").write_text("".join(f"eins zwei {i}\n" for i in range(60)))
    (tmp_path / "a.en").write_text("".join(f"one two {i}\n" for i in range(60)))
    files = ["data.dataset=null", f"data.train_src={tmp_path}/a.de", f"data.train_tgt={tmp_path}/a.en",
             "data.vocab_size=30"]
    first = training_corpus(config(*files).data)
    assert first.folder.parent == cache_root() and first.folder.name.startswith("a.de-")
    made = (first.folder / "manifest.json").stat().st_mtime_ns
    again = training_corpus(config(*files).data)
    assert again.folder == first.folder and (again.folder / "manifest.json").stat().st_mtime_ns == made
    assert training_corpus(config(*files, "data.max_len=50").data).folder != first.folder
    (tmp_path / "a.en").write_text("".join(f"one two {i}\n" for i in range(59)) + "one two three\n")
    changed = training_corpus(config(*files).data)
    assert changed.folder != first.folder and changed.manifest["inputs"] != first.manifest["inputs"]
    (changed.folder / "tgt.blocks").write_bytes(b"")  # a damaged cached corpus is prepared again
    assert len(training_corpus(config(*files).data)) == 60 and "preparing it again" in capsys.readouterr().err


def test_a_named_directory_must_match_the_files_by_content(tmp_path):
    (tmp_path / "a.de").write_text("".join(f"eins zwei {i}\n" for i in range(60)))
    (tmp_path / "a.en").write_text("".join(f"one two {i}\n" for i in range(60)))
    files = ["data.dataset=null", f"data.train_src={tmp_path}/a.de", f"data.train_tgt={tmp_path}/a.en",
             "data.vocab_size=30", f"data.prepared={tmp_path}/p"]
    prepare(config(*files).data, tmp_path / "p", workers=1)
    os.utime(tmp_path / "a.de", ns=(1, 1))  # touched (or copied): the same text still matches
    assert len(training_corpus(config(*files).data)) == 60
    (tmp_path / "a.de").write_text("".join(f"eins zwei {i}\n" for i in range(59)) + "drei\n")
    with pytest.raises(XattnError, match=r"^data.train_src: .*a.de is not the file .* \(its text differs\)"):
        training_corpus(config(*files).data)
    with pytest.raises(XattnError, match=r"^data.vocab_size: data.prepared=.* was prepared with 30, this run has 40"):
        training_corpus(config(*files, "data.vocab_size=40").data)


def test_a_kill_during_prepare_leaves_nothing_training_accepts(tmp_path):
    src, tgt = tmp_path / "big.de", tmp_path / "big.en"
    src.write_text("".join(f"eins zwei drei {i} vier {i * 7}\n" for i in range(40_000)))
    tgt.write_text("".join(f"one two three {i} four {i * 7}\n" for i in range(40_000)))
    out = tmp_path / "prepared"
    args = [sys.executable, "-m", "xattn", "prepare", "numbers-de-en", "data.dataset=null", f"data.train_src={src}",
            f"data.train_tgt={tgt}", "data.vocab_size=200", "--out", str(out), "--workers", "1"]
    env = os.environ | {"OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(args, env=env, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while not any(f.name.endswith(".bin") for d in tmp_path.glob(".prepared.tmp-*") for f in d.iterdir()):
        assert proc.poll() is None and time.time() < deadline, "prepare ended before it was killed"
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not out.exists() and list(tmp_path.glob(".prepared.tmp-*"))  # killed mid-way: only the temporary
    with pytest.raises(XattnError, match="not a prepared corpus"):
        MappedCorpus.open(out)
    result = subprocess.run(args, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "left half-written by process" in result.stderr and not list(tmp_path.glob(".prepared.tmp-*"))
    assert len(MappedCorpus.open(out)) == 40_000


def _prepare_while_workers_encode(tmp_path):
    """`xattn prepare --workers 2` of 60,000 pairs, in a process group of its own (as a terminal's command), once its
    workers have started to write the encoded chunks."""
    src, tgt = tmp_path / "big.de", tmp_path / "big.en"
    src.write_text("".join(f"eins zwei drei {i} vier {i * 7}\n" for i in range(60_000)))
    tgt.write_text("".join(f"one two three {i} four {i * 7}\n" for i in range(60_000)))
    args = [sys.executable, "-m", "xattn", "prepare", "numbers-de-en", "data.dataset=null", f"data.train_src={src}",
            f"data.train_tgt={tgt}", "data.vocab_size=200", "--out", str(tmp_path / "prepared"), "--workers", "2"]
    proc = subprocess.Popen(args, env=os.environ | {"OMP_NUM_THREADS": "1"}, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    deadline = time.monotonic() + 120  # a bound against hanging, not a timing check
    while not any(f.name.endswith(".bin") for d in tmp_path.glob(".prepared.tmp-*") for f in d.iterdir()):
        assert proc.poll() is None and time.monotonic() < deadline, "prepare ended before it was stopped"
        time.sleep(0.05)
    return proc


@pytest.mark.parametrize("stop, code", [(signal.SIGINT, 130), (signal.SIGTERM, -signal.SIGTERM)])
def test_ctrl_c_or_a_kill_of_the_group_while_workers_encode_ends_prepare_at_once_in_one_line(tmp_path, stop, code):
    """A terminal's Ctrl+C (or a kill of the process group) reaches the encoding workers too: multiprocessing.Pool's
    died of it holding its queue's lock, and prepare then hung for good (a helper's probe: still there after 12
    minutes), after 8 to 22 lines of the workers' tracebacks."""
    proc = _prepare_while_workers_encode(tmp_path)
    os.killpg(proc.pid, stop)
    try:
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == code and len(err.strip().splitlines()) <= 1 and "Traceback" not in err, err
    assert not (tmp_path / "prepared").exists()


def test_a_kill_9_of_prepare_alone_ends_its_encoding_workers(tmp_path):
    """SIGKILL (the system's OOM killer, say) of prepare alone, its workers left running: they stayed blocked for good
    on queues whose other ends they hold themselves (a helper's probe). Each now ends with the process that started
    it, without a traceback."""
    proc = _prepare_while_workers_encode(tmp_path)  # (bounds below: against hanging, not timing checks)
    proc.kill()
    try:
        _, err = proc.communicate(timeout=60)  # the end of its stderr: every process holding it has ended
        deadline = time.monotonic() + 60
        while _group_alive(proc.pid):
            assert time.monotonic() < deadline, "a process of prepare's group is still running"
            time.sleep(0.05)
    finally:
        if _group_alive(proc.pid):
            os.killpg(proc.pid, signal.SIGKILL)
    # Python's resource tracker may warn of the semaphores it cleans up; a worker still being started (spawned, its
    # start not yet read from prepare) fails in Python's own start-up, before any code of xattn runs
    assert all("pickle.load(from_parent)" in block and "EOFError: Ran out of input" in block
               for block in err.split("Traceback (most recent call last):")[1:]), err


def _group_alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    return True


def _a_megabyte(i: int) -> bytes:
    return bytes(1 << 20)


def _die(i: int) -> None:
    os.kill(os.getpid(), signal.SIGKILL)  # as the system kills a process for memory


def test_an_encoding_worker_that_dies_is_one_error_and_no_hang():
    """The others, blocked writing their results, kept the pool's shutdown waiting for good (a review's probe,
    before the pool's workers were killed on every way out)."""
    from xattn.data.prepare import worker_processes

    with pytest.raises(XattnError, match=r"^a worker process of this one ended abruptly \(killed, perhaps for "):
        with worker_processes(2) as pool:
            results = [pool.submit(_a_megabyte, i) for i in range(6)]
            pool.submit(_die, 0).result(timeout=120)  # (a bound against hanging)
            for result in results:
                result.result(timeout=120)


def test_a_ctrl_c_while_the_pool_starts_its_manager_thread_is_not_a_traceback(monkeypatch):
    """Ctrl+C inside the first submit(), as it started the pool's manager thread, made the pool's shutdown raise
    `RuntimeError: cannot join thread before it is started` over the KeyboardInterrupt (seen once in the test
    above): prepare then printed two tracebacks and exited 1."""
    from concurrent.futures import process

    from xattn.data.prepare import worker_processes

    def interrupted(self):
        raise KeyboardInterrupt
    monkeypatch.setattr(process._ExecutorManagerThread, "start", interrupted)
    with pytest.raises(KeyboardInterrupt):
        with worker_processes(2) as pool:
            pool.submit(print, "never")
