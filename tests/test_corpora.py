"""Several training corpora with weights (xattn/corpora.py): the data.corpora entries, the epoch's draws of each
corpus in the sampler, one prepared directory for all of them, and training on them with exact resume."""
import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

import xattn
from xattn.checks import ConfigError
from xattn.config import load_config
from xattn.corpora import draws, mixture
from xattn.data import TokenBatchSampler
from xattn.data.prepare import prepare
from xattn.data.prepared import MappedCorpus
from xattn.data.store import cache_key
from xattn.training import Trainer, train


def test_the_entries_are_checked_like_config_keys():
    cfg = load_config(None, ["data.corpora=[{src: a.de, tgt: a.en, upsample: 2.5}, {tsv: b.tsv, links: b.links}]"])
    assert [c.get("upsample") for c in cfg.data.corpora] == [2.5, None]
    for overrides, message in (
            (["data.corpora=[{src: a, tgt: b, wieght: 2}]"], r"unknown config key data.corpora\[0\].wieght \(did you mean 'weight'\?\)"),
            (["data.corpora=[{src: a}]"], r"data.corpora\[0\].src: give src and tgt"),
            (["data.corpora=[{src: a, tgt: b, tsv: c}]"], r"data.corpora\[0\].src: give src and tgt"),
            (["data.corpora=[{tsv: a, upsample: 0}]"], r"data.corpora\[0\].upsample: must be > 0"),
            (["data.corpora=[a.tsv]"], r"data.corpora\[0\]: expected a mapping"),
            (["data.corpora=[{tsv: a, upsample: 2}]", "data.weight=1"], r"data.corpora\[0\]: mixes upsample and weight"),
            (["data.corpora=[{tsv: a, weight: 1, upsample: 2}]"], r"data.corpora\[0\]: mixes upsample and weight"),
            (["data.corpora=[{tsv: a, weight: 1}, {tsv: b, upsample: 2}]"],
             r"data.corpora\[1\]: mixes upsample and weight"),
            (["data.corpora=[{tsv: a}]", "data.weight=1", "data.upsample=2"], r"data.weight: mixes upsample and weight"),
            (["data.upsample=2"], "data.upsample: weighs the training corpus against those of data.corpora"),
            (["data.corpora={tsv: a}"], "data.corpora: expected list")):
        with pytest.raises(xattn.XattnError, match=message):
            load_config(None, overrides)


def test_validation_files_that_are_the_training_files_are_told(tmp_path):
    from xattn.corpora import validates_on_training

    for name in ("a.de", "a.en", "b.en", "t.tsv"):
        (tmp_path / name).write_text("x\n")
    (tmp_path / "link.de").symlink_to(tmp_path / "a.de")
    files = lambda **kw: load_config(None, ["data.dataset=null", *(f"data.{k}={tmp_path / v}"  # noqa: E731
                                                                   for k, v in kw.items())]).data
    assert validates_on_training(files(train_src="a.de", train_tgt="a.en", valid_src="link.de", valid_tgt="a.en"))
    assert not validates_on_training(files(train_src="a.de", train_tgt="a.en", valid_src="a.de", valid_tgt="b.en"))
    assert validates_on_training(files(train_tsv="t.tsv", valid_tsv="t.tsv"))
    assert not validates_on_training(files(train_tsv="t.tsv", valid_src="a.de", valid_tgt="a.en"))


def test_upsampling_and_weights_become_copies_per_epoch():
    data = lambda *o: load_config(None, list(o)).data  # noqa: E731
    assert mixture(data("data.corpora=[{tsv: a}]"), [100, 50]) is None
    assert mixture(data("data.corpora=[{tsv: a, upsample: 3}]"), [100, 50]) == ([100, 50], [1.0, 3.0])
    assert mixture(data("data.corpora=[{tsv: a, upsample: 0.5}]", "data.upsample=2"), [100, 50]) == ([100, 50], [2.0, 0.5])
    counts, factors = mixture(data("data.corpora=[{tsv: a, weight: 1}]"), [100, 50])  # equal shares of 150
    assert draws(counts, factors) == [75, 75] and factors == [0.75, 1.5]
    counts, factors = mixture(data("data.corpora=[{tsv: a, weight: 3}, {tsv: b, weight: 1}]", "data.weight=1"), [60, 30, 10])
    assert draws(counts, factors) == [20, 60, 20]
    with pytest.raises(ConfigError, match="lists 1 corpora besides the first, but the prepared directory holds 2"):
        mixture(data("data.corpora=[{tsv: a, upsample: 2}]"), [10, 10, 10])
    with pytest.raises(ConfigError, match=r"^data.corpora\[0\]: no pair of this corpus is left after cleaning"):
        mixture(data("data.corpora=[{tsv: a, weight: 3}]"), [300, 0])  # (else a quarter of the 300 an epoch)


@pytest.mark.parametrize("factors", [(1.0, 3.0), (2.0, 0.5), (0.25, 1.5)])
def test_an_epoch_draws_each_corpus_as_often_as_its_factor_says(factors):
    counts = [200, 120]
    rng = np.random.default_rng(0)
    src, tgt = rng.integers(1, 30, 320), rng.integers(1, 30, 320)
    sampler = TokenBatchSampler(src, tgt, 300, seed=3, mixture=(counts, list(factors)))
    epochs = []
    for epoch in range(3):
        drawn = Counter(i for batch in sampler.batches(epoch) for i in batch)
        per_corpus = [sum(c for i, c in drawn.items() if i < 200), sum(c for i, c in drawn.items() if i >= 200)]
        assert per_corpus == draws(counts, list(factors))
        for k, (start, n, f) in enumerate(((0, 200, factors[0]), (200, 120, factors[1]))):
            times = [drawn[i] for i in range(start, start + n)]  # floor(f) or floor(f) + 1 each
            assert set(times) <= {int(f), int(f) + 1} and sum(t > int(f) for t in times) == round((f - int(f)) * n)
        epochs.append(drawn)
        assert sampler.batches(epoch) == TokenBatchSampler(src, tgt, 300, seed=3, mixture=(counts, list(factors))).batches(epoch)
    if any(f != int(f) for f in factors):  # a new sample of the fraction every epoch
        assert epochs[0] != epochs[1]


def write(folder: Path, name: str, lines: list[str]) -> str:
    (folder / name).write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
    return str(folder / name)


@pytest.fixture
def two_corpora(tmp_path) -> list[str]:
    """A main corpus of 60 pairs (one empty) and a small one of 8 with links, as overrides."""
    main_de = [f"eins zwei {i % 7}" for i in range(59)] + [""]
    main_en = [f"one two {i % 7}" for i in range(60)]
    small_de, small_en = [f"drei vier {i}" for i in range(8)], [f"four three {i}" for i in range(8)]
    return ["data.dataset=null", f"data.train_src={write(tmp_path, 'm.de', main_de)}",
            f"data.train_tgt={write(tmp_path, 'm.en', main_en)}", f"data.valid_src={tmp_path}/m.de",
            f"data.valid_tgt={tmp_path}/m.en", "data.vocab_size=30",
            f"data.corpora=[{{src: {write(tmp_path, 's.de', small_de)}, tgt: {write(tmp_path, 's.en', small_en)}, "
            f"links: {write(tmp_path, 's.links', ['0-1 1-0 2-2'] * 8)}, upsample: 3}}]"]


def test_one_file_in_two_corpora_is_checked_as_each(two_corpora, tmp_path):
    """Two references of one source (the main corpus' source file again in data.corpora): its two records were one,
    keyed by its path, and a run with data.prepared was refused, however often it was prepared again."""
    from xattn.data.store import check_matches

    again = [*two_corpora[:-1], f"data.corpora=[{{src: {tmp_path}/m.de, tgt: {write(tmp_path, 'r.en', ['uno'] * 60)}}}]"]
    cfg = load_config(None, again)
    manifest = prepare(cfg.data, tmp_path / "out", workers=1)
    assert sorted(r["key"] for r in manifest["inputs"].values()) == \
        ["corpora[0].train_src", "corpora[0].train_tgt", "train_src", "train_tgt"]
    check_matches(MappedCorpus.open(tmp_path / "out"), cfg.data, {})  # (refused before)
    (tmp_path / "r.en").write_text("due e\n" * 60)
    with pytest.raises(xattn.XattnError, match=r"^data.corpora\[0\].tgt: .*r.en is not the file .* \(its text differs\)"):
        check_matches(MappedCorpus.open(tmp_path / "out"), cfg.data, {})


def test_the_corpora_are_prepared_one_after_another_and_the_weights_prepare_nothing_again(two_corpora, tmp_path):
    cfg = load_config(None, two_corpora)
    manifest = prepare(cfg.data, tmp_path / "out", workers=1)
    assert manifest["pairs"] == 67 and manifest["corpora"] == [59, 8] and manifest["links"]["pairs"] == 8
    assert sorted(r["key"] for r in manifest["inputs"].values()) == \
        ["corpora[0].train_links", "corpora[0].train_src", "corpora[0].train_tgt", "train_src", "train_tgt"]
    corpus = MappedCorpus.open(tmp_path / "out")
    assert [len(corpus.sentence("links", i)) for i in (0, 58)] == [0, 0] and len(corpus.sentence("links", 59)) > 0
    other_weight = load_config(None, [*two_corpora[:-1], two_corpora[-1].replace("upsample: 3", "upsample: 5")])
    assert cache_key(other_weight.data, {}) == cache_key(cfg.data, {})
    swapped = [o.replace("s.de", "SWAP").replace("m.de", "s.de").replace("SWAP", "m.de") for o in two_corpora]
    assert cache_key(load_config(None, swapped).data, {}) != cache_key(cfg.data, {})


def test_preparing_refuses_a_weighted_corpus_that_cleaning_empties(two_corpora, tmp_path):
    """`prepare` wrote such a directory, and only training refused it (after an hour's preparing, on a large one)."""
    blank = write(tmp_path, "blank.tsv", ["drei\t", "\tthree"])  # a side of no text in every pair: all dropped
    emptied = [*two_corpora[:-1], f"data.corpora=[{{tsv: {blank}, weight: 2}}]", "data.weight=1"]
    with pytest.raises(ConfigError, match=r"^data.corpora\[0\]: no pair of this corpus is left after cleaning"):
        prepare(load_config(None, emptied).data, tmp_path / "out", workers=1)
    assert not (tmp_path / "out").exists()


TINY = ["model.d_model=16", "model.n_heads=2", "model.n_encoder_layers=1", "model.n_decoder_layers=1",
        "model.d_ff=32", "model.share_embeddings=true", "model.tie_output=true", "train.max_tokens=150",
        "train.warmup=5", "train.lr=0.003", "train.amp=none", "train.eval_every=4", "train.eval_bleu_sentences=4",
        "train.log_every=1", "train.threads=1"]


def test_an_epoch_of_no_batch_for_its_processes_is_refused_not_trained_as_done(two_corpora, tmp_path):
    """Draws that round to no pair (or fewer batches than torchrun's processes) trained no step, counted the
    epochs up to train.max_epochs and saved the untrained model as done."""
    from xattn.distributed import Context

    tiny = [*two_corpora[:-1], "data.upsample=0.001", two_corpora[-1].replace("upsample: 3", "upsample: 0.01")]
    with pytest.raises(xattn.XattnError, match="^an epoch draws no training pair: raise data.upsample"):
        train(load_config(None, [*tiny, *TINY, "train.max_steps=12"]), tmp_path / "none", quiet=True)
    assert Context(rank=1, world=2).shard([0, 1, 2]) == [1]
    with pytest.raises(xattn.XattnError, match="^an epoch holds 1 batch of training pairs for 2 training processes"):
        Context(rank=0, world=2).shard([0])


def test_training_on_upsampled_corpora_resumes_exactly(two_corpora, tmp_path, capsys):
    full, parts = tmp_path / "full", tmp_path / "parts"
    train(load_config(None, [*two_corpora, *TINY, "train.max_steps=12"]), full)
    said = capsys.readouterr().out
    assert "corpora: 59 of 59 pairs (1x), 24 of 8 pairs (3x) per epoch, 83 in all" in said
    assert "note: the validation files are the training files" in said  # (this fixture's are: said, not silent)
    train(load_config(None, [*two_corpora, *TINY, "train.max_steps=5"]), parts, quiet=True)
    train(load_config(None, [*two_corpora, *TINY, "train.max_steps=12"]), parts, quiet=True)
    logged = [[json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()] for run in (full, parts)]
    a, b = ({r["step"]: r["loss"] for r in records if "loss" in r} for records in logged)
    assert sorted(a) == sorted(b) == list(range(1, 13)) and max(r.get("epoch", 0) for r in logged[0]) >= 1
    assert [a[s] for s in a] == pytest.approx([b[s] for s in a], rel=1e-6)
    other = [*two_corpora[:-1], two_corpora[-1].replace("upsample: 3", "upsample: 4")]
    with pytest.raises(xattn.XattnError, match=r"data.corpora: \[\{'upsample': 3\}\] -> \[\{'upsample': 4\}\]"):
        Trainer(load_config(None, [*other, *TINY, "train.max_steps=14"]), parts, quiet=True)


def test_a_named_prepared_directory_must_hold_the_corpora_the_config_lists(two_corpora, tmp_path):
    from xattn.data.store import training_corpus

    cfg = load_config(None, two_corpora)
    prepare(cfg.data, tmp_path / "out", workers=1)
    named = load_config(None, [*two_corpora, f"data.prepared={tmp_path / 'out'}"])
    assert training_corpus(named.data).manifest["corpora"] == [59, 8]
    other = two_corpora[-1].replace("s.de", "m.de").replace("s.en", "m.en")
    with pytest.raises(xattn.XattnError, match=r"^data.corpora\[0\].src: .*m.de is not the file .* was prepared from"):
        training_corpus(load_config(None, [*two_corpora[:-1], other, f"data.prepared={tmp_path / 'out'}"]).data)
    more = two_corpora[-1].replace("}]", "}, {tsv: x.tsv}]")
    with pytest.raises(xattn.XattnError, match=r"^data.corpora: .* was prepared from 2 corpora, this run names 3"):
        training_corpus(load_config(None, [*two_corpora[:-1], more, f"data.prepared={tmp_path / 'out'}"]).data)
    with pytest.raises(xattn.XattnError, match=r"^data.corpora: .* was prepared from 2 corpora, this run names 1"):
        training_corpus(load_config(None, [*two_corpora[:-1], f"data.prepared={tmp_path / 'out'}"]).data)
