"""Large files in bounded memory: read_line_chunks keeps read_lines' rules across chunk and block borders,
`translate -i` and `evaluate` work a chunk at a time with the results of the whole, and write atomically."""
import gzip
import tracemalloc

import pytest
import sacrebleu

import xattn.lines
from tests.conftest import MULTI30K
from xattn.cli.main import main
from xattn.errors import XattnError
from xattn.evaluation import Scorer, evaluate
from xattn.lines import count_lines, paired_line_chunks, read_line_chunks, read_lines

TRICKY = "\ufeffeins\r\nzwei\x0cdrei\nvier\u2028fünf\n\n  sechs  \nsieben"


@pytest.mark.parametrize("size, block", [(1, 1), (2, 3), (3, 7), (100, 1 << 20)])
def test_chunks_are_the_lines_of_read_lines(tmp_path, size, block):
    path = tmp_path / "a.txt.gz"
    with gzip.open(path, "wb") as f:
        f.write(TRICKY.encode())
    chunks = list(read_line_chunks(path, size, block))
    assert [line for chunk in chunks for line in chunk] == read_lines(path) == \
        ["eins", "zwei\x0cdrei", "vier\u2028fünf", "", "  sechs  ", "sieben"]
    assert all(len(chunk) == size for chunk in chunks[:-1]) and count_lines(path) == 6


def test_errors_name_the_line_across_block_borders(tmp_path):
    path = tmp_path / "bad.txt"
    path.write_bytes(b"".join(b"line %d\n" % i for i in range(1, 40)) + b"vier\xffzig\n")
    for block in (1, 5, 64):
        with pytest.raises(XattnError, match=r"bad.txt: line 40: invalid UTF-8"):
            list(read_line_chunks(path, 7, block))
    (tmp_path / "cr.txt").write_bytes(b"eins\rzwei\r")
    with pytest.raises(XattnError, match="carriage return alone"):
        list(read_line_chunks(tmp_path / "cr.txt", 2, 3))
    (tmp_path / "three.txt").write_bytes(b"one\ntwo\nthree\n")  # counted first: it was "cr.txt has 1 lines, ..."
    for pair in (("cr.txt", "three.txt"), ("three.txt", "cr.txt")):
        with pytest.raises(XattnError, match="cr.txt: lines end in a carriage return alone"):
            list(paired_line_chunks(*(tmp_path / name for name in pair)))
    for text, lines in ((b"eins\r", 1), (b"\r\r", 1), (b"", 0)):  # a CR at the end only: one line (its \r dropped)
        (tmp_path / "end.txt").write_bytes(text)
        assert count_lines(tmp_path / "end.txt") == lines == len(read_lines(tmp_path / "end.txt"))


def test_reading_a_large_file_holds_one_chunk(tmp_path):
    path = tmp_path / "big.txt"
    path.write_text("".join(f"ein langer Satz mit der Nummer {i} und noch ein paar Wörtern mehr\n" for i in range(300_000)))
    tracemalloc.start()
    count = sum(len(chunk) for chunk in read_line_chunks(path, 1000))
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert count == 300_000 and peak < 8 * 2**20 < path.stat().st_size / 2  # the file is 20 MB; a block is 1 MB


def test_a_scorer_fed_chunks_gives_the_score_of_the_whole():
    refs = [f"a dog runs across the field number {i} ." for i in range(50)] + ["Two men , one woman ."] * 5
    hyps = [r.replace("dog", "cat") if i % 3 else r.upper() for i, r in enumerate(refs)]
    whole = {"bleu": sacrebleu.corpus_bleu(hyps, [refs]).score,
             "bleu_lc": sacrebleu.BLEU(lowercase=True).corpus_score(hyps, [refs]).score,
             "chrf": sacrebleu.corpus_chrf(hyps, [refs]).score}
    for size in (1, 7, len(hyps)):
        scorer = Scorer()
        for start in range(0, len(hyps), size):
            scorer.add(hyps[start:start + size], refs[start:start + size])
        assert {k: s.score for k, s in scorer.scores().items()} == whole
    assert {k: s.score for k, s in evaluate(hyps, refs).items()} == whole


def test_translate_and_evaluate_work_a_chunk_at_a_time(numbers_model, tmp_path, monkeypatch, capsys):
    src = [f"{w} {v}" for w in ("eins", "zwei", "drei", "vier", "fünf") for v in ("sechs", "sieben", "acht", "neun", "zehn")]
    (tmp_path / "in.txt").write_text("\n".join(src) + "\n")
    assert main(["translate", str(numbers_model), "-i", str(tmp_path / "in.txt"), "-o", str(tmp_path / "whole.txt")]) == 0
    monkeypatch.setattr(xattn.lines, "CHUNK_LINES", 4)
    assert main(["translate", str(numbers_model), "-i", str(tmp_path / "in.txt"), "-o", str(tmp_path / "chunked.txt")]) == 0
    assert (tmp_path / "chunked.txt").read_text() == (tmp_path / "whole.txt").read_text()
    assert len((tmp_path / "chunked.txt").read_text().splitlines()) == 25
    (tmp_path / "ref.txt").write_text((tmp_path / "whole.txt").read_text())
    capsys.readouterr()
    assert main(["evaluate", str(numbers_model), "--src", str(tmp_path / "in.txt"), "--ref", str(tmp_path / "ref.txt"),
                 "--json", "-o", str(tmp_path / "hyp.txt")]) == 0
    assert '"bleu": {"score": 100.0' in capsys.readouterr().out
    assert (tmp_path / "hyp.txt").read_text() == (tmp_path / "whole.txt").read_text()


def test_an_error_late_in_the_input_leaves_the_output_file_as_it_was(numbers_model, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(xattn.lines, "CHUNK_LINES", 4)
    (tmp_path / "in.txt").write_bytes(b"eins\n" * 9 + b"vier\xffzig\n")
    (tmp_path / "out.txt").write_text("kept\n")
    assert main(["translate", str(numbers_model), "-i", str(tmp_path / "in.txt"), "-o", str(tmp_path / "out.txt")]) == 2
    assert "in.txt: line 10: invalid UTF-8" in capsys.readouterr().err
    assert (tmp_path / "out.txt").read_text() == "kept\n" and sorted(p.name for p in tmp_path.iterdir()) == ["in.txt", "out.txt"]
    (tmp_path / "ref.txt").write_text("one\n" * 9)
    (tmp_path / "in.txt").write_text("eins\n" * 10)
    assert main(["evaluate", str(numbers_model), "--src", str(tmp_path / "in.txt"), "--ref", str(tmp_path / "ref.txt")]) == 2
    assert "line counts differ: " in capsys.readouterr().err


@pytest.mark.skipif(not (MULTI30K / "val.en.gz").is_file(), reason="no Multi30k copy")
def test_count_lines_agrees_with_read_lines_on_multi30k():
    assert count_lines(MULTI30K / "val.en.gz") == len(read_lines(MULTI30K / "val.en.gz")) == 1014


@pytest.mark.parametrize("data, lines", [(b"\xef\xbb\xbf", 0), (b"\xef\xbb\xbf\n", 1), (b"\xef\xbb\xbfa", 1), (b"", 0)])
def test_count_lines_drops_a_leading_bom_as_read_lines_does(tmp_path, data, lines):
    """A file of a BOM alone was counted as one line and read as none (a line-count mismatch out of nothing)."""
    path = tmp_path / "t.txt"
    path.write_bytes(data)
    assert count_lines(path) == len(read_lines(path)) == lines
