import gzip
import io
import os
import random
import urllib.error
import urllib.request
from pathlib import Path

import num2words
import pytest
import torch

from xattn.data import (
    Batch, FilterStats, TokenBatchSampler, TokenizedCorpus, clean_pairs, collate, read_parallel, read_tsv,
    tokenize_pairs,
)
from xattn.datasets import NUMBERS_MAX, _converter, load_pairs, multi30k, multi30k_files, numbers
from xattn.errors import XattnError
from xattn.tokenizer import TokenizerPair

MULTI30K = Path(__file__).resolve().parents[2] / "shared" / "data" / "multi30k"


def write(path: Path, data: bytes) -> Path:
    path.write_bytes(gzip.compress(data) if path.suffix == ".gz" else data)
    return path


def test_read_parallel_plain_and_gz(tmp_path):
    src = write(tmp_path / "a.de.gz", "Ein Hund.\nZwei Männer.  \r\n".encode())
    tgt = write(tmp_path / "a.en", b"A dog.\nTwo men.\n")
    assert read_parallel(src, tgt) == [("Ein Hund.", "A dog."), ("Zwei Männer.", "Two men.")]


def test_line_count_mismatch_names_both_files(tmp_path):
    src = write(tmp_path / "a.de", b"1\n2\n3\n")
    tgt = write(tmp_path / "a.en", b"1\n2\n")
    with pytest.raises(XattnError, match=r"line counts differ: .*a\.de has 3 lines, .*a\.en has 2"):
        read_parallel(src, tgt)


def test_invalid_utf8_names_file_and_line(tmp_path):
    src = write(tmp_path / "train.de.gz", b"gut\nok\nbad \xff byte\n")
    with pytest.raises(XattnError, match=r"train\.de\.gz: line 3: invalid UTF-8"):
        read_parallel(src, src)
    with pytest.raises(XattnError, match="no such file"):
        read_parallel(tmp_path / "missing.de", src)


def test_read_tsv(tmp_path):
    good = write(tmp_path / "good.tsv", "eins\tone\nzwei \t two\n".encode())
    assert read_tsv(good) == [("eins", "one"), ("zwei", "two")]
    bad = write(tmp_path / "bad.tsv", b"eins\tone\nzwei\ttwo\textra\n")
    with pytest.raises(XattnError, match=r"bad\.tsv: line 2: expected 2 tab-separated fields, found 3"):
        read_tsv(bad)


def test_clean_pairs_counts_each_reason():
    pairs = [("a b", "c d"), ("", "x"), ("a", " "), ("a b c d e f", "a"), ("a", "b c d e"), ("a b c", "d e")]
    kept, stats = clean_pairs(pairs, max_len=5, max_ratio=3.0)
    assert kept == [("a b", "c d"), ("a b c", "d e")]
    assert stats == FilterStats(kept=2, empty=2, too_long=1, ratio=1)
    kept, stats = clean_pairs(pairs, max_len=5, length=len)
    assert stats == FilterStats(kept=2, empty=2, too_long=2, ratio=0)


def skewed_lengths(n: int = 600, seed: int = 0) -> tuple[list[int], list[int]]:
    rnd = random.Random(seed)
    src = [rnd.choice([2, 3, 4, 5]) if rnd.random() < 0.8 else rnd.randint(20, 60) for _ in range(n)]
    tgt = [max(1, s + rnd.randint(-2, 3)) for s in src]
    return src, tgt


def test_sampler_covers_every_index_once_within_budget():
    src, tgt = skewed_lengths()
    src[7] = tgt[7] = 500
    sampler = TokenBatchSampler(src, tgt, max_tokens=120, seed=3, bucket_size=200)
    for epoch in range(3):
        batches = sampler.batches(epoch)
        assert sorted(i for b in batches for i in b) == list(range(len(src)))
        for b in batches:
            assert len(b) == 1 or len(b) * max(max(src[i], tgt[i]) for i in b) <= 120
    assert [7] in sampler.batches(0)
    assert len(sampler) == len(sampler.batches(0))


def test_sampler_is_a_function_of_seed_and_epoch():
    src, tgt = skewed_lengths()
    a = TokenBatchSampler(src, tgt, max_tokens=100, seed=1)
    b = TokenBatchSampler(src, tgt, max_tokens=100, seed=1)
    assert a.batches(4) == b.batches(4)
    assert a.batches(4) != a.batches(5)
    assert a.batches(4) != TokenBatchSampler(src, tgt, max_tokens=100, seed=2).batches(4)


def test_sampler_without_shuffle_is_sorted_by_length():
    src, tgt = skewed_lengths()
    sampler = TokenBatchSampler(src, tgt, max_tokens=100, shuffle=False)
    order = [i for b in sampler.batches(0) for i in b]
    longest = [max(src[i], tgt[i]) for i in order]
    assert longest == sorted(longest) and sampler.batches(0) == sampler.batches(9)


def test_bucketing_pads_less_than_random_batches():
    src, tgt = skewed_lengths()
    sampler = TokenBatchSampler(src, tgt, max_tokens=200, seed=0)
    order = list(range(len(src)))
    random.Random(0).shuffle(order)
    random_batches = [order[i : i + 8] for i in range(0, len(order), 8)]
    bucketed = sampler.padding_fraction(sampler.batches(0))
    assert bucketed < 0.15 < sampler.padding_fraction(random_batches)


def test_collate_pads_right_and_adds_bos_eos():
    batch = collate([[5, 6, 7], [8]], [[9], [10, 11]], indices=[4, 2])
    assert isinstance(batch, Batch) and len(batch) == 2 and batch.indices == [4, 2]
    assert batch.src.tolist() == [[5, 6, 7, 2], [8, 2, 0, 0]]
    assert batch.tgt_in.tolist() == [[1, 9, 0], [1, 10, 11]]
    assert batch.tgt_out.tolist() == [[9, 2, 0], [10, 11, 2]]
    assert batch.src.dtype == batch.tgt_in.dtype == torch.int64
    assert batch.n_tgt_tokens == 5
    moved = batch.to("cpu")
    assert moved is not batch and torch.equal(moved.src, batch.src)


class CharTokenizer:
    """Stands in for a SentencePiece model: one id per character."""

    def encode_batch(self, texts):
        return [[4 + ord(c) % 50 for c in t] for t in texts]


def test_tokenize_pairs_truncates_and_feeds_the_sampler():
    tok = CharTokenizer()
    corpus = tokenize_pairs([("abcdef", "xy"), ("a", "xyz")], TokenizerPair(tok, tok, joint=True), max_len=4)
    assert isinstance(corpus, TokenizedCorpus) and len(corpus) == 2
    assert corpus.src_lengths() == [5, 2] and corpus.tgt_lengths() == [3, 4]
    batch = corpus.collate([1, 0])
    assert batch.src.shape == (2, 5) and batch.tgt_out.shape == (2, 4)


def test_numbers_known_values_and_disjoint_splits():
    train, val, test = (numbers("de", "en", split) for split in ("train", "val", "test"))
    assert (len(train), len(val), len(test)) == (20000, 500, 500)
    values = {s: {int(d) for d, _ in numbers("digits", "en", s)} for s in ("train", "val", "test")}
    assert not values["train"] & values["val"] and not values["train"] & values["test"]
    assert not values["val"] & values["test"]
    assert {len(str(v)) for v in values["train"]} == {1, 2, 3, 4, 5, 6}
    assert {len(str(v)) for v in values["test"]} == {3, 4, 5, 6}
    assert ("siebenhundertdreiundzwanzig", "seven hundred and twenty-three") in train
    assert dict(numbers("digits", "fr", "train"))["723"] == "sept cent vingt-trois"
    assert numbers("de", "en", "val") == val


def test_numbers_match_num2words_with_its_tables_cut_to_their_range():
    """num2words scans its whole table of number words (up to 10**600) at every step: the converters are copies
    whose tables stop at NUMBERS_MAX, which give the same words (a wall-clock bound on this was flaky)."""
    assert all(max(_converter(lang).cards) <= NUMBERS_MAX for lang in ("en", "de", "fr"))  # (cs has no table)
    assert max(num2words.CONVERTER_CLASSES["fr"].cards) > 10 ** 100  # (num2words' own is left whole)
    pairs = numbers("fr", "cs", "train", seed=5)
    digits = numbers("digits", "fr", "train", seed=5)
    for (fr, cs), (n, _) in list(zip(pairs, digits))[:300]:
        assert fr == num2words.num2words(int(n), lang="fr").lower()
        assert cs == num2words.num2words(int(n), lang="cs").lower()


def test_dataset_user_errors():
    with pytest.raises(XattnError, match="valid: en, de, fr, cs"):
        numbers("de", "xx", "train")
    with pytest.raises(XattnError, match="valid: multi30k, numbers"):
        load_pairs("wmt", "de", "en", "train")
    with pytest.raises(XattnError, match="valid: train, val, test_2016_flickr"):
        multi30k_files("dev", "de")
    with pytest.raises(XattnError, match="valid: en, de, fr, cs"):
        multi30k_files("train", "es")


def offline(*args, **kwargs):
    raise urllib.error.URLError("network disabled in tests")


def test_multi30k_missing_files_and_no_network(tmp_path, monkeypatch):
    monkeypatch.setattr(urllib.request, "urlopen", offline)
    monkeypatch.delenv("XATTN_DATA", raising=False)
    with pytest.raises(XattnError, match="nowhere: no such folder"):
        multi30k("de", "en", "val", data_dir=tmp_path / "nowhere")
    with pytest.raises(XattnError, match=f"{tmp_path}: no val.de.gz there"):
        multi30k("de", "en", "val", data_dir=tmp_path)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    with pytest.raises(XattnError, match="cannot download Multi30k val.de.gz.*offline.*XATTN_DATA"):
        multi30k("de", "en", "val")


def test_multi30k_download_goes_to_the_cache(tmp_path, monkeypatch):
    urls = []

    def fake_urlopen(url, timeout):
        urls.append(url)
        return io.BytesIO(gzip.compress(b"line\n"))

    monkeypatch.setattr(urllib.request, "urlopen", fake_urlopen)
    monkeypatch.delenv("XATTN_DATA", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert multi30k("de", "en", "test") == [("line", "line")]
    assert urls[0].endswith("/task1/raw/test_2016_flickr.de.gz")
    assert sorted(os.listdir(tmp_path / "xattn" / "multi30k")) == ["test_2016_flickr.de.gz", "test_2016_flickr.en.gz"]
    multi30k("de", "en", "test")
    assert len(urls) == 2


@pytest.mark.skipif(not MULTI30K.is_dir(), reason=f"no local Multi30k at {MULTI30K}")
@pytest.mark.parametrize("folder", [MULTI30K, MULTI30K.parent])
def test_multi30k_local_copy_via_env(folder, monkeypatch):
    monkeypatch.setattr(urllib.request, "urlopen", offline)
    monkeypatch.setenv("XATTN_DATA", str(folder))
    pairs = multi30k("de", "en", "val")
    assert len(pairs) == 1014 and all(src and tgt for src, tgt in pairs)
    assert pairs[0][1].startswith("A group of men")
    assert len(load_pairs("multi30k", "en", "cs", "test_2016_flickr", size=10)) == 10


def test_a_training_subset_is_a_fixed_random_slice():
    from xattn.config import DataConfig
    from xattn.corpus import read_split
    from xattn.errors import XattnError

    full = read_split(DataConfig(dataset="numbers", numbers_size=300), "train")
    cfg = DataConfig(dataset="numbers", numbers_size=300, train_subset=50)
    subset = read_split(cfg, "train")
    assert len(subset) == 50 and read_split(cfg, "train") == subset
    assert [p for p in full if p in subset] == subset  # drawn from the corpus, in its order
    assert read_split(DataConfig(dataset="numbers", numbers_size=300, train_subset=50, subset_seed=2), "train") != subset
    assert read_split(cfg, "val") == read_split(DataConfig(dataset="numbers", numbers_size=300), "val")
    with pytest.raises(XattnError, match="data.train_subset: 301 is more than the 300 pairs"):
        read_split(DataConfig(dataset="numbers", numbers_size=300, train_subset=301), "train")
