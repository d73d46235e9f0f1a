"""Continuous batching (xattn/decoding/stream.py): sentences that join and leave between steps get what greedy
search gives each of them."""
import pytest
import torch

import xattn
from xattn.decoding import search
from xattn.decoding.stream import Stream, streamable
from xattn.batching import pad_batch

from conftest import tiny_config


def sources(n: int, seed: int, eos: int = 2, vocab: int = 40) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (int(torch.randint(1, 12, (1,), generator=g)),), generator=g).tolist() + [eos]
            for _ in range(n)]


def eos_model(seed: int = 0, **overrides) -> xattn.Transformer:
    torch.manual_seed(seed)
    model = xattn.Transformer(tiny_config(**overrides)).eval()
    with torch.no_grad():  # sharpened, EOS-prone: sentences end at different lengths
        model.generator.weight.mul_(4.0)
        model.generator.bias[2] = 1.5
    return model


def alone(model, src: list[int], cfg) -> xattn.decoding.Hypothesis:
    return search(model, torch.tensor([src]), cfg)[0][0]


@pytest.mark.parametrize("seed", range(3))
def test_sentences_joining_and_leaving_get_what_greedy_search_gives_each(seed):
    model, cfg = eos_model(seed), xattn.DecodeConfig(beam_size=1, max_len_a=1.0, max_len_b=6)
    srcs = sources(14, seed)
    stream, results, arrivals = Stream(model, cfg), {}, {0: range(0, 5), 2: range(5, 6), 3: range(6, 11), 7: range(11, 14)}
    steps = 0
    while steps < 200 and (len(results) < len(srcs)):
        if steps in arrivals:
            rows = list(arrivals[steps])
            stream.add(pad_batch([srcs[i] for i in rows], model.cfg.pad_id), rows)
        for tag, hyp in stream.step():
            results[tag] = hyp
        steps += 1
    lengths = {len(h.tokens) for h in results.values()}
    assert len(results) == len(srcs) and len(lengths) > 2 and len(stream) == 0
    for i, src in enumerate(srcs):
        want = alone(model, src, cfg)
        assert results[i].tokens == want.tokens
        assert results[i].score == pytest.approx(want.score, abs=1e-4)
        assert results[i].log_prob == pytest.approx(want.log_prob, abs=1e-4)


def test_a_full_stream_takes_the_explicit_attention_path_and_still_gets_what_greedy_search_gives(monkeypatch):
    """40 sentences of different lengths in the stream: its steps of at least 32 rows read the pools' sliced
    views through the explicit attention path (attention._fused_is_slower), with each row's own mask."""
    import xattn.attention as attention
    model, cfg = eos_model(2), xattn.DecodeConfig(beam_size=1, max_len_a=1.0, max_len_b=6)
    srcs = sources(40, 11)
    chosen, choose = [], attention._fused_is_slower
    monkeypatch.setattr(attention, "_fused_is_slower", lambda q, k, v: chosen.append(choose(q, k, v)) or chosen[-1])
    stream, results = Stream(model, cfg), {}
    stream.add(pad_batch(srcs[:20], model.cfg.pad_id), range(20))
    for tag, hyp in stream.step():
        results[tag] = hyp
    stream.add(pad_batch(srcs[20:], model.cfg.pad_id), range(20, 40))  # rows at positions of their own
    for _ in range(200):
        for tag, hyp in stream.step():
            results[tag] = hyp
        if len(results) == len(srcs):
            break
    assert any(chosen) and len(results) == len(srcs)
    monkeypatch.setattr(attention, "_fused_is_slower", choose)
    for i, src in enumerate(srcs):
        want = alone(model, src, cfg)
        assert results[i].tokens == want.tokens
        assert results[i].score == pytest.approx(want.score, abs=1e-4)


def test_a_lone_sentence_needs_no_self_attention_mask_and_gets_what_greedy_search_gives_it():
    model, cfg = eos_model(1), xattn.DecodeConfig(beam_size=1, max_len_a=1.0, max_len_b=6)
    first, second = sources(2, 7)
    stream, results = Stream(model, cfg), {}
    stream.add(pad_batch([first], model.cfg.pad_id), ["first"])
    assert stream.cache.self_mask() is None  # a lone row sees every position held
    assert stream.cache.at() == (0, slice(0, 1))  # and writes at its one position by slices, not an index_put
    for tag, hyp in stream.step():
        results[tag] = hyp
    stream.add(pad_batch([second], model.cfg.pad_id), ["second"])  # now two rows at different positions
    assert len(stream) == 2 and stream.cache.self_mask() is not None
    while len(stream):
        for tag, hyp in stream.step():
            results[tag] = hyp
        if len(stream) == 1:  # left alone: at its own position, T - 1 once the pools were measured again
            assert stream.cache.at() == (int(stream.cache.lengths[0]), slice(0, 1))
    for tag, src in (("first", first), ("second", second)):
        want = alone(model, src, cfg)
        assert results[tag].tokens == want.tokens
        assert results[tag].score == pytest.approx(want.score, abs=1e-4)


def test_a_cancelled_sentence_leaves_and_the_others_are_unchanged():
    model, cfg = eos_model(1), xattn.DecodeConfig(beam_size=1, max_len_a=0.0, max_len_b=30)
    with torch.no_grad():
        model.generator.bias[2] = -50.0  # nobody ends before the maximum length
    srcs = sources(4, 7)
    stream = Stream(model, cfg)
    stream.add(pad_batch(srcs, model.cfg.pad_id), ["a", "b", "c", "d"])
    stream.step()
    assert stream.cancel("b") and not stream.cancel("b") and len(stream) == 3
    results = {}
    while len(stream):
        results.update(stream.step())
    assert sorted(results) == ["a", "c", "d"]
    for tag, i in (("a", 0), ("c", 2), ("d", 3)):
        assert results[tag].tokens == alone(model, srcs[i], cfg).tokens


def test_long_sources_and_outputs_grow_the_pools():
    model, cfg = eos_model(2), xattn.DecodeConfig(beam_size=1, max_len_a=2.0, max_len_b=3)
    short, long = sources(3, 3), [list(range(3, 39)) + [2]]
    stream = Stream(model, cfg)
    stream.add(pad_batch(short, model.cfg.pad_id), [0, 1, 2])
    stream.step()
    stream.add(pad_batch(long, model.cfg.pad_id), [3])  # longer source and output than the pools hold
    results = {}
    while len(stream):
        results.update(stream.step())
    for i, src in enumerate(short + long):
        assert results[i].tokens == alone(model, src, cfg).tokens


def test_the_pools_shrink_as_sentences_leave_and_the_rest_are_unchanged():
    model, cfg = eos_model(3), xattn.DecodeConfig(beam_size=1, max_len_a=1.0, max_len_b=2)
    with torch.no_grad():
        model.generator.bias[2] = -50.0  # each sentence runs to its own maximum length, so they leave one by one
    srcs = sources(16, 11)
    stream = Stream(model, cfg)
    stream.add(pad_batch(srcs, model.cfg.pad_id), list(range(16)))
    slots, results, late = [stream.cache.C], {}, None
    while len(stream):
        results.update(stream.step())
        slots.append(stream.cache.C)
        if late is None and 0 < len(stream) <= 4:  # a sentence joins the shrunken pools
            late = sources(1, 99)[0]
            stream.add(pad_batch([late], model.cfg.pad_id), [16])
    assert slots[0] == 16 and min(slots) <= 4 and late is not None
    assert stream.cache.C == 1  # empty: the least pools
    for i, src in enumerate(srcs + [late]):
        assert results[i].tokens == alone(model, src, cfg).tokens
        assert results[i].log_prob == pytest.approx(alone(model, src, cfg).log_prob, abs=1e-4)


def test_more_rows_join_pools_that_shrank():
    model, cfg = eos_model(4), xattn.DecodeConfig(beam_size=1, max_len_a=1.0, max_len_b=2)
    first, later = sources(16, 12), [s[:-1][:2] + [2] for s in sources(20, 13)]  # later: short sources
    stream = Stream(model, cfg)
    stream.add(pad_batch(first, model.cfg.pad_id), list(range(16)))
    results = dict(stream.step())
    kept = sorted((i for i in range(16) if i not in results), key=lambda i: len(first[i]))[:2]
    for i in range(16):
        if i not in kept:
            stream.cancel(i)
    assert stream.cache.C <= 4  # shrunk to the two shortest: fewer slots and positions than the first rows had
    stream.add(pad_batch(later, model.cfg.pad_id), list(range(16, 36)))  # more slots than ever, fewer positions
    while len(stream):
        results.update(stream.step())
    for i, src in zip(kept + list(range(16, 36)), [first[i] for i in kept] + later):
        assert results[i].tokens == alone(model, src, cfg).tokens


def test_what_a_stream_cannot_decode():
    model = eos_model()
    assert streamable(xattn.DecodeConfig(beam_size=1), model)
    for cfg in (xattn.DecodeConfig(beam_size=2), xattn.DecodeConfig(sampling=True), xattn.DecodeConfig(beam_size=1, min_len=2),
                xattn.DecodeConfig(beam_size=1, no_repeat_ngram_size=2), xattn.DecodeConfig(beam_size=1, shortlist=True)):
        assert not streamable(cfg, model)
        with pytest.raises(ValueError):
            Stream(model, cfg)
    hard = xattn.Transformer(tiny_config(attention={"dec_self": "gaussian"}))
    assert not streamable(xattn.DecodeConfig(beam_size=1), hard)
