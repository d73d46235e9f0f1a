"""Precision, recall and AER against sure/possible gold, by hand; `xattn aer` end to end (its errors: test_cli_errors)."""
import json

import pytest

from xattn.analysis.aer import AERScore, score
from xattn.analysis.alignment import format_links, read_alignments
from xattn.cli.main import main
from xattn.errors import XattnError

# Two sentences, sure S, possible P (⊇ S), hypothesis A:
#   1: S = {00, 11}  P = S + {12}   A = {00, 12, 22}   |A| = 3  |A∩S| = 1 (00)  |A∩P| = 2 (00, 12)
#   2: S = {00}      P = S + {11}   A = {11}           |A| = 1  |A∩S| = 0       |A∩P| = 1 (11)
# pooled: |A| = 4, |S| = 3, |P| = 5, |A∩S| = 1, |A∩P| = 3
#   precision = 3/4 = 0.75, recall = 1/3, AER = 1 - (1 + 3)/(4 + 3) = 3/7 = 0.428571...
# (the mean of the sentence AERs, (1 - 3/5 + 1 - 1/2)/2 = 0.45, is not what is reported)
GOLDS = [({(0, 0), (1, 1)}, {(0, 0), (1, 1), (1, 2)}), ({(0, 0)}, {(0, 0), (1, 1)})]
HYPS = [{(0, 0), (1, 2), (2, 2)}, {(1, 1)}]


def test_the_worked_example():
    result = score(HYPS, GOLDS)
    assert result == AERScore(precision=0.75, recall=pytest.approx(1 / 3), aer=pytest.approx(3 / 7),
                              n_links=4, n_sure=3, n_possible=5)


def test_sure_links_count_as_possible_whether_or_not_the_gold_lists_them():
    assert score(HYPS, [(sure, possible - sure) for sure, possible in GOLDS]) == score(HYPS, GOLDS)


def test_possible_links_raise_precision_but_not_recall():
    sure, possible = {(0, 0), (1, 1)}, {(0, 0), (1, 1), (1, 2), (2, 2)}
    exact = score([sure], [(sure, possible)])
    assert (exact.precision, exact.recall, exact.aer) == (1.0, 1.0, 0.0)
    everything = score([possible], [(sure, possible)])  # 1 - (2 + 4)/(4 + 2) = 0
    assert (everything.precision, everything.recall, everything.aer) == (1.0, 1.0, 0.0)
    half = score([{(0, 0), (1, 2)}], [(sure, possible)])  # P 2/2, R 1/2, AER 1 - (1 + 2)/(2 + 2) = 1/4
    assert (half.precision, half.recall, half.aer) == (1.0, 0.5, 0.25)
    wrong = score([{(0, 0), (2, 0)}], [(sure, possible)])  # P 1/2, R 1/2, AER 1 - (1 + 1)/(2 + 2) = 1/2
    assert (wrong.precision, wrong.recall, wrong.aer) == (0.5, 0.5, 0.5)


def test_empty_sets_by_convention_and_mismatched_counts():
    nothing = score([set()], [({(0, 0)}, {(0, 0)})])
    assert (nothing.precision, nothing.recall, nothing.aer) == (1.0, 0.0, 1.0)
    no_gold = score([{(0, 0)}], [(set(), set())])
    assert (no_gold.precision, no_gold.recall, no_gold.aer) == (0.0, 1.0, 1.0)
    assert score([set()], [(set(), set())]) == AERScore(1.0, 1.0, 0.0, 0, 0, 0)
    assert score([], []) == AERScore(1.0, 1.0, 0.0, 0, 0, 0)
    with pytest.raises(XattnError, match="2 hypothesis alignments but 1 gold alignments"):
        score(HYPS, GOLDS[:1])


# ------------------------------------------------------------------------------------------------- the CLI

def aer(argv, capsys) -> tuple[int, str]:
    code = main(["aer", *argv])
    captured = capsys.readouterr()
    assert captured.err == "", captured.err
    return code, captured.out


@pytest.fixture
def files(tmp_path):
    """The worked example as files: the gold 1-based, the hypothesis 0-based and reversed (target-source)."""
    (tmp_path / "gold.talp").write_text("1-1 2-2 2p3\n1-1 2p2\n")
    (tmp_path / "hyp.align").write_text("0-0 1-2 2-2\n1-1\n")
    (tmp_path / "hyp-reversed.align").write_text("0-0 2-1 2-2\n1-1\n")
    (tmp_path / "pairs.txt").write_text("a b c ||| x y z\nd e ||| u v\n")
    (tmp_path / "pairs-reversed.txt").write_text("x y z ||| a b c\nu v ||| d e\n")
    (tmp_path / "src.txt").write_text("a b c\nd e\n")
    (tmp_path / "tgt.txt").write_text("x y z\nu v\n")
    return tmp_path


def test_cli_table_and_json(files, capsys):
    gold, hyp = str(files / "gold.talp"), str(files / "hyp.align")
    code, out = aer(["--gold", gold, "--hyp", hyp, "--gold-one-indexed"], capsys)
    assert code == 0
    assert out == ("precision  recall   AER  links  sure  possible  sentences\n"
                   "     75.0    33.3  42.9      4     3         5          2\n")
    code, out = aer(["--gold", gold, "--hyp", hyp, "--gold-one-indexed", "--json"], capsys)
    assert code == 0 and json.loads(out) == {"precision": 75.0, "recall": 33.33, "aer": 42.86, "links": 4, "sure": 3,
                                             "possible": 5, "sentences": 2}


def test_cli_precision_of_no_links_and_recall_of_no_sure_links_are_not_scores(files, capsys):
    """No link proposed: precision is undefined, n/a (null), not the library's conventional 100; no sure link in the
    gold: recall likewise."""
    (files / "none.align").write_text("\n\n")
    code, out = aer(["--gold", str(files / "gold.talp"), "--hyp", str(files / "none.align"), "--gold-one-indexed",
                     "--json"], capsys)
    assert code == 0 and json.loads(out) == {"precision": None, "recall": 0.0, "aer": 100.0, "links": 0, "sure": 3,
                                             "possible": 5, "sentences": 2}
    (files / "possible.talp").write_text("1p1\n\n")  # no sure links: recall is undefined, AER is not
    (files / "one.align").write_text("0-0\n\n")
    code, out = aer(["--gold", str(files / "possible.talp"), "--hyp", str(files / "one.align"), "--gold-one-indexed",
                     "--json"], capsys)
    assert code == 0 and json.loads(out) == {"precision": 100.0, "recall": None, "aer": 0.0, "links": 1, "sure": 0,
                                             "possible": 1, "sentences": 2}


@pytest.mark.parametrize("text, reversed_text", [
    (["--pairs", "pairs.txt"], ["--pairs", "pairs-reversed.txt"]),
    (["--src", "src.txt", "--tgt", "tgt.txt"], ["--src", "tgt.txt", "--tgt", "src.txt"]),
])
def test_cli_with_sentences_and_reversed(files, text, reversed_text, capsys):
    expected = {"precision": 75.0, "recall": 33.33, "aer": 42.86}
    for hyp, sentences, reverse in (("hyp.align", text, []), ("hyp-reversed.align", reversed_text, ["--reverse"])):
        sentences = [a if a.startswith("--") else str(files / a) for a in sentences]
        code, out = aer(["--gold", str(files / "gold.talp"), "--gold-one-indexed", "--hyp", str(files / hyp), "--json",
                         *sentences, *reverse], capsys)
        assert code == 0 and json.loads(out).items() >= expected.items()


def test_the_hansards_gold_scores_its_own_sure_links_perfectly(hansards, tmp_path, capsys):
    gold = read_alignments(hansards / "gold.talp", one_indexed=True)
    (tmp_path / "sure.align").write_text("".join(format_links(sure) + "\n" for sure, _ in gold))
    code, out = aer(["--gold", str(hansards / "gold.talp"), "--hyp", str(tmp_path / "sure.align"), "--gold-one-indexed",
                     "--pairs", str(hansards / "test.en-fr"), "--json"], capsys)
    assert code == 0 and json.loads(out) == {"precision": 100.0, "recall": 100.0, "aer": 0.0, "links": 4038,
                                             "sure": 4038, "possible": 17438, "sentences": 447}


def test_cli_help_has_a_hansards_example(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["aer", "--help"])
    assert exit_.value.code == 0
    assert "xattn aer --gold ../shared/data/alignment/hansards-en-fr/gold.talp" in capsys.readouterr().out
