"""SentencePiece pieces -> the words they belong to (xattn.words), for either side of a sentence pair."""
from __future__ import annotations

import functools
from typing import Sequence

from xattn.words import is_separator, split_words

EOS, BOS = "</s>", "<s>"
WORD_START = "\u2581"  # SentencePiece's mark of a piece that starts a word
UNK_PIECE, UNK_SURFACE = "<unk>", "\u2047"  # what SentencePiece prints for an unknown piece, without its spaces
SPECIALS = frozenset({EOS, BOS, "<pad>"})


def piece_words(pieces: Sequence[str], unk_surface: str = UNK_SURFACE) -> tuple[list[str], list[int]]:
    """SentencePiece pieces -> (words, word index of each piece; -1 for </s>, <s>).

    A word (xattn.words) of the text the pieces spell ("\u2581" read as a space, an unknown piece as
    `unk_surface`): for a hypothesis, the words of its printed text (its tokenizer decodes "<unk>" to " \u2047 ");
    for a source, those of the line it was encoded from. A piece that spells no character (a lone "\u2581")
    belongs to the word after it.
    """
    words: list[str] = []
    word_of: list[int] = []
    pending: list[int] = []  # pieces that spelled nothing yet
    in_word = False
    for piece in pieces:
        if piece in SPECIALS:
            word_of.append(-1)
            in_word = False
            continue
        word_of.append(-2)
        pending.append(len(word_of) - 1)
        split_first, runs, ends_in_word = spelling(unk_surface if piece == UNK_PIECE else piece)
        for n, run in enumerate(runs):
            if n == 0 and in_word and not split_first:
                words[-1] += run
            else:
                words.append(run)
            if n == 0:
                for k in pending:
                    word_of[k] = len(words) - 1
                pending = []
        in_word = in_word if ends_in_word is None else ends_in_word
    for k in pending:  # spelled nothing and no word follows: the word before, if any
        word_of[k] = len(words) - 1
    return words, word_of


@functools.lru_cache(maxsize=1 << 16)
def spelling(piece: str) -> tuple[bool, tuple[str, ...], bool | None]:
    """What a piece spells ("\u2581" read as a space), as piece_words reads it: (a separator comes before its
    first run of word characters, those runs, it ends inside a word: None for a piece of no characters)."""
    text = piece.replace(WORD_START, " ")
    runs: list[str] = []
    run, split_first = "", False
    for ch in text:
        if not is_separator(ch):
            run += ch
            continue
        if run:
            runs.append(run)
            run = ""
        elif not runs:
            split_first = True
    if run:
        runs.append(run)
    return split_first, tuple(runs), (not is_separator(text[-1])) if text else None


def word_membership(tokenizer, text: str, pieces: Sequence[str]) -> list[int] | None:
    """Word index of each of `pieces` (the line's pieces + </s>), from encoding its words (xattn.words) one by
    one; None when the line's pieces are not its words' pieces in a row."""
    return word_memberships(tokenizer, [text], [pieces])[0]


def word_memberships(tokenizer, texts: Sequence[str], pieces: Sequence[Sequence[str]]) -> list[list[int] | None]:
    """word_membership of each line, the words of all lines encoded together (by_words: Tokenizer.encode_batch
    picks the quickest way for their number)."""
    ids, word_of = by_words(tokenizer, texts, -1)
    return [of if tokenizer.pieces(line[:-1]) == list(given[:-1]) else None
            for line, of, given in zip(ids, word_of, pieces, strict=True)]


def by_words(tokenizer, texts: Sequence[str], eos: int) -> tuple[list[list[int]], list[list[int]]]:
    """Each text encoded word by word (xattn.words) + </s>: (ids, word index of each id, -1 for </s>).

    SentencePiece never joins pieces across a word separator, so this is the whole line's encoding, with each
    piece's word known exactly (a word the tokenizer drops entirely has no piece).
    """
    words = [split_words(text) for text in texts]
    flat = tokenizer.encode_batch([w for ws in words for w in ws])
    ids, word_of, k = [], [], 0
    for ws in words:
        per_word = flat[k: k + len(ws)]
        k += len(ws)
        ids.append([i for word in per_word for i in word] + [eos])
        word_of.append([w for w, word in enumerate(per_word) for _ in word] + [-1])
    return ids, word_of
