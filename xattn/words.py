"""What a word is, for every verb that counts words (align, aer, heads align, translate --alignment,
attention --words, diagnose, the server's alignment, corpus length filters): a maximal run of characters
that are not word separators.

The separators are the characters SentencePiece's default normaliser (nmt_nfkc, which xattn trains its
tokenizers with) reads as a space: tab, line feed, form feed, carriage return and Unicode's space, line and
paragraph separators (categories Zs, Zl, Zp). So a word of the text is a word of the tokenizer, and the
pieces of a line are its words' pieces in a row. `str.split()` also splits at the information separators
U+001C..U+001F, at U+0085 (NEL) and at the vertical tab, which SentencePiece drops or keeps as a character;
those stay inside their word here.
"""
from __future__ import annotations

import re

SEPARATORS = "\t\n\f\r \u00a0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a" \
             "\u2028\u2029\u202f\u205f\u3000"
_RUN = re.compile(f"[{SEPARATORS}]+")


def split_words(text: str) -> list[str]:
    """The words of `text`, in order ([] for a text of separators only)."""
    return [word for word in _RUN.split(text) if word]


def is_separator(ch: str) -> bool:
    return ch in SEPARATORS


def strip_separators(text: str) -> str:
    """`text` without separators at either end (where `str.strip()` would also drop U+001C and the like)."""
    return text.strip(SEPARATORS)
