import pytest
import torch

from xattn.config import DecodeConfig, ModelConfig
from xattn.decoding.processors import (StepState, constraints, max_length, min_length, no_repeat_ngram, temperature, top_k,
                              top_p)

NEG = float("-inf")


def _state(tokens, t=None, max_len=10, prefix=None):
    tokens = torch.tensor(tokens, dtype=torch.long).view(len(tokens), -1)
    return StepState(tokens.shape[1] if t is None else t, tokens, torch.full((tokens.shape[0],), max_len), prefix)


def test_top_k_keeps_the_k_best():
    lp = torch.tensor([[0.1, 0.5, 0.2, 0.9]]).log()
    out = top_k(2)(lp, _state([[]]))
    assert torch.isinf(out[0, [0, 2]]).all() and torch.isfinite(out[0, [1, 3]]).all()


def test_top_p_keeps_the_smallest_set_reaching_p():
    lp = torch.tensor([[0.05, 0.5, 0.15, 0.3]]).log()
    assert torch.isfinite(top_p(0.8)(lp, _state([[]]))).tolist() == [[False, True, False, True]]
    assert torch.isfinite(top_p(0.81)(lp, _state([[]]))).tolist() == [[False, True, True, True]]
    assert torch.isfinite(top_p(0.4)(lp, _state([[]]))).tolist() == [[False, True, False, False]]


def test_temperature_renormalises():
    lp = torch.tensor([[0.2, 0.8]]).log()
    out = temperature(0.5)(lp, _state([[]])).exp()
    assert out[0].tolist() == pytest.approx([0.04 / 0.68, 0.64 / 0.68])


def test_no_repeat_ngram_bans_the_completing_token():
    lp = torch.zeros(2, 6)
    out = no_repeat_ngram(2)(lp, _state([[3, 4, 5, 3], [1, 2, 1, 2]]))
    assert out[0].tolist() == [0, 0, 0, 0, NEG, 0]   # "3 4" seen: 4 may not follow 3 again
    assert out[1].tolist() == [0, NEG, 0, 0, 0, 0]   # "2 1" seen: 1 may not follow 2 again
    out3 = no_repeat_ngram(3)(lp, _state([[3, 4, 5, 3, 4], [1, 2, 1, 2, 3]]))
    assert out3[0].tolist() == [0, 0, 0, 0, 0, NEG] and out3[1].eq(0).all()


def test_lengths_and_prefix():
    lp = lambda: torch.zeros(2, 5)  # noqa: E731  (constraints write in place: a fresh tensor each call)
    assert min_length(2, 2)(lp(), _state([[7], [7]], t=1))[:, 2].eq(NEG).all()
    assert min_length(2, 2)(lp(), _state([[7, 7], [7, 7]], t=2)).eq(0).all()
    forced = max_length(2)(lp(), StepState(3, torch.zeros(2, 3, dtype=torch.long), torch.tensor([3, 5])))
    assert forced[0].tolist() == [NEG, NEG, 0, NEG, NEG] and forced[1].eq(0).all()
    prefix = torch.tensor([[4, 3], [4, 0]])
    rules = constraints(DecodeConfig(no_repeat_ngram_size=1), ModelConfig(src_vocab_size=5, tgt_vocab_size=5))
    out, _ = rules(lp(), StepState(1, torch.tensor([[3], [3]]), torch.tensor([9, 9]), prefix))
    assert out[0].tolist() == [NEG, NEG, NEG, 0, NEG]  # its prefix token, though no_repeat_ngram bans a second 3
    assert out[1].tolist() == [NEG, NEG, 0, NEG, 0]  # past its prefix: the rules (pad, BOS and the repeated 3 banned)
    out, _ = rules(lp(), StepState(0, torch.zeros(2, 0, dtype=torch.long), torch.tensor([9, 9]), prefix))
    assert out[1].tolist() == [NEG, NEG, NEG, NEG, 0]
    scores = torch.tensor([[-1.0, -2.0, -3.0], [-4.0, -5.0, -6.0]])
    kept = max_length(1)(scores.clone(), StepState(2, torch.zeros(2, 2, dtype=torch.long), torch.tensor([2, 7])))
    assert kept.tolist() == [[NEG, -2.0, NEG], [-4.0, -5.0, -6.0]]  # the forced token keeps its own log-prob


@pytest.mark.parametrize("value", [1e-300, 1.7e-121, 1e-30, 0.5, 3.4028235677973366e+38, 1e300])
def test_extreme_temperatures_give_a_distribution_not_nan(value):
    from xattn.decoding.processors import temperature

    lp = torch.tensor([[0.0, -1.0, -5.0, float("-inf")]]).log_softmax(-1)
    out = temperature(value)(lp, None).exp()
    assert torch.isfinite(out).all() and out[0, 3] == 0 and torch.allclose(out.sum(-1), torch.ones(1))


def test_the_maximum_length_wins_over_a_longer_minimum():
    """--min-len 2 with a maximum length of 1: EOS at the maximum, never a row with nothing allowed."""
    from xattn.decoding.processors import StepState, apply_all, max_length, min_length

    lp = torch.tensor([[-1.0, -2.0, -0.5], [-1.0, -2.0, -0.5]])  # EOS is id 2
    state = StepState(1, torch.zeros(2, 1, dtype=torch.long), torch.tensor([1, 5]), None)
    out = apply_all([min_length(2, 2), max_length(2)], lp.clone(), state)
    assert out[0].tolist() == [float("-inf"), float("-inf"), -0.5]  # at its maximum: EOS, with its own score
    assert out[1, 2] == float("-inf") and torch.isfinite(out[1, :2]).all()  # below it: the minimum holds


@pytest.mark.parametrize("p", [2.7e-144, 1e-45, 1e-3])
def test_top_p_always_keeps_the_most_probable_token(p):
    from xattn.decoding.processors import top_p

    lp = torch.tensor([[-2.0, -0.1, -3.0, float("-inf")]])
    out = top_p(p)(lp.clone(), None)
    assert out[0, 1] == lp[0, 1] and torch.isinf(out[0, [0, 2, 3]]).all()
