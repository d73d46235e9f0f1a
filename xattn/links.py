"""Word links: the Pharaoh format (read, written), and links between words carried onto their pieces.

A link (i, j) joins source word i and target word j (words as xattn.words splits a line), both 0-based; an
alignment is a `set[tuple[int, int]]`. Without torch: `xattn prepare` maps a training corpus' links here.
"""
from __future__ import annotations

import numbers
import re
from collections.abc import Sequence
from pathlib import Path

from xattn.errors import ItemError, ParameterError, XattnError
from xattn.lines import read_lines
from xattn.words import split_words

Links = set[tuple[int, int]]

# ------------------------------------------------------------------------------------------------ Pharaoh

_LINK = re.compile(r"(-?[0-9]+)([-p])(-?[0-9]+)")


def check_links(name: str, links, lengths: tuple[int, int] | None = None) -> list[tuple[int, int]]:
    """`links` as a list of (i, j) of Python ints, once every item is a link of two whole numbers from 0 (NumPy's
    too; below `lengths` (source words, target words) when given): else an ItemError naming `name`[k], or a
    ParameterError if `links` is not a collection of them."""
    if isinstance(links, (str, bytes, dict)) or not hasattr(links, "__iter__"):
        raise ParameterError(name, f"a collection of links (source word i, target word j), got {type(links).__name__}")
    checked = []
    for k, link in enumerate(links):  # (read once: an iterator goes by once)
        pair = tuple(link) if hasattr(link, "__len__") and not isinstance(link, (str, bytes)) else ()
        if len(pair) != 2 or not all(isinstance(x, numbers.Integral) and not isinstance(x, bool) and x >= 0
                                     for x in pair):
            raise ItemError(name, k, f"a link (source word i, target word j) of two whole numbers from 0, got {link!r}")
        pair = (int(pair[0]), int(pair[1]))
        if lengths is not None and (pair[0] >= lengths[0] or pair[1] >= lengths[1]):
            raise ItemError(name, k, f"{pair}: this pair has {lengths[0]} source and {lengths[1]} target words "
                            "(0-based)")
        checked.append(pair)
    return checked


def format_links(links: Links, possible: Links = frozenset(), one_indexed: bool = False) -> str:
    """Pharaoh text "0-0 1-2 ...", sorted by (i, j); links only in `possible` are written "ipj"."""
    links, possible = check_links("links", links), check_links("possible", possible)
    if not isinstance(one_indexed, bool):
        raise ParameterError("one_indexed", f"True or False, got {one_indexed!r}")
    base = 1 if one_indexed else 0
    sure = set(links)
    return " ".join(f"{i + base}{'-' if (i, j) in sure else 'p'}{j + base}" for i, j in sorted(sure | set(possible)))


def parse_links(line: str, one_indexed: bool = False, reverse: bool = False,
                lengths: tuple[int, int] | None = None, where: str = "links") -> tuple[Links, Links]:
    """One line of Pharaoh links -> (sure, possible), 0-based; `possible` includes `sure`.

    Tokens are `i-j` (sure) or `ipj` (possible), separated as words are (xattn.words); an empty line has no links.
    `lengths` = (n, m) bounds the first and the second index as written (before `reverse`, which turns
    (i, j) into (j, i)). Errors name `where` (e.g. "gold.talp: line 3") and the token.
    """
    base = 1 if one_indexed else 0
    sure, possible = set(), set()
    for token in split_words(line):
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


# ----------------------------------------------------------------------------------------- words -> pieces

def piece_links(links: Links, src_word_of: Sequence[int], tgt_word_of: Sequence[int]) -> list[tuple[int, int]]:
    """Word links -> piece links (s, t), sorted: each piece inherits its word's links, so a link (i, j) joins
    every piece s of source word i with every piece t of target word j. `src_word_of[s]`, `tgt_word_of[t]`:
    the word of each piece (-1 for a piece of no word); a word without pieces loses its links."""
    src_pieces: dict[int, list[int]] = {}
    tgt_pieces: dict[int, list[int]] = {}
    for pieces, word_of in ((src_pieces, src_word_of), (tgt_pieces, tgt_word_of)):
        for k, w in enumerate(word_of):
            if w >= 0:
                pieces.setdefault(w, []).append(k)
    return sorted({(s, t) for i, j in links for s in src_pieces.get(i, ()) for t in tgt_pieces.get(j, ())})


def word_of_pieces(encode, texts: Sequence[str], ids: Sequence[Sequence[int]]) -> list[list[int] | None]:
    """The word (xattn.words) of each of `ids[k]`, the line `texts[k]`'s pieces, found by encoding its words
    one by one with `encode` (a tokenizer's encode_batch); None where the words' pieces in a row are not the
    line's (a normaliser that joins or drops what the words hold)."""
    words = [split_words(text) for text in texts]
    per_word = encode([w for ws in words for w in ws])
    out, k = [], 0
    for ws, line in zip(words, ids):
        pieces = per_word[k: k + len(ws)]
        k += len(ws)
        word_of = [w for w, word in enumerate(pieces) for _ in word]
        out.append(word_of if [i for word in pieces for i in word] == list(line) else None)
    return out


def corpus_piece_links(rows: Sequence[tuple], src_ids: Sequence[Sequence[int]], tgt_ids: Sequence[Sequence[int]],
                       tokenizers, path: str) -> tuple[list[list[int]], dict[str, int]]:
    """The piece links of training pairs, each flat as [s0, t0, s1, t1, ...] (xattn.data.prepared stores them
    like a side's ids). `rows[k]`: (source text, target text, its line of the links file `path` or None, that
    line's number, ...), `src_ids[k]`, `tgt_ids[k]` its pieces. Sure and possible links alike. A link outside the
    pair's words is one XattnError naming `path` and the line. Returns the links and counts: pairs with
    links, piece links, and pairs whose words the tokenizer splits otherwise than their line (links dropped)."""
    src_of = word_of_pieces(tokenizers.src.encode_batch, [r[0] for r in rows], src_ids)
    tgt_of = word_of_pieces(tokenizers.tgt.encode_batch, [r[1] for r in rows], tgt_ids)
    out, counts = [], {"pairs": 0, "links": 0, "unmatched": 0}
    for (src, tgt, line, number, *_), s_of, t_of in zip(rows, src_of, tgt_of):
        if not line:
            out.append([])
            continue
        _, links = parse_links(line, lengths=(len(split_words(src)), len(split_words(tgt))),
                               where=f"{path}: line {number}")
        if s_of is None or t_of is None:
            counts["unmatched"] += 1
            out.append([])
            continue
        pieces = piece_links(links, s_of, t_of)
        counts["pairs"] += bool(pieces)
        counts["links"] += len(pieces)
        out.append([k for link in pieces for k in link])
    return out, counts
