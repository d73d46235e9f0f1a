"""Word alignments: link sets, Pharaoh I/O and symmetrisation (later: attention -> links).

A link (i, j) joins source word i and target word j, both 0-based; an alignment is a `set[tuple[int, int]]`.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Sequence

from xattn.errors import XattnError
from xattn.io import read_lines

Links = set[tuple[int, int]]

# ------------------------------------------------------------------------------ Pharaoh I/O and symmetrisation

_LINK = re.compile(r"(-?[0-9]+)([-p])(-?[0-9]+)")


def format_links(links: Links, possible: Links = frozenset(), one_indexed: bool = False) -> str:
    """Pharaoh text "0-0 1-2 ...", sorted by (i, j); links only in `possible` are written "ipj"."""
    base = 1 if one_indexed else 0
    sure = set(links)
    return " ".join(f"{i + base}{'-' if (i, j) in sure else 'p'}{j + base}" for i, j in sorted(sure | set(possible)))


def parse_links(line: str, one_indexed: bool = False, reverse: bool = False,
                lengths: tuple[int, int] | None = None, where: str = "links") -> tuple[Links, Links]:
    """One line of Pharaoh links -> (sure, possible), 0-based; `possible` includes `sure`.

    Tokens are `i-j` (sure) or `ipj` (possible), separated by whitespace; an empty line has no links.
    `lengths` = (n, m) bounds the first and the second index as written (before `reverse`, which turns
    (i, j) into (j, i)). Errors name `where` (e.g. "gold.talp: line 3") and the token.
    """
    base = 1 if one_indexed else 0
    sure, possible = set(), set()
    for token in line.split():
        match = _LINK.fullmatch(token)
        if match is None:
            raise XattnError(f"{where}: {token!r} is not a link (expected i-j for sure or ipj for possible)")
        link = (int(match[1]) - base, int(match[3]) - base)
        for side, (k, written) in enumerate(zip(link, (match[1], match[3]))):
            if k < 0:
                first = "1 is the first word" if one_indexed else "0 is the first word"
                raise XattnError(f"{where}: link {token!r}: index {written} is not a word ({first})")
            if lengths is not None and k >= lengths[side]:
                raise XattnError(f"{where}: link {token!r}: index {written} is beyond the {lengths[side]} words of "
                                 f"the {('first', 'second')[side]} side "
                                 f"({'1' if one_indexed else '0'}-based indices)")
        if reverse:
            link = link[::-1]
        possible.add(link)
        if match[2] == "-":
            sure.add(link)
    return sure, possible


def parse_alignments(lines: Sequence[str], where: str, one_indexed: bool = False, reverse: bool = False,
                     lengths: Sequence[tuple[int, int]] | None = None) -> list[tuple[Links, Links]]:
    """Lines of Pharaoh links -> [(sure, possible), ...]; `where` names the file in errors; see `parse_links`."""
    if lengths is not None and len(lengths) != len(lines):
        raise XattnError(f"{where} has {len(lines)} lines, but {len(lengths)} sentence pairs were given")
    return [parse_links(line, one_indexed, reverse, None if lengths is None else lengths[n], f"{where}: line {n + 1}")
            for n, line in enumerate(lines)]


def read_alignments(path: str | Path, one_indexed: bool = False, reverse: bool = False,
                    lengths: Sequence[tuple[int, int]] | None = None) -> list[tuple[Links, Links]]:
    """A Pharaoh file (one sentence pair a line) -> [(sure, possible), ...]; see `parse_links`."""
    return parse_alignments(read_lines(path), str(path), one_indexed, reverse, lengths)


SYMMETRISATIONS = ("intersect", "union", "grow-diag", "grow-diag-final", "grow-diag-final-and")
# The order matters (see `symmetrise`): left, up, right, down, then the diagonals; (di, dj) in (source, target).
NEIGHBOURS = ((-1, 0), (0, -1), (1, 0), (0, 1), (-1, -1), (-1, 1), (1, -1), (1, 1))


def symmetrise(forward: Links, backward: Links, method: str, src_len: int, tgt_len: int) -> Links:
    """Combine a source->target (`forward`) and a target->source (`backward`) alignment, both as (i, j) links.

    The heuristics of Koehn et al. (2003) as the Moses manual writes them, with i = source, j = target:
      intersect  forward ∩ backward;  union  forward ∪ backward.
      grow-diag  start from the intersection A. Sweep: for i = 0..src_len-1, for j = 0..tgt_len-1, if (i, j)
                 is in A (points added earlier in the same sweep count), visit its neighbours (i+di, j+dj) in
                 the order of NEIGHBOURS; add a neighbour to A at once if it is in the union and its source
                 word or its target word is not yet aligned in A. Repeat sweeps until one adds nothing.
      grow-diag-final  grow-diag, then FINAL(forward), then FINAL(backward), where FINAL(X): for the links
                 (i, j) of X in sorted order, add (i, j) to A at once if word i or word j is not yet aligned.
      grow-diag-final-and  the same, except that FINAL adds (i, j) only if both words are unaligned.
    Adding at once makes the result depend on these orders; they are fixed, so the result is deterministic.
    Moses' symal program visits points and directions in orders of its own, so its output may differ on a
    few points. intersect, union and grow-diag are symmetric in `forward` and `backward`; the FINAL
    variants are not. Links outside src_len x tgt_len are an error.
    """
    if method not in SYMMETRISATIONS:
        raise XattnError(f"unknown symmetrisation {method!r}; choose one of {', '.join(SYMMETRISATIONS)}")
    for name, links in (("forward", forward), ("backward", backward)):
        bad = [(i, j) for i, j in links if not (0 <= i < src_len and 0 <= j < tgt_len)]
        if bad:
            raise XattnError(f"{name} alignment: link {min(bad)} is outside a {src_len}x{tgt_len} sentence pair")
    if method == "intersect":
        return set(forward) & set(backward)
    if method == "union":
        return set(forward) | set(backward)
    grid = _Grid(set(forward) & set(backward))
    grid.grow_diag(set(forward) | set(backward), src_len, tgt_len)
    if method != "grow-diag":
        for links in (forward, backward):
            grid.final(links, both_unaligned=method == "grow-diag-final-and")
    return grid.links


class _Grid:
    """An alignment being grown, with the words it aligns on each side."""

    def __init__(self, links: Links):
        self.links = set(links)
        self.src = {i for i, _ in links}
        self.tgt = {j for _, j in links}

    def add(self, i: int, j: int) -> None:
        self.links.add((i, j))
        self.src.add(i)
        self.tgt.add(j)

    def grow_diag(self, union: Links, src_len: int, tgt_len: int) -> None:
        added = True
        while added:
            added = False
            for i in range(src_len):
                for j in range(tgt_len):
                    if (i, j) not in self.links:
                        continue
                    for di, dj in NEIGHBOURS:
                        n = (i + di, j + dj)
                        if n in union and n not in self.links and (n[0] not in self.src or n[1] not in self.tgt):
                            self.add(*n)
                            added = True

    def final(self, links: Links, both_unaligned: bool) -> None:
        for i, j in sorted(links):
            free_i, free_j = i not in self.src, j not in self.tgt
            if (free_i and free_j) if both_unaligned else (free_i or free_j):
                self.add(i, j)
