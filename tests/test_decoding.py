import dataclasses
import itertools
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import xattn
import xattn.attention as attention
from tests.conftest import tiny_config
from xattn.decoding import beam
from xattn.config import DecodeConfig
from xattn.decoding import Hypothesis, finish, gnmt_penalty, greedy, max_lengths, search
from xattn.decoding.processors import constraints


def beam_search(model, src, beam_size, length_penalty, n_best, max_len, **options):
    cfg = DecodeConfig(beam_size=beam_size, length_penalty=length_penalty, n_best=n_best, **options)
    return finish(beam.beam_search(model, src, cfg, max_len, constraints(cfg, model.cfg)))

PAD, BOS, EOS = 0, 1, 2


def eos_model(vocab: int = 30, seed: int = 0, scale: float = 3.0, eos_bias: float = 1.5) -> xattn.Transformer:
    """A random tiny model whose sharpened, EOS-biased generator ends sentences at different lengths."""
    torch.manual_seed(seed)
    model = xattn.Transformer(tiny_config(src_vocab_size=vocab, tgt_vocab_size=vocab)).eval()
    with torch.no_grad():
        model.generator.weight.mul_(scale)
        model.generator.bias[EOS] = eos_bias
    return model


def random_src(seed: int, batch: int = 8, vocab: int = 30, max_len: int = 7) -> torch.Tensor:
    """(batch, max_len) sources of lengths 2..max_len, each ending with EOS, right-padded."""
    g = torch.Generator().manual_seed(seed)
    src = torch.full((batch, max_len), PAD)
    for i in range(batch):
        n = int(torch.randint(1, max_len, (1,), generator=g))
        src[i, :n] = torch.randint(4, vocab, (n,), generator=g)
        src[i, n] = EOS
    return src


def sequence_log_prob(model, src_row: torch.Tensor, tokens: list[int]) -> float:
    """Teacher-forced log P(tokens + EOS | src) over the full vocabulary, no cache."""
    src = src_row[src_row.ne(PAD)].unsqueeze(0)
    tgt = torch.tensor([[BOS] + tokens])
    with torch.no_grad():
        lp = model(src, tgt).logits.log_softmax(-1)[0]  # (T, V)
    return float(lp.gather(1, torch.tensor(tokens + [EOS]).unsqueeze(1)).sum())


def reference_greedy(model, src_row: torch.Tensor, max_len: int) -> tuple[list[int], float]:
    """Greedy search re-running the whole decoder at every step; pad and BOS are never chosen."""
    src = src_row[src_row.ne(PAD)].unsqueeze(0)
    tokens, total = [], 0.0
    with torch.no_grad():
        enc = model.encode(src)
        for t in range(max_len + 1):
            lp = model.decode(torch.tensor([[BOS] + tokens]), enc).logits[0, -1].log_softmax(-1)
            lp[[PAD, BOS]] = float("-inf")
            token = EOS if t == max_len else int(lp.argmax())
            total += float(lp[token])
            if token == EOS:
                return tokens, total
            tokens.append(token)
    raise AssertionError("unreachable")


def reference_beam(model, src_row: torch.Tensor, K: int, alpha: float, n_best: int, max_len: int,
                   stopping: str = "exact"):
    """One-sentence beam search with the same rules, re-running the whole decoder per hypothesis: EOS among
    the K best of 2K finishes; the greedy path keeps a place while active and its EOS always finishes it."""
    src = src_row[src_row.ne(PAD)].unsqueeze(0)
    beam, finished = [([], 0.0, True)], []  # (tokens, log p, is the greedy path)
    score = lambda total, tokens: total / gnmt_penalty(len(tokens) + 1, alpha)  # noqa: E731
    with torch.no_grad():
        enc = model.encode(src)
        for t in range(max_len + 1):
            candidates, greedy = [], None
            for tokens, total, is_greedy in beam:
                lp = model.decode(torch.tensor([[BOS] + tokens]), enc).logits[0, -1].log_softmax(-1).tolist()
                allowed = [EOS] if t == max_len else range(EOS, len(lp))
                candidates += [(total + lp[v], tokens, v) for v in allowed]
                if is_greedy:
                    v = max(allowed, key=lambda v: lp[v])
                    greedy = (total + lp[v], tokens, v)
            candidates = sorted(candidates, key=lambda c: -c[0])[: 2 * K]
            ended = [c for c in candidates[:K] if c[2] == EOS]
            ended += [greedy] if greedy and greedy[2] == EOS and greedy not in ended else []
            finished += [(tokens, total) for total, tokens, v in ended]
            active = [c for c in candidates if c[2] != EOS and c != greedy][:K]
            if greedy and greedy[2] != EOS:
                active = [greedy] + active[:K - 1]
            beam = [(tokens + [v], total, c is greedy) for c in active for total, tokens, v in [c]]
            ranked = sorted((score(total, tokens) for tokens, total in finished), reverse=True)
            if not beam or (stopping == "early" and len(finished) >= K):
                break
            bound = max(total for _, total, _ in beam) / gnmt_penalty(max_len + 1, alpha)
            if stopping == "exact" and len(ranked) >= n_best and bound <= ranked[n_best - 1]:
                break
    ranked = sorted(((score(total, tokens), tokens) for tokens, total in finished), key=lambda c: -c[0])
    return ranked[:n_best]


@pytest.mark.parametrize("seed,alpha,stopping", [(0, 0.0, "exact"), (1, 1.0, "exact"), (2, 2.0, "exact"),
                                                   (3, 3.0, "exact"), (1, 1.0, "early"), (2, 0.0, "early")])
def test_beam_matches_reference(seed, alpha, stopping):
    model, src = eos_model(), random_src(20 + seed)
    max_len = torch.tensor([6, 2, 6, 4, 6, 1, 6, 6])
    hyps = beam_search(model, src, beam_size=4, length_penalty=alpha, n_best=4, max_len=max_len, stopping=stopping)
    for i, found in enumerate(hyps):
        expected = reference_beam(model, src[i], 4, alpha, 4, int(max_len[i]), stopping)
        assert [h.tokens for h in found] == [tokens for _, tokens in expected]
        assert [h.score for h in found] == pytest.approx([score for score, _ in expected], abs=1e-5)


@pytest.mark.parametrize("alpha", [0.0, 1.0])
def test_beam_of_one_is_greedy(alpha):
    model, src = eos_model(), random_src(0)
    max_len = torch.tensor([12, 12, 12, 12, 5, 12, 3, 12])
    g = greedy(model, src, max_len, length_penalty=alpha)
    b = beam_search(model, src, beam_size=1, length_penalty=alpha, n_best=1, max_len=max_len, stopping="early")
    assert len({len(h[0].tokens) for h in g}) >= 3, "fixture should end sentences at different lengths"
    assert [h[0].tokens for h in g] == [h[0].tokens for h in b]
    assert [h[0].score for h in g] == [h[0].score for h in b]
    assert [h[0].log_prob for h in g] == [h[0].log_prob for h in b]
    exact = beam_search(model, src, beam_size=1, length_penalty=alpha, n_best=1, max_len=max_len)
    assert all(e[0].score >= h[0].score for e, h in zip(exact, g))  # exact search may go on past greedy's EOS


def test_greedy_matches_full_recompute():
    model, src = eos_model(), random_src(1)
    max_len = torch.tensor([12, 4, 12, 12, 0, 12, 7, 12])
    hyps = greedy(model, src, max_len)
    for i, [h] in enumerate(hyps):
        tokens, log_prob = reference_greedy(model, src[i], int(max_len[i]))
        assert h.tokens == tokens
        assert h.log_prob == pytest.approx(log_prob, abs=1e-4)
        assert h.score == pytest.approx(log_prob / gnmt_penalty(len(tokens) + 1, 1.0), abs=1e-4)


def test_many_rows_match_full_recompute(monkeypatch):
    """Steps of many rows take the explicit attention path (attention._fused_is_slower), which must agree
    with the fused kernel that the reference's full passes run."""
    model, src = eos_model(), random_src(3, batch=40)
    max_len = torch.full((40,), 8)
    sdpa, fused_rows = torch.nn.functional.scaled_dot_product_attention, []

    def counting(q, *args, **kwargs):
        if q.shape[-2] == 1:  # a decoder step's
            fused_rows.append(q.shape[0])
        return sdpa(q, *args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", counting)
    hyps = greedy(model, src, max_len)
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", sdpa)
    assert 40 not in fused_rows and max(fused_rows, default=0) < attention.DECODE_ROWS  # 40 rows: explicit
    for i, [h] in enumerate(hyps):
        tokens, log_prob = reference_greedy(model, src[i], 8)
        assert h.tokens == tokens
        assert h.log_prob == pytest.approx(log_prob, abs=1e-4)


def explicit_calls(monkeypatch) -> list[bool]:
    """Record, for each attention call from here on, whether it takes the explicit path instead of the fused one."""
    chosen, choose = [], attention._fused_is_slower
    monkeypatch.setattr(attention, "_fused_is_slower", lambda q, k, v: chosen.append(choose(q, k, v)) or chosen[-1])
    return chosen


def test_a_beam_of_many_rows_on_the_explicit_path_finds_what_the_fused_kernel_finds(monkeypatch):
    """40 sentences with a beam of 4: their steps' folded cross-attention and 160-row self-attention take the
    explicit path, and find the same hypotheses as with the fused kernel everywhere."""
    model, src = eos_model(), random_src(5, batch=40)
    max_len = torch.full((40,), 7)
    chosen = explicit_calls(monkeypatch)
    found = beam_search(model, src, beam_size=4, length_penalty=1.0, n_best=2, max_len=max_len)
    assert any(chosen)
    monkeypatch.setattr(attention, "DECODE_ROWS", 10 ** 9)
    chosen.clear()
    fused = beam_search(model, src, beam_size=4, length_penalty=1.0, n_best=2, max_len=max_len)
    assert not any(chosen)
    for a, b in zip(found, fused):
        assert [h.tokens for h in a] == [h.tokens for h in b]
        assert [h.score for h in a] == pytest.approx([h.score for h in b], abs=1e-5)


def test_greedy_drops_finished_rows():
    model, src = eos_model(), random_src(0)
    sizes = []
    decode = model.decode

    def counting_decode(tgt, enc, cache=None, need_weights=False, head_mask=None):
        sizes.append(tgt.shape[0])
        return decode(tgt, enc, cache=cache, need_weights=need_weights, head_mask=head_mask)

    model.decode = counting_decode
    hyps = greedy(model, src, torch.full((8,), 12))
    lengths = [len(h[0].tokens) for h in hyps]
    assert sizes == [sum(n >= t for n in lengths) for t in range(max(lengths) + 1)]


@pytest.mark.parametrize("seed", range(5))
def test_beam_scores_at_least_greedy(seed):
    model, src = eos_model(), random_src(10 + seed)
    max_len = torch.full((8,), 10)
    g = greedy(model, src, max_len)
    b = beam_search(model, src, beam_size=5, length_penalty=1.0, n_best=1, max_len=max_len)
    for [gh], [bh] in zip(g, b):
        assert bh.score >= gh.score - 1e-6


@pytest.mark.parametrize("alpha", [0.0, 1.0])
def test_wide_beam_equals_exhaustive_search(alpha):
    """V = 6 leaves 3 content tokens; with max_len 3 there are 1 + 3 + 9 + 27 = 40 sequences."""
    model, src = eos_model(vocab=6, scale=1.0, eos_bias=0.0), random_src(2, batch=2, vocab=6, max_len=5)
    words = [3, 4, 5]
    every = [list(seq) for n in range(4) for seq in itertools.product(words, repeat=n)]
    hyps = beam_search(model, src, beam_size=40, length_penalty=alpha, n_best=40, max_len=torch.tensor([3, 3]))
    for i, found in enumerate(hyps):
        brute = sorted(((sequence_log_prob(model, src[i], seq) / gnmt_penalty(len(seq) + 1, alpha), seq)
                        for seq in every), key=lambda x: -x[0])
        assert len(found) == 40
        assert [h.tokens for h in found] == [seq for _, seq in brute]
        assert [h.score for h in found] == pytest.approx([s for s, _ in brute], abs=1e-5)


def test_batching_invariance():
    model, src = eos_model(), random_src(3)
    max_len = torch.tensor([12, 3, 12, 8, 12, 12, 5, 12])
    for decode in (lambda s, m: greedy(model, s, m),
                   lambda s, m: beam_search(model, s, beam_size=4, length_penalty=1.0, n_best=3, max_len=m)):
        together = decode(src, max_len)
        for i in range(len(src)):
            row = src[i: i + 1, : int(src[i].ne(PAD).sum())]
            [alone] = decode(row, max_len[i: i + 1])
            assert [h.tokens for h in alone] == [h.tokens for h in together[i]]
            assert [h.score for h in alone] == pytest.approx([h.score for h in together[i]], abs=1e-5)


def test_n_best_sorted_distinct_and_scored_correctly():
    model, src = eos_model(), random_src(4)
    alpha = 0.6
    hyps = beam_search(model, src, beam_size=5, length_penalty=alpha, n_best=3, max_len=torch.full((8,), 10))
    for i, nbest in enumerate(hyps):
        assert len(nbest) == 3
        assert all(isinstance(h, Hypothesis) for h in nbest)
        assert [h.score for h in nbest] == sorted((h.score for h in nbest), reverse=True)
        assert len({tuple(h.tokens) for h in nbest}) == 3
        for h in nbest:
            assert h.log_prob == pytest.approx(sequence_log_prob(model, src[i], h.tokens), abs=1e-4)
            assert h.score == pytest.approx(h.log_prob / ((5 + len(h.tokens) + 1) / 6) ** alpha)
            assert EOS not in h.tokens and PAD not in h.tokens and BOS not in h.tokens


@pytest.mark.parametrize("strategy", ["greedy", "beam"])
def test_max_len_respected(strategy):
    model, src = eos_model(eos_bias=-100.0), random_src(5, batch=4)  # EOS only when forced
    max_len = torch.tensor([0, 1, 3, 6])
    if strategy == "greedy":
        hyps = greedy(model, src, max_len)
    else:
        hyps = beam_search(model, src, beam_size=3, length_penalty=1.0, n_best=3, max_len=max_len)
    for nbest, n in zip(hyps, max_len.tolist()):
        assert nbest and all(len(h.tokens) == n for h in nbest)
    loose = eos_model()
    for nbest, n in zip(beam_search(loose, src, 3, 1.0, 3, max_len), max_len.tolist()):
        assert all(len(h.tokens) <= n for h in nbest)


def test_max_lengths_and_search_dispatch():
    src = torch.tensor([[5, 6, 7, EOS], [5, EOS, PAD, PAD], [EOS, PAD, PAD, PAD]])
    cfg = xattn.DecodeConfig(beam_size=1, max_len_a=1.5, max_len_b=2)
    model = eos_model()
    assert max_lengths(src, cfg, model.cfg).tolist() == [8, 5, 0]
    assert search(model, src, cfg) == greedy(model, src, max_lengths(src, cfg, model.cfg), cfg.length_penalty)
    beam = xattn.DecodeConfig(beam_size=3, n_best=2, max_len_a=1.5, max_len_b=2)
    found = search(model, src, beam)
    assert found == beam_search(model, src, 3, beam.length_penalty, 2, max_lengths(src, beam, model.cfg))
    assert found[2] == [Hypothesis([], found[2][0].log_prob, found[2][0].log_prob)]  # lp(1) = 1


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu():
    model, src = eos_model(), random_src(6)
    max_len = torch.full((8,), 10)
    cpu = beam_search(model, src, 4, 1.0, 2, max_len)
    gpu = beam_search(model.cuda(), src.cuda(), 4, 1.0, 2, max_len.cuda())
    assert [[h.tokens for h in n] for n in cpu] == [[h.tokens for h in n] for n in gpu]
    assert greedy(model, src.cuda(), max_len)[0][0].tokens == greedy(model.cpu(), src, max_len)[0][0].tokens


# ----------------------------------------------------------------------------- strategies of the decoding issue

def _search(model, src, **options):
    return search(model, src, DecodeConfig(**options))


def test_sampling_is_reproducible_and_varied():
    model, src = eos_model(), random_src(10)
    a = _search(model, src, sampling=True, num_samples=4, seed=3)
    b = _search(model, src, sampling=True, num_samples=4, seed=3)
    c = _search(model, src, sampling=True, num_samples=4, seed=4)
    assert [[h.tokens for h in s] for s in a] == [[h.tokens for h in s] for s in b]
    assert [[h.tokens for h in s] for s in a] != [[h.tokens for h in s] for s in c]
    assert all(len(s) == 4 for s in a)
    assert len({tuple(h.tokens) for s in a for h in s}) > len(a)


@pytest.mark.parametrize("options", [dict(top_k=1), dict(temperature=1e-4), dict(top_p=1e-6),
                                     dict(top_k=1, temperature=1e8), dict(top_k=1, temperature=3e38)])
def test_degenerate_sampling_is_greedy(options):
    """top_k 1 keeps the best token at any temperature (after a temperature of 1e8, float32 rounded every
    log-probability into one tie, and the draw was uniform)."""
    model, src = eos_model(), random_src(11)
    sampled = _search(model, src, sampling=True, seed=0, **options)
    greedy_ = _search(model, src, beam_size=1)
    assert [s[0].tokens for s in sampled] == [g[0].tokens for g in greedy_]
    assert [s[0].log_prob for s in sampled] == pytest.approx([g[0].log_prob for g in greedy_], abs=1e-5)


@pytest.mark.parametrize("options", [dict(beam_size=1), dict(beam_size=4), dict(sampling=True, seed=1)])
def test_forced_prefix_is_continued(options):
    model, src = eos_model(), random_src(12, batch=3)
    prefix = torch.tensor([[7, 8, 9], [5, 0, 0], [0, 0, 0]])
    hyps = search(model, src, DecodeConfig(**options), prefix=prefix)
    assert hyps[0][0].tokens[:3] == [7, 8, 9] and hyps[1][0].tokens[:1] == [5]
    free = search(model, src[2:], DecodeConfig(**options))
    assert hyps[2][0].tokens == free[0][0].tokens
    if options.get("beam_size", 1) == 1 and not options.get("sampling"):
        ref = sequence_log_prob(model, src[0], hyps[0][0].tokens)
        assert hyps[0][0].log_prob == pytest.approx(ref, abs=1e-4)


@pytest.mark.parametrize("options", [dict(beam_size=1), dict(beam_size=4), dict(sampling=True, seed=1)])
def test_a_forced_prefix_is_kept_whole_whatever_the_rules_say(options):
    """no_repeat_ngram_size banned the prefix's own repeated n-gram, and the translation ended there, cut short
    (relaxed); a prefix is the caller's: it is continued whole, and the rules hold after it."""
    model, src = eos_model(), random_src(12, batch=2)
    prefix = torch.tensor([[7, 8, 7, 8, 7], [5, 5, 5, 0, 0]])
    hyps = search(model, src, DecodeConfig(no_repeat_ngram_size=1, **options), prefix=prefix)
    assert hyps[0][0].tokens[:5] == [7, 8, 7, 8, 7] and hyps[1][0].tokens[:3] == [5, 5, 5]
    for row, hyp in enumerate(h[0] for h in hyps):
        after = hyp.tokens[5 if row == 0 else 3:]
        assert len(set(after)) == len(after) and not set(after) & set(prefix[row].tolist()) - {0}  # the rule after it
    if options.get("beam_size", 1) == 1 and not options.get("sampling"):  # scored at the model's log-probability
        assert hyps[0][0].log_prob == pytest.approx(sequence_log_prob(model, src[0], hyps[0][0].tokens), abs=1e-4)


def forced_cross(model, src, hyps, rows):
    """The cross-attention of a teacher-forced pass over `hyps` (Translator.forced_attention, on the plain model)."""
    from xattn.inference import Speedups
    from xattn.translator import Translator

    translator = Translator(model, None, "cpu", speedups=Speedups(pack=False))
    return translator.forced_attention(src, [h.tokens for h in hyps], rows).cross


@pytest.mark.parametrize("options", [dict(beam_size=1), dict(beam_size=3, n_best=3), dict(sampling=True, seed=2, num_samples=2)])
def test_attention_tracked_in_search_equals_teacher_forcing(options):
    model, src = eos_model(), random_src(13)
    tracked = search(model, src, DecodeConfig(**options), need_attention=True)
    plain = search(model, src, DecodeConfig(**options))
    assert [[h.tokens for h in s] for s in tracked] == [[h.tokens for h in s] for s in plain]
    flat = [h for s in tracked for h in s]
    rows = [b for b, s in enumerate(tracked) for _ in s]
    expected = forced_cross(model, src, flat, rows)
    src_len = src.ne(PAD).sum(1).tolist()
    for h, r, e in zip(flat, rows, expected):
        torch.testing.assert_close(h.cross_attention[..., : src_len[r]], torch.from_numpy(e), atol=1e-5, rtol=1e-4)


def test_coverage_penalty_score_by_hand():
    model, src = eos_model(), random_src(14)
    beta, alpha = 0.4, 1.0
    hyps = _search(model, src, beam_size=4, n_best=2, length_penalty=alpha, coverage_penalty=beta)
    flat = [h for s in hyps for h in s]
    rows = [b for b, s in enumerate(hyps) for _ in s]
    attention = forced_cross(model, src, flat, rows)
    for h, a in zip(flat, attention):
        coverage = torch.from_numpy(a[-1].mean(axis=0)).sum(dim=0)  # (S,) last layer, mean of heads
        expected = h.log_prob / gnmt_penalty(len(h.tokens) + 1, alpha) + beta * coverage.clamp(1e-10, 1).log().sum()
        assert h.score == pytest.approx(float(expected), abs=1e-4)
    plain = _search(model, src, beam_size=4, n_best=2, length_penalty=alpha)
    assert [h.score for s in plain for h in s] != pytest.approx([h.score for h in flat])


def test_no_repeat_ngram_and_min_len_hold():
    model, src = eos_model(vocab=8, eos_bias=-1.0), random_src(15, vocab=8)
    for options in (dict(beam_size=1), dict(beam_size=3)):
        for s in _search(model, src, no_repeat_ngram_size=2, min_len=4, max_len_b=12, **options):
            tokens = s[0].tokens
            bigrams = list(zip(tokens, tokens[1:]))
            assert len(bigrams) == len(set(bigrams)) and len(tokens) >= 4


def test_exact_stopping_is_no_worse_than_early_stopping():
    """Both rules follow the same beam until early stopping ends; exact search only adds finished ones."""
    for seed in range(6):
        model = eos_model(eos_bias=0.5) if seed < 3 else random_markov(seed, 9)
        src = random_src(20 + seed, vocab=30 if seed < 3 else 9)
        early = _search(model, src, beam_size=3, length_penalty=1.0, stopping="early")
        exact = _search(model, src, beam_size=3, length_penalty=1.0)
        assert all(f[0].score >= e[0].score - 1e-5 for e, f in zip(early, exact))


@pytest.mark.parametrize("options, message", [
    (dict(temperature=0), "temperature"), (dict(top_p=0), "top_p"), (dict(top_p=1.5), "top_p"),
    (dict(beam_size=0), "beam_size"), (dict(top_k=-1), "top_k"), (dict(num_samples=0), "num_samples"),
    (dict(beam_size=2, n_best=3), "n_best"), (dict(coverage_penalty=-1), "coverage_penalty"),
])
def test_invalid_settings_are_clear_errors(options, message):
    with pytest.raises(xattn.XattnError, match=message):
        DecodeConfig(**options)


@pytest.mark.parametrize("V", [50, 3000, 3008])
def test_best_extensions_equal_a_top_n_over_all_sums(V):
    from xattn.decoding.beam import best_extensions

    torch.manual_seed(0)
    N, K, n = 4, 3, 6
    lp = torch.randn(N * K, V).log_softmax(dim=-1)
    lp[1, 100 % V:] = float("-inf")                  # a row with few allowed words
    log_prob = torch.randn(N, K)
    log_prob[2, 1:] = float("-inf")                   # a sentence with one live hypothesis
    sums = (log_prob.unsqueeze(2) + lp.view(N, K, V)).view(N, K * V)
    expected, index = sums.topk(n, dim=1)
    score, parent, token = best_extensions(lp, log_prob, n)
    torch.testing.assert_close(score, expected, rtol=0, atol=0)
    finite = expected.isfinite()
    assert torch.equal(parent[finite], (index // V)[finite]) and torch.equal(token[finite], (index % V)[finite])


# ------------------------------------------------------------------------------------- the stopping rule

class MarkovModel(xattn.Transformer):
    """A Transformer whose next-token distribution depends only on the last token: `table[last]` (V, V)
    probabilities. The real decoder still runs, so caches grow, expand and select as in any search."""

    def __init__(self, table: torch.Tensor):
        super().__init__(tiny_config(src_vocab_size=table.shape[0], tgt_vocab_size=table.shape[0]))
        self.log_table = table.log()

    def decode(self, tgt, enc, cache=None, need_weights=False, head_mask=None, *, cross_layers=()):
        out = super().decode(tgt, enc, cache=cache, need_weights=need_weights, head_mask=head_mask,
                             cross_layers=cross_layers)
        return dataclasses.replace(out, logits=self.log_table[tgt])  # (B, T, V)


def chain(rows: dict[int, dict[int, float]], V: int = 8) -> torch.Tensor:
    """A transition table: rows[token] = {next: probability}, the rest of each row spread thinly."""
    table = torch.full((V, V), 1e-4)
    for token, nexts in rows.items():
        for nxt, p in nexts.items():
            table[token, nxt] = p
    return table / table.sum(dim=1, keepdim=True)


A, B_, C, D, E = 3, 4, 5, 6, 7
TRAP = chain({BOS: {A: 0.6, B_: 0.25, C: 0.15}, A: {D: 0.97, C: 0.02}, D: {E: 0.98}, E: {EOS: 0.98},
              B_: {EOS: 0.9}, C: {EOS: 0.9}})
"""Greedy reads a d e </s> (p ~ 0.57). Two short hypotheses finish on the way (b </s>, then a c </s>), so a
beam of 2 that stops once 2 have finished returns b </s> (p 0.18), as the issue's quickstart model did."""


def test_early_stopping_can_return_worse_than_greedy_and_exact_stopping_cannot():
    model = MarkovModel(TRAP).eval()
    src, max_len = torch.tensor([[A, EOS]]), torch.tensor([8])
    [[early]] = beam_search(model, src, beam_size=2, length_penalty=1.0, n_best=1, max_len=max_len, stopping="early")
    [[exact]] = beam_search(model, src, beam_size=2, length_penalty=1.0, n_best=1, max_len=max_len)
    [[greedy_]] = greedy(model, src, max_len)
    assert greedy_.tokens == [A, D, E] and exact.tokens == [A, D, E]
    assert early.tokens == [B_] and early.score < greedy_.score - 0.5
    assert exact.score == pytest.approx(greedy_.score, abs=1e-6)


def test_the_greedy_path_keeps_its_place_in_the_beam():
    """On this chain the beam's 3 best prefixes all leave the greedy path after 2 tokens, and end 2.6 nats
    below it (found by search over random chains; the greedy path's slot 0 brings it back)."""
    model, src, max_len = random_markov(53, 9), torch.tensor([[3, EOS]]), torch.tensor([6])
    [[greedy_]] = greedy(model, src, max_len, length_penalty=1.0)
    [[best]] = beam_search(model, src, beam_size=3, length_penalty=1.0, n_best=1, max_len=max_len)
    assert greedy_.tokens == [4, 3, 7, 7, 7, 7] and best.tokens == greedy_.tokens
    assert best.score == pytest.approx(greedy_.score, abs=1e-5)


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 10_000), K=st.integers(1, 6), N=st.integers(1, 4))
def test_children_take_their_parents_slots(seed, K, N):
    """in_parents_slots: the kept candidates by slot, each parent's first child by rank in its parent's slot, the
    other children in the slots no kept candidate descends from, by rank; the greedy continuation (first by rank,
    a child of slot 0) in slot 0."""
    g = torch.Generator().manual_seed(seed)
    C = 2 * K + 1
    parent = torch.randint(0, K, (N, C), generator=g)
    pick = torch.stack([torch.randperm(C, generator=g)[:K] for _ in range(N)])  # ranks: first = best
    parent[:, pick[:, 0]] = 0  # the first by rank continues slot 0, as the greedy path's continuation does
    by_slot = beam.in_parents_slots(pick, parent)
    for n in range(N):
        ranked, placed = pick[n].tolist(), by_slot[n].tolist()
        assert sorted(placed) == sorted(ranked)
        parents = [int(parent[n, c]) for c in ranked]
        firsts = {p: c for c, p in reversed(list(zip(ranked, parents)))}  # each parent's first child by rank
        assert all(placed[p] == c for p, c in firsts.items())
        others = [c for c, p in zip(ranked, parents) if firsts[p] != c]
        assert [placed[s] for s in range(K) if s not in firsts] == others
        assert placed[0] == ranked[0]


def random_markov(seed: int, V: int) -> MarkovModel:
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(V, V, generator=g) * 3
    logits[:, EOS] += torch.rand(V, generator=g) * 4 - 2  # some tokens lead to the end, others away from it
    return MarkovModel(logits.softmax(dim=1)).eval()


@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 10_000), K=st.integers(2, 6), alpha=st.sampled_from([0.0, 0.6, 1.0, 2.0]),
       n=st.integers(1, 8), markov=st.booleans())
def test_beam_is_never_worse_than_greedy_and_n_best_never_changes_the_first(seed, K, alpha, n, markov):
    """A chain ignores its source, so it decodes one sentence; the Transformer decodes a batch."""
    model = random_markov(seed, 9) if markov else eos_model(seed=seed % 50, eos_bias=(seed % 7) - 3.0)
    src = random_src(seed, batch=1 if markov else 4, vocab=9 if markov else 30)
    max_len = torch.full((src.shape[0],), n)
    [greedy_] = zip(*greedy(model, src, max_len, length_penalty=alpha))
    first = beam_search(model, src, beam_size=K, length_penalty=alpha, n_best=1, max_len=max_len)
    every = beam_search(model, src, beam_size=K, length_penalty=alpha, n_best=K, max_len=max_len)
    for g, [b], n_best in zip(greedy_, first, every):
        assert b.score >= g.score - 1e-5
        # the two searches batch different rows, so float32 sums may round apart (seed 1370: 1.4e-6)
        assert n_best[0].tokens == b.tokens and n_best[0].score == pytest.approx(b.score, abs=1e-5)
        assert [h.score for h in n_best] == sorted((h.score for h in n_best), reverse=True)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), alpha=st.sampled_from([0.0, 1.0, 2.0]), n=st.integers(0, 3))
def test_wide_beam_is_exhaustive_search_on_random_chains(seed, alpha, n):
    """V = 6: three content tokens; a beam as wide as every sequence of up to n tokens finds the best."""
    model, src = random_markov(seed, 6), torch.tensor([[3, EOS]])
    every = [list(seq) for k in range(n + 1) for seq in itertools.product([3, 4, 5], repeat=k)]
    [[best]] = beam_search(model, src, beam_size=27, length_penalty=alpha, n_best=1, max_len=torch.tensor([n]))
    brute = max((sequence_log_prob(model, src[0], seq) / gnmt_penalty(len(seq) + 1, alpha), seq) for seq in every)
    assert best.tokens == brute[1] and best.score == pytest.approx(brute[0], abs=1e-5)


# ------------------------------------------------------------------------ constraints that leave nothing

@pytest.mark.parametrize("options", [dict(beam_size=1), dict(beam_size=2), dict(beam_size=4, n_best=3),
                                     dict(sampling=True, num_samples=3, seed=1), dict(beam_size=3, coverage_penalty=0.4)])
def test_constraints_that_forbid_every_token_end_the_sentence_and_say_so(options):
    """V = 12 leaves 9 content tokens: no_repeat_ngram_size 1 has used them all up long before min_len 200."""
    model, src = eos_model(vocab=12, eos_bias=-2.0), random_src(4, vocab=12)
    cfg = DecodeConfig(no_repeat_ngram_size=1, min_len=200, max_len_b=300, **options)
    for hyps in search(model, src, cfg):
        for h in hyps:
            assert h.relaxed and math.isfinite(h.score) and math.isfinite(h.log_prob)
            assert len(h.tokens) == len(set(h.tokens)) == 9  # every content token once, then the last resort
            assert EOS not in h.tokens and PAD not in h.tokens


def test_constraints_that_leave_a_token_relax_nothing():
    model, src = eos_model(vocab=12), random_src(4, vocab=12)
    for options in (dict(beam_size=1), dict(beam_size=3), dict(sampling=True, seed=2)):
        for hyps in search(model, src, DecodeConfig(no_repeat_ngram_size=2, min_len=3, **options)):
            assert not any(h.relaxed for h in hyps)


@pytest.mark.parametrize("rows,columns", [(1, 80), (4, 64), (4, 65), (5, 127), (7, 128), (40, 8000), (9, 8001)])
def test_first_argmax_is_torchs_argmax_with_ties_infinities_and_nan(rows, columns):
    from xattn.decoding.step import first_argmax
    g = torch.Generator().manual_seed(rows * columns)
    ties = torch.randint(-2, 2, (rows, columns), generator=g).float()  # many equal maxima: the first one counts
    late = torch.randn(rows, columns, generator=g)
    late[:, -1] = 1e9  # the maximum in the last, short block
    late[0, 3] = 1e9  # ... and also early in one row
    masked = torch.randn(rows, columns, generator=g)
    masked[:, ::2] = float("-inf")
    masked[0] = float("-inf")  # a row with nothing left
    masked[-1, columns // 2] = float("nan")  # NaN is torch's maximum
    masked[rows // 2, columns - 1] = float("nan")  # ... in a middle row too, after a finite maximum
    for x in (ties, late, masked, ties.half(), late.bfloat16(), masked.half()):
        assert torch.equal(first_argmax(x), x.argmax(dim=-1))
        assert torch.equal(first_argmax(x.t().contiguous().t()), x.argmax(dim=-1))  # a strided view
    assert torch.equal(first_argmax(late[0]), late[0].argmax(dim=-1))  # other shapes: torch's own
    assert torch.equal(first_argmax(late.view(1, rows, columns)), late.argmax(dim=-1).view(1, rows))


def test_search_names_the_argument_a_caller_got_wrong(tiny_model):
    """`xattn.decoding.search` is public: a config that is not one, 1-D ids, a prefix of other rows or holding BOS,
    raised AttributeError or IndexError, or were taken silently (a 3-row prefix for 1 sentence; BOS forced into the
    output)."""
    from xattn.decoding import search
    from xattn.errors import ParameterError

    model = tiny_model.eval()
    src, cfg = torch.tensor([[5, 6, 2]]), xattn.DecodeConfig(max_len_b=4)
    for kwargs, name, fragment in (
            (dict(cfg={"beam_size": 2}), "cfg", "expected a DecodeConfig, got dict"),
            (dict(src=torch.tensor([5, 6, 2])), "src", "expected a 2-D \\(batch, length\\) tensor"),
            (dict(prefix=torch.tensor([[7]] * 3)), "prefix", "3 rows for the 1 sentences of src"),
            (dict(prefix=torch.tensor([[99999]])), "prefix", "outside this model's vocabulary"),
            (dict(prefix=torch.tensor([[7.0]])), "prefix", "expected a 2-D \\(batch, length\\) tensor"),
            (dict(prefix=torch.tensor([[model.cfg.bos_id, 7]])), "prefix", "holds the BOS id"),
            (dict(enc=model.encode(torch.tensor([[5, 2], [6, 2]]))), "enc", "got one of 2 sentences")):
        args = dict(src=src, cfg=cfg) | kwargs
        with pytest.raises(ParameterError, match=fragment) as e:
            search(model, args.pop("src"), args.pop("cfg"), **args)
        assert e.value.name == name
    assert search(model, src, cfg, torch.tensor([[7, 8]]))[0][0].tokens[:2] == [7, 8]
    # a model whose BOS is its pad id (Marian's: decoder_start_token_id) takes a prefix padded with it
    marian = xattn.Transformer(tiny_config(bos_id=0)).eval()
    two = search(marian, torch.tensor([[5, 6, 2], [7, 2, 0]]), cfg, torch.tensor([[7, 8], [9, 0]]))
    assert two[0][0].tokens[:2] == [7, 8] and two[1][0].tokens[:1] == [9]
