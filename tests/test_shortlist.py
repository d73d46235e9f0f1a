"""Lexical shortlists: counting, the candidates of a batch, decoding over them (every strategy, every
inference copy), the model directory's file and `xattn shortlist`."""
import numpy as np
import pytest
import torch

import xattn
from xattn.decoding import Vocab, search
from xattn.inference import Speedups, prepare
from xattn.shortlist import FILE, Shortlist, build

from conftest import tiny_config


def test_counts_rank_translations_by_dice_above_frequent_words():
    # source 5 translates as 7, source 6 as 8; target 9 is in every sentence (frequent), 10 in a few
    src = [np.array([5, 3]), np.array([5, 4]), np.array([6, 3]), np.array([6, 4]), np.array([5, 6])]
    tgt = [np.array([7, 9]), np.array([7, 9, 10]), np.array([8, 9]), np.array([8, 9, 10]), np.array([7, 8, 9])]
    sl = build(src, tgt, (12, 12), specials=[2], per_source=2, frequent=1)
    assert sl.frequent.tolist() == [2, 9]
    assert sl.table[5].tolist() == [7, 10]  # dice(5, 7) = 2*3/(3+3), (5, 10) 2*1/(3+2), (5, 8) 2*1/(3+3)
    assert sl.table[6][0] == 8
    assert sl.table[11].tolist() == [-1, -1]  # never seen: only the frequent list
    assert sl.pairs == 5


def test_each_sentences_candidates_are_its_lists_the_frequent_and_its_forced_ids():
    table = np.full((6, 2), -1, np.int32)
    table[3], table[4] = [10, 11], [12, -1]
    sl = Shortlist(np.array([2, 20]), table)
    src = torch.tensor([[3, 2, 0], [4, 0, 0]])
    listed = sl.candidates(src)
    assert listed.ids.tolist() == [2, 10, 11, 12, 20]  # the batch's: the rows of the output projection
    assert listed.allowed.tolist() == [[True, True, True, False, True], [True, False, False, True, True]]
    listed = sl.candidates(src, [7], torch.tensor([[15, 0], [0, 0]]), pad=0)  # a forced prefix: its sentence's
    assert listed.ids.tolist() == [2, 7, 10, 11, 12, 15, 20]
    assert [[i for i, on in zip(listed.ids.tolist(), row) if on] for row in listed.allowed.tolist()] == \
        [[2, 7, 10, 11, 15, 20], [2, 7, 12, 20]]


def model_and_list(seed=0):
    torch.manual_seed(seed)
    model = xattn.Transformer(tiny_config(src_vocab_size=40, tgt_vocab_size=50)).eval()
    src = torch.randint(3, 40, (4, 6))
    src[:, -1] = model.cfg.eos_id
    return model, src


@pytest.mark.parametrize("cfg", [xattn.DecodeConfig(beam_size=1), xattn.DecodeConfig(beam_size=3, n_best=2),
                                 xattn.DecodeConfig(sampling=True, seed=3, num_samples=2)])
def test_decoding_over_the_whole_vocabulary_changes_nothing(cfg):
    model, src = model_and_list()
    every = torch.arange(model.cfg.tgt_vocab_size)
    plain = search(model, src, cfg)
    listed = search(model, src, cfg, vocab=Vocab(every))
    for a, b in zip(plain, listed):
        assert [h.tokens for h in a] == [h.tokens for h in b]
        assert [h.score for h in a] == pytest.approx([h.score for h in b], abs=1e-5)


@pytest.mark.parametrize("speedups", [None, Speedups(), Speedups(quantize="int8")])
@pytest.mark.parametrize("beam", [1, 4])
def test_decoding_produces_only_listed_ids_with_their_own_scores(speedups, beam):
    model, src = model_and_list(1)
    decoder = prepare(model, speedups) if speedups is not None else model
    vocab = torch.tensor([2, 5, 7, 11, 13, 17, 19, 23, 29, 31])  # EOS and a few others
    cfg = xattn.DecodeConfig(beam_size=beam, max_len_a=0, max_len_b=8)
    hyps = search(decoder, src, cfg, vocab=Vocab(vocab))
    for (h,) in hyps:
        assert set(h.tokens) <= set(vocab.tolist())
    # the same search over a model whose other outputs are impossible anyway
    masked = torch.full((model.cfg.tgt_vocab_size,), -1e9)
    masked[vocab] = 0.0
    with torch.no_grad():
        model.generator.bias += masked
    reference = search(prepare(model, speedups) if speedups is not None else model, src, cfg)
    assert [h[0].tokens for h in hyps] == [h[0].tokens for h in reference]
    assert [h[0].score for h in hyps] == pytest.approx([h[0].score for h in reference], abs=0.05 if speedups and
                                                        speedups.quantize else 1e-4)


@pytest.mark.parametrize("cfg", [xattn.DecodeConfig(beam_size=1), xattn.DecodeConfig(beam_size=3, n_best=3),
                                 xattn.DecodeConfig(beam_size=2, coverage_penalty=0.5, stopping="early")])
def test_a_sentence_gets_what_its_own_list_gives_it_whatever_else_is_in_the_batch(cfg):
    """Each sentence is scored over its own list: the same tokens and scores in a batch as alone, though the
    batch's other lists add rows to the output projection."""
    model, src = model_and_list(3)
    rng = np.random.default_rng(0)
    table = rng.choice(np.arange(3, 50), size=(40, 3)).astype(np.int32)
    sl = Shortlist(np.array([2, 4]), table)
    batch = search(model, src, cfg, vocab=sl.candidates(src))
    assert len(sl.candidates(src).ids) > max(len(sl.candidates(src[b:b + 1]).ids) for b in range(len(src)))
    for b, hyps in enumerate(batch):
        (alone,) = search(model, src[b:b + 1], cfg, vocab=sl.candidates(src[b:b + 1]))
        own = set(sl.candidates(src[b:b + 1]).ids.tolist())
        assert [h.tokens for h in hyps] == [h.tokens for h in alone] and all(set(h.tokens) <= own for h in hyps)
        assert [h.score for h in hyps] == pytest.approx([h.score for h in alone], abs=1e-5)


def test_the_model_directory_keeps_it_and_refuses_another_vocabulary(tmp_path):
    sl = Shortlist(np.array([2, 4]), np.array([[3, -1], [5, 6]], np.int32), pairs=7)
    sl.save(tmp_path, {"per_source": 2})
    back = Shortlist.load(tmp_path, 2, 10)
    assert back.frequent.tolist() == [2, 4] and back.table.tolist() == [[3, -1], [5, 6]] and back.pairs == 7
    with pytest.raises(xattn.XattnError, match="another vocabulary"):
        Shortlist.load(tmp_path, 3, 10)
    with pytest.raises(xattn.XattnError, match="another vocabulary"):
        Shortlist.load(tmp_path, 2, 6)
    (tmp_path / FILE).write_bytes(b"not safetensors")
    with pytest.raises(xattn.XattnError, match="not a shortlist"):
        Shortlist.load(tmp_path, 2, 10)
    with pytest.raises(xattn.XattnError, match="no shortlist"):
        Shortlist.load(tmp_path / "elsewhere", 2, 10)


def test_cli_counts_the_training_data_and_translate_uses_it(numbers_model, tmp_path, capsys):
    import shutil

    from xattn.cli.main import main

    model = tmp_path / "model"
    shutil.copytree(numbers_model, model)
    src = tmp_path / "in.de"
    src.write_text("drei\nsiebzehn\nzweihundert eins\n")
    assert main(["translate", str(model), "-i", str(src), "--shortlist"]) == 2
    assert "--shortlist: this model has no shortlist" in capsys.readouterr().err
    assert main(["shortlist", str(model), "--per-source", "3", "--frequent", "5"]) == 0
    assert "counted on 300 sentence pairs of the training data" in capsys.readouterr().out
    translator = xattn.load(model)
    assert translator.shortlist.per_source == 3
    assert main(["translate", str(model), "-i", str(src), "--shortlist", "--beam", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3
    allowed = set(translator.shortlist.candidates(torch.tensor(
        [translator.tokenizers.src.encode(s) + [2] for s in ["drei"]])).ids.tolist())
    out = translator.translate(["drei"], xattn.DecodeConfig(beam_size=2, shortlist=True))[0]
    assert set(translator.tokenizers.tgt.encode(out.text)) <= allowed


def test_the_defaults_fit_a_target_vocabulary_smaller_than_they_are(numbers_model, tmp_path, capsys, monkeypatch):
    """`xattn shortlist MODEL` of a model fine-tuned on few target pieces (65) was an error about --frequent, a flag
    never given: the defaults are capped by the vocabulary; a value given over it is still refused."""
    import shutil

    import xattn.cli.shortlist as verb
    from xattn.cli.main import main

    model = tmp_path / "model"
    shutil.copytree(numbers_model, model)
    size = xattn.load(model).model.cfg.tgt_vocab_size
    monkeypatch.setattr(verb, "PER_SOURCE", size + 1)
    monkeypatch.setattr(verb, "FREQUENT", size + 7)
    assert main(["shortlist", str(model)]) == 0
    assert f"{size} target tokens per source token and " in capsys.readouterr().out  # (the frequent: those seen)
    assert main(["shortlist", str(model), "--frequent", str(size + 1)]) == 2
    assert f"--frequent: {size + 1} is more than the model's {size} target tokens" in capsys.readouterr().err


@pytest.mark.parametrize("args, message", [
    (["--src", "S"], "--src and --tgt go together"),
    (["--src", "S", "--tgt", "T"], "T: ends at line 2, before the other side"),
    (["--per-source", "0"], "--per-source: must be at least 1"),
    (["--per-source", "1000000000"], "--per-source: 1000000000 is more than the model's"),
    (["--frequent", "100000"], "--frequent: 100000 is more than the model's"),
    (["--src", "B", "--tgt", "B"], "B + {tmp}/B: no sentence pair has text on both sides; nothing to count"),
])
def test_cli_refuses_bad_input_in_one_line(numbers_model, tmp_path, capsys, args, message):
    from xattn.cli.main import main

    (tmp_path / "S").write_text("eins\nzwei\ndrei\n")
    (tmp_path / "T").write_text("one\ntwo\n")
    (tmp_path / "B").write_text("\n \n\n")  # blank lines: counted, they replaced a shortlist with the specials alone
    args = [str(tmp_path / a) if a in ("S", "T", "B") else a for a in args]
    message = message.replace("{tmp}", str(tmp_path))
    assert main(["shortlist", str(numbers_model), *args]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
    assert not (numbers_model / FILE).exists()


@pytest.mark.parametrize("cfg", [
    xattn.DecodeConfig(beam_size=1, min_len=4, no_repeat_ngram_size=1, max_len_a=0, max_len_b=7),
    xattn.DecodeConfig(beam_size=3, n_best=3, min_len=2, no_repeat_ngram_size=2, max_len_a=0, max_len_b=9),
    xattn.DecodeConfig(sampling=True, seed=5, num_samples=3, top_k=4, top_p=0.9, min_len=2, max_len_a=0, max_len_b=6)])
def test_constraints_and_prefixes_hold_over_the_listed_columns(cfg):
    model, src = model_and_list(2)
    vocab = torch.tensor([2, 4, 6, 9, 12, 15, 21, 30, 33, 47])
    prefix = torch.tensor([[9, 30], [47, 0], [0, 0], [12, 12]])  # pad-ended; 12 12 against no-repeat: relaxed
    masked = torch.full((model.cfg.tgt_vocab_size,), -1e9)
    masked[vocab] = 0.0
    listed = search(model, src, cfg, prefix, vocab=Vocab(vocab))
    with torch.no_grad():
        model.generator.bias += masked
    reference = search(model, src, cfg, prefix)
    for a, b in zip(listed, reference):
        if not cfg.sampling:  # a sample draws from the same distribution, over other columns: other draws
            assert [h.tokens for h in a] == [h.tokens for h in b]
            assert [h.relaxed for h in a] == [h.relaxed for h in b]
        assert all(set(h.tokens) <= set(vocab.tolist()) and (len(h.tokens) >= 2 or h.relaxed) for h in a)
    assert all(h.tokens[:2] == [9, 30] for h in listed[0]) and all(h.tokens[:1] == [47] for h in listed[1])


def test_a_shortlist_made_for_other_tokenizers_is_refused(numbers_model, tmp_path):
    """Its ids are another tokenizer's pieces, though they may be as many: the file names the tokenizers it was
    counted with (xattn shortlist), and a model directory with others refuses it."""
    import shutil

    from xattn.tokenizer import tokenizer_hashes

    model = tmp_path / "model"
    shutil.copytree(numbers_model, model)
    cfg = xattn.load(model).model.cfg
    table = np.full((cfg.src_vocab_size, 2), -1, np.int32)
    Shortlist(np.array([2]), table).save(model, {"tokenizers": tokenizer_hashes(model)})
    Shortlist.load(model, cfg.src_vocab_size, cfg.tgt_vocab_size)
    Shortlist(np.array([2]), table).save(model, {"tokenizers": {"spm.model": "0" * 64}})
    with pytest.raises(xattn.XattnError, match=r"shortlist.safetensors: made for other tokenizers than this model's"):
        Shortlist.load(model, cfg.src_vocab_size, cfg.tgt_vocab_size)


def test_no_shortlist_turns_off_a_shortlist_the_models_settings_ask_for(numbers_model, tmp_path, capsys):
    """--shortlist could only be turned on: a model whose config.yaml says decode.shortlist but whose list is gone
    could not translate until its config was edited by hand."""
    import shutil

    import yaml

    from xattn.cli.main import main

    model = tmp_path / "model"
    shutil.copytree(numbers_model, model)
    raw = yaml.safe_load((model / "config.yaml").read_text())
    raw["decode"]["shortlist"] = True
    (model / "config.yaml").write_text(yaml.safe_dump(raw))
    src = tmp_path / "in.de"
    src.write_text("drei\n")
    assert main(["translate", str(model), "-i", str(src)]) == 2
    assert "this model has no shortlist" in capsys.readouterr().err
    assert main(["translate", str(model), "-i", str(src), "--no-shortlist"]) == 0
    assert capsys.readouterr().out.strip()
