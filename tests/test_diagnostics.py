"""Diagnostics from cross-attention on hand-made maps: coverage, entropy, </s> mass, flags."""
import numpy as np

from xattn.analysis.diagnostics import Thresholds, diagnose, summary
from xattn.analysis.maps import HeadChoice, PairAttention


def pair_with(rows: list[list[float]], src=("▁a", "▁b", "▁c", "</s>")) -> PairAttention:
    """A pair whose one head's cross-attention has the given rows (one per decoding step)."""
    cross = np.array(rows, dtype=np.float32)[None, None]  # (1, 1, T, S)
    tgt = [f"▁x{t}" for t in range(len(rows) - 1)] + ["</s>"]
    return PairAttention.build(list(src), tgt, cross)


def test_coverage_and_under_translation():
    d = diagnose(pair_with([[1, 0, 0, 0], [1, 0, 0, 0], [0, 0.9, 0.1, 0], [0, 0, 0, 1]]), HeadChoice(0))
    np.testing.assert_allclose(d.coverage, [2.0, 0.9, 0.1])
    assert d.least_covered == "c" and d.most_covered == "a"
    assert d.flags == ["under"]
    assert abs(d.eos_mass - 0.25) < 1e-6
    # entropy in nats: one step spreads 0.9 / 0.1, the others are one-hot
    expected = -(0.9 * np.log(0.9) + 0.1 * np.log(0.1)) / 4
    assert abs(d.entropy - expected) < 1e-5


def test_one_hot_attention_has_entropy_zero_not_minus_zero():
    d = diagnose(pair_with([[1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]]), HeadChoice(0))
    assert d.entropy == 0.0 and str(d.entropy) == "0.0"  # -(1 * log 1) is -0.0, printed as such before
    assert str(summary([d])["mean_entropy"]) == "0.0"


def test_over_translation_and_detached():
    over = diagnose(pair_with([[1, 0, 0, 0]] * 3 + [[0.3, 0.3, 0.4, 0]]), HeadChoice(0), Thresholds(over=2.5))
    assert "over" in over.flags and over.most_covered == "a"
    detached = diagnose(pair_with([[0.3, 0.3, 0.3, 0.1], [0, 0, 0.1, 0.9], [0, 0, 0.2, 0.8], [0.1, 0, 0, 0.9]]),
                        HeadChoice(0))
    # target words are read where they are predicted (rows 0-2): two of three look at </s> most
    assert abs(detached.eos_share - 2 / 3) < 1e-6 and "detached" in detached.flags
    s = summary([over, detached])
    assert s["sentences"] == 2 and s["flag_detached"] == 1 and s["flagged"] == 2


def test_punctuation_is_not_under_translated():
    pair = pair_with([[0.5, 0.5, 0, 0], [0.5, 0.5, 0, 0], [0, 0, 0, 1]], src=("▁a", "▁b", "▁.", "</s>"))
    assert diagnose(pair, HeadChoice(0)).flags == []
