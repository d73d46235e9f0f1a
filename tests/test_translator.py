import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import xattn
from tests.conftest import tiny_model_dir
from tests.test_decoding import eos_model
from xattn.errors import ParameterError
from xattn.batching import token_batches
from xattn.translator import Translation, Translator, load

WORDS = ["<pad>", "<s>", "</s>", "<unk>"] + [f"w{i}" for i in range(4, 30)]


class WordTokenizer:
    """Whitespace words over a fixed vocabulary; the Tokenizer interface of xattn.tokenizer."""

    pad_id, bos_id, eos_id, unk_id = 0, 1, 2, 3

    def encode(self, text: str) -> list[int]:
        return [WORDS.index(w) if w in WORDS else self.unk_id for w in text.split()]

    def encode_batch(self, texts, name: str = "texts") -> list[list[int]]:
        return [self.encode(text) for text in texts]

    def decode(self, ids) -> str:
        return " ".join(WORDS[i] for i in ids if i > self.eos_id)

    def pieces(self, ids) -> list[str]:
        return [WORDS[i] for i in ids]


TEXTS = ["w5 w6 w7 w8 w9 w10", "w11", "w12 w13 w14", "w15 w16 w17 w18 w19 w20 w21 w22 w23", "w24 w25"]


@pytest.fixture
def translator():
    tok = WordTokenizer()
    return Translator(eos_model(), SimpleNamespace(src=tok, tgt=tok, joint=True), device="cpu")


def texts_and_scores(results, expected=None):
    """Texts exactly; scores to 1e-5 (attention requests take the explicit attention path, equal to ~1e-7):
    compare texts_and_scores(a) == texts_and_scores(b, expected=True)."""
    return [(r.text, pytest.approx(r.score, abs=1e-5) if expected else r.score) for r in results]


@pytest.mark.parametrize("beam_size", [1, 3])
def test_input_order_restored_across_batches(translator, beam_size):
    cfg = xattn.DecodeConfig(beam_size=beam_size, n_best=1, max_tokens=12 * beam_size)
    assert len(token_batches([len(t.split()) + 1 for t in TEXTS], cfg.max_tokens, beam_size)) > 2
    together = translator.translate(TEXTS, cfg)
    alone = [translator.translate([text], cfg)[0] for text in TEXTS]
    assert [r.text for r in together] == [r.text for r in alone]
    assert [r.score for r in together] == pytest.approx([r.score for r in alone], abs=1e-5)
    assert [r.src_tokens for r in together] == [t.split() + ["</s>"] for t in TEXTS]
    assert len({r.text for r in together}) > 1


def test_batches_fit_token_budget(translator, monkeypatch):
    shapes = []
    search = xattn.translator.search_steps

    def recording_search(model, src, cfg, *args, **kwargs):
        shapes.append(tuple(src.shape))
        return search(model, src, cfg, *args, **kwargs)

    monkeypatch.setattr(xattn.translator, "search_steps", recording_search)
    cfg = xattn.DecodeConfig(beam_size=3, max_tokens=40)
    translator.translate(TEXTS * 3, cfg)
    assert sum(b for b, _ in shapes) == 15 and len(shapes) > 3
    assert all(b == 1 or cfg.beam_size * b * s <= cfg.max_tokens for b, s in shapes)
    assert any(b > 1 for b, _ in shapes)


def test_translation_matches_search(translator):
    cfg = xattn.DecodeConfig(beam_size=3, n_best=1)
    [result] = translator.translate([TEXTS[0]], cfg)
    src = torch.tensor([[WORDS.index(w) for w in TEXTS[0].split()] + [2]])
    [[hyp]] = xattn.decoding.search(translator.model, src, cfg)
    assert result.text == " ".join(WORDS[i] for i in hyp.tokens)
    assert result.tgt_tokens == [WORDS[i] for i in hyp.tokens] + ["</s>"]
    assert result.score == hyp.score


def test_token_batches_respect_budget():
    lengths = [5, 1, 9, 3, 3, 7, 2, 12]
    batches = token_batches(lengths, max_tokens=24, beam_size=2)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    for batch in batches:
        assert len(batch) == 1 or 2 * len(batch) * max(lengths[i] for i in batch) <= 24
    assert [max(lengths[i] for i in b) for b in batches] == sorted(max(lengths[i] for i in b) for b in batches)


def test_a_batch_holds_no_more_output_positions_than_its_budget(translator, monkeypatch):
    """The searches make their token buffers for the longest output allowed: --max-len-b 100000 on 4,000 one-word
    lines asked for 3.2 GB at once (a traceback, or the OOM killer). Batches are cut by those positions too, where a
    length that large asks for it; with default lengths the token budget alone decides."""
    from xattn import batching, translator as translator_module

    assert len(token_batches([2] * 4000, 8000, 1, lambda n: 13)) == 1  # the real budget: far above default lengths
    made = []

    def recorded(*args, **kwargs):
        made.append(token_batches(*args, **kwargs))
        return made[-1]
    monkeypatch.setattr(translator_module, "token_batches", recorded)
    monkeypatch.setattr(batching, "OUTPUT_POSITIONS", 2000)
    texts = ["a"] * 60
    for beam, max_len_b, most in ((1, 100, 19), (2, 100, 9), (1, 10, 60)):
        cfg = xattn.DecodeConfig(beam_size=beam, n_best=1, max_len_a=0, max_len_b=max_len_b)
        assert [r.text for r in translator.translate(texts, cfg)] == [r.text for r in translator.translate(texts[:1], cfg)] * 60
        assert max(map(len, made[-2])) == most  # (19 x 101 and 2 x 9 x 101 <= 2000; 60 x 11 <= 2000)
    cfg = xattn.DecodeConfig(beam_size=1, n_best=1, max_len_a=0, max_len_b=10)
    mc = translator.model.cfg
    tracked = translator.translate(texts, cfg, return_attention=True)  # its attention's buffers too: L x H values a step
    per_row = 11 * (1 + mc.n_decoder_layers * max(mc.heads_per_layer("cross")) * 2 // 2)
    assert max(map(len, made[-1])) == 2000 // per_row < 60 and [t.text for t in tracked] == [t.text for t in
                                                                                             translator.translate(texts, cfg)]


@pytest.mark.parametrize("beam_size", [1, 4])
def test_attention_shapes_rows_and_unchanged_translation(translator, beam_size):
    cfg = xattn.DecodeConfig(beam_size=beam_size, n_best=1)
    plain = translator.translate(TEXTS, cfg)
    with_attention = translator.translate(TEXTS, cfg, return_attention=True)
    assert texts_and_scores(plain) == texts_and_scores(with_attention, expected=True)
    L, H = translator.model.cfg.n_decoder_layers, translator.model.cfg.n_heads
    for r in with_attention:
        assert r.cross_attention.dtype == np.float32
        assert r.cross_attention.shape == (L, H, len(r.tgt_tokens), len(r.src_tokens))
        np.testing.assert_allclose(r.cross_attention.sum(-1), 1.0, atol=1e-5)
        assert plain[0].cross_attention is None


def test_attention_equals_unbatched_teacher_forcing(translator):
    results = translator.translate(TEXTS, xattn.DecodeConfig(beam_size=2), return_attention=True)
    model = translator.model
    for text, r in zip(TEXTS, results):
        src = torch.tensor([[WORDS.index(w) for w in r.src_tokens]])
        tgt = torch.tensor([[1] + [WORDS.index(w) for w in r.tgt_tokens[:-1]]])
        with torch.no_grad():
            out = model.decode(tgt, model.encode(src), need_weights=True)
        expected = torch.stack(out.cross_attn, dim=1)[0].numpy()  # (L, H, T, S)
        np.testing.assert_allclose(r.cross_attention, expected, atol=1e-5)


def test_cross_attention_crops_padding(translator):
    src = torch.tensor([[5, 6, 7, 2], [8, 2, 0, 0]])
    forced = translator.forced_attention(src, [[9, 10, 11], [], [12]], rows=[0, 1, 1],
                                         kinds=("cross", "decoder-self", "encoder-self"))
    assert [m.shape[2:] for m in forced.decoder_self] == [(4, 4), (1, 1), (2, 2)]
    assert [m.shape[2:] for m in forced.cross] == [(4, 4), (1, 2), (2, 2)]
    assert [m.shape[2:] for m in forced.encoder_self] == [(4, 4), (2, 2), (2, 2)]
    np.testing.assert_allclose(forced.cross[1].sum(-1), 1.0, atol=1e-5)
    with pytest.raises(ParameterError, match="kinds: 'self' is not one of cross, decoder-self, encoder-self"):
        translator.forced_attention(src, [[9]], kinds=("self",))
    for targets, rows, message in (([[99999]], None, r"targets\[0\]: an id outside the target vocabulary"),
                                   ([[9], [9, -1]], None, r"targets\[1\]: an id outside"),
                                   ([[9]], [3], r"rows\[0\]: 3 is not a row of src, which has 2"),
                                   ([[9], [9]], [0], "rows: 1 rows for 2 targets")):  # (an IndexError before)
        with pytest.raises(ParameterError, match=message):
            translator.forced_attention(src, targets, rows)
    for bad, targets, message in (([[5, 2]], [[9]], r"src: a \(batch, length\) tensor of token ids, got list"),
                                  (src.float(), [[9]], r"got \(2, 4\) of torch.float32"),
                                  (src[0], [[9]], r"got \(4,\) of torch.int64"),
                                  (src + 99999, [[9]], "src: an id outside the source vocabulary"),
                                  (src, ["ab"], r"targets\[0\]: expected a list of int token ids"),
                                  (src, [[9], [9.0]], r"targets\[1\]: expected")):  # (bare errors from inside)
        with pytest.raises(ParameterError, match=message):
            translator.forced_attention(bad, targets)


def test_n_best_alternatives(translator):
    cfg = xattn.DecodeConfig(beam_size=4, n_best=3)
    results = translator.translate(TEXTS, cfg, return_attention=True)
    for r in results:
        assert len(r.alternatives) == 3
        top = r.alternatives[0]
        assert (top.text, top.score, top.src_tokens, top.tgt_tokens) == (r.text, r.score, r.src_tokens, r.tgt_tokens)
        np.testing.assert_array_equal(top.cross_attention, r.cross_attention)
        scores = [a.score for a in r.alternatives]
        assert scores == sorted(scores, reverse=True)
        assert len({tuple(a.tgt_tokens) for a in r.alternatives}) == 3
        for a in r.alternatives:
            assert a.alternatives == [] and a.src_tokens == r.src_tokens
            assert a.cross_attention.shape[2:] == (len(a.tgt_tokens), len(a.src_tokens))
    single = translator.translate(TEXTS, dataclasses.replace(cfg, n_best=1))
    assert [r.alternatives for r in single] == [[]] * len(TEXTS)
    assert texts_and_scores(single) == texts_and_scores(results, expected=True)


def test_empty_input(translator):
    results = translator.translate(["", TEXTS[1], ""], xattn.DecodeConfig(beam_size=3, n_best=2), return_attention=True)
    for r in (results[0], results[2]):
        assert r.text == "" and r.src_tokens == ["</s>"] and r.tgt_tokens == ["</s>"]
        assert r.cross_attention.shape[2:] == (1, 1)
        assert [a.text for a in r.alternatives] == [""]
    assert results[1].text == translator.translate([TEXTS[1]], xattn.DecodeConfig(beam_size=3, n_best=2))[0].text
    assert translator.translate([]) == []


def test_translation_is_a_plain_dataclass():
    t = Translation("a", -1.0, ["x", "</s>"], ["a", "</s>"])
    assert t.cross_attention is None and t.alternatives == []


def test_load_model_directory(tmp_path):
    pytest.importorskip("sentencepiece")
    model, pair = tiny_model_dir(tmp_path)
    translator = load(tmp_path, device="cpu")
    assert isinstance(translator, Translator) and translator.device == torch.device("cpu")
    cfg = xattn.DecodeConfig(beam_size=2)
    [result] = translator.translate(["word3 word5"], cfg, return_attention=True)
    direct = Translator(model, pair, device="cpu").translate(["word3 word5"], cfg)[0]
    assert (result.text, result.score) == (direct.text, pytest.approx(direct.score, abs=1e-6))
    assert result.src_tokens[-1] == "</s>" and result.tgt_tokens[-1] == "</s>"
    assert result.cross_attention.shape == (1, 2, len(result.tgt_tokens), len(result.src_tokens))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu():
    tok = WordTokenizer()
    cfg = xattn.DecodeConfig(beam_size=3, n_best=2)
    cpu = Translator(eos_model(), SimpleNamespace(src=tok, tgt=tok, joint=True), device="cpu")
    gpu = Translator(eos_model(), SimpleNamespace(src=tok, tgt=tok, joint=True), device="cuda")
    a, b = cpu.translate(TEXTS, cfg, return_attention=True), gpu.translate(TEXTS, cfg, return_attention=True)
    assert [r.text for r in a] == [r.text for r in b]
    for x, y in zip(a, b):
        np.testing.assert_allclose(x.cross_attention, y.cross_attention, atol=1e-4)


@pytest.mark.parametrize("cfg", [xattn.DecodeConfig(beam_size=1), xattn.DecodeConfig(beam_size=3, n_best=2),
                                 xattn.DecodeConfig(sampling=True, num_samples=2, seed=5)], ids=["greedy", "beam", "sample"])
def test_attention_from_search_equals_rescoring(translator, cfg):
    tracked = translator.translate(TEXTS, cfg, return_attention=True)
    rescored = translator.translate(TEXTS, cfg, return_attention=True, attention_from="rescore")
    assert texts_and_scores(tracked) == texts_and_scores(rescored, expected=True)
    for a, b in zip(tracked, rescored):
        np.testing.assert_allclose(a.cross_attention, b.cross_attention, atol=1e-5)
        for x, y in zip(a.alternatives, b.alternatives):
            np.testing.assert_allclose(x.cross_attention, y.cross_attention, atol=1e-5)
    if cfg.sampling:
        assert all(len(r.alternatives) == 2 for r in tracked)


def test_self_attention_on_request(translator):
    results = translator.translate(TEXTS, xattn.DecodeConfig(beam_size=2), return_self_attention=True)
    for r in results:
        T = len(r.tgt_tokens)
        assert r.cross_attention is None and r.self_attention.shape[2:] == (T, T)
        np.testing.assert_allclose(r.self_attention.sum(-1), 1.0, atol=1e-5)
        assert np.all(np.triu(r.self_attention[0, 0], 1) == 0)


def test_prefixes_are_continued(translator):
    prefixes = ["w7 w8", "", "w9", "w10 w11 w12", ""]
    results = translator.translate(TEXTS, xattn.DecodeConfig(beam_size=3), prefixes=prefixes)
    free = translator.translate(TEXTS, xattn.DecodeConfig(beam_size=3))
    for prefix, r, f in zip(prefixes, results, free):
        assert r.text.startswith(prefix)
        if not prefix:
            assert r.text == f.text
    with pytest.raises(xattn.XattnError, match="prefixes"):
        translator.translate(TEXTS, prefixes=["w7"])


@pytest.mark.parametrize("cfg", [xattn.DecodeConfig(beam_size=1), xattn.DecodeConfig(beam_size=3, n_best=2),
                                 xattn.DecodeConfig(beam_size=3, coverage_penalty=0.5),
                                 xattn.DecodeConfig(sampling=True, num_samples=2, seed=5)],
                         ids=["greedy", "beam", "coverage", "sample"])
@pytest.mark.parametrize("heads", [(0, (1,)), (1, None), (1, (0, 1))])
def test_the_chosen_heads_tracked_by_the_search_are_the_teacher_forced_ones(translator, cfg, heads):
    from xattn.analysis.maps import HeadChoice

    tracked = translator.translate(TEXTS, cfg, return_attention=True, attention_heads=heads)
    rescored = translator.translate(TEXTS, cfg, return_attention=True, attention_from="rescore")
    kept = translator.translate(TEXTS, cfg, return_attention=True, attention_from="rescore", attention_heads=heads)
    assert texts_and_scores(tracked) == texts_and_scores(rescored, expected=True)
    for a, b, c in zip(tracked, rescored, kept):
        for x, y, z in zip([a, *a.alternatives], [b, *b.alternatives], [c, *c.alternatives]):
            expected = HeadChoice(*heads).select(y.cross_attention)[None, None]  # (1, 1, T, S)
            assert x.cross_attention.shape == expected.shape == (1, 1, len(y.tgt_tokens), len(y.src_tokens))
            np.testing.assert_allclose(x.cross_attention, expected, atol=1e-5)
            np.testing.assert_allclose(z.cross_attention, expected, atol=1e-6)
            assert z.cross_attention.base is None  # its own array, not a view keeping the whole pass alive


def test_tracked_heads_of_a_pruned_model_with_a_head_mask_and_a_prefix_are_the_teacher_forced_ones():
    from xattn.analysis.maps import HeadChoice
    from tests.conftest import tiny_config

    torch.manual_seed(1)
    model = xattn.Transformer(tiny_config(src_vocab_size=30, tgt_vocab_size=30, heads={"cross": [2, 1]})).eval()
    tok = WordTokenizer()
    translator = Translator(model, SimpleNamespace(src=tok, tgt=tok, joint=True), device="cpu")
    translator.head_mask = {"cross": [torch.tensor([1.0, 0.0]), None]}
    prefixes = ["w9", "", "w4 w5", "", "w6"]
    for cfg in (xattn.DecodeConfig(beam_size=1, max_len_b=4), xattn.DecodeConfig(beam_size=3, max_len_b=4)):
        for heads in ((0, None), (1, None), (0, (1,))):
            tracked = translator.translate(TEXTS, cfg, return_attention=True, attention_heads=heads, prefixes=prefixes)
            rescored = translator.translate(TEXTS, cfg, return_attention=True, attention_from="rescore",
                                            prefixes=prefixes)
            for a, b in zip(tracked, rescored):
                assert a.text == b.text
                np.testing.assert_allclose(a.cross_attention, HeadChoice(*heads).select(b.cross_attention)[None, None],
                                           atol=1e-5)
    with pytest.raises(xattn.XattnError, match="attention_heads: layer 1 has no head 1"):
        translator.translate(TEXTS, xattn.DecodeConfig(), return_attention=True, attention_heads=(1, (1,)))


def test_the_default_settings_are_the_model_directory_s_and_a_call_s_batches_never_draw_alike(numbers_model):
    """`translate(texts)` decodes as every command does (the directory's decode settings, not DecodeConfig()); and
    a seeded sampling call draws once: one sentence per batch, the same sentence four times, is not sampled four
    times alike (every batch reused the seed's numbers)."""
    translator = xattn.load(numbers_model)
    texts = ["drei", "vierhundertzwölf", "sieben"]
    assert translator.translate(texts) == translator.translate(texts, translator.decode_config)
    one_each = xattn.DecodeConfig(sampling=True, seed=7, max_tokens=1)
    samples = [t.text for t in translator.translate(["siebenhundertzwölf"] * 4, one_each)]
    assert len(set(samples)) > 1, samples
    assert [t.text for t in translator.translate(["siebenhundertzwölf"] * 4, one_each)] == samples  # seeded
