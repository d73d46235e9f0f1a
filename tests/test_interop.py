"""Hugging Face Marian and CTranslate2 interop: exported models compute what xattn computes.

Reference equality against `MarianMTModel` (teacher-forced logits, greedy `generate`), `MarianTokenizer`
ids, export -> import round trips, a synthetic Helsinki-NLP opus-mt directory (Marian ids unrelated to
SentencePiece's), CTranslate2 greedy output, the CLI verbs, and the tokenizer's optional id table.
"""
import dataclasses
import io
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import sentencepiece as spm
import torch

from xattn.checkpoint import load_model_dir, save_model_dir, weights_of
from xattn.cli.main import main
from xattn.config import DataConfig, DecodeConfig, ModelConfig, RunConfig, load_config
from xattn.decoding import Vocab, search
from xattn.errors import XattnError
from xattn.interop import require
from xattn.interop.marian import activation_of, check_exportable, check_importable, name_map
from xattn.model import Transformer
from xattn.tokenizer import Tokenizer, load_tokenizers, train_sentencepiece, train_tokenizers, vocab_file
from xattn.batching import pad_batch
from xattn.translator import Translator

pytestmark = pytest.mark.filterwarnings("ignore:Recommended. pip install sacremoses")  # MarianTokenizer's advice

EN = "the a one dog cat man woman child runs jumps sits over under near red blue big small ball park street".split()
DE = ("der die ein hund katze mann frau kind rennt springt sitzt über unter neben rot blau groß klein ball park "
      "straße").split()
MAX_LEN = 12

# (tokenizer layout, share_embeddings, tie_output)
VARIANTS = {"joint-tied": (True, True, True), "joint-untied": (True, True, False),
            "separate": (False, False, False), "separate-tied": (False, False, True)}


def parallel(n: int, seed: int) -> tuple[list[str], list[str]]:
    """German and English sentences, word for word (DE[i] translates EN[i])."""
    rnd = random.Random(seed)
    picks = [[rnd.randrange(len(EN)) for _ in range(rnd.randint(2, 7))] for _ in range(n)]
    return ([" ".join(DE[i] for i in p).capitalize() + "." for p in picks],
            [" ".join(EN[i] for i in p).capitalize() + "." for p in picks])


TRAIN_SRC, TRAIN_TGT = parallel(200, seed=0)
SOURCES, TARGETS = parallel(5, seed=1)


def fit(forward, params, src, tgt, pad_id: int, steps: int = 60) -> None:
    """A few Adam steps of teacher forcing: random models emit one token forever; briefly trained ones
    give varied tokens and EOS at varied lengths. forward(src, tgt_in) -> logits; src (B, S), tgt (B, T)."""
    torch.manual_seed(0)
    opt = torch.optim.Adam(params, lr=3e-3)
    for _ in range(steps):
        logits = forward(src, tgt[:, :-1])  # (B, T - 1, V)
        loss = torch.nn.functional.cross_entropy(logits.transpose(1, 2), tgt[:, 1:], ignore_index=pad_id)
        opt.zero_grad()
        loss.backward()
        opt.step()


def make_model_dir(out: Path, joint: bool = True, share: bool = True, tie: bool = True, seed: int = 0, **model) -> Path:
    """A tiny xattn model directory: SentencePiece on generated sentences, seeded weights trained for a moment."""
    pair = train_tokenizers(TRAIN_SRC, TRAIN_TGT, out, vocab_size=100, joint=joint)
    cfg = ModelConfig(**dict(src_vocab_size=pair.src.vocab_size, tgt_vocab_size=pair.tgt.vocab_size, d_model=32,
                             n_heads=4, n_encoder_layers=2, n_decoder_layers=2, d_ff=64, dropout=0.0,
                             share_embeddings=share, tie_output=tie) | model)
    torch.manual_seed(seed)
    net = Transformer(cfg)
    src = batch(pair.src, TRAIN_SRC[:64], cfg.pad_id, last=[cfg.eos_id])
    tgt = batch(pair.tgt, TRAIN_TGT[:64], cfg.pad_id, first=[cfg.bos_id], last=[cfg.eos_id])
    fit(lambda s, t: net(s, t).logits, net.parameters(), src, tgt, cfg.pad_id)
    run = RunConfig(model=cfg, data=DataConfig(joint_vocab=joint, vocab_size=100), decode=DecodeConfig(beam_size=3))
    save_model_dir(out, net.eval(), run)
    return out


def batch(tokenizer: Tokenizer, texts: list[str], pad_id: int, first: list[int] = (), last: list[int] = ()):
    return pad_batch([list(first) + tokenizer.encode(t) + list(last) for t in texts], pad_id)  # (B, L)


def hf_logits(hf, src, tgt, pad_id: int):
    with torch.no_grad():
        return hf(input_ids=src, attention_mask=src.ne(pad_id), decoder_input_ids=tgt).logits  # (B, T, V)


def hf_greedy(hf, src, pad_id: int, eos_id: int) -> list[list[int]]:
    """HF greedy tokens, decoder start and EOS removed; forced EOS after MAX_LEN tokens, as in xattn."""
    with torch.no_grad():
        out = hf.generate(input_ids=src, attention_mask=src.ne(pad_id), num_beams=1, do_sample=False,
                          max_new_tokens=MAX_LEN + 1)
    rows = [row[1:] for row in out.tolist()]
    return [row[: row.index(eos_id)] for row in rows]


def xattn_greedy(model: Transformer, src) -> list[list[int]]:
    hyps = search(model, src, DecodeConfig(beam_size=1, max_len_a=0.0, max_len_b=MAX_LEN))
    return [h[0].tokens for h in hyps]


@pytest.fixture(scope="module")
def transformers():
    return pytest.importorskip("transformers")


@pytest.fixture(scope="module", params=list(VARIANTS))
def exported(request, tmp_path_factory, transformers):
    from xattn.interop.marian import export_marian

    root = tmp_path_factory.mktemp(request.param)
    joint, share, tie = VARIANTS[request.param]
    model_dir = make_model_dir(root / "model", joint, share, tie)
    return model_dir, export_marian(model_dir, root / "hf")


# --------------------------------------------------------------------------------------- HF export

def test_name_map_covers_every_parameter():
    for share, tie in ((True, True), (False, False)):
        cfg = ModelConfig(src_vocab_size=30, tgt_vocab_size=30, d_model=16, n_heads=2, n_encoder_layers=2,
                          n_decoder_layers=1, d_ff=32, share_embeddings=share, tie_output=tie)
        assert set(name_map(cfg)) == set(Transformer(cfg).state_dict())


def test_marian_logits_match(exported, transformers):
    model_dir, hf_dir = exported
    loaded = load_model_dir(model_dir)
    cfg, tok = loaded.model.cfg, loaded.tokenizers
    hf = transformers.MarianMTModel.from_pretrained(hf_dir).eval()
    assert hf.config.share_encoder_decoder_embeddings == cfg.share_embeddings
    assert hf.config.tie_word_embeddings == cfg.tie_output
    src = batch(tok.src, SOURCES, cfg.pad_id, last=[cfg.eos_id])  # (B, S), padded rows
    tgt = batch(tok.tgt, TARGETS, cfg.pad_id, first=[cfg.bos_id])  # (B, T)
    assert src.eq(cfg.pad_id).any() and tgt.eq(cfg.pad_id).any()
    with torch.no_grad():
        ours = loaded.model(src, tgt).logits
    theirs = hf_logits(hf, src, tgt, cfg.pad_id)
    real = tgt.ne(cfg.pad_id)
    torch.testing.assert_close(theirs[real], ours[real], atol=1e-4, rtol=0)


def test_marian_greedy_matches_generate(exported, transformers):
    model_dir, hf_dir = exported
    loaded = load_model_dir(model_dir)
    cfg, tok = loaded.model.cfg, loaded.tokenizers
    hf = transformers.MarianMTModel.from_pretrained(hf_dir).eval()
    src = batch(tok.src, SOURCES, cfg.pad_id, last=[cfg.eos_id])
    ours = xattn_greedy(loaded.model, src)
    assert any(0 < len(o) < MAX_LEN for o in ours)  # some end on their own, not all at once
    assert hf_greedy(hf, src, cfg.pad_id, cfg.eos_id) == ours


def test_marian_tokenizer_encodes_like_xattn(exported, transformers):
    model_dir, hf_dir = exported
    tok = load_tokenizers(model_dir)
    hf_tok = transformers.MarianTokenizer.from_pretrained(hf_dir)
    eos = tok.src.eos_id
    assert hf_tok(SOURCES).input_ids == [tok.src.encode(s) + [eos] for s in SOURCES]
    assert hf_tok(text_target=TARGETS).input_ids == [tok.tgt.encode(t) + [eos] for t in TARGETS]
    ids = tok.tgt.encode(TARGETS[0])
    assert hf_tok.decode(ids + [eos], skip_special_tokens=True) == tok.tgt.decode(ids) == TARGETS[0]
    assert hf_tok.eos_token_id == eos and hf_tok.pad_token_id == tok.src.pad_id


def test_export_import_round_trip(exported, tmp_path):
    from xattn.interop.marian import import_marian

    model_dir, hf_dir = exported
    out = import_marian(hf_dir, tmp_path / "back")
    before, after = load_model_dir(model_dir), load_model_dir(out)
    assert load_config(out / "config.yaml") == load_config(model_dir / "config.yaml")
    a, b = weights_of(before.model), weights_of(after.model)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    names = sorted(p.name for p in model_dir.glob("spm*.model"))
    assert sorted(p.name for p in out.glob("spm*")) == names  # same layout, no id table needed
    assert all((out / n).read_bytes() == (model_dir / n).read_bytes() for n in names)


def test_import_refuses_a_weights_file_that_lacks_a_tensor(exported, tmp_path):
    """transformers would fill a missing tensor with random numbers: a partial checkpoint is refused, named."""
    import shutil

    from safetensors.torch import load_file, save_file

    from xattn.interop.marian import import_marian

    _, hf_dir = exported
    partial = tmp_path / "partial"
    shutil.copytree(hf_dir, partial)
    tensors = load_file(partial / "model.safetensors")
    name = next(k for k in tensors if k.endswith("self_attn.q_proj.weight"))
    del tensors[name]
    save_file(tensors, partial / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(XattnError, match=rf"partial: the weights file lacks 1 tensor\(s\) the model needs, e.g. "
                                         rf"(model\.)?{name.removeprefix('model.')}"):
        import_marian(partial, tmp_path / "back")
    assert not (tmp_path / "back").exists()


def test_import_names_a_damaged_weights_file_and_a_config_that_does_not_fit_it(exported, tmp_path):
    """A weights file cut in half (a download cut short) ended in a traceback; a config.json whose d_model does not
    fit the weights gave 'look at the above report', which was never printed."""
    import json
    import shutil

    from xattn.interop.marian import import_marian

    _, hf_dir = exported
    cut, wide = tmp_path / "cut", tmp_path / "wide"
    for copy in (cut, wide):
        shutil.copytree(hf_dir, copy)
        (copy / "xattn_config.yaml").unlink(missing_ok=True)
    weights = (cut / "model.safetensors").read_bytes()
    (cut / "model.safetensors").write_bytes(weights[: len(weights) // 2])
    with pytest.raises(XattnError, match=r"cut: the weights file is damaged or incomplete \("):
        import_marian(cut, tmp_path / "back")
    config = json.loads((wide / "config.json").read_text())
    (wide / "config.json").write_text(json.dumps(config | {"d_model": 2 * config["d_model"]}))
    with pytest.raises(XattnError, match=r"wide: config.json does not fit the weights: \S+ is \([\d, ]+\) in the "
                                         r"weights file, \([\d, ]+\) by config.json$"):
        import_marian(wide, tmp_path / "back")
    assert not (tmp_path / "back").exists()


def test_import_refuses_what_the_model_it_would_write_could_not_be_loaded_with_or_would_silently_drop(exported, tmp_path):
    """A config.json of fewer layers than the weights (transformers drops the rest: the import translated otherwise,
    exit 0), NaN weights and a vocab.json shorter than the embeddings (imported, exit 0, then refused by every verb
    that loads the model) are refused by the import itself, naming the Hugging Face directory's file."""
    import json
    import shutil

    from safetensors.torch import load_file, save_file

    from xattn.interop.marian import import_marian

    _, hf_dir = exported
    fewer, nan, short = tmp_path / "fewer", tmp_path / "nan", tmp_path / "short"
    for copy in (fewer, nan, short):
        shutil.copytree(hf_dir, copy)
        (copy / "xattn_config.yaml").unlink(missing_ok=True)
    config = json.loads((fewer / "config.json").read_text())
    assert config["encoder_layers"] >= 2
    (fewer / "config.json").write_text(json.dumps(config | {"encoder_layers": config["encoder_layers"] - 1}))
    with pytest.raises(XattnError, match=r"fewer: config.json does not fit the weights: the weights file holds \d+ "
                                         r"tensor\(s\) the config has no place for, e.g. \S*encoder.layers.\d+\."):
        import_marian(fewer, tmp_path / "back")
    tensors = load_file(nan / "model.safetensors")
    name = next(k for k in tensors if k.endswith("fc1.weight"))
    tensors[name][0, 0] = float("nan")
    save_file(tensors, nan / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(XattnError, match=r"nan: the weights hold NaN or infinite values \(in \S+fc1.weight, as "
                                         r"imported\)"):
        import_marian(nan, tmp_path / "back")
    vocab = json.loads((short / "vocab.json").read_text())
    (short / "vocab.json").write_text(json.dumps(dict(list(vocab.items())[:-3])))
    with pytest.raises(XattnError, match=rf"short/vocab.json: has {len(vocab) - 3} ids for the source, but the "
                                         rf"weights' source embedding has {len(vocab)} rows"):
        import_marian(short, tmp_path / "back")
    assert not (tmp_path / "back").exists()


def test_export_refuses_unsupported_models(tmp_path):
    for key, value in (("norm", "pre"), ("positions", "learned"), ("score", "dot")):
        cfg = ModelConfig(src_vocab_size=30, tgt_vocab_size=30, d_model=16, n_heads=2, n_encoder_layers=1,
                          n_decoder_layers=1, d_ff=32, **{key: value})
        with pytest.raises(XattnError, match=f"model.{key}='{value}'"):
            check_exportable(Transformer(cfg))


def test_import_refuses_unsupported_configs():
    base = dict(model_type="marian", encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
                decoder_ffn_dim=64, activation_function="relu", scale_embedding=True)
    check_importable(base, "config.json")
    for key, value in (("normalize_before", True), ("activation_function", "tanh"), ("scale_embedding", False),
                       ("decoder_ffn_dim", 32), ("model_type", "bart"), ("static_position_embeddings", False)):
        with pytest.raises(XattnError, match=key):
            check_importable(base | {key: value}, "config.json")
    for key, value, shown in (("d_model", "x", '"x"'), ("max_position_embeddings", -1, "-1"),
                              ("encoder_layers", 2.0, "2.0"), ("pad_token_id", True, "true")):  # (the hub's traceback)
        with pytest.raises(XattnError, match=rf"^config.json: {key} must be a whole number >= [01], got {shown}$"):
            check_importable(base | {key: value}, "config.json")
    for key, value, expected in (("vocab_size", "32000", 'vocab_size must be a whole number >= 1, got "32000"'),
                                 ("scale_embedding", 1, "scale_embedding must be true or false, got 1"),
                                 ("share_encoder_decoder_embeddings", "true",
                                  'share_encoder_decoder_embeddings must be true or false, got "true"'),
                                 ("dropout", None, "dropout must be a number, got null")):  # (transformers' strict
        with pytest.raises(XattnError, match=rf"^config.json: {expected}$"):           # config class: a traceback)
            check_importable(base | {key: value}, "config.json")
    check_importable(base | {"decoder_vocab_size": None, "dropout": 0}, "config.json")
    check_importable(base | {"bos_token_id": None}, "config.json")  # (as transformers writes it: not read)
    ct2 = {"add_source_bos": False, "add_source_eos": False, "bos_token": "<s>", "eos_token": "</s>"}  # (exported)
    with pytest.raises(XattnError, match=r"^config.json: names no model_type, so it is no Hugging Face model's config "
                                         r"\(a CTranslate2 model directory's, say\)"):  # (was: scale_embedding=False)
        check_importable(ct2, "config.json")
    for name, ours in (("relu", "relu"), ("gelu", "gelu"), ("swish", "swish"), ("silu", "swish"), ("tanh", None),
                       (["relu"], None)):
        assert activation_of(name) == ours  # every activation xattn has (registry.ACTIVATIONS), by HF's names too


def test_missing_optional_package_is_one_line(tmp_path, monkeypatch, capsys):
    with pytest.raises(XattnError, match="pip install xattn_no_such_package$"):
        require("xattn_no_such_package")
    for package, fmt in (("transformers", "hf"), ("ctranslate2", "ct2")):
        monkeypatch.setitem(sys.modules, package, None)  # import fails as if not installed
        assert main(["export", str(tmp_path / "model"), str(tmp_path / "out"), "--format", fmt]) == 2
        assert capsys.readouterr().err == f"xattn export: error: this needs the optional package {package}: " \
                                          f"pip install {package}\n"
        monkeypatch.undo()


# ------------------------------------------------------------------------------- opus-mt-like import

def plain_spm(texts: list[str], vocab_size: int = 60) -> bytes:
    """A SentencePiece model with SentencePiece's default ids (unk 0, bos 1, eos 2, no pad), as opus-mt ships."""
    out = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(texts), model_writer=out, vocab_size=vocab_size,
                                   hard_vocab_limit=False, minloglevel=2, num_threads=1)
    return out.getvalue()


def marian_vocab(spm_files: list[bytes], size: int, seed: int) -> dict[str, int]:
    """Marian's numbering: </s> 0, <unk> 1, pieces in an order unrelated to SentencePiece's, <pad> = size - 1."""
    pieces = set()
    for model in spm_files:
        sp = spm.SentencePieceProcessor(model_proto=model)
        pieces |= {sp.id_to_piece(i) for i in range(sp.get_piece_size())}
    pieces = sorted(pieces - {"<s>", "</s>", "<unk>"})
    random.Random(seed).shuffle(pieces)
    pieces += [f"▁unused{i}" for i in range(size - 3 - len(pieces))]
    return {p: i for i, p in enumerate(["</s>", "<unk>", *pieces, "<pad>"])}


def make_opus_dir(out: Path, transformers, shared: bool) -> Path:
    """What a converted Helsinki-NLP opus-mt directory holds, with a tiny random model (fp16, as on the Hub)."""
    out.mkdir()
    source, target = plain_spm(TRAIN_SRC), plain_spm(TRAIN_TGT)
    size = 140 if shared else 70  # the converter needs equal source and target sizes
    src_vocab = marian_vocab([source, target] if shared else [source], size, seed=1)
    tgt_vocab = src_vocab if shared else marian_vocab([target], size, seed=2)
    pad = size - 1
    config = transformers.MarianConfig(
        vocab_size=size, decoder_vocab_size=size, d_model=32, encoder_layers=2, decoder_layers=1,
        encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64,
        activation_function="swish", max_position_embeddings=512, scale_embedding=True, pad_token_id=pad,
        eos_token_id=0, forced_eos_token_id=0, bos_token_id=0, decoder_start_token_id=pad,
        share_encoder_decoder_embeddings=shared, tie_word_embeddings=True)
    torch.manual_seed(3)
    hf = transformers.MarianMTModel(config)
    with torch.no_grad():
        for emb in (hf.model.encoder.embed_tokens, hf.model.decoder.embed_tokens):
            emb.weight[pad] = 0.0  # the converter's zero <pad> row: the decoder starts from a zero vector
        hf.final_logits_bias.normal_(0.0, 0.3)

    def ids(model: bytes, vocab: dict[str, int], texts: list[str], first: list[int]) -> torch.Tensor:
        sp = spm.SentencePieceProcessor(model_proto=model)
        return pad_batch([first + [vocab.get(p, 1) for p in sp.encode(t, out_type=str)] + [0] for t in texts], pad)

    src, tgt = ids(source, src_vocab, TRAIN_SRC[:64], []), ids(target, tgt_vocab, TRAIN_TGT[:64], [pad])
    fit(lambda s, t: hf(input_ids=s, attention_mask=s.ne(pad), decoder_input_ids=t).logits, hf.parameters(),
        src, tgt, pad)
    hf.generation_config = transformers.GenerationConfig(
        bad_words_ids=[[pad]], decoder_start_token_id=pad, eos_token_id=0, forced_eos_token_id=0, pad_token_id=pad,
        num_beams=4, max_length=512)
    hf.half().save_pretrained(out)
    extra = dict(normalize_before=False, normalize_embedding=False, static_position_embeddings=True,
                 add_bias_logits=False, add_final_layer_norm=False, extra_pos_embeddings=size)
    (out / "config.json").write_text(json.dumps(json.loads((out / "config.json").read_text()) | extra))
    (out / "source.spm").write_bytes(source)
    (out / "target.spm").write_bytes(target)
    (out / "vocab.json").write_text(json.dumps(src_vocab, ensure_ascii=False))
    if not shared:
        (out / "target_vocab.json").write_text(json.dumps(tgt_vocab, ensure_ascii=False))
    (out / "tokenizer_config.json").write_text(json.dumps(
        dict(source_lang="de", target_lang="en", separate_vocabs=not shared, model_max_length=512)))
    return out


def test_a_language_code_is_one_token_as_marian_tokenizer_makes_it(tmp_path, transformers):
    """A multilingual opus-mt model (en-ROMANCE) reads the target language from a leading `>>fr<<`, which its vocabulary
    holds and its SentencePiece model does not: SentencePiece cut it into pieces, and the output language was any."""
    from xattn.interop.marian import import_marian

    hf_dir = make_opus_dir(tmp_path / "opus", transformers, True)
    vocab = json.loads((hf_dir / "vocab.json").read_text())
    for old, code in zip(sorted(p for p in vocab if p.startswith("▁unused"))[:2], (">>fr<<", ">>es<<")):
        vocab[code] = vocab.pop(old)
    (hf_dir / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False))
    tok = load_tokenizers(import_marian(hf_dir, tmp_path / "model")).src
    texts = [f">>fr<< {SOURCES[0]}", f">>es<<{SOURCES[1]}", f">>xx<< {SOURCES[2]}", SOURCES[3], ">>fr<<"]
    ours = [tok.encode(t) + [0] for t in texts]
    assert ours[0][0] == vocab[">>fr<<"] and ours[1][0] == vocab[">>es<<"] and ours[2][0] == vocab["<unk>"]
    assert ours == transformers.MarianTokenizer.from_pretrained(hf_dir)(texts).input_ids


@pytest.mark.parametrize("shared", [True, False], ids=["shared-vocab", "separate-vocabs"])
def test_opus_mt_like_import(tmp_path, transformers, shared):
    from xattn.interop.marian import export_marian, import_marian

    hf_dir = make_opus_dir(tmp_path / "opus", transformers, shared)
    out = import_marian(hf_dir, tmp_path / "model")
    assert (out / ("spm.src.vocab.json")).is_file() and (out / ("spm.tgt.vocab.json")).is_file()
    translator = Translator.from_dir(out, device="cpu")
    model, tok, cfg = translator.model, translator.tokenizers, translator.model.cfg
    pad = 139 if shared else 69
    assert (cfg.pad_id, cfg.bos_id, cfg.eos_id) == (pad, pad, 0)
    assert (cfg.share_embeddings, cfg.tie_output) == (shared, True)
    assert translator.decode_config.beam_size == 4  # generation_config.json's num_beams (it was xattn's default)
    hf_tok = transformers.MarianTokenizer.from_pretrained(hf_dir)
    hf = transformers.MarianMTModel.from_pretrained(hf_dir, dtype=torch.float32).eval()
    src = batch(tok.src, SOURCES, cfg.pad_id, last=[cfg.eos_id])
    assert src.tolist() == hf_tok(SOURCES, padding=True).input_ids  # pad is V - 1 on both sides
    assert [tok.tgt.encode(t) + [0] for t in TARGETS] == hf_tok(text_target=TARGETS).input_ids
    tgt = batch(tok.tgt, TARGETS, cfg.pad_id, first=[cfg.bos_id])
    with torch.no_grad():
        ours = model(src, tgt).logits
    real = tgt.ne(cfg.pad_id)
    real[:, 0] = True  # the start token is <pad> here
    torch.testing.assert_close(hf_logits(hf, src, tgt, cfg.pad_id)[real], ours[real], atol=1e-4, rtol=0)
    greedy = xattn_greedy(model, src)
    assert any(0 < len(g) < MAX_LEN for g in greedy)
    assert hf_greedy(hf, src, cfg.pad_id, cfg.eos_id) == greedy
    texts = [t.text for t in translator.translate(SOURCES, DecodeConfig(beam_size=1, max_len_a=0.0, max_len_b=MAX_LEN))]
    assert texts == [hf_tok.decode(g, skip_special_tokens=True) for g in greedy]
    again = export_marian(out, tmp_path / "again")  # Marian ids survive the way back
    assert transformers.MarianTokenizer.from_pretrained(again)(SOURCES, padding=True).input_ids == src.tolist()
    hf_again = transformers.MarianMTModel.from_pretrained(again).eval()
    torch.testing.assert_close(hf_logits(hf_again, src, tgt, cfg.pad_id), hf_logits(hf, src, tgt, cfg.pad_id),
                               atol=1e-5, rtol=0)


def test_opus_mt_import_of_languages_outside_multi30k_names_no_dataset(tmp_path, transformers):
    """opus-mt covers hundreds of pairs: an en->es import loads and translates, its config names no dataset (it
    was not trained on Multi30k), and `evaluate` without files asks for them instead of scoring Multi30k."""
    from xattn.interop.marian import import_marian

    hf_dir = make_opus_dir(tmp_path / "opus", transformers, shared=True)
    options = json.loads((hf_dir / "tokenizer_config.json").read_text())
    (hf_dir / "tokenizer_config.json").write_text(json.dumps(options | dict(source_lang="en", target_lang="es")))
    out = import_marian(hf_dir, tmp_path / "model")
    translator = Translator.from_dir(out, device="cpu")
    data = translator.config.data
    assert (data.dataset, data.src_lang, data.tgt_lang) == (None, "en", "es")
    assert len(translator.translate(SOURCES[:2], DecodeConfig(beam_size=1))) == 2
    result = _run("evaluate", str(out))
    assert result.returncode == 2 and "give --src and --ref" in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


# ------------------------------------------------------------------------------------- tokenizer table

def test_tokenizer_id_table(tmp_path):
    tok = train_sentencepiece(TRAIN_TGT, tmp_path / "spm.model", vocab_size=60)
    own = tok.vocab
    pieces = sorted(own, key=own.get)
    order = [pieces[2], pieces[3], *random.Random(0).sample(pieces[4:], len(pieces) - 4), pieces[0], pieces[1]]
    table = {p: i for i, p in enumerate(order)}  # eos 0, unk 1, ..., pad, bos last
    vocab_file(tmp_path / "spm.model").write_text(json.dumps(table))
    mapped = Tokenizer.load(tmp_path / "spm.model")
    text = "The dog runs over the red ball."
    assert mapped.encode(text) == [table[p] for p in tok.pieces(tok.encode(text))]
    assert mapped.encode_batch([text]) == [mapped.encode(text)]
    assert (mapped.eos_id, mapped.unk_id, mapped.pad_id, mapped.bos_id) == (0, 1, len(order) - 2, len(order) - 1)
    assert mapped.decode([mapped.bos_id, *mapped.encode(text), mapped.eos_id, mapped.pad_id]) == text
    assert mapped.pieces(mapped.encode(text)) == tok.pieces(tok.encode(text))
    assert mapped.vocab == table and mapped.vocab_size == len(order)
    assert 1 in mapped.encode("Ünïcödé")  # unknown characters -> the table's <unk>
    train_sentencepiece(TRAIN_TGT, tmp_path / "spm.model", vocab_size=60)
    assert not vocab_file(tmp_path / "spm.model").exists()  # a retrained model drops the stale table
    assert Tokenizer.load(tmp_path / "spm.model").vocab == own


def test_tokenizer_id_table_errors(tmp_path):
    train_sentencepiece(TRAIN_TGT, tmp_path / "spm.model", vocab_size=60)
    vocab_file(tmp_path / "spm.model").write_text(json.dumps({"a": 1, "b": 1}))
    with pytest.raises(XattnError, match="share an id"):
        Tokenizer.load(tmp_path / "spm.model")
    vocab_file(tmp_path / "spm.model").write_text("[1, 2]")
    with pytest.raises(XattnError, match="piece -> non-negative integer id"):
        Tokenizer.load(tmp_path / "spm.model")


# ------------------------------------------------------------------------------------------- CTranslate2

@pytest.mark.parametrize("variant", ["joint-tied", "separate"])
def test_ct2_greedy_matches_xattn(tmp_path, transformers, variant):
    ctranslate2 = pytest.importorskip("ctranslate2")
    from xattn.interop.ct2 import export_ct2

    joint, share, tie = VARIANTS[variant]
    model_dir = make_model_dir(tmp_path / "model", joint, share, tie, seed=1)
    out = export_ct2(model_dir, tmp_path / "ct2")
    assert (out / "model.bin").is_file() and (out / "source.spm").is_file()
    loaded = load_model_dir(model_dir)
    cfg, tok = loaded.model.cfg, loaded.tokenizers
    src = batch(tok.src, SOURCES, cfg.pad_id, last=[cfg.eos_id])
    ours = [tok.tgt.pieces(ids) for ids in xattn_greedy(loaded.model, src)]
    assert all(len(o) < MAX_LEN for o in ours) and any(ours)
    pieces = [tok.src.pieces(tok.src.encode(s)) + ["</s>"] for s in SOURCES]
    translator = ctranslate2.Translator(str(out), device="cpu", intra_threads=1)
    never = [[tok.tgt.pieces([i])[0]] for i in (cfg.pad_id, cfg.bos_id)]  # xattn never produces these
    results = translator.translate_batch(pieces, beam_size=1, max_decoding_length=MAX_LEN, suppress_sequences=never)
    assert [r.hypotheses[0] for r in results] == ours
    quantized = export_ct2(model_dir, tmp_path / "ct2-int8", quantization="int8")
    outputs = ctranslate2.Translator(str(quantized), device="cpu", intra_threads=1).translate_batch(pieces, beam_size=1)
    assert len(outputs) == len(SOURCES)


def test_ct2_with_the_exported_shortlist_matches_xattn_with_it(tmp_path, transformers):
    ctranslate2 = pytest.importorskip("ctranslate2")
    from xattn.interop.ct2 import export_ct2
    from xattn.shortlist import build

    model_dir = make_model_dir(tmp_path / "model", *VARIANTS["separate"], seed=1)
    loaded = load_model_dir(model_dir)
    cfg, tok = loaded.model.cfg, loaded.tokenizers
    shortlist = build([np.array(tok.src.encode(s)) for s in SOURCES], [np.array(tok.tgt.encode(s)) for s in SOURCES[::-1]],
                      (cfg.src_vocab_size, cfg.tgt_vocab_size), [cfg.eos_id, tok.tgt.unk_id], per_source=2, frequent=3)
    shortlist.save(model_dir, {})
    out = export_ct2(model_dir, tmp_path / "ct2")
    assert (out / "vmap.txt").is_file()
    src = batch(tok.src, SOURCES, cfg.pad_id, last=[cfg.eos_id])
    vocab = shortlist.candidates(src).ids  # CTranslate2's vocabulary map: the batch's lists for every sentence
    assert len(vocab) < cfg.tgt_vocab_size / 2
    ours = [tok.tgt.pieces(h[0].tokens) for h in search(loaded.model, src, DecodeConfig(
        beam_size=1, max_len_a=0.0, max_len_b=MAX_LEN), vocab=Vocab(vocab))]
    assert any(ours) and all(len(o) < MAX_LEN for o in ours) and all(set(tok.tgt.encode(" ".join(o))) <= set(vocab.tolist()) for o in ours if o)
    pieces = [tok.src.pieces(tok.src.encode(s)) + ["</s>"] for s in SOURCES]
    never = [[tok.tgt.pieces([i])[0]] for i in (cfg.pad_id, cfg.bos_id)]
    translator = ctranslate2.Translator(str(out), device="cpu", intra_threads=1)
    results = translator.translate_batch(pieces, beam_size=1, max_decoding_length=MAX_LEN, suppress_sequences=never,
                                         use_vmap=True)
    assert [r.hypotheses[0] for r in results] == ours


def test_the_decoding_settings_generate_has_are_exported_and_the_others_named(tmp_path, transformers, capsys):
    """Only the special ids, num_beams and max_length were written: a sampling model exported as a 5-beam search,
    min_len, no_repeat_ngram_size and n_best were dropped, and nothing said so."""
    from xattn.config import save_config

    model_dir = make_model_dir(tmp_path / "model", seed=3)
    run = load_config(model_dir / "config.yaml")
    for name, decode, expected, note in (
            ("beam", dict(beam_size=3, n_best=2, min_len=2, no_repeat_ngram_size=3, length_penalty=0.6,
                          coverage_penalty=0.2),
             dict(num_beams=3, num_return_sequences=2, min_new_tokens=2, no_repeat_ngram_size=3, length_penalty=0.6,
                  early_stopping="never"),
             "generate() does not apply decode.length_penalty=0.6 (generate divides by len ** alpha, xattn by GNMT's "
             "((5 + len) / 6) ** alpha); decode.coverage_penalty=0.2; xattn_config.yaml keeps them, for an import "
             "back"),
            ("sampling", dict(sampling=True, temperature=0.7, top_k=5, top_p=0.9, num_samples=2),
             dict(do_sample=True, num_beams=1, temperature=0.7, top_k=5, top_p=0.9, num_return_sequences=2), None),
            ("early", dict(beam_size=4, stopping="early", length_penalty=0.0), dict(num_beams=4, early_stopping=True),
             None)):
        save_config(dataclasses.replace(run, decode=DecodeConfig(**decode)), model_dir / "config.yaml")
        assert main(["export", str(model_dir), str(tmp_path / name), "--format", "hf"]) == 0
        written = json.loads((tmp_path / name / "generation_config.json").read_text())
        assert {k: written.get(k) for k in expected} == expected
        err = capsys.readouterr().err
        assert (f"xattn export: note: {note}\n" == err) if note else err == ""
    generation = transformers.GenerationConfig.from_pretrained(tmp_path / "sampling")
    assert generation.do_sample and generation.top_k == 5  # (transformers reads it back)


def test_a_model_without_encoder_layers_goes_to_hugging_face_and_back(tmp_path, transformers):
    """Its export worked (the CTranslate2 export's refusal advises it) and its import was refused: encoder_layers=0."""
    model_dir = make_model_dir(tmp_path / "model", n_encoder_layers=0)
    assert main(["export", str(model_dir), str(tmp_path / "hf"), "--format", "hf"]) == 0
    assert main(["import", str(tmp_path / "hf"), str(tmp_path / "back")]) == 0
    loaded, back = load_model_dir(model_dir), load_model_dir(tmp_path / "back")
    a, tok, b = loaded.model, loaded.tokenizers, back.model
    assert b.cfg.n_encoder_layers == 0
    src = batch(tok.src, SOURCES, a.cfg.pad_id, last=[a.cfg.eos_id])
    tgt = batch(tok.tgt, TARGETS, a.cfg.pad_id, first=[a.cfg.bos_id])
    with torch.no_grad():
        torch.testing.assert_close(b(src, tgt).logits, a(src, tgt).logits, atol=1e-5, rtol=0)


def test_an_import_takes_the_beam_of_generation_config_json(tmp_path, transformers):
    from xattn.interop.marian import import_marian

    hf_dir = make_opus_dir(tmp_path / "opus", transformers, True)
    (hf_dir / "generation_config.json").write_text(json.dumps({"num_beams": 0}))
    with pytest.raises(XattnError, match=r"generation_config.json: num_beams: must be in \[1, 1024\], got 0$"):
        import_marian(hf_dir, tmp_path / "model")
    (hf_dir / "generation_config.json").write_text(json.dumps({"num_beams": 6}))
    assert load_config(import_marian(hf_dir, tmp_path / "model") / "config.yaml").decode.beam_size == 6


def test_a_model_that_decodes_over_its_shortlist_exports_and_imports_back_without_it(tmp_path, transformers):
    """The export carries no shortlist.safetensors, but kept decode.shortlist: true, which the import restored, so the
    imported model refused every translation ("this model has no shortlist")."""
    from xattn.config import save_config
    from xattn.shortlist import build

    model_dir = make_model_dir(tmp_path / "model", seed=2)
    loaded = load_model_dir(model_dir)
    cfg, tok = loaded.model.cfg, loaded.tokenizers
    build([np.array(tok.src.encode(s)) for s in SOURCES], [np.array(tok.tgt.encode(s)) for s in SOURCES],
          (cfg.src_vocab_size, cfg.tgt_vocab_size), [cfg.eos_id, tok.tgt.unk_id], per_source=2, frequent=3
          ).save(model_dir, {})
    run = load_config(model_dir / "config.yaml")
    save_config(dataclasses.replace(run, decode=dataclasses.replace(run.decode, shortlist=True)), model_dir / "config.yaml")
    assert main(["export", str(model_dir), str(tmp_path / "hf"), "--format", "hf"]) == 0
    assert main(["import", str(tmp_path / "hf"), str(tmp_path / "back")]) == 0
    assert load_config(tmp_path / "back" / "config.yaml").decode.shortlist is False
    (tmp_path / "in.txt").write_text(SOURCES[0] + "\n")
    assert main(["translate", str(tmp_path / "back"), "-i", str(tmp_path / "in.txt"), "-o", str(tmp_path / "out.txt")]) == 0
    assert (tmp_path / "out.txt").read_text().count("\n") == 1


# --------------------------------------------------------------------------------------------------- CLI

def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "xattn", *args], capture_output=True, text=True, timeout=300,
                          env=os.environ | {"OMP_NUM_THREADS": "1"})


def test_cli_export_import(tmp_path, transformers):
    model_dir = make_model_dir(tmp_path / "model", joint=False, share=False, tie=False)
    result = _run("export", str(model_dir), str(tmp_path / "hf"), "--format", "hf")
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "hf" / "config.json").is_file() and (tmp_path / "hf" / "target_vocab.json").is_file()
    result = _run("import", str(tmp_path / "hf"), str(tmp_path / "back"))
    assert result.returncode == 0, result.stderr
    a, b = weights_of(load_model_dir(model_dir).model), weights_of(load_model_dir(tmp_path / "back").model)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_cli_errors_are_one_line(tmp_path, transformers):
    pre = make_model_dir(tmp_path / "pre", norm="pre")
    cases = [
        (("export", str(pre), str(tmp_path / "out")), "model.norm='pre'"),
        (("export", str(pre), str(tmp_path / "out"), "--quantization", "int8"), "--format ct2 only"),
        (("import", str(tmp_path / "pre"), str(tmp_path / "out")), "no config.json"),
        (("import", str(tmp_path / "hf-spm"), str(tmp_path / "out")), f"{tmp_path}/hf-spm/source.spm: not a "
                                                                      "SentencePiece model"),  # (its temporary copy)
    ]
    hf = tmp_path / "hf-spm"
    assert _run("export", str(make_model_dir(tmp_path / "plain")), str(hf), "--format", "hf").returncode == 0
    (hf / "source.spm").write_bytes(b"not a model")
    for args, message in cases:
        result = _run(*args)
        assert result.returncode == 2, (args, result.stderr)
        assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert not (tmp_path / "out").exists()
    post = make_model_dir(tmp_path / "post")
    result = _run("export", str(post), str(pre))  # not an empty directory
    assert result.returncode == 2 and "not an empty directory" in result.stderr


def test_ct2_export_refuses_a_model_without_encoder_layers_and_its_leftovers_go(tmp_path, capsys):
    pytest.importorskip("ctranslate2")
    from conftest import tiny_model_dir
    from xattn.interop.ct2 import export_ct2

    tiny_model_dir(tmp_path / "model", n_encoder_layers=0)
    (tmp_path / ".ct2.tmp-999999999.hf.abc").mkdir()  # what a killed export's Hugging Face step left
    with pytest.raises(XattnError, match=r"^format: ct2: CTranslate2 cannot load a model without encoder layers "
                                         r"\(model.n_encoder_layers=0\); export it as hf instead$"):
        export_ct2(tmp_path / "model", tmp_path / "ct2")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]
    from xattn.cli.main import main  # the command line names its flag
    assert main(["export", str(tmp_path / "model"), str(tmp_path / "ct2"), "--format", "ct2"]) == 2
    assert "error: --format: ct2: CTranslate2 cannot load" in capsys.readouterr().err
