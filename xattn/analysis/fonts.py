"""Fonts for token labels in any script: matplotlib's default font first, then installed fonts that have the
glyphs it lacks (Chinese, Japanese, Korean, ...), as a fallback list of families for one figure.

matplotlib draws a box for a character its font lacks; since 3.6 it tries each family of a list in turn,
so the list only needs fonts that cover what the default font misses. When no installed font covers a
character, one line on stderr says which characters and which package to install, and the figure is still drawn.
"""
from __future__ import annotations

import sys
import unicodedata
from contextlib import contextmanager
from functools import lru_cache
from typing import Iterable, Iterator, NamedTuple

EAST_ASIAN = ("CJK", "HIRAGANA", "KATAKANA", "HANGUL", "BOPOMOFO", "IDEOGRAPHIC", "HALFWIDTH", "FULLWIDTH")
PLACEHOLDER_FONTS = ("Last Resort",)  # matplotlib's own: a box for every character, which is no glyph
_warned: set[str] = set()  # characters already named in a warning, so that a run of figures warns once


class Font(NamedTuple):
    family: str
    path: str
    index: int  # the face in a .ttc collection


def families(texts: Iterable[str]) -> list[str]:
    """Families to draw `texts` with: the default font's, then, for the characters it lacks, the fewest
    installed fonts that have them (chosen greedily, most characters first)."""
    default = _default_font()
    missing = {ord(ch) for ch in _drawn(texts)} - _charmap(default.path, default.index)  # code points
    chosen = [default.family]
    if not missing:
        return chosen
    coverage = {font: missing & _charmap(font.path, font.index) for font in _candidates()
                if font.family not in chosen}
    while missing and coverage:
        best = min(coverage, key=lambda f: (-len(coverage[f] & missing), "mono" in f.family.lower(), f.family))
        if not coverage[best] & missing:
            break
        chosen.append(best.family)
        missing -= coverage.pop(best)
    if {chr(code) for code in missing} - _warned:
        _warn({chr(code) for code in missing})
    return chosen


@contextmanager
def fonts_for(texts: Iterable[str]) -> Iterator[list[str]]:
    """`with fonts_for(labels) as fams:` matplotlib's font family is `fams` inside, and restored after.

    Text made inside keeps the list (matplotlib resolves it when drawing), so a figure built inside
    may be saved outside; tick labels made later by matplotlib itself copy an existing label's font.
    """
    import matplotlib

    fams = families(texts)
    with matplotlib.rc_context({"font.family": fams}):
        yield fams


def install_hint(chars: Iterable[str]) -> str:
    """The Debian package that has glyphs for `chars`."""
    east_asian = any(unicodedata.name(ch, "").startswith(EAST_ASIAN) for ch in chars)
    return ("fonts-noto-cjk (or the small fonts-wqy-microhei for Chinese and Japanese)" if east_asian
            else "fonts-noto")


def _drawn(texts: Iterable[str]) -> set[str]:
    """The characters of `texts` that need a glyph (not spaces, controls or format marks)."""
    return {ch for text in texts for ch in text if unicodedata.category(ch)[0] not in "ZC"}


def _warn(missing: set[str]) -> None:
    _warned.update(missing)
    shown = sorted(missing)
    listed = " ".join(shown[:5]) + (f" and {len(shown) - 5} more" if len(shown) > 5 else "")
    print(f"xattn: warning: no installed font has glyphs for {listed}; they are drawn as boxes. "
          f"Install a font, e.g. on Debian: apt-get install {install_hint(missing)}", file=sys.stderr)


@lru_cache(maxsize=1)
def _default_font() -> Font:
    from matplotlib import font_manager
    from matplotlib.ft2font import FT2Font

    path = font_manager.findfont(font_manager.FontProperties())
    return Font(FT2Font(path).family_name, path, 0)


@lru_cache(maxsize=1)
def _candidates() -> tuple[Font, ...]:
    """Upright, regular-weight fonts matplotlib can use, including fonts installed after its font cache
    was written (they are registered with its font manager, else matplotlib could not find them by name)."""
    from matplotlib import font_manager

    manager = font_manager.fontManager
    known = {entry.fname for entry in manager.ttflist}
    for path in font_manager.findSystemFonts():
        if path not in known:
            try:
                manager.addfont(path)
            except (OSError, RuntimeError, ValueError):  # a font file FreeType cannot read
                continue
    fonts = {}  # family -> its first regular upright face
    for e in manager.ttflist:
        if (e.style == "normal" and e.weight in (400, "normal", "regular", "book")
                and not e.name.startswith(PLACEHOLDER_FONTS)):
            fonts.setdefault(e.name, Font(e.name, e.fname, getattr(e, "index", 0)))
    return tuple(fonts.values())


@lru_cache(maxsize=None)
def _charmap(path: str, index: int = 0) -> frozenset[int]:
    from matplotlib.ft2font import FT2Font

    try:
        font = FT2Font(path, face_index=index) if index else FT2Font(path)  # face_index: matplotlib >= 3.10
        return frozenset(font.get_charmap())
    except (OSError, RuntimeError, ValueError):
        return frozenset()
