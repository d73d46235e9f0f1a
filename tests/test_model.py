import math

import pytest
import torch

import xattn
from tests.conftest import tiny_config

SRC = torch.tensor([[5, 6, 7, 8, 2], [9, 10, 2, 0, 0]])
TGT = torch.tensor([[1, 11, 12, 13], [1, 14, 15, 0]])


def _model(**overrides):
    torch.manual_seed(0)
    return xattn.Transformer(tiny_config(**overrides)).eval()


HARD_CODED = [dict(attention={"enc_self": "gaussian", "dec_self": "gaussian"}),
              dict(attention={"enc_self": "gaussian", "dec_self": "gaussian", "cross": "gaussian"}, length_ratio=1.3),
              dict(attention={"enc_self": "gaussian", "dec_self": "gaussian"}, heads={"cross": [0, 1]}),
              dict(attention={"cross": ["gaussian", "learned"]}, heads={"enc_self": [1, 2], "dec_self": 1})]
VARIANTS = [dict(), dict(norm="pre"), dict(positions="learned"), dict(score="dot"), dict(score="general"),
            dict(score="additive"), dict(activation="gelu"),
            dict(share_embeddings=True, tie_output=True, src_vocab_size=50), *HARD_CODED]


@pytest.mark.parametrize("overrides", VARIANTS, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()) or "default")
def test_future_tokens_do_not_change_earlier_logits(overrides):
    model = _model(**overrides)
    changed = TGT.clone()
    changed[:, 2:] = torch.tensor([[20, 21], [22, 23]])
    with torch.no_grad():
        a, b = model(SRC, TGT).logits, model(SRC, changed).logits
    torch.testing.assert_close(a[:, :2], b[:, :2])
    assert not torch.allclose(a[:, 2:], b[:, 2:])


@pytest.mark.parametrize("overrides", VARIANTS[:4], ids=str)
def test_padding_leaves_real_positions_unchanged(overrides):
    model = _model(**overrides)
    with torch.no_grad():
        a = model(SRC, TGT, need_weights=True)
        b = model(torch.nn.functional.pad(SRC, (0, 3)), torch.nn.functional.pad(TGT, (0, 2)), need_weights=True)
        single = model(SRC[1:, :3], TGT[1:, :3]).logits
    torch.testing.assert_close(a.logits, b.logits[:, :4], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(single, a.logits[1:, :3], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(a.cross_attn[0], b.cross_attn[0][:, :, :4, :5], atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("overrides", VARIANTS, ids=str)
def test_cached_incremental_decoding_equals_full_decoding(overrides):
    model = _model(**overrides)
    with torch.no_grad():
        enc = model.encode(SRC)
        full = model.decode(TGT, enc, need_weights=True)
        cache = model.new_cache(enc)
        steps = [model.decode(TGT[:, t:t + 1], None, cache=cache, need_weights=True) for t in range(TGT.shape[1])]
    torch.testing.assert_close(torch.cat([s.logits for s in steps], 1), full.logits, atol=1e-5, rtol=1e-5)
    for layer in range(2):
        torch.testing.assert_close(torch.cat([s.cross_attn[layer] for s in steps], 2), full.cross_attn[layer],
                                   atol=1e-6, rtol=1e-5)
    assert cache.length == TGT.shape[1]
    heads, width = model.cfg.heads_of("dec_self", 0), 0 if model.cfg.variant("dec_self", 0) == "gaussian" else 8
    assert cache.layers[0].self_k.shape == (2, heads, 4, width) and cache.layers[0].buffer_k.shape[0] >= 16


def test_cache_takes_several_positions_at_once_and_reorders():
    model = _model()
    with torch.no_grad():
        enc = model.encode(SRC)
        full = model.decode(TGT, enc).logits
        cache = model.new_cache(enc)
        first = model.decode(TGT[:, :3], None, cache=cache).logits
        cache.select(torch.tensor([1, 0]))
        last = model.decode(TGT.flip(0)[:, 3:], None, cache=cache).logits
    torch.testing.assert_close(first, full[:, :3], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(last, full.flip(0)[:, 3:], atol=1e-5, rtol=1e-5)


def test_cross_attention_shapes_rows_sum_to_one_and_zero_on_padding():
    model = _model()
    with torch.no_grad():
        out = model(SRC, TGT, need_weights=True)
    assert len(out.cross_attn) == 2 and len(out.self_attn) == 2
    for w in out.cross_attn:
        assert w.shape == (2, 2, 4, 5)  # (B, H, T, S)
        torch.testing.assert_close(w.sum(-1), torch.ones(2, 2, 4))
        assert torch.all(w[1, :, :, 3:] == 0)
    for w in out.self_attn:
        assert w.shape == (2, 2, 4, 4)
        assert torch.all(w.triu(1) == 0)
    assert model(SRC, TGT).cross_attn is None


def test_encoder_self_attention_on_request():
    model = _model()
    enc = model.encode(SRC, need_weights=True)
    assert enc.states.shape == (2, 5, 16) and enc.mask.tolist()[1] == [True, True, True, False, False]
    assert [w.shape for w in enc.self_attn] == [(2, 2, 5, 5)] * 2
    assert model.encode(SRC).self_attn is None


@pytest.mark.parametrize("overrides", VARIANTS, ids=str)
def test_parameter_groups_partition_every_parameter(overrides):
    model = _model(**overrides)
    groups = model.parameter_groups()
    names = [n for g in groups.values() for n in g]
    assert sorted(names) == sorted(n for n, _ in model.named_parameters())
    assert len(names) == len(set(names))
    assert all(".cross_attn" in n for n in groups["xattn"])
    assert not any("cross_attn" in n for g in ("enc", "dec", "src", "tgt") for n in groups[g])


def test_parameter_names_are_pinned():
    groups = _model().parameter_groups()
    assert groups["src"] == ["src_embed.weight"]
    assert groups["tgt"] == ["tgt_embed.weight", "generator.weight", "generator.bias"]
    sub = lambda prefix, mods: [f"{prefix}.{m}.{p}" for m in mods for p in ("weight", "bias")]  # noqa: E731
    attn = ["q_proj", "k_proj", "v_proj", "out_proj"]
    enc = [n for i in range(2) for n in sub(f"encoder.layers.{i}.self_attn", attn)
           + sub(f"encoder.layers.{i}", ["self_attn_norm", "ffn.fc1", "ffn.fc2", "ffn_norm"])]
    dec = [n for i in range(2) for n in sub(f"decoder.layers.{i}.self_attn", attn)
           + sub(f"decoder.layers.{i}", ["self_attn_norm", "ffn.fc1", "ffn.fc2", "ffn_norm"])]
    xat = [n for i in range(2) for n in sub(f"decoder.layers.{i}.cross_attn", attn)
           + sub(f"decoder.layers.{i}", ["cross_attn_norm"])]
    assert groups["enc"] == enc
    assert sorted(groups["dec"]) == sorted(dec)
    assert sorted(groups["xattn"]) == sorted(xat)
    pre = _model(norm="pre").parameter_groups()
    assert "encoder.norm.weight" in pre["enc"] and "decoder.norm.weight" in pre["dec"]


def test_config_errors_are_clear():
    with pytest.raises(xattn.XattnError, match="divisible"):
        tiny_config(d_model=15)
    with pytest.raises(xattn.XattnError, match="model.score"):
        tiny_config(score="cosine")


def test_gradients_reach_every_parameter():
    model = _model(score="additive").train()
    model(SRC, TGT).logits.sum().backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None]
    assert missing == []


def test_sinusoidal_positions_golden_values():
    from xattn.model import SinusoidalPositions
    table = SinusoidalPositions(8)(0, 300)
    pos, i = 7, 1
    angle = pos / 10000 ** (2 * i / 8)
    assert table[pos, i].item() == pytest.approx(math.sin(angle), abs=1e-6)
    assert table[pos, 4 + i].item() == pytest.approx(math.cos(angle), abs=1e-6)
    assert table.shape == (300, 8)
    torch.testing.assert_close(SinusoidalPositions(8)(5, 3), table[5:8])


@pytest.mark.parametrize("overrides", [dict(), HARD_CODED[1]], ids=["learned", "gaussian"])
def test_grouped_cache_equals_copied_rows(overrides):
    """A beam's rows sharing one cross-attention K/V per source decode exactly like independent copies."""
    model = _model(**overrides)
    K = 3
    steps = torch.tensor([[11, 12, 13], [14, 15, 16], [17, 18, 19], [20, 21, 22], [23, 24, 25], [26, 27, 28]])
    with torch.no_grad():
        enc = model.encode(SRC)
        grouped, copied = model.new_cache(enc), model.new_cache(enc)
        grouped.expand(K, grouped=True)
        copied.expand(K, grouped=False)
        assert grouped.layers[0].cross_k.shape[0] == 2 and copied.layers[0].cross_k.shape[0] == 6
        reorder = torch.tensor([2, 2, 0, 4, 3, 5])   # back-pointers within each source's group
        drop = torch.tensor([3, 4, 5])               # the first source finishes
        for t, index in enumerate([None, reorder, drop]):
            if index is not None:
                grouped.select(index)
                copied.select(index)
                steps = steps[index]
            tokens = steps[:, t:t + 1]
            a = model.decode(tokens, None, cache=grouped, need_weights=True)
            b = model.decode(tokens, None, cache=copied, need_weights=True)
            torch.testing.assert_close(a.logits, b.logits, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(a.cross_attn[1], b.cross_attn[1], atol=1e-6, rtol=1e-5)
    assert grouped.src_mask.shape[0] == 1 and grouped.layers[0].self_k.shape[:3] == (3, 2, 3)


def test_cache_buffer_grows_past_its_capacity():
    model = _model()
    tgt = torch.randint(3, 50, (2, 40))
    tgt[:, 0] = 1
    with torch.no_grad():
        enc = model.encode(SRC)
        full = model.decode(tgt, enc).logits
        cache = model.new_cache(enc)
        steps = torch.cat([model.decode(tgt[:, t:t + 1], None, cache=cache).logits for t in range(40)], 1)
    torch.testing.assert_close(steps, full, atol=1e-5, rtol=1e-5)


def test_layer_cache_reorders_like_indexing_a_list_of_steps():
    """Appends, reorders that shrink, permute and repeat rows, and growth past the capacity, against
    the plain reference: every step's K/V kept as a list and indexed on each reorder."""
    from xattn.cache import LayerCache

    torch.manual_seed(0)
    cache, keys, values = LayerCache(torch.zeros(1), torch.zeros(1)), [], []
    rows = 6
    for t in range(40):
        k, v = torch.randn(rows, 2, 1, 4), torch.randn(rows, 2, 1, 4)
        got_k, got_v = cache.append(k, v)
        keys, values = keys + [k], values + [v]
        torch.testing.assert_close(got_k, torch.cat(keys, 2), rtol=0, atol=0)
        torch.testing.assert_close(got_v, torch.cat(values, 2), rtol=0, atol=0)
        if t % 3 == 2:
            n = rows - 1 if t < 12 else rows + 2    # shrink, then grow past the spare storage
            index = torch.randint(0, rows, (n,))
            cache.select(index)
            keys, values = [x[index] for x in keys], [x[index] for x in values]
            rows = n
    assert cache.buffer_k.shape[0] >= 40


@pytest.mark.parametrize("overrides", [dict(), HARD_CODED[0], HARD_CODED[3], dict(heads={"dec_self": [2, 0]})],
                         ids=["learned", "gaussian-self", "pruned", "no-self-heads"])
def test_a_selection_that_moves_few_rows_copies_only_those_within_the_buffers(overrides):
    """DecoderCache.select of rows most of which keep their places (a beam step whose children took their parents'
    slots; rows leaving from the end, or moved into the places of those that left: cache.filling, as `remove`)
    copies the rows that move within the same storage, which then holds the kept rows as a view; a selection that
    moves most rows makes new tensors. Both decode as a cache given the same rows' steps anew, as the buffers grow
    past their capacity after narrowing; hard-coded self-attention (which caches values but no keys), pruned heads
    and a layer without self-attention heads too."""
    from xattn.cache import filling, moved_rows
    from xattn.model import EncoderOutput

    model = _model(**overrides)
    g = torch.Generator().manual_seed(3)
    R, T = 12, 40
    src = torch.randint(3, 40, (R, 6), generator=g)
    src[:, -1] = 2
    steps = torch.randint(3, 50, (R, T), generator=g)
    few = torch.arange(R)
    few[[2, 7]] = torch.tensor([3, 3])  # two of twelve rows move
    gone = torch.zeros(R, dtype=torch.bool)
    gone[[1, 5, 11]] = True  # rows 9 and 10 move into places 1 and 5
    plans = {3: few, 6: filling(gone), 9: torch.arange(8).flip(0), 20: torch.tensor([0, 1, 2, 3, 4, 6])}
    with torch.no_grad():
        enc = model.encode(src)
        cache, rows, history = model.new_cache(enc), torch.arange(R), []
        for t in range(T):
            if t in plans:
                index = plans[t]
                in_place = moved_rows(index, len(rows)) is not None
                storage = cache.layers[0].buffer_v.untyped_storage().data_ptr()  # (a gaussian layer caches no keys)
                cache.select(index)
                assert (cache.layers[0].buffer_v.untyped_storage().data_ptr() == storage) == in_place
                assert in_place == (t != 9)
                rows, history = rows[index], [h[index] for h in history]
            history.append(steps[rows, t])
            fresh = model.decode(torch.stack(history, 1), EncoderOutput(enc.states[rows], enc.mask[rows]))
            got = model.decode(history[-1].unsqueeze(1), None, cache=cache)
            torch.testing.assert_close(got.logits[:, -1], fresh.logits[:, -1], atol=1e-5, rtol=1e-5)
    assert cache.layers[0].buffer_v.shape[0] >= T and cache.src_mask.shape[0] == 6
    assert torch.equal(enc.mask, src.ne(0))  # the caller's encoding is left as it was


def test_a_beam_cache_frees_the_cross_attention_of_sentences_done():
    """A grouped cache narrows its cross-attention K/V in place while most sentences go on, and makes new tensors
    once fewer than half the rows its storage holds are kept, so the memory of sentences done is freed."""
    from xattn.cache import _rows_held, filling

    model, K = _model(), 2
    src = torch.randint(3, 40, (8, 6), generator=torch.Generator().manual_seed(2))
    src[:, -1] = 2
    with torch.no_grad():
        cache = model.new_cache(model.encode(src))
        cache.expand(K, grouped=True)
        model.decode(torch.ones(8 * K, 1, dtype=torch.long), None, cache=cache)
        for done, held in [([5], 8), ([0, 6], 8), ([1, 2, 4], 2)]:  # 7, then 5 sentences in place; then 2 of 5
            gone = torch.zeros(cache.src_mask.shape[0], dtype=torch.bool)
            gone[done] = True
            sentences = filling(gone)
            cache.select((sentences.unsqueeze(1) * K + torch.arange(K)).view(-1))
            assert cache.layers[0].cross_k.shape[0] == len(sentences) and _rows_held(cache.layers[0].cross_k) == held


def test_cross_layers_returns_those_layers_weights_alone_and_the_same_output(tiny_model):
    src = torch.tensor([[5, 6, 7, 2], [8, 9, 2, 0]])
    tgt = torch.tensor([[1, 10, 11], [1, 12, 0]])
    full = tiny_model(src, tgt, need_weights=True)
    one = tiny_model(src, tgt, cross_layers=(1,))
    assert one.cross_attn[0] is None and one.self_attn is None
    torch.testing.assert_close(one.cross_attn[1], full.cross_attn[1])
    torch.testing.assert_close(one.logits, full.logits, atol=1e-5, rtol=1e-5)
    assert tiny_model(src, tgt).cross_attn is None


@pytest.mark.parametrize("overrides", [dict(), HARD_CODED[1]], ids=["learned", "gaussian"])
def test_removing_ended_rows_decodes_like_selecting_the_rest(overrides):
    """DecoderCache.remove moves the last rows into the places of the ended ones (greedy search's rows leaving):
    the rows it keeps, in the order it returns, decode exactly as a cache that selected those rows, with and
    without attention weights, over many rows and fewer, and as the buffers grow past their capacity."""
    model = _model(**overrides)
    g = torch.Generator().manual_seed(1)
    R, T = 40, 24
    src = torch.randint(3, 40, (R, 6), generator=g)
    src[:, -1] = 2
    src[::3, 3:] = 0
    src[::3, 2] = 2
    steps = torch.randint(3, 50, (R, T), generator=g)
    leaving = {2: [1, 5], 5: [30, 0, 37, 4], 9: list(range(20, 28)), 17: [3], 20: list(range(2, 14, 2))}
    with torch.no_grad():
        enc = model.encode(src)
        moved, selected = model.new_cache(enc), model.new_cache(enc)
        rows = torch.arange(R)
        for t in range(T):
            if t in leaving:
                ended = torch.tensor(leaving[t])  # unsorted, and indices into the rows left by then
                order = moved.remove(ended)
                assert sorted(order.tolist()) == [r for r in range(len(rows)) if r not in leaving[t]]
                selected.select(order)
                rows = rows[order]
            tokens = steps[rows, t:t + 1]
            weights = t % 2 == 0
            a = model.decode(tokens, None, cache=moved, need_weights=weights)
            b = model.decode(tokens, None, cache=selected, need_weights=weights)
            torch.testing.assert_close(a.logits, b.logits, rtol=0, atol=0)
            if weights:
                torch.testing.assert_close(a.cross_attn[1], b.cross_attn[1], rtol=0, atol=0)
        assert moved.src_mask.shape[0] == len(rows) == 19 and torch.equal(moved.src_mask, src.ne(0)[rows])
    assert torch.equal(enc.mask, src.ne(0))  # the caller's encoding is left as it was


def test_encoding_in_parts_of_near_equal_length_gives_each_source_its_states(monkeypatch):
    """encode_in_parts: each source's states are its own part's, which are its states in the whole batch up to
    float rounding; a batch of one length, or whose parts would leave out little padding, is one pass."""
    from xattn.decoding import step

    model = _model()
    lengths = [2, 9, 3, 3, 7, 9, 1, 5, 2, 8]
    src = torch.zeros(len(lengths), 10, dtype=torch.long)
    for i, n in enumerate(lengths):
        src[i, :n - 1], src[i, n - 1] = torch.randint(3, 40, (n - 1,)), 2
    monkeypatch.setattr(step, "PART_POSITIONS", 6)
    calls = []
    encode = model.encode
    monkeypatch.setattr(model, "encode", lambda s, **k: calls.append(s.shape) or encode(s, **k))
    with torch.no_grad():
        whole = encode(src)
        parts = step.encode_in_parts(model, src)
        assert len(calls) > 2 and all(n <= 9 for _, n in calls) and sum(b for b, _ in calls) == len(lengths)
        assert torch.equal(parts.mask, whole.mask)
        torch.testing.assert_close(parts.states[whole.mask], whole.states[whole.mask], rtol=1e-5, atol=1e-5)
        assert parts.states.isfinite().all()
        for rows in ([1, 5], [9, 1, 5, 4]):  # lengths 9 and 9; 8, 9, 9 and 7, whose parts would save 8%
            calls.clear()
            step.encode_in_parts(model, src[rows])
            assert calls == [torch.Size([len(rows), 10])]
        left = torch.cat([torch.zeros(1, 3, dtype=torch.long), src[6:7, :7]], 1)  # a source padded on its left
        calls.clear()
        torch.testing.assert_close(step.encode_in_parts(model, torch.cat([src[:, :10], left])).states[-1], encode(
            left).states[0], rtol=1e-5, atol=1e-5)
        assert len(calls) == 1  # encoded whole
        mask = {"enc_self": [torch.tensor([0.0, 1.0]), torch.tensor([1.0, 0.5])]}
        masked, parts = encode(src, head_mask=mask), step.encode_in_parts(model, src, mask)
        torch.testing.assert_close(parts.states[whole.mask], masked.states[whole.mask], rtol=1e-5, atol=1e-5)
        assert not torch.allclose(masked.states[whole.mask], whole.states[whole.mask])


@pytest.mark.parametrize("call, message", [
    (lambda m: m(SRC, TGT[:1]), r"^tgt: 1 rows against the 2 sentences encoded$"),  # broadcast silently before
    (lambda m: m.decode(TGT[:1], m.encode(SRC)), r"^tgt: 1 rows against the 2 sentences encoded$"),
    (lambda m: m.decode(TGT, None), r"^enc: decoding without a cache needs the encoder output"),
    (lambda m: m.encode(SRC[0]), r"^src: expected a 2-D \(batch, length\) tensor of integer token ids, got a "
                                 r"torch.int64 tensor of shape \(5,\)$"),
    (lambda m: m.encode(SRC.float()), r"^src: .*got a torch.float32 tensor of shape \(2, 5\)$"),
    (lambda m: m.encode(SRC.tolist()), r"^src: .*got list$"),
    (lambda m: m.encode(SRC + 1000), r"^src: token id 1005 is outside this model's vocabulary of \d+$"),
    (lambda m: m(SRC, TGT - 5), r"^tgt: token id -4 is outside this model's vocabulary of \d+$"),
])
def test_the_model_names_the_argument_a_call_gets_wrong(call, message):
    """A teacher-forced pass of 1 target row against 2 encoded sentences broadcast the encoder output and returned
    logits for a pair never given (a probe of the low-level API); wrong shapes, types and ids were bare errors that
    named nothing (IndexError: tuple index out of range)."""
    with pytest.raises(xattn.errors.ParameterError, match=message):
        call(_model())
