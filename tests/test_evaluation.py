import pytest

from xattn.errors import XattnError
from xattn.evaluation import Score, bleu, chrf, evaluate

REFS = ["The cat sat on the mat .", "A dog runs through the green park .", "Two men are playing football outside ."]


def test_identical_output_scores_100():
    assert bleu(REFS, REFS).score == pytest.approx(100.0)
    assert chrf(REFS, REFS).score == pytest.approx(100.0)


def test_lowercased_bleu_ignores_case():
    hyps = [r.upper() for r in REFS]
    assert bleu(hyps, REFS, lowercase=True).score > bleu(hyps, REFS).score
    assert bleu(hyps, REFS, lowercase=True).score == pytest.approx(100.0)


def test_signatures_name_case_and_tokenizer():
    scores = evaluate(REFS[:2], REFS[:2])
    assert set(scores) == {"bleu", "bleu_lc", "chrf"}
    assert all(isinstance(s, Score) and s.name == key for key, s in scores.items())
    assert "case:mixed" in scores["bleu"].signature and "tok:13a" in scores["bleu"].signature
    assert "case:lc" in scores["bleu_lc"].signature
    assert "nc:6" in scores["chrf"].signature
    assert str(scores["bleu"]).startswith("bleu = 100.00 (nrefs:1|")


def test_partial_match_scores_between_0_and_100():
    hyps = ["The cat sat on a mat .", "A dog runs in the park .", "Two men play football ."]
    assert 0 < bleu(hyps, REFS).score < 100


@pytest.mark.parametrize("hyps, refs", [(REFS, REFS[:2]), ([], [])])
def test_bad_lengths_are_user_errors(hyps, refs):
    with pytest.raises(XattnError):
        bleu(hyps, refs)
    with pytest.raises(XattnError):
        evaluate(hyps, refs)
