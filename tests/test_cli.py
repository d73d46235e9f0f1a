import json
import math
import os
import select
import signal
import time
import subprocess
import sys
from pathlib import Path

import pytest

from xattn.cli.main import main

QUICK = ["--minutes", "0.25", "data.numbers_size=3000", "model.d_model=64", "model.d_ff=128",
         "train.eval_every=40", "train.eval_bleu_sentences=50", "train.threads=1"]


def _run(*args, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "xattn", *args], input=stdin, capture_output=True, text=True,
                          timeout=300, env=os.environ | {"OMP_NUM_THREADS": "1"})


@pytest.fixture(scope="module")
def quickstart_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("qs") / "model"
    result = _run("quickstart", "--out", str(out), "--examples", "2", *QUICK)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "exact match" in result.stdout and "cross-attention heatmap" in result.stdout
    return out


def test_quickstart_end_to_end(quickstart_dir):
    for name in ("config.yaml", "model.safetensors", "spm.model", "log.jsonl", "attention.png"):
        assert (quickstart_dir / name).is_file(), name
    assert (quickstart_dir / "attention.png").read_bytes()[:4] == b"\x89PNG"


def test_translate_stdin_and_files(quickstart_dir, tmp_path):
    result = _run("translate", str(quickstart_dir), "--beam", "2", stdin="dreiundzwanzig\nsieben\n")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 2 and all(lines)
    src = tmp_path / "in.txt"
    src.write_text("dreiundzwanzig\nsieben\n")
    out = tmp_path / "out.txt"
    assert _run("translate", str(quickstart_dir), "-i", str(src), "-o", str(out), "--beam", "2").returncode == 0
    assert out.read_text().splitlines() == lines
    nbest = _run("translate", str(quickstart_dir), "--n-best", "3", "--beam", "3", stdin="sieben\n").stdout.splitlines()
    assert len(nbest) == 3 and all(line.startswith("0 ||| ") for line in nbest)
    int8 = _run("translate", str(quickstart_dir), "--beam", "2", "--quantize", "int8", stdin="dreiundzwanzig\nsieben\n")
    assert int8.returncode == 0 and len(int8.stdout.splitlines()) == 2


def test_n_best_prints_distinct_texts_and_samples_every_draw():
    """Two hypotheses of a beam can read alike (▁a + b and ▁ab: other tokens, one text); --n-best printed both, where
    the README promises distinct hypotheses and the server gives distinct alternatives. Samples may repeat."""
    from dataclasses import replace

    from xattn.cli.translate import output_lines
    from xattn.translator import Translation

    best, same, other = (Translation(text, score, [], []) for text, score in (("a b", -1.0), ("a b", -1.5), ("c", -2.0)))
    result = replace(best, alternatives=[best, same, other])
    assert output_lines([result], ["x"], 4, False, None) == ["4 ||| a b ||| -1.0000", "4 ||| c ||| -2.0000"]
    assert len(output_lines([result], ["x"], 4, False, None, samples=True)) == 3


def test_translate_sampling_and_prefix(quickstart_dir, tmp_path):
    args = ("translate", str(quickstart_dir), "--sample", "--top-p", "0.9", "--num-samples", "3", "--seed", "7")
    first, again = _run(*args, stdin="dreiundzwanzig\n"), _run(*args, stdin="dreiundzwanzig\n")
    assert first.returncode == 0 and first.stdout == again.stdout and len(first.stdout.splitlines()) == 3
    prefix = tmp_path / "prefix.txt"
    prefix.write_text("twenty\n")
    forced = _run("translate", str(quickstart_dir), "--prefix", str(prefix), stdin="dreiundzwanzig\n")
    assert forced.returncode == 0 and forced.stdout.startswith("twenty")
    wrong = _run("translate", str(quickstart_dir), "--top-k", "5", stdin="sieben\n")
    assert wrong.returncode == 2 and "applies to sampling only; set --sample" in wrong.stderr
    bad = _run("translate", str(quickstart_dir), "--sample", "--temperature", "0", stdin="sieben\n")
    assert bad.returncode == 2 and "temperature" in bad.stderr and "Traceback" not in bad.stderr


def test_constraints_that_leave_no_token_end_the_translation_with_a_note(quickstart_dir):
    for strategy in (["--beam", "1"], ["--beam", "2"], ["--sample", "--seed", "1"]):
        result = _run("translate", str(quickstart_dir), "--no-repeat-ngram", "1", "--min-len", "1000", "--max-len-b",
                      "1100", "--scores", *strategy, stdin="drei\nvier\n")  # min_len above the vocabulary's size
        assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
        scores = [float(line.rsplit(" ||| ", 1)[1]) for line in result.stdout.splitlines()]
        assert len(scores) == 2 and all(math.isfinite(s) for s in scores)
        assert "note: stdin: lines 1, 2: the decoding constraints" in result.stderr


def test_translate_prints_each_line_of_a_pipe_before_the_input_ends(quickstart_dir):
    """A person typing into `xattn translate` (a terminal or a pipe) sees each translation at once."""
    proc = subprocess.Popen([sys.executable, "-m", "xattn", "translate", str(quickstart_dir), "--beam", "1"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=os.environ | {"OMP_NUM_THREADS": "1"})
    try:
        answers = []
        for line in (b"dreiundzwanzig\n", b"sieben\n"):
            proc.stdin.write(line)
            proc.stdin.flush()
            ready, _, _ = select.select([proc.stdout], [], [], 120)  # a bound against hanging, not a timing check
            assert ready, "no translation while the input stays open"
            answers.append(proc.stdout.readline().decode())
        proc.stdin.close()
        assert proc.wait(timeout=120) == 0 and proc.stdout.read() == b""
    finally:
        proc.kill()
    piped = _run("translate", str(quickstart_dir), "--beam", "1", stdin="dreiundzwanzig\nsieben\n")
    assert "".join(answers) == piped.stdout and len(answers) == 2 and all(a.strip() for a in answers)


INTERRUPTED_AT_IMPORT = """
import sys

class Interrupt:  # Ctrl+C as the module `name` starts to import
    def find_spec(self, name, path=None, target=None):
        if name == sys.argv[1]:
            raise KeyboardInterrupt

sys.meta_path.insert(0, Interrupt())
from xattn.cli.main import main
sys.exit(main(["translate", "--help"]))
"""


@pytest.mark.parametrize("module", ["yaml", "numpy"])
def test_ctrl_c_as_the_command_starts_is_one_line(module):
    """The command line's start imports every verb's module (NumPy and YAML with them, over a tenth of a second): a
    Ctrl+C then was a traceback. The console script's own import of xattn.cli.main takes none of them, so only
    Python's own start is left outside main."""
    result = subprocess.run([sys.executable, "-c", INTERRUPTED_AT_IMPORT, module], capture_output=True, text=True,
                            timeout=120)
    assert (result.returncode, result.stderr, result.stdout) == (130, "xattn: interrupted\n", "")
    loaded = subprocess.run([sys.executable, "-c", "import sys, xattn.cli.main; print(*sorted(m for m in "
                             "('numpy', 'yaml', 'torch', 'tqdm') if m in sys.modules))"], capture_output=True,
                            text=True, timeout=120, check=True)
    assert loaded.stdout == "\n"


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_sigterm_or_sighup_leaves_no_half_written_output(numbers_model, tmp_path, signum):
    """What `timeout`, systemd, `docker stop` and a closed terminal send unwinds as Ctrl+C does: the output file's
    temporary is removed (SIGTERM left it behind), and the process then ends by that signal."""
    out = tmp_path / "out.en"
    proc = subprocess.Popen([sys.executable, "-m", "xattn", "translate", str(numbers_model), "-o", str(out)],
                            stdin=subprocess.PIPE, stderr=subprocess.PIPE, env=os.environ | {"OMP_NUM_THREADS": "1"})
    try:
        proc.stdin.write(b"drei hundert\n")
        proc.stdin.flush()
        for _ in range(1200):  # a bound against hanging, not a timing check
            if list(tmp_path.glob(".out.en.tmp-*")):
                break
            time.sleep(0.05)
        assert list(tmp_path.glob(".out.en.tmp-*")), "the output's temporary never appeared"
        proc.send_signal(signum)
        assert proc.wait(timeout=120) == -signum
        assert proc.stderr.read().decode() == f"xattn translate: stopped by {signal.Signals(signum).name}\n"
    finally:
        proc.kill()
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("verb, signum, status", [("quickstart", signal.SIGINT, 130),
                                                   ("train", signal.SIGTERM, -signal.SIGTERM),
                                                   ("train", signal.SIGHUP, -signal.SIGHUP)])
def test_a_signal_stops_training_at_a_checkpoint_and_nothing_runs_after_it(tmp_path, verb, signum, status):
    """Ctrl+C, SIGTERM or SIGHUP (a closed terminal) during training stops it at the next step, checkpointed. The
    quickstart then stops too (it went on to translate with the model cut short, and failed when no evaluation had
    saved one yet), and after a SIGTERM or SIGHUP the process ends by that signal, as every verb does (training
    exited 130, as for Ctrl+C; a SIGHUP stopped it where it was, with no checkpoint)."""
    out = tmp_path / "run"
    first = ["quickstart", "--out", str(out)] if verb == "quickstart" else ["train", "numbers-de-en", "--out", str(out)]
    proc = subprocess.Popen([sys.executable, "-m", "xattn", *first, "data.numbers_size=3000", "model.d_model=64",
                             "model.d_ff=128", "train.threads=1", "train.log_every=1", "train.max_steps=100000"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=os.environ | {"OMP_NUM_THREADS": "1"})
    try:
        for _ in range(2400):  # a bound against hanging, not a timing check
            log = out / "log.jsonl"
            if log.is_file() and '"loss"' in log.read_text():
                break
            time.sleep(0.05)
        proc.send_signal(signum)
        assert proc.wait(timeout=120) == status
        stdout, stderr = proc.stdout.read().decode(), proc.stderr.read().decode()
    finally:
        proc.kill()
    assert "; run the same command again to resume" in stdout + stderr
    assert "error" not in stderr and "held-out" not in stdout, stdout + stderr
    if signum != signal.SIGINT:
        assert stderr.endswith(f"xattn train: stopped by {signal.Signals(signum).name}\n"), stderr
    steps = [json.loads(line)["step"] for line in (out / "log.jsonl").read_text().splitlines() if '"loss"' in line]
    manifest = json.loads((out / "train_state" / "manifest.json").read_text())
    assert manifest["step"] == max(steps), manifest


def test_evaluate_named_split_and_files(quickstart_dir, tmp_path):
    result = _run("evaluate", str(quickstart_dir), "--split", "test", "--beam", "1", "--json")
    assert result.returncode == 0, result.stderr
    scores = json.loads(result.stdout)
    assert set(scores) == {"bleu", "bleu_lc", "chrf"} and "case:lc" in scores["bleu_lc"]["signature"]
    src, ref = tmp_path / "src.txt", tmp_path / "ref.txt"
    src.write_text("sieben\nacht\n")
    ref.write_text("seven\n")
    bad = _run("evaluate", str(quickstart_dir), "--src", str(src), "--ref", str(ref))
    assert bad.returncode == 2 and "line counts differ" in bad.stderr and len(bad.stderr.splitlines()) == 1
    for search in (["--beam", "1"], ["--sample", "--seed", "1"]):  # (a BLEU unchanged by it, exit 0)
        unused = _run("evaluate", str(quickstart_dir), "--src", str(src), "--ref", str(src), "--length-penalty", "3",
                      *search)
        assert unused.returncode == 2 and unused.stderr.startswith("xattn evaluate: error: --length-penalty: with "
                                                                   "greedy search or sampling it changes only")
    assert _run("evaluate", str(quickstart_dir), "--src", str(src), "--ref", str(src), "--length-penalty", "3",
                "--beam", "2").returncode == 0
    for out in ("-", "/dev/stdout"):  # the translations went into the scores' stream (--json's too)
        mixed = _run("evaluate", str(quickstart_dir), "--split", "test", "--json", "-o", out)
        assert (mixed.returncode, mixed.stdout, mixed.stderr) == (2, "", "xattn evaluate: error: --output: the scores "
                                                                 "go to standard output; write the translations to a file\n")


@pytest.mark.parametrize("args, message", [
    (["translate", "/nonexistent/model"], "not a model directory"),
    (["train", "/nonexistent.yaml"], "config file not found"),
    (["train", "numbers-de-en", "train.max_step=3"], "did you mean 'max_steps'"),
    (["train", "numbers-de-en", "model.d_model=100", "model.n_heads=3"], "divisible"),
    (["train", "numbers-de-en", "lr=3"], "expected section.key=value"),
    (["train", "numbers-de-em"], "presets: multi30k-de-en, multi30k-de-en-8heads, multi30k-en-de, multi30k-en-fr, multi30k-fr-en, numbers-de-en"),
])
def test_user_mistakes_are_one_line_and_exit_2(args, message, capsys):
    assert main(args) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_bad_corpus_file_names_file_and_line(tmp_path, capsys):
    (tmp_path / "a.de").write_text("eins\nzwei\n")
    (tmp_path / "a.en").write_text("one\n")
    args = ["train", "numbers-de-en", "data.dataset=null", f"data.train_src={tmp_path}/a.de",
            f"data.train_tgt={tmp_path}/a.en", f"data.valid_src={tmp_path}/a.de", f"data.valid_tgt={tmp_path}/a.de",
            "--out", str(tmp_path / "m")]
    assert main(args) == 2
    assert "line counts differ: " in capsys.readouterr().err
    (tmp_path / "a.en").write_bytes(b"one\n\xff\xfe\n")
    assert main(args) == 2
    assert "a.en: line 2: invalid UTF-8" in capsys.readouterr().err


def test_every_verb_has_help_with_an_example():
    for verb in ("quickstart", "train", "translate", "evaluate"):
        result = _run(verb, "--help")
        assert result.returncode == 0 and "example:" in result.stdout


SMALL = ["data.numbers_size=3000", "model.d_model=32", "model.d_ff=64", "train.eval_every=20",
         "train.eval_bleu_sentences=20", "train.threads=1", "train.max_steps=40", "--examples", "3"]


def slowed(monkeypatch, seconds: float) -> None:
    """Every training step takes `seconds` longer, as on a machine busy with other work."""
    from xattn.training import Trainer

    step = Trainer._train_step

    def slow_step(self, group):
        time.sleep(seconds)
        return step(self, group)
    monkeypatch.setattr(Trainer, "_train_step", slow_step)


def quickstart(out: Path, capsys, *args) -> str:
    assert main(["quickstart", "--out", str(out), *SMALL, *args]) == 0
    return capsys.readouterr().out


def test_the_quickstart_result_does_not_depend_on_the_machine_being_busy(tmp_path, capsys, monkeypatch):
    """A step budget, not the wall clock, decides the model: a slowed run prints the same results."""
    quick = quickstart(tmp_path / "quick", capsys, "--minutes", "30")
    slowed(monkeypatch, 0.3)
    slow = quickstart(tmp_path / "slow", capsys, "--minutes", "30")
    results = lambda text: text[text.index("== held-out"):text.index("== cross-attention")]  # noqa: E731
    assert results(slow) == results(quick) and "exact match" in results(quick)
    assert "cap ended training" not in slow


def test_a_quickstart_cut_by_its_time_cap_says_so_and_how_to_go_on(tmp_path, capsys, monkeypatch):
    slowed(monkeypatch, 0.5)
    out = quickstart(tmp_path / "capped", capsys, "--minutes", "0.05")
    assert "note: the 0.05-minute cap ended training at step" in out and "of 40 (a slow or busy machine)" in out
    assert f"xattn quickstart --out {tmp_path / 'capped'} --minutes 0.1 data.numbers_size=3000" in out
    again = quickstart(tmp_path / "capped", capsys, "--minutes", "0.05")
    assert "already trained to max_minutes" in again and "raise --minutes to go on" in again


def test_sampling_draws_anew_for_each_chunk_of_a_file(numbers_model, tmp_path, capsys, monkeypatch):
    """A file is translated CHUNK_LINES at a time; one generator for the whole run, so a chunk does not repeat
    the draws of the one before (translate and evaluate)."""
    monkeypatch.setattr("xattn.lines.CHUNK_LINES", 2)
    src, ref = tmp_path / "in.de", tmp_path / "ref.en"
    src.write_text("drei hundert\n" * 4)
    ref.write_text("three hundred\n" * 4)
    sample = ["--sample", "--seed", "3", "--temperature", "3"]
    assert main(["translate", str(numbers_model), "-i", str(src), *sample]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 4 and lines[2:] != lines[:2]
    out = tmp_path / "out.en"
    assert main(["evaluate", str(numbers_model), "--src", str(src), "--ref", str(ref), "-o", str(out), *sample]) == 0
    assert out.read_text().splitlines() == lines  # the same run's draws


def test_a_prefix_file_longer_than_the_input_on_stdin_is_named(numbers_model, tmp_path, capsys, monkeypatch):
    import io

    prefix = tmp_path / "p.txt"
    prefix.write_text("a\nb\nc\n")
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b"drei\nvier\n")))
    assert main(["translate", str(numbers_model), "--prefix", str(prefix)]) == 2
    assert capsys.readouterr().err.strip() == f"xattn translate: error: line counts differ: {prefix} has 3 lines, " \
        "the input (stdin) has 2"


def fifo(path, data: bytes):
    """A named pipe at `path` that a thread writes `data` into once it is opened for reading."""
    import threading

    os.mkfifo(path)

    def write():
        with open(path, "wb") as f:
            f.write(data)
    threading.Thread(target=write, daemon=True).start()
    return str(path)


def test_inputs_from_pipes_and_stdin_are_read_once(numbers_model, tmp_path, capsys, monkeypatch):
    """A pipe, a FIFO or stdin cannot be read twice: their lines were counted first and then read again, so
    translate --prefix printed nothing with exit 0 and evaluate scored nothing (or a traceback: stdin cannot be
    counted). Each is read once now, and a mismatch is found as it is read."""
    import io

    src, prefix, ref = b"drei\nvier hundert\n", b"three\nfour\n", b"three\nfour hundred\n"
    for name, data in (("in.de", src), ("p.en", prefix), ("ref.en", ref)):
        (tmp_path / name).write_bytes(data)
    assert main(["translate", str(numbers_model), "-i", str(tmp_path / "in.de"), "--prefix", str(tmp_path / "p.en")]) == 0
    expected = capsys.readouterr().out
    assert len(expected.splitlines()) == 2
    assert main(["translate", str(numbers_model), "-i", fifo(tmp_path / "f1", src), "--prefix",
                 fifo(tmp_path / "f2", prefix)]) == 0
    assert capsys.readouterr().out == expected
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(prefix)))
    assert main(["translate", str(numbers_model), "-i", str(tmp_path / "in.de"), "--prefix", "-"]) == 0
    assert capsys.readouterr().out == expected
    assert main(["evaluate", str(numbers_model), "--src", str(tmp_path / "in.de"), "--ref", str(tmp_path / "ref.en"),
                 "--json"]) == 0
    scores = capsys.readouterr().out
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(src)))
    assert main(["evaluate", str(numbers_model), "--src", "-", "--ref", str(tmp_path / "ref.en"), "--json"]) == 0
    assert capsys.readouterr().out == scores
    assert main(["evaluate", str(numbers_model), "--src", fifo(tmp_path / "f3", src), "--ref",
                 fifo(tmp_path / "f4", ref + b"five\n"), "--json"]) == 2
    assert capsys.readouterr().err.strip().endswith(f"line counts differ: {tmp_path / 'f3'} has 2 lines, "
                                                    f"{tmp_path / 'f4'} has 3")
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(src + b"sieben\n")))
    assert main(["evaluate", str(numbers_model), "--src", "-", "--ref", str(tmp_path / "ref.en")]) == 2
    assert capsys.readouterr().err.strip().endswith(f"line counts differ: stdin has 3 lines, {tmp_path / 'ref.en'} "
                                                    "has 2")  # (it named stdin `-`)
    assert main(["evaluate", str(numbers_model), "--src", "-", "--ref", "-"]) == 2
    assert capsys.readouterr().err.strip().endswith("--src and --ref: both read stdin (-); give one of them as a file")
    assert main(["translate", str(numbers_model), "--prefix", "-"]) == 2
    assert capsys.readouterr().err.strip().endswith("--input/-i and --prefix: both read stdin (-); give one of them "
                                                    "as a file")


def test_an_output_named_as_standard_output_is_written_to_it(numbers_model, tmp_path, capsys):
    """-o /dev/stdout writes to the standard output (as -o - does), never replaces the file it may lead to."""
    src = tmp_path / "in.de"
    src.write_text("drei\nvier\n")
    assert main(["translate", str(numbers_model), "-i", str(src)]) == 0
    plain = capsys.readouterr().out
    for name in ("/dev/stdout", "/proc/self/fd/1"):
        assert main(["translate", str(numbers_model), "-i", str(src), "-o", name]) == 0
        assert capsys.readouterr().out == plain


def test_evaluate_split_train_scores_the_pairs_the_model_trained_on(numbers_model, tmp_path, capsys):
    """A numbers model of data.numbers_size=300 trained on 300 pairs: --split train scored the task's default 20,000,
    of which it had seen a few hundred; with data.train_subset it saw a draw of them, which evaluate cannot name."""
    import shutil

    out = tmp_path / "train.en"
    assert main(["evaluate", str(numbers_model), "--split", "train", "--beam", "1", "-o", str(out)]) == 0
    assert len(out.read_text().splitlines()) == 300
    subset = tmp_path / "subset"
    shutil.copytree(numbers_model, subset)
    config = (subset / "config.yaml").read_text()
    assert "  train_subset: null\n" in config
    (subset / "config.yaml").write_text(config.replace("  train_subset: null\n", "  train_subset: 100\n"))
    capsys.readouterr()
    assert main(["evaluate", str(subset), "--split", "train", "--beam", "1"]) == 2
    assert "--split train: the model trained on 100 pairs drawn from it" in capsys.readouterr().err


def test_help_does_not_load_torch():
    """`xattn --help` took 2.6 s, 1.7 of them importing torch for two verbs' lists of choices (heads importance
    methods, finetune strategies); every verb's help is built without it now."""
    probe = ("import sys; from xattn.cli.main import build_parser; build_parser(); "
             "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "False", out.stdout + out.stderr


def test_a_stop_signal_raised_where_python_drops_it_still_stops_the_command(monkeypatch, capsys):
    """SIGTERM while a finalizer ran (a helper's probe: during an export, `Exception ignored in: Group.__del__ ...
    Terminated: 15`): Python dropped the Terminated, the export went on and exited 0."""
    import xattn.cli.aer as verb
    from xattn.cli import main as cli

    class Finalized:
        def __del__(self):
            cli._terminate(signal.SIGTERM, None)

    def run(args):
        Finalized()  # collected at once: its exception is printed as ignored, and the run goes on
        return 0
    raised = []
    monkeypatch.setattr(verb, "run", run)
    monkeypatch.setattr(signal, "raise_signal", raised.append)  # (not this test's process)
    cli.main(["aer", "--gold", "gold.talp", "--hyp", "hyp.align"])
    assert raised == [signal.SIGTERM] and "xattn aer: stopped by SIGTERM" in capsys.readouterr().err


def test_a_full_disk_while_copying_names_the_file_written_not_the_one_read(monkeypatch, capsys):
    """shutil.copyfile's OSError names its source first: prune and import said `MODEL/spm.model: No space left on
    device` of the input model (a helper's probe)."""
    import errno

    import xattn.cli.aer as verb
    from xattn.cli.main import main as run_main

    def run(args):
        raise OSError(errno.ENOSPC, "No space left on device", "model/spm.model", None, "out/spm.model")
    monkeypatch.setattr(verb, "run", run)
    assert run_main(["aer", "--gold", "gold.talp", "--hyp", "hyp.align"]) == 2
    assert capsys.readouterr().err == "xattn aer: error: out/spm.model: No space left on device\n"
