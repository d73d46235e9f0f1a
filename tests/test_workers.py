"""Workers (xattn/workers.py, Translator.workers, --workers): a call's sentences decoded in parts on threads at once
give what one part gives, in input order, with PyTorch's thread count restored, errors and all."""
import threading
import time

import pytest
import torch

import xattn
from tests.conftest import tiny_model_dir
from xattn.batching import shares
from xattn.cli.main import main
from xattn.errors import ParameterError
from xattn.translator import Translator
from xattn.workers import run_parts

TEXTS = [" ".join(f"word{(i * 5 + j) % 23}" for j in range(1 + i % 7)) for i in range(40)] + [""]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("workers") / "model"
    tiny_model_dir(path, n_encoder_layers=2, n_decoder_layers=2)
    return path


def counts() -> tuple[int, int]:
    """PyTorch's thread count in this thread and in a thread started now: a worker's setting must not stay behind
    in either (with OpenMP, a thread that has asked for its count keeps its own; new threads take the last set)."""
    seen = []
    thread = threading.Thread(target=lambda: seen.append(torch.get_num_threads()))
    thread.start()
    thread.join()
    return torch.get_num_threads(), seen[0]


@pytest.fixture
def threads():
    """The test's PyTorch thread count, restored after it (workers share it out while they run)."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield 2
    torch.set_num_threads(before)


def test_shares_deal_every_index_once_by_length():
    lengths = [7, 1, 9, 3, 3, 12, 5, 2, 8]
    parts = shares(lengths, 2)
    assert sorted(i for part in parts for i in part) == list(range(len(lengths)))
    assert [len(p) for p in parts] == [5, 4]
    assert all([lengths[i] for i in part] == sorted(lengths[i] for i in part) for part in parts)
    assert sum(lengths[i] for i in parts[0]) <= sum(lengths[i] for i in parts[1]) + max(lengths)  # alike, not all
    assert shares([4, 2], 3) == [[1], [0]]  # no empty part
    assert shares([4, 2], 10 ** 20) == [[1], [0]]  # at once: parts are counted by the sentences there are


@pytest.mark.parametrize("settings", [dict(beam_size=1), dict(beam_size=3, n_best=2), dict(beam_size=4, max_tokens=60)])
def test_parts_find_what_one_call_finds_in_input_order(model_dir, threads, settings):
    cfg = xattn.DecodeConfig(**settings)
    one = Translator.from_dir(model_dir, device="cpu")
    many = Translator.from_dir(model_dir, device="cpu", workers=3)
    alone, parted = one.translate(TEXTS, cfg, return_attention=True), many.translate(TEXTS, cfg, return_attention=True)
    assert [r.text for r in parted] == [r.text for r in alone] and len({r.text for r in alone}) > 10
    assert [r.score for r in parted] == pytest.approx([r.score for r in alone], abs=1e-5)
    assert [[a.text for a in r.alternatives] for r in parted] == [[a.text for a in r.alternatives] for r in alone]
    for a, b in zip(alone, parted):
        assert a.src_tokens == b.src_tokens and b.cross_attention.shape == a.cross_attention.shape
    assert counts() == (threads, threads)


@pytest.mark.parametrize("quantize", [None, "int8"])
def test_each_part_gives_exactly_what_its_sentences_give_alone(model_dir, threads, quantize):
    """The same batches as the part translated by itself, bit for bit: int8 too, whose batches quantize their
    activations together (so int8 may differ from one part's; not from the same parts decoded one after another on
    a thread each, as the parts run)."""
    cfg = xattn.DecodeConfig(beam_size=2)
    one = Translator.from_dir(model_dir, device="cpu", quantize=quantize)
    many = Translator.from_dir(model_dir, device="cpu", quantize=quantize, workers=2)
    parted = many.translate(TEXTS, cfg)
    torch.set_num_threads(1)  # each part's share (float32 products sum in another order on two threads)
    for part in shares([len(one.tokenizers.src.encode_batch([t])[0]) + 1 for t in TEXTS], 2):
        alone = one.translate([TEXTS[i] for i in part], cfg)
        assert [(parted[i].text, parted[i].score) for i in part] == [(r.text, r.score) for r in alone]


def test_a_translator_built_in_memory_decodes_in_parts_too(tmp_path, threads):
    model, pair = tiny_model_dir(tmp_path / "model")
    one, many = Translator(model, pair, device="cpu"), Translator(model, pair, device="cpu")
    many.workers = 2
    assert [r.text for r in many.translate(TEXTS)] == [r.text for r in one.translate(TEXTS)]


def test_prefixes_follow_their_sentences_into_the_parts(model_dir, threads):
    cfg = xattn.DecodeConfig(beam_size=2)
    prefixes = [TEXTS[(i + 3) % len(TEXTS)].split(" ")[0] for i in range(len(TEXTS))]
    one, many = Translator.from_dir(model_dir, device="cpu"), Translator.from_dir(model_dir, device="cpu", workers=2)
    assert [r.text for r in many.translate(TEXTS, cfg, prefixes=prefixes)] == \
        [r.text for r in one.translate(TEXTS, cfg, prefixes=prefixes)]


def test_each_part_samples_from_its_own_generator_seeded_from_the_call(model_dir, threads):
    cfg = xattn.DecodeConfig(sampling=True, seed=5, temperature=3.0)
    many = Translator.from_dir(model_dir, device="cpu", workers=2)
    first, again = many.translate(TEXTS, cfg), many.translate(TEXTS, cfg)
    assert [r.text for r in first] == [r.text for r in again]
    assert [r.text for r in many.translate(TEXTS, xattn.DecodeConfig(sampling=True, seed=6, temperature=3.0))] != \
        [r.text for r in first]
    generator = torch.Generator().manual_seed(1)  # a caller's generator: each call draws anew from it
    assert [r.text for r in many.translate(TEXTS, cfg, generator=generator)] != \
        [r.text for r in many.translate(TEXTS, cfg, generator=generator)]


def test_parts_run_at_once_each_with_its_share_of_threads(threads):
    barrier, seen = threading.Barrier(2, timeout=10), []

    def job(k):
        def steps():
            seen.append((k, torch.get_num_threads(), threading.current_thread().name))
            barrier.wait()  # both parts must be running at once to pass it
            yield 0
            return k * 10
        return steps

    assert run_parts([job(0), job(1)], threads_each=1) == [0, 10]
    assert sorted(n for _, n, _ in seen) == [1, 1] and len({name for *_, name in seen}) == 2
    assert counts() == (threads, threads)


def test_calls_that_run_parts_at_once_give_the_thread_count_back_when_the_last_ends(threads):
    """The second call starts while the first one's parts hold PyTorch at one thread each: it must neither save
    that count as its own nor leave it behind."""
    barrier, after = threading.Barrier(4, timeout=10), {}

    def job():
        barrier.wait()  # all four parts of the two calls run at once
        yield 0

    def call(name, delay):
        time.sleep(delay)
        run_parts([job, job], threads_each=1)
        after[name] = torch.get_num_threads()

    callers = [threading.Thread(target=call, args=("first", 0)), threading.Thread(target=call, args=("second", 0.2))]
    for caller in callers:
        caller.start()
    for caller in callers:
        caller.join()
    assert after == {"first": threads, "second": threads} and counts() == (threads, threads)


def test_int8_rewrites_take_turns(monkeypatch):
    """A shortlist's int8 output layer is rewritten per batch, by two parts at once; the rewrite sets the process's
    warning filters aside (warnings.catch_warnings), which two at once would leave wrong."""
    import warnings

    from xattn.inference import Speedups, rewrite

    quantize, running, most = torch.ao.quantization.quantize_dynamic, [], []

    def slow_quantize(*args, **kwargs):
        running.append(1)
        most.append(len(running))
        time.sleep(0.05)
        running.pop()
        return quantize(*args, **kwargs)

    monkeypatch.setattr(torch.ao.quantization, "quantize_dynamic", slow_quantize)
    before = list(warnings.filters)
    layers = [torch.nn.Sequential(torch.nn.Linear(8, 8)) for _ in range(2)]
    rewriters = [threading.Thread(target=rewrite, args=(layer, Speedups(quantize="int8"))) for layer in layers]
    for rewriter in rewriters:
        rewriter.start()
    for rewriter in rewriters:
        rewriter.join()
    assert max(most) == 1 and warnings.filters == before


def test_a_failing_part_stops_the_others_and_its_error_is_raised(threads):
    steps_taken = []

    def failing():
        yield 0
        raise ValueError("part 0 failed")

    def long():
        for i in range(10_000):
            steps_taken.append(i)
            yield 0
            time.sleep(0.001)
        return "done"

    with pytest.raises(ValueError, match="part 0 failed"):
        run_parts([failing, long], threads_each=1)
    assert len(steps_taken) < 10_000 and counts() == (threads, threads)


def test_an_error_inside_the_parts_reaches_the_caller_as_it_would_from_one(model_dir, threads):
    many = Translator.from_dir(model_dir, device="cpu", workers=2)  # no shortlist: the batches' search refuses
    with pytest.raises(ParameterError, match="no shortlist"):
        many.translate(TEXTS, xattn.DecodeConfig(shortlist=True))
    assert counts() == (threads, threads)


def test_an_interrupt_of_the_caller_stops_the_parts(threads):
    """Ctrl+C while the parts run: the calling thread's KeyboardInterrupt stops them at their next step."""
    import os
    import signal

    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signals reach the main thread only")
    steps_taken = []

    def interrupting():
        yield 0
        os.kill(os.getpid(), signal.SIGINT)
        for i in range(10_000):
            steps_taken.append(i)
            yield 0
            time.sleep(0.001)

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            run_parts([interrupting, interrupting], threads_each=1)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert len(steps_taken) < 10_000 and counts() == (threads, threads)


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2"])
def test_workers_must_be_a_whole_number_of_one_or_more(model_dir, bad):
    with pytest.raises(ParameterError, match="workers"):
        Translator.from_dir(model_dir, device="cpu", workers=bad)


def test_the_cli_flag_gives_the_same_file_and_names_a_bad_value(model_dir, tmp_path, capsys, threads):
    src = tmp_path / "in.txt"
    src.write_text("\n".join(TEXTS) + "\n")
    outs = []
    for workers in ("1", "2"):
        out = tmp_path / f"out{workers}.txt"
        assert main(["translate", str(model_dir), "-i", str(src), "-o", str(out), "--beam", "3", "--workers",
                     workers]) == 0
        outs.append(out.read_text())
    assert outs[0] == outs[1] and len(outs[0].splitlines()) == len(TEXTS)
    capsys.readouterr()
    assert main(["translate", str(model_dir), "-i", str(src), "--workers", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["xattn translate: error: --workers: a whole number >= 1, got 0"]
    assert main(["translate", str(model_dir), "-i", str(src), "--workers", "2", "--compile"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "xattn translate: error: --workers: parts run on a CPU without a compiled step; this Translator decodes "
        "with one"]
