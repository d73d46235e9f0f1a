"""Attention maps of sentence pairs: pieces -> words, word merging, teacher forcing, shift vs naive."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import xattn
from xattn.analysis.alignment import AlignSettings, attention_links, links_from_weights, word_attention
from xattn.analysis.maps import HeadChoice, PairAttention, TextWords, merge_words, teacher_forced
from xattn.analysis.pieces import UNK_SURFACE, piece_words, word_membership, word_memberships
from xattn.errors import XattnError
from xattn.words import is_separator, split_words


def test_piece_words_golden():
    words, of = piece_words(["▁Ein", "▁Hund", "▁läuft", "▁", ".", "</s>"])
    assert words == ["Ein", "Hund", "läuft", "."] and of == [0, 1, 2, 3, 3, -1]
    # an unknown piece inside a source word stays in that word; in a hypothesis it prints as " ⁇ "
    assert piece_words(["▁", "x", "<unk>", "y", "</s>"])[0] == [f"x{UNK_SURFACE}y"]
    assert piece_words(["▁", "x", "<unk>", "y"], f" {UNK_SURFACE} ")[0] == ["x", UNK_SURFACE, "y"]
    # a piece that spells nothing belongs to the word after it, or the word before at the end
    assert piece_words(["▁a", "▁", "▁b", "▁"]) == (["a", "b"], [0, 1, 1, 1])
    assert piece_words(["</s>"]) == ([], [-1])


@pytest.fixture(scope="module")
def translator(numbers_model):
    return xattn.load(numbers_model, device="cpu")


def test_hypothesis_words_are_the_printed_words(translator):
    """For any ids a model can emit, the words of its pieces are the whitespace tokens of the decoded text."""
    tok = translator.tokenizers.tgt

    @settings(max_examples=300, deadline=None)
    @given(st.lists(st.integers(3, tok.vocab_size - 1), max_size=12))
    def check(ids):
        assert piece_words(tok.pieces(ids), f" {UNK_SURFACE} ")[0] == tok.decode(ids).split()
    check()


@settings(max_examples=500, deadline=None)
@given(st.lists(st.text(alphabet=["a", "é", " ", "\u2581", "\t", "\u2028", "\x1c"], max_size=4), max_size=8))
def test_piece_words_are_the_words_the_pieces_spell(pieces):
    """Any pieces: the words are those of the text they spell, and each piece belongs to the word its first
    word character joins (a piece that spells none: the next word, else the last)."""
    words, word_of = piece_words(pieces)
    text = "".join(pieces).replace("\u2581", " ")
    assert words == split_words(text)
    at = 0  # the word being spelled at each position of `text`
    starts = []
    for k, ch in enumerate(text):
        starts.append(at)
        if not is_separator(ch) and (k + 1 == len(text) or is_separator(text[k + 1])):
            at += 1
    offset = 0
    for piece, word in zip(pieces, word_of):
        spelled = [starts[offset + k] for k, ch in enumerate(piece.replace("\u2581", " ")) if not is_separator(ch)]
        later = [starts[k] for k in range(offset, len(text)) if not is_separator(text[k])]
        assert word == (spelled[0] if spelled else later[0] if later else len(words) - 1)
        offset += len(piece)


def test_merge_words_keeps_row_sums():
    rng = np.random.default_rng(0)
    weights = rng.random((2, 3, 5, 7)).astype(np.float32)
    weights /= weights.sum(-1, keepdims=True)
    rows = np.array([[1, 1, 0, 0, 0], [0, 0, 1, 0, 0], [0, 0, 0, 1, 1]], dtype=np.float32)
    cols = np.array([[1, 0, 0, 0, 0, 0, 0], [0, 1, 1, 1, 0, 0, 0], [0, 0, 0, 0, 1, 1, 0], [0, 0, 0, 0, 0, 0, 1]],
                    dtype=np.float32)
    merged = merge_words(weights, rows, cols)
    assert merged.shape == (2, 3, 3, 4)
    np.testing.assert_allclose(merged.sum(-1), 1.0, atol=1e-6)
    # a target word averages its pieces' rows; a source word sums its pieces' columns
    np.testing.assert_allclose(merged[1, 2, 0, 1], weights[1, 2, :2, 1:4].sum(-1).mean(), rtol=1e-6)


def diagonal_pair(n_src_words=3, n_tgt_words=3) -> PairAttention:
    """Target piece t (row t predicts it) looks only at source piece t: a 'naive' diagonal alignment."""
    src = [f"▁s{i}" for i in range(n_src_words)] + ["</s>"]
    tgt = [f"▁t{j}" for j in range(n_tgt_words)] + ["</s>"]
    cross = np.zeros((2, 2, len(tgt), len(src)), dtype=np.float32)
    for t in range(len(tgt)):
        cross[:, :, t, min(t, len(src) - 1)] = 1.0
    return PairAttention.build(src, tgt, cross)


def test_shift_reads_the_row_where_the_word_is_the_input():
    pair = diagonal_pair()
    naive = attention_links(pair, AlignSettings(HeadChoice(0), "naive"))
    shift = attention_links(pair, AlignSettings(HeadChoice(0), "shift"))
    assert naive == {(0, 0), (1, 1), (2, 2)}
    # target word j is the decoder input at row j + 1, which looks at source piece j + 1 (the last: </s>, dropped)
    assert shift == {(1, 0), (2, 1)}
    assert attention_links(pair, AlignSettings(HeadChoice(0), "shift", eos="keep")) == {(1, 0), (2, 1)}


def test_word_view_rows_sum_to_one_and_links_mark_cells():
    src = ["▁Ein", "▁Hund", "e", "▁", ".", "</s>"]
    tgt = ["▁A", "▁do", "g", "▁.", "</s>"]
    rng = np.random.default_rng(1)
    cross = rng.random((1, 2, len(tgt), len(src))).astype(np.float32)
    cross /= cross.sum(-1, keepdims=True)
    pair = PairAttention.build(src, tgt, cross, src=TextWords("Ein Hunde ."), tgt=TextWords("A dog ."))
    maps = pair.maps("cross", words=True, links=[(1, 1)])
    assert maps.cols == ["Ein", "Hunde", ".", "</s>"] and maps.rows == ["A", "dog", ".", "</s>"]
    np.testing.assert_allclose(maps.weights.sum(-1), 1.0, atol=1e-6)
    assert maps.links == [(1, 1)]
    pieces = pair.maps("cross", links=[(1, 1)])
    assert sorted(pieces.links) == [(1, 1), (1, 2), (2, 1), (2, 2)]  # (source piece, target piece) cells
    assert word_attention(pair, "naive").shape == (1, 2, 3, 4)


def test_text_must_match_the_tokenizer_words():
    with pytest.raises(XattnError, match="line 7: the source tokenizer splits this source into 2 words"):
        PairAttention.build(["▁a", "▁b", "</s>"], ["</s>"], np.ones((1, 1, 1, 3)) / 3, src=TextWords("ab"), line=7)


def test_memberships_of_many_lines_are_those_of_each_line(translator):
    """One call into the tokenizer for every line's words gives each line's membership as encoding it alone
    does, a line whose pieces are not its words' pieces in a row (None) and an empty line included."""
    tok = translator.tokenizers.src
    texts = ["drei´s hundert \u200b vier", "", "zwei und zwanzig", "vier hundert"]
    results = translator.translate(texts, xattn.DecodeConfig(beam_size=1), return_attention=True)
    pieces = [r.src_tokens for r in results]
    pieces[3] = [*pieces[2]]  # line 4 with line 3's pieces: not its words
    batched = word_memberships(tok, texts, pieces)
    assert batched == [word_membership(tok, t, p) for t, p in zip(texts, pieces)]
    assert batched[1] == [-1] and batched[3] is None and batched[0] is not None
    pairs = PairAttention.from_translations(results, texts, tok, [1, 2, 3, 4])
    one = [PairAttention.from_translation(r, t, n, tok) for n, (r, t) in enumerate(zip(results, texts), 1)]
    assert [(p.src_words, p.src_word_of, p.tgt_word_of) for p in pairs] == \
        [(p.src_words, p.src_word_of, p.tgt_word_of) for p in one]


def test_words_whose_characters_normalise_to_spaces(translator):
    """NFKC turns ´ into a space and a combining accent, so the pieces of `drei´s` spell two words; encoding
    word by word still knows which word each piece belongs to."""
    tok = translator.tokenizers.src
    text = "drei´s hundert \u200b vier"
    res = translator.translate([text], xattn.DecodeConfig(beam_size=1), return_attention=True)[0]
    membership = word_membership(tok, text, res.src_tokens)
    assert membership is not None and max(membership) <= 3
    pair = PairAttention.from_translation(res, text, tokenizer=tok)
    assert pair.src_words == text.split()
    weights = word_attention(pair, "naive")
    assert weights.shape[-1] == len(text.split()) + 1
    taught = teacher_forced(translator, [text], ["three hundred four"])[0]
    np.testing.assert_allclose(taught.cross.sum(-1), 1.0, atol=1e-5)
    assert taught.src_words == text.split() and taught.src_word_of[-1] == -1


def test_decoder_self_masks_the_future():
    pair = diagonal_pair()
    pair.decoder_self = np.tril(np.ones((1, 1, 4, 4), dtype=np.float32))
    pair.decoder_self /= pair.decoder_self.sum(-1, keepdims=True)
    maps = pair.maps("decoder-self")
    assert maps.rows == ["<s>", "▁t0", "▁t1", "▁t2"]
    assert (maps.masked == np.triu(np.ones((4, 4), bool), 1)).all()


def test_links_threshold_eos_and_punctuation():
    # target words x (source words a , b, </s>)
    weights = np.array([[0.5, 0.3, 0.1, 0.1],
                        [0.1, 0.1, 0.2, 0.6],
                        [0.05, 0.8, 0.05, 0.1]], dtype=np.float32)
    src, tgt = ["a", ",", "b"], ["x", "y", ","]
    choice = HeadChoice(0)
    assert links_from_weights(weights, src, tgt, AlignSettings(choice)) == {(0, 0), (2, 1), (1, 2)}
    assert links_from_weights(weights, src, tgt, AlignSettings(choice, eos="keep")) == {(0, 0), (1, 2)}
    assert links_from_weights(weights, src, tgt, AlignSettings(choice, threshold=0.3)) == {(0, 0), (1, 0), (2, 1), (1, 2)}
    # rows renormalised over the words: [.56 .33 .11], [.25 .25 .5], [.06 .89 .06]
    # match: the comma links only to the comma, words never to it
    weights[0] = [0.2, 0.7, 0.0, 0.1]
    assert links_from_weights(weights, src, tgt, AlignSettings(choice, punct="match")) == {(0, 0), (2, 1), (1, 2)}
    # a target word whose every allowed weight is 0 (here all on </s>, dropped) links to nothing
    weights[1] = [0.0, 0.0, 0.0, 1.0]
    for settings in (AlignSettings(choice), AlignSettings(choice, threshold=0.3)):
        assert links_from_weights(weights, src, tgt, settings) == {(1, 0), (1, 2)}


def test_teacher_forced_is_the_model_reading_the_pair(translator):
    """Each pair of a padded batch gets exactly the maps of the model reading that pair alone."""
    import torch

    sources = ["drei hundert vier", "eins", "zwei tausend sieben hundert elf"]
    targets = ["three hundred four", "one one one one", "two"]
    pairs = teacher_forced(translator, sources, targets, ("cross", "decoder-self", "encoder-self"))
    model, tok, cfg = translator.model, translator.tokenizers, translator.model.cfg
    for src_text, tgt_text, pair in zip(sources, targets, pairs):
        src = torch.tensor([tok.src.encode(src_text) + [cfg.eos_id]])
        tgt = torch.tensor([[cfg.bos_id] + tok.tgt.encode(tgt_text)])
        with torch.no_grad():
            enc = model.encode(src, need_weights=True)
            out = model.decode(tgt, enc, need_weights=True)
        np.testing.assert_allclose(pair.cross, torch.stack(out.cross_attn, 1)[0].numpy(), atol=1e-5)
        np.testing.assert_allclose(pair.decoder_self, torch.stack(out.self_attn, 1)[0].numpy(), atol=1e-5)
        np.testing.assert_allclose(pair.encoder_self, torch.stack(enc.self_attn, 1)[0].numpy(), atol=1e-5)
        assert pair.src_words == src_text.split() and pair.tgt_words == tgt_text.split()
        assert pair.tgt_tokens[-1] == "</s>" and len(pair.tgt_tokens) == tgt.shape[1]


def test_the_encoder_map_of_a_translation_is_under_the_head_mask(tmp_path):
    """`xattn attention --kind encoder-self --head-mask F` drew the encoder's map as if no head were masked (its
    encoder pass left the mask out); it is the teacher-forced pass's map under the mask."""
    import torch

    from tests.conftest import tiny_model_dir
    from xattn.analysis.maps import encoder_attention

    tiny_model_dir(tmp_path, n_encoder_layers=2)
    translator = xattn.load(tmp_path, device="cpu")
    text = "word1 word2 word3 word4"
    plain = encoder_attention(translator, text)
    translator.head_mask = {"enc_self": [torch.tensor([0.0, 1.0]), None]}
    masked = encoder_attention(translator, text)
    forced = teacher_forced(translator, [text], ["word5"], ("cross", "encoder-self"))[0]
    np.testing.assert_allclose(masked, forced.encoder_self, atol=1e-6)
    np.testing.assert_allclose(masked[0], plain[0], atol=1e-6)  # the mask acts on layer 0's output: layer 1 on
    assert not np.allclose(masked[1], plain[1], atol=1e-4)


def test_python_api_draws_a_translation(translator):
    import xattn.analysis as analysis

    res = translator.translate(["drei hundert vier"], xattn.DecodeConfig(beam_size=2), return_attention=True,
                               return_self_attention=True)[0]
    fig = analysis.figure(res, words=True, links=[(0, 0)])
    heatmap = fig.axes[0]
    assert len(heatmap.get_xticklabels()) == len(PairAttention.from_translation(res).src_words) + 1  # + </s>
    assert len(analysis.figure(res, grid=True).axes) == 1 * (2 + 1) + 1  # layers x (heads + mean) + colour bar
    assert analysis.figure(res, kind="decoder-self").axes
    page = analysis.html_page(res, words=True)
    assert page.startswith("<!DOCTYPE html>") and "vier" in page
    with pytest.raises(XattnError, match="no encoder-self attention"):
        analysis.maps_of(res, "encoder-self")


def test_choosing_heads_before_or_after_merging_words_agrees():
    rng = np.random.default_rng(3)
    src, tgt = ["▁a", "b", "▁c", "</s>"], ["▁x", "▁y", "z", "</s>"]
    cross = rng.random((2, 3, len(tgt), len(src))).astype(np.float32)
    pair = PairAttention.build(src, tgt, cross / cross.sum(-1, keepdims=True))
    for choice in (HeadChoice(1), HeadChoice(0, (2,)), HeadChoice(1, (0, 2))):
        for method in ("naive", "shift"):
            np.testing.assert_allclose(word_attention(pair, method, choice),
                                       choice.select(word_attention(pair, method)), atol=1e-6)


# ------------------------------------------------------------------------------ pruned layers (fewer heads, or none)

def padded(heads: list[int], R: int = 2, C: int = 3) -> np.ndarray:
    """(L, max heads, R, C) weights where layer l has heads[l] heads and NaN for the rest (model.stack_layers)."""
    w = np.random.default_rng(4).random((len(heads), max(heads, default=0), R, C)).astype(np.float32)
    for layer, n in enumerate(heads):
        w[layer, n:] = np.nan
    return w


def test_each_layer_counts_and_averages_its_own_heads():
    from xattn.analysis.maps import head_mean, heads_per_layer

    w = padded([3, 0, 1])
    assert heads_per_layer(w) == [3, 0, 1] and heads_per_layer(np.zeros((2, 0, 2, 3))) == [0, 0]
    mean = head_mean(w)
    np.testing.assert_allclose(mean[0], w[0].mean(axis=0), rtol=1e-6)
    np.testing.assert_allclose(mean[2], w[2, 0])
    assert np.isnan(mean[1]).all()  # no heads, no mean (never zeros that look like weights)
    assert head_mean(np.zeros((2, 0, 2, 3), np.float32)).shape == (2, 2, 3)
    np.testing.assert_allclose(HeadChoice(0).select(w), mean[0], rtol=1e-6)


@pytest.mark.parametrize("heads, choice, message", [
    ([3, 0, 1], HeadChoice(1), "layer 1 has no attention heads left (pruned); layers with heads: 0, 2"),
    ([3, 0, 1], HeadChoice(2, (1,)), "layer 2 has no head 1 (its attention heads: 0 to 0)"),
    ([3, 0, 1], HeadChoice(3), "layer 3 is not a layer of this model (0 to 2)"),
    ([0, 0], HeadChoice(0), "this model has no attention heads left (all pruned): there is no attention to read"),
])
def test_a_layer_or_head_that_is_not_there_is_one_line_without_flags(heads, choice, message):
    with pytest.raises(XattnError) as e:
        choice.check(heads)
    assert str(e.value) == message
    with pytest.raises(XattnError, match=message.replace("(", r"\(").replace(")", r"\)")):
        choice.select(padded(heads))


def test_a_layer_chosen_for_the_user_is_the_nearest_with_heads():
    from xattn.model import nearest_with_heads

    assert nearest_with_heads([4, 4, 4], 1) == 1
    assert nearest_with_heads([4, 0, 0], 2) == 0 and nearest_with_heads([0, 0, 4], 0) == 2
    assert nearest_with_heads([4, 0, 4], 1) == 0  # below first
    assert nearest_with_heads([0, 0], 1) is None
    assert HeadChoice.nearest([2, 0], 1) == HeadChoice(0)
    with pytest.raises(XattnError, match="no cross-attention heads left"):
        HeadChoice.nearest([0, 0], 1, "cross-attention")


@pytest.mark.parametrize("setting, value", [("method", "bogus"), ("eos", "hide"), ("punct", "strict")])
def test_an_alignment_setting_out_of_its_choices_names_the_parameter_not_a_flag(setting, value):
    from xattn.errors import ParameterError

    with pytest.raises(ParameterError) as e:
        AlignSettings(HeadChoice(0), **{setting: value})
    assert e.value.name == setting and str(e.value).startswith(f"{setting}: expected one of ")
    assert "--" not in str(e.value)


@pytest.mark.parametrize("layer, heads", [(1, None), (2, (1,)), (3, None), (0, (0, 5))])
def test_a_search_s_tracked_heads_are_checked_as_a_map_s(layer, heads):
    """One check of a layer and heads (checks.head_problem): a search's Tracked said it otherwise."""
    from xattn.decoding import Tracked
    from xattn.errors import ParameterError

    class Pruned:  # a ModelConfig's heads per layer, layer 1's pruned
        def heads_per_layer(self, place):
            return [3, 0, 1]
    with pytest.raises(XattnError) as drawn:
        HeadChoice(layer, heads).check([3, 0, 1], "cross-attention")
    with pytest.raises(ParameterError) as searched:
        Tracked(layer, heads).checked(Pruned())
    assert str(searched.value) == f"attention_heads: {drawn.value}"


def test_the_views_name_the_argument_a_call_gets_wrong(translator):
    """figure, html_page and format_links took a link outside the pair (drawn nowhere), a negative one (drawn at the
    last word), any true value for grid, links beside AttentionMaps (ignored), and named nothing for a wrong
    source, kind or choice (AttributeError, KeyError; a probe of the low-level API)."""
    from xattn.analysis import figure, format_links, html_page, maps_of
    from xattn.errors import ItemError, ParameterError

    res = translator.translate(["dreiundzwanzig"], return_attention=True, return_self_attention=True)
    one, words = res[0], len(split_words("dreiundzwanzig"))
    wrong = [(lambda: figure(one, links=[(0, 0), (words, 0)]), ItemError, rf"^links\[1\]: \({words}, 0\): this pair has"),
             (lambda: figure(one, links=[(-1, 0)]), ItemError, r"^links\[0\]: a link .* got \(-1, 0\)$"),
             (lambda: html_page(one, links="0-0"), ParameterError, r"^links: a collection of links"),
             (lambda: figure(one, grid="no"), ParameterError, r"^grid: True or False, got 'no'$"),
             (lambda: figure(one, choice=(0, None)), ParameterError, r"^choice: a HeadChoice or None, got tuple$"),
             (lambda: html_page(one, title=5), ParameterError, r"^title: a string or None, got int$"),
             (lambda: figure(res), ParameterError, r"^source: a Translation .* got list$"),
             (lambda: figure(one, kind="cross-attention"), ParameterError, r"^kind: 'cross-attention' is not one of"),
             (lambda: figure(maps_of(one), links=[(0, 0)]), ParameterError, r"^links: AttentionMaps carry their own"),
             (lambda: html_page(maps_of(one), words=True), ParameterError, r"^words: True, where the AttentionMaps"),
             (lambda: format_links({(0, -1)}), ItemError, r"^links\[0\]: a link"),
             (lambda: format_links({(0, 1)}, one_indexed="yes"), ParameterError, r"^one_indexed: True or False")]
    for call, error, message in wrong:
        with pytest.raises(error, match=message):
            call()
    assert figure(one, links=[[0, 0]], words=True) is not None and format_links({(0, 1)}, {(1, 1)}) == "0-1 1p1"
    # ready-made maps of any kind draw as they are; links from an iterator or NumPy are links as any others
    for maps in (maps_of(one, "decoder-self", words=True), maps_of(one, words=True, links=iter([(0, 0)]))):
        assert figure(maps) is not None and html_page(maps)
    assert maps_of(one, words=True, links=iter([(0, 0)])).links == [(0, 0)]
    assert format_links(link for link in [(np.int64(0), np.int64(1)), np.array([2, 3])]) == "0-1 2-3"
