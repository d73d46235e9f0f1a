"""Link sets: Pharaoh I/O and symmetrisation, against a grid worked out by hand."""
import random

import pytest

from xattn.analysis.alignment import SYMMETRISATIONS, format_links, parse_links, read_alignments, symmetrise
from xattn.errors import XattnError

# ------------------------------------------------------------------------------------------- Pharaoh I/O


def test_format_is_sorted_and_round_trips():
    sure = {(2, 0), (0, 1), (0, 0), (10, 3)}
    possible = sure | {(1, 1), (0, 5)}
    assert format_links(sure) == "0-0 0-1 2-0 10-3"
    assert format_links(sure, possible) == "0-0 0-1 0p5 1p1 2-0 10-3"
    assert parse_links(format_links(sure, possible)) == (sure, possible)
    assert format_links(sure, one_indexed=True) == "1-1 1-2 3-1 11-4"
    assert parse_links(format_links(sure, possible, one_indexed=True), one_indexed=True) == (sure, possible)
    assert format_links(set()) == "" and parse_links("") == (set(), set()) and parse_links(" \t ") == (set(), set())


def test_parse_one_indexed_and_reversed():
    assert parse_links("1-1 2p3 3-2", one_indexed=True) == ({(0, 0), (2, 1)}, {(0, 0), (1, 2), (2, 1)})
    assert parse_links("0-1 2p3", reverse=True) == ({(1, 0)}, {(1, 0), (3, 2)})
    # lengths bound the indices as written, before the reversal
    assert parse_links("2-0", reverse=True, lengths=(3, 1)) == ({(0, 2)}, {(0, 2)})
    assert parse_links("1-1 1p1") == ({(1, 1)}, {(1, 1)})  # sure wins over a repeated possible


@pytest.mark.parametrize("line, options, message", [
    ("0-0 1x2", {}, "gold.talp: line 7: '1x2' is not a link"),
    ("0-0 1-", {}, "'1-' is not a link"),
    ("0-0 1-2-3", {}, "'1-2-3' is not a link"),
    ("a-b", {}, "'a-b' is not a link"),
    ("1-1 0-2", {"one_indexed": True}, "gold.talp: line 7: link '0-2': index 0 is not a word (1 is the first word)"),
    ("1--2", {}, "link '1--2': index -2 is not a word (0 is the first word)"),
    ("3-1", {"lengths": (3, 5)}, "gold.talp: line 7: link '3-1': index 3 is beyond the 3 words of the first side"),
    ("1-4", {"lengths": (3, 4), "one_indexed": True}, None),
    ("1-5", {"lengths": (3, 4), "one_indexed": True}, "index 5 is beyond the 4 words of the second side (1-based"),
])
def test_parse_errors_name_the_place_and_the_token(line, options, message):
    if message is None:
        parse_links(line, where="gold.talp: line 7", **options)
        return
    with pytest.raises(XattnError) as error:
        parse_links(line, where="gold.talp: line 7", **options)
    assert message in str(error.value)


def test_read_alignments_names_file_and_line(tmp_path):
    path = tmp_path / "hyp.align"
    path.write_text("0-0 1-1\n\n0-1 1p0\n")
    assert read_alignments(path) == [({(0, 0), (1, 1)}, {(0, 0), (1, 1)}), (set(), set()), ({(0, 1)}, {(0, 1), (1, 0)})]
    with pytest.raises(XattnError, match=r"hyp.align: line 3: link '1p0': index 1 is beyond the 1 words"):
        read_alignments(path, lengths=[(2, 2), (0, 0), (1, 2)])
    with pytest.raises(XattnError, match="hyp.align has 3 lines, but 2 sentence pairs were given"):
        read_alignments(path, lengths=[(2, 2), (0, 0)])
    path.write_text("0-0\n0-0 1:1\n")
    with pytest.raises(XattnError, match=r"hyp.align: line 2: '1:1' is not a link"):
        read_alignments(path)
    with pytest.raises(XattnError, match="nope.align: no such file"):
        read_alignments(tmp_path / "nope.align")


def test_the_hansards_gold_parses(hansards):
    gold = read_alignments(hansards / "gold.talp", one_indexed=True)
    assert len(gold) == 447
    assert all(sure <= possible for sure, possible in gold)
    assert sum(map(len, (s for s, _ in gold))) == 4038 and sum(map(len, (p for _, p in gold))) == 17438
    pairs = [line.split("|||") for line in (hansards / "test.en-fr").read_text().splitlines()]
    lengths = [(len(en.split()), len(fr.split())) for en, fr in pairs]
    assert read_alignments(hansards / "gold.talp", one_indexed=True, lengths=lengths) == gold


# ------------------------------------------------------------------------------------------ symmetrisation

# A 5x5 pair worked on paper; rows i (source), columns j (target); f forward only, b backward only, x both.
#
#        j=0 1 2 3 4
#   i=0    x . . . b        forward  F = {00, 11, 22, 30, 44}
#   i=1    . x . . .        backward B = {00, 11, 23, 43, 04}
#   i=2    . . f b .
#   i=3    f . . . .
#   i=4    . . . b f
#
# intersect: {00, 11}.  union: all eight points.
# grow-diag, sweep 1 in row-major order over the points of A:
#   00: its neighbours 10, 01, 11 (the others fall off the grid): none is a union point outside A.
#   11: neighbours 01 10 21 12 00 02 20 22: only 22 is in the union and not in A; source word 2 is unaligned
#       -> add 22 (the diagonal step; plain "grow" would stop here).
#   22: (added in this sweep, reached later in it) neighbours 12 21 32 23 11 13 31 33: 23 is in the union,
#       source 2 is aligned but target 3 is not -> add 23.
#   23: neighbours 13 22 33 24 12 14 32 34: nothing new.
#   Sweep 2 adds nothing (30, 43, 44, 04 touch no point of A).   grow-diag = {00, 11, 22, 23}
#   aligned now: source {0, 1, 2}, target {0, 1, 2, 3}.
# grow-diag-final: FINAL(F) in sorted order: 00 11 22 are in; 30: source 3 unaligned -> add;
#   44: both unaligned -> add. FINAL(B): 00 11 23 in; 04: source 0 and target 4 aligned -> no;
#   43: source 4 and target 3 aligned -> no.   grow-diag-final = {00, 11, 22, 23, 30, 44}
# grow-diag-final-and: FINAL-AND(F): 30: target 0 is aligned -> no; 44: both unaligned -> add.
#   FINAL-AND(B): 04: source 0 aligned -> no; 43: source 4 now aligned -> no.   = {00, 11, 22, 23, 44}
# Swapping the directions, FINAL(B) runs first: 04 (target 4 unaligned) -> add; 43 (source 4) -> add;
#   then FINAL(F): 30 (source 3) -> add; 44: both aligned now -> no.   = {00, 11, 22, 23, 04, 43, 30}


def pts(text: str) -> set[tuple[int, int]]:
    return {(int(p[0]), int(p[1])) for p in text.split()}


F, B = pts("00 11 22 30 44"), pts("00 11 23 43 04")
EXPECTED = {"intersect": pts("00 11"), "union": pts("00 11 22 30 44 23 43 04"), "grow-diag": pts("00 11 22 23"),
            "grow-diag-final": pts("00 11 22 23 30 44"), "grow-diag-final-and": pts("00 11 22 23 44")}


@pytest.mark.parametrize("method", SYMMETRISATIONS)
def test_symmetrise_the_worked_example(method):
    assert symmetrise(F, B, method, 5, 5) == EXPECTED[method]


def test_the_final_steps_depend_on_which_direction_goes_first():
    assert symmetrise(B, F, "grow-diag-final", 5, 5) == pts("00 11 22 23 04 43 30")


def test_grow_diag_adds_in_sweep_order():
    # 12 comes before the diagonal 22 among the neighbours of 11; once 12 aligns target 2, 22 still aligns
    # source 2 and is added too. Row-major sweeps and a fixed neighbour order make this the only answer.
    forward, backward = pts("00 11 12"), pts("00 11 22")
    assert symmetrise(forward, backward, "grow-diag", 3, 3) == pts("00 11 12 22")


def random_alignment(rng: random.Random, n: int, m: int) -> set[tuple[int, int]]:
    return {(i, j) for i in range(n) for j in range(m) if rng.random() < 0.25}


@pytest.mark.parametrize("seed", range(40))
def test_the_heuristics_nest_and_the_symmetric_ones_ignore_direction(seed):
    rng = random.Random(seed)
    n, m = rng.randint(1, 7), rng.randint(1, 7)
    f, b = random_alignment(rng, n, m), random_alignment(rng, n, m)
    got = {method: symmetrise(f, b, method, n, m) for method in SYMMETRISATIONS}
    assert got["intersect"] <= got["grow-diag"] <= got["grow-diag-final"] <= got["union"]
    assert got["grow-diag"] <= got["grow-diag-final-and"] <= got["union"]
    for method in ("intersect", "union", "grow-diag"):
        assert symmetrise(b, f, method, n, m) == got[method]
    # the FINAL steps leave no union point with an unaligned word
    for links in (got["grow-diag-final"], symmetrise(b, f, "grow-diag-final", n, m)):
        src, tgt = {i for i, _ in links}, {j for _, j in links}
        assert all(i in src and j in tgt for i, j in f | b)
    assert symmetrise(f, b, "grow-diag-final", n, m) == got["grow-diag-final"]  # deterministic


def test_symmetrise_refuses_links_outside_the_pair_and_unknown_methods():
    with pytest.raises(XattnError, match=r"backward alignment: link \(2, 0\) is outside a 2x3 sentence pair"):
        symmetrise({(0, 0)}, {(2, 0)}, "union", 2, 3)
    with pytest.raises(XattnError, match="unknown symmetrisation 'grow-diagonal'"):
        symmetrise(set(), set(), "grow-diagonal", 2, 3)
