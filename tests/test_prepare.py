"""`prepare` (xattn/data/prepare.py): the training corpus streamed into a prepared directory, with the ids,
tokenizers and cleaning of the in-memory path it replaced (pinned), the same bytes from any number of workers."""
import gzip
import re
from pathlib import Path

import pytest

from tests.conftest import MULTI30K
from xattn.config import DataConfig
from xattn.corpus import prepare_corpus
from xattn.data.prepare import prepare
from xattn.data.prepared import MappedCorpus
from xattn.errors import XattnError
from xattn.lines import read_lines

NUMBERS = DataConfig(dataset="numbers", numbers_size=2000, vocab_size=120, max_ratio=10.0)


def arrays(folder: Path) -> dict[str, bytes]:
    return {f.name: f.read_bytes() for f in sorted(folder.iterdir()) if f.name != "manifest.json"}


def test_one_worker_and_two_write_the_same_bytes(tmp_path):
    one = prepare(NUMBERS, tmp_path / "one", workers=1)
    two = prepare(NUMBERS, tmp_path / "two", workers=2)
    assert arrays(tmp_path / "one") == arrays(tmp_path / "two") and one["arrays"] == two["arrays"]
    assert one["pairs"] == 2000 and one["cleaning"]["kept"] == 2000 and one["data"]["vocab_size"] == 120


PINNED = {0: (128, "c1c515a93b53a81e3aac02fe822a7a97702f91887c3e78197c62119ed69066e3"),
          1: (128, "afa0b31f8b93a4c2bbe3363c64a85b7ee572a5d45d04f2bab400bbc9c010fe92")}
"""Epoch -> (batches, SHA-256 of each batch's indices, source and target ids) of the multi30k-de-en preset
with its seed, as the in-memory path of xattn before prepared corpora (commit 6281ac2) made them."""
PINNED_SPM = "326c7eec0513e47a2bfacb40da2408fef31a8e5aa60c1e655fefd8a6917a6b9b"


@pytest.mark.skipif(not (MULTI30K / "train.de.gz").is_file(), reason="no Multi30k copy")
def test_training_batches_are_those_of_the_in_memory_path(tmp_path):
    import hashlib

    import numpy as np

    from xattn.config import load_config

    from xattn.presets import resolve_config
    from xattn.data import TokenBatchSampler

    cfg = load_config(resolve_config("multi30k-de-en"), [f"data.data_dir={MULTI30K}"])
    corpus = prepare_corpus(cfg.data, tmp_path / "model")
    assert hashlib.sha256((tmp_path / "model" / "spm.model").read_bytes()).hexdigest() == PINNED_SPM
    sampler = TokenBatchSampler(corpus.train.src_lengths(), corpus.train.tgt_lengths(), cfg.train.max_tokens,
                                seed=cfg.train.seed)
    for epoch, (count, pinned) in PINNED.items():
        digest, batches = hashlib.sha256(), sampler.batches(epoch)
        for indices in batches:
            batch = corpus.train.collate(indices)
            for array in (np.asarray(indices, dtype=np.int64), batch.src.numpy(), batch.tgt_out.numpy()):
                digest.update(array.tobytes())
        assert (len(batches), digest.hexdigest()) == (count, pinned)
    assert corpus.stats.kept == len(corpus.train) == 28997


def test_files_are_streamed_with_the_line_rules_and_hashed(tmp_path):
    src, tgt = tmp_path / "a.de.gz", tmp_path / "a.en"
    with gzip.open(src, "wt", encoding="utf-8") as f:
        f.write("".join(f"eins zwei {i}\n" for i in range(300)) + "\n")
    tgt.write_text("".join(f"one two {i}\r\n" for i in range(300)) + "x\n", encoding="utf-8")
    cfg = DataConfig(dataset=None, train_src=str(src), train_tgt=str(tgt), valid_src=str(tgt), valid_tgt=str(tgt),
                     vocab_size=60)
    manifest = prepare(cfg, tmp_path / "out", workers=1)
    assert manifest["pairs"] == 300 and manifest["cleaning"]["empty"] == 1 and [r["path"] for r in manifest["inputs"].values()] == [str(src), str(tgt)]
    assert [r["key"] for r in manifest["inputs"].values()] == ["train_src", "train_tgt"]
    mapped = MappedCorpus.open(tmp_path / "out")
    assert len(mapped) == 300


@pytest.mark.parametrize("content, message", [
    (b"eins\nzw\xffei\n", "b.de: line 2: invalid UTF-8"),
    (b"eins\nzwei\ndrei\n", "line counts differ: "),
])
def test_bad_files_are_one_line_and_leave_nothing(tmp_path, content, message):
    (tmp_path / "b.de").write_bytes(content)
    (tmp_path / "b.en").write_bytes(b"one\ntwo\n")
    cfg = DataConfig(dataset=None, train_src=str(tmp_path / "b.de"), train_tgt=str(tmp_path / "b.en"), vocab_size=8)
    with pytest.raises(XattnError, match=message):
        prepare(cfg, tmp_path / "out", workers=1)
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out*"))


def test_nothing_left_after_cleaning_is_an_error_and_leaves_nothing(tmp_path):
    with pytest.raises(XattnError, match=r"no training pairs left after cleaning \(sides of no piece, data.max_len"):
        prepare(DataConfig(dataset="numbers", numbers_size=500, vocab_size=120, max_len=1), tmp_path / "out", workers=1)
    assert list(tmp_path.iterdir()) == []


def test_dedup_drops_exact_repeats(tmp_path):
    (tmp_path / "d.de").write_text("eins\nzwei\neins\ndrei\neins\n")
    (tmp_path / "d.en").write_text("one\ntwo\none\nthree\nuno\n")
    cfg = DataConfig(dataset=None, train_src=str(tmp_path / "d.de"), train_tgt=str(tmp_path / "d.en"), vocab_size=20,
                     dedup=True)
    manifest = prepare(cfg, tmp_path / "out", workers=1)
    assert manifest["pairs"] == 4 and manifest["cleaning"]["duplicate"] == 1  # "eins ||| uno" is another pair


def test_the_prepare_summary_counts_the_repeats_dedup_dropped(tmp_path, capsys):
    from xattn.cli.main import main

    (tmp_path / "d.de").write_text("eins\nzwei\neins\ndrei\neins\n")
    (tmp_path / "d.en").write_text("one\ntwo\none\nthree\nuno\n")
    files = ["data.dataset=null", f"data.train_src={tmp_path}/d.de", f"data.train_tgt={tmp_path}/d.en",
             "data.vocab_size=20", "data.dedup=true"]
    assert main(["prepare", "numbers-de-en", *files, "--out", str(tmp_path / "out"), "--workers", "1"]) == 0
    assert "4 pairs" in (out := capsys.readouterr().out) and ", 1 repeating an earlier pair (data.dedup)" in out


def test_a_tsv_line_with_an_empty_side_is_two_fields_in_validation_as_in_training(tmp_path):
    """`src<TAB>` is a pair with an empty target, which cleaning drops; read_tsv stripped the tab first and called it
    one field, an error, for a validation file only."""
    from xattn.data.text import read_tsv

    (tmp_path / "v.tsv").write_text("eins\tone\nzwei\t\n")
    assert read_tsv(tmp_path / "v.tsv") == [("eins", "one"), ("zwei", "")]


MEMORY = """
import gzip, random, resource, sys
from pathlib import Path
from xattn.config import DataConfig
from xattn.data.prepare import prepare
tmp, rng = Path(sys.argv[1]), random.Random(0)
words = [f"w{i}" for i in range(3000)]
for name in ("big.de.gz", "big.en.gz"):
    with gzip.open(tmp / name, "wt") as f:
        f.writelines(" ".join(rng.choice(words) for _ in range(rng.randint(5, 40))) + "\\n" for _ in range(200_000))
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
cfg = DataConfig(dataset=None, train_src=str(tmp / "big.de.gz"), train_tgt=str(tmp / "big.en.gz"), vocab_size=4000,
                 spm_sample=20_000)
prepare(cfg, tmp / "out", workers=1)
print(before // 1024, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024)
"""


def test_preparing_200k_pairs_stays_within_a_memory_bound(tmp_path):
    """Peak RSS of preparing 200,000 pairs (about 45 tokens a side) with a 20,000-pair tokenizer sample: 122 MB
    above the interpreter here; reading them into lists, as the in-memory path before prepared corpora did,
    peaked 1,247 MB above it. The bound is far from both."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", MEMORY, str(tmp_path)], capture_output=True, text=True, timeout=600,
                          env={**__import__("os").environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    before, peak = map(int, done.stdout.split())
    assert peak - before < 400, f"preparing took {peak - before} MB above the {before} MB at the start"


def test_a_full_disk_is_one_line_and_leaves_nothing(tmp_path, monkeypatch, capsys):
    import errno

    from xattn.cli.main import main
    from xattn.data.prepared import SideWriter

    written = SideWriter.add

    def add(self, sentences):
        written(self, sentences)
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(SideWriter, "add", add)
    out = tmp_path / "out"
    assert main(["prepare", "numbers-de-en", "data.numbers_size=300", "data.vocab_size=120", "--out", str(out),
                 "--workers", "1"]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and f"{out}: the disk filled up after " in err and "nothing was kept" in err
    assert list(tmp_path.iterdir()) == []


def linked_files(tmp_path: Path, links: list[str]) -> DataConfig:
    """Six pairs (one empty, one over the length ratio) whose English reverses the German, and a links file."""
    de = ["rot haus", "blau auto schnell", "", "klein", "gross rot", "haus haus haus haus haus haus haus"]
    en = ["house red", "fast car blue", "x", "small", "red big", "house"]
    for name, lines in (("l.de", de), ("l.en", en), ("l.links", links)):
        (tmp_path / name).write_text("".join(f"{line}\n" for line in lines))
    return DataConfig(dataset=None, train_src=str(tmp_path / "l.de"), train_tgt=str(tmp_path / "l.en"),
                      train_links=str(tmp_path / "l.links"), vocab_size=28, max_ratio=3.0)


def test_links_are_stored_as_piece_links_beside_their_pairs_and_drop_with_them(tmp_path):
    from xattn.links import piece_links
    from xattn.analysis.maps import by_words
    from xattn.tokenizer import load_tokenizers

    cfg = linked_files(tmp_path, ["0-1 1-0", "0-2 1-1 2-0", "", "", "0-1 1-0", "0-0"])
    manifest = prepare(cfg, tmp_path / "out", workers=1)
    assert manifest["pairs"] == 4 and manifest["cleaning"]["ratio"] == 1 and manifest["cleaning"]["empty"] == 1
    assert manifest["links"]["pairs"] == 3 and manifest["links"]["unmatched"] == 0
    assert [r["key"] for r in manifest["inputs"].values()] == ["train_src", "train_tgt", "train_links"]
    corpus = MappedCorpus.open(tmp_path / "out")
    tok = load_tokenizers(tmp_path / "out")
    kept = [(0, {(0, 1), (1, 0)}), (1, {(0, 2), (1, 1), (2, 0)}), (3, set()), (4, {(0, 1), (1, 0)})]
    de, en = (tmp_path / "l.de").read_text().splitlines(), (tmp_path / "l.en").read_text().splitlines()
    for k, (line, links) in enumerate(kept):  # the pairs kept, in order, with the links of their own lines
        (src, src_of), (tgt, tgt_of) = (by_words(t, [text], 2) for t, text in ((tok.src, de[line]), (tok.tgt, en[line])))
        assert corpus.sentence("src", k).tolist() == src[0][:-1] and corpus.sentence("tgt", k).tolist() == tgt[0][:-1]
        expected = [i for link in piece_links(links, src_of[0][:-1], tgt_of[0][:-1]) for i in link]
        assert corpus.sentence("links", k).tolist() == expected
    batch = corpus.collate([0, 3])
    assert batch.links[:, 0].unique().tolist() == [0, 1]
    assert (batch.links[:, 1] < (batch.tgt_out != 0).sum(1)[batch.links[:, 0]] - 1).all()  # never the </s> row


def test_one_worker_and_two_write_the_same_links(tmp_path):
    cfg = linked_files(tmp_path, ["0-1 1-0", "0-2 1-1 2-0", "", "", "0-1 1-0", "0-0"])
    prepare(cfg, tmp_path / "one", workers=1)
    prepare(cfg, tmp_path / "two", workers=2)
    assert arrays(tmp_path / "one") == arrays(tmp_path / "two") and "links.bin" in arrays(tmp_path / "one")


@pytest.mark.parametrize("links, message", [
    (["0-1"] * 5, r"l\.links: line 6: missing; the links file has 5 lines"),
    (["0-1"] * 7, r"l\.links: line 7: one line more than the 6 pairs"),
    (["0-1", "0-2 3-0", "", "", "", ""], r"l\.links: line 2: link '3-0': index 3 is beyond the 3 words of the first side"),
    (["0-1", "0-x", "", "", "", ""], r"l\.links: line 2: '0-x' is not a link"),
])
def test_a_links_file_that_does_not_fit_the_corpus_is_one_line_naming_file_and_line(tmp_path, links, message):
    with pytest.raises(XattnError, match=message):
        prepare(linked_files(tmp_path, links), tmp_path / "out", workers=1)
    assert not (tmp_path / "out").exists()


def test_a_side_of_no_piece_is_empty_and_a_tab_does_not_join_two_pairs(tmp_path):
    """A side whose text encodes to no piece (a zero-width space, a lone BOM) is dropped and counted as empty, as a
    side with no text is; with dedup, two pairs whose texts differ by where a tab falls are two pairs."""
    (tmp_path / "d.de").write_text("eins\nzwei\n\u200b\ndrei\neins zwei\tdrei\neins zwei\n")
    (tmp_path / "d.en").write_text("one\ntwo\nthree\n\ufeff\none two three\ndrei\tone two three\n")
    cfg = DataConfig(dataset=None, train_src=str(tmp_path / "d.de"), train_tgt=str(tmp_path / "d.en"), vocab_size=20,
                     dedup=True)
    manifest = prepare(cfg, tmp_path / "out", workers=1)
    assert manifest["cleaning"]["empty"] == 2 and manifest["cleaning"]["duplicate"] == 0 and manifest["pairs"] == 4
    corpus = MappedCorpus.open(tmp_path / "out")
    assert all(len(corpus.sentence(side, i)) for side in ("src", "tgt") for i in range(len(corpus)))


def test_a_nul_in_a_corpus_is_refused_with_its_line_as_everywhere(tmp_path):
    """A BOM-less UTF-16 file reads as UTF-8 with a NUL after each ASCII letter: refused, whatever else the block
    holds, as the CLI's and the server's readers refuse it."""
    (tmp_path / "u.de").write_bytes("eins\nzwei\n".encode("utf-16-le"))
    (tmp_path / "u.en").write_text("one\ntwo\n")
    cfg = DataConfig(dataset=None, train_src=str(tmp_path / "u.de"), train_tgt=str(tmp_path / "u.en"), vocab_size=20)
    with pytest.raises(XattnError, match=r"u.de: line 1: holds a NUL byte"):
        prepare(cfg, tmp_path / "out", workers=1)


def test_a_corpus_another_compressor_made_is_named_and_gzip_is_read_whatever_its_name(tmp_path):
    """An .xz or .bz2 corpus was read as text with NUL bytes ('holds a NUL byte ... iconv -f UTF-16'); gzip data
    without a .gz name was read the same way."""
    import bz2
    import lzma

    text = "eins\nzwei\ndrei\n".encode()
    (tmp_path / "u.en").write_text("one\ntwo\nthree\n")
    for name, data, message in (("u.de.xz", lzma.compress(text), "xz-compressed"),
                                ("u.de.bz2", bz2.compress(text), "bzip2-compressed")):
        (tmp_path / name).write_bytes(data)
        cfg = DataConfig(dataset=None, train_src=str(tmp_path / name), train_tgt=str(tmp_path / "u.en"), vocab_size=20)
        with pytest.raises(XattnError, match=rf"{name}: {message}, which xattn does not read; decompress it"):
            prepare(cfg, tmp_path / "out", workers=1)
    (tmp_path / "u.de.data").write_bytes(gzip.compress(text))
    cfg = DataConfig(dataset=None, train_src=str(tmp_path / "u.de.data"), train_tgt=str(tmp_path / "u.en"),
                     vocab_size=20)
    assert prepare(cfg, tmp_path / "gz", workers=1)["pairs"] == 3
    (tmp_path / "bzh.txt").write_text("BZh is where it starts\n")  # text, however it begins
    assert read_lines(tmp_path / "bzh.txt") == ["BZh is where it starts"]


def test_a_tsv_line_of_three_fields_is_refused_in_training_as_in_validation_whatever_they_hold(tmp_path):
    """`zwei<TAB><TAB>` (two empty last fields) was read in training as an empty pair and dropped, and refused by
    validation's reader."""
    from xattn.data.text import read_tsv

    for i, line in enumerate(["zwei\t\t", "zwei\t \t ", "zwei\tzwo\t"]):
        (tmp_path / "c.tsv").write_text(f"eins\tone\n{line}\ndrei\tthree\n")
        cfg = DataConfig(dataset=None, train_tsv=str(tmp_path / "c.tsv"), vocab_size=20)
        message = f"{tmp_path / 'c.tsv'}: line 2: expected 2 tab-separated fields, found 3"
        with pytest.raises(XattnError, match=re.escape(message)):
            read_tsv(tmp_path / "c.tsv")
        with pytest.raises(XattnError, match=re.escape(message)):
            prepare(cfg, tmp_path / f"out{i}", workers=1)


def test_a_tsv_line_with_an_empty_target_is_an_empty_pair_as_one_with_an_empty_source(tmp_path):
    (tmp_path / "c.tsv").write_text("eins\tone\n\ttwo\nzehn\t\ndrei\tthree\n")
    cfg = DataConfig(dataset=None, train_tsv=str(tmp_path / "c.tsv"), vocab_size=20)
    manifest = prepare(cfg, tmp_path / "out", workers=1)
    assert manifest["cleaning"]["empty"] == 2 and manifest["pairs"] == 2


def test_a_carriage_return_inside_the_last_line_is_a_character_as_in_every_other_line(tmp_path):
    (tmp_path / "c.de").write_bytes(b"eins\nzwei\ndrei\rvier")  # the last line has no newline
    (tmp_path / "c.en").write_text("one\ntwo\nthree four\n")
    cfg = DataConfig(dataset=None, train_src=str(tmp_path / "c.de"), train_tgt=str(tmp_path / "c.en"), vocab_size=20)
    assert prepare(cfg, tmp_path / "out", workers=1)["pairs"] == 3
    (tmp_path / "cr.de").write_bytes(b"eins\rzwei\rdrei")  # no newline at all: lines that end in CR alone
    with pytest.raises(XattnError, match="cr.de: lines end in a carriage return alone"):
        prepare(DataConfig(dataset=None, train_src=str(tmp_path / "cr.de"), train_tgt=str(tmp_path / "c.en"),
                           vocab_size=20), tmp_path / "out2", workers=1)


def test_a_run_into_a_prepared_corpus_is_refused_in_one_line(tmp_path, capsys):
    """`train --out` a prepared corpus wrote the run's tokenizer over the corpus's (exit 0; the corpus then failed its
    checksum), and `--out` its own data.prepared was a SameFileError traceback (a probe)."""
    from tests.conftest import NUMBERS_TINY
    from xattn.cli.main import main

    corpus = tmp_path / "corpus"
    assert main(["prepare", "numbers-de-en", "data.numbers_size=300", "data.vocab_size=120", "--out", str(corpus),
                 "--workers", "1"]) == 0
    before = {p.name: p.read_bytes() for p in corpus.iterdir() if p.is_file()}
    capsys.readouterr()
    for extra in ([], [f"data.prepared={corpus}"]):
        assert main(["train", "numbers-de-en", *NUMBERS_TINY, "train.max_steps=2", *extra, "--out", str(corpus)]) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and f"{corpus}: holds a prepared corpus" in err, err
    assert {p.name: p.read_bytes() for p in corpus.iterdir() if p.is_file() and p.name in before} == before


def test_the_encoding_progress_counts_to_the_rows_read_with_a_subset(tmp_path, monkeypatch, capsys):
    """Its total was the pairs train_subset kept, against which it counted every row read: `-52 s left`."""
    import xattn.data.prepare as prepare_module

    monkeypatch.setattr(prepare_module, "REPORT_EVERY", 100)
    (tmp_path / "c.de").write_text("".join(f"eins zwei {i}\n" for i in range(400)))
    (tmp_path / "c.en").write_text("".join(f"one two {i}\n" for i in range(400)))
    cfg = DataConfig(dataset=None, train_src=str(tmp_path / "c.de"), train_tgt=str(tmp_path / "c.en"), vocab_size=40,
                     train_subset=50)
    assert prepare(cfg, tmp_path / "out", workers=1)["pairs"] == 50
    lines = [line for line in capsys.readouterr().err.splitlines() if "encoding:" in line]
    assert len(lines) == 4 and all(" -" not in line.split("pairs/s")[1] for line in lines), lines


def test_a_file_of_a_bom_alone_has_no_line_in_prepare_as_everywhere(tmp_path):
    """prepare read it as one empty line, read_lines and count_lines as none: a src file of a BOM alone beside an
    empty tgt file was a line-count mismatch."""
    from xattn.data.inputs import Inputs
    from xattn.lines import count_lines

    for name, data in (("bom.de", b"\xef\xbb\xbf"), ("bom-line.de", b"\xef\xbb\xbfeins"), ("empty.en", b"")):
        (tmp_path / name).write_bytes(data)
        cfg = DataConfig(dataset=None, train_src=str(tmp_path / name), train_tgt=str(tmp_path / name))
        read = list(Inputs(cfg).lines(str(tmp_path / name), "train_src"))
        assert read == read_lines(tmp_path / name) and len(read) == count_lines(tmp_path / name), name
