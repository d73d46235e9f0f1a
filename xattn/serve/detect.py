"""Which language a text is written in: POST /detect, `source: auto` on /translate, and (later) a server with
several models choosing one by the language of the text: `identify(texts, candidates)`.

The identifier is py3langid (langid.py's naive Bayes over byte n-grams; its model of 140 languages ships inside
the pip package, nothing is downloaded). Chosen over eight others on Multi30k captions for accuracy, a small
model that loads quickly, and probabilities that stay modest on short texts (it scales its scores by
1/sqrt(bytes) before the softmax): benchmarks/README.md, Language identification. Thread-safe once loaded.
"""
from __future__ import annotations

import copy
import threading
import unicodedata
from collections import Counter
from functools import lru_cache
from typing import Iterable, NamedTuple, Sequence

from py3langid.langid import MODEL_FILE, LanguageIdentifier

MIN_LETTERS = 20
"""`source: auto` refuses no text with fewer letters, and with several models such texts go with the longer ones
of their request (serve/models.py): on shorter ones the identifier is too often unsure."""
SOURCE_AT_MOST = 0.005
"""... and refuses a text only when the identifier gives the model's source language at most this probability.
Both chosen on Multi30k val (no source-language text refused); measured on test in benchmarks/README.md."""
RULED_OUT = 1e-4
"""... or, whatever its length, when the identifier gives the source at most this, for the whole text and for its
letters of each script of SCRIPT_LETTERS or more: short texts of the language itself, or of another written in the
same script, stay above it, while a text of a few characters in another script (Japanese, Cyrillic, Arabic to a
German model) falls far below (chosen on Multi30k train: benchmarks/README.md, Language identification). A name
in another script (`Herr Иванов`) leaves the rest of the text to tell."""
SCRIPT_LETTERS = 3
"""Letters of one script that go by themselves under RULED_OUT (fewer: near-even probabilities, which tell nothing)."""
UNDETERMINED = "und"
"""ISO 639-2 for a text with nothing to go on (no letters), or no candidate language the identifier knows."""


class Guess(NamedTuple):
    language: str      # an ISO 639 code (py3langid's: ISO 639-1 where there is one), or UNDETERMINED
    confidence: float  # the identifier's probability of that language, 0..1


_LOADING = threading.Lock()
_model: LanguageIdentifier | None = None


def _everything() -> LanguageIdentifier:
    global _model
    if _model is None:
        with _LOADING:
            if _model is None:  # another thread may have loaded it while this one waited
                _model = LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)
    return _model


@lru_cache(maxsize=16)
def _among(candidates: frozenset[str]) -> LanguageIdentifier:
    restricted = copy.copy(_everything())  # set_languages rebinds the model's arrays, it never writes into them
    restricted.set_languages(sorted(candidates))
    return restricted


def load() -> None:
    """Load the model now rather than at the first call, which would wait for it."""
    _everything()


def languages() -> list[str]:
    """The languages the identifier knows (ISO 639 codes)."""
    return list(_everything().labels)


def _identifier(candidates: Iterable[str] | None) -> LanguageIdentifier | None:
    if candidates is None:
        return _everything()
    known = frozenset(candidates) & frozenset(languages())
    return _among(known) if known else None


def _rank(identifier: LanguageIdentifier | None, text: str) -> list[tuple[str, float]]:
    if identifier is None or not any(ch.isalpha() for ch in text):
        return []
    return identifier.rank(text)


def ranking(text: str, candidates: Iterable[str] | None = None) -> list[Guess]:
    """Every candidate language (default: all the identifier knows) with its probability for `text`, the most
    likely first; [] when the text has no letters or the identifier knows none of the candidates."""
    return [Guess(lang, p) for lang, p in _rank(_identifier(candidates), text)]


def identify(texts: Sequence[str], candidates: Iterable[str] | None = None) -> list[Guess]:
    """The most likely language of each text and its probability, among `candidates` (ISO 639 codes; the
    ones the identifier does not know are left out) or, by default, every language it knows. A text with no
    letters, or candidates it knows none of, give Guess(UNDETERMINED, 0.0)."""
    identifier = _identifier(candidates)
    return [Guess(*next(iter(_rank(identifier, text)), (UNDETERMINED, 0.0))) for text in texts]


def as_source(texts: Sequence[str], source: str) -> list[Guess]:
    """The language each text is taken to be in when a client asks a model that reads `source` for
    `source: auto`: Guess(source, the identifier's probability of it), unless the text is clearly in another
    language, that is, the identifier gives `source` at most SOURCE_AT_MOST and the text has at least MIN_LETTERS
    letters, or at most RULED_OUT (and so for its letters of each script too); then the most likely language and
    its probability. A source language the identifier does not know is never refused (its probability is 0)."""
    identifier = _everything() if source in _everything().labels else None
    out = []
    for text in texts:
        ranked = _rank(identifier, text)
        mine = of(ranked, source)
        letters = sum(ch.isalpha() for ch in text)
        clearly_other = bool(ranked) and (mine <= SOURCE_AT_MOST and letters >= MIN_LETTERS or mine <= RULED_OUT
                                          and all(of(_rank(identifier, part), source) <= RULED_OUT
                                                  for part in script_parts(text)))
        out.append(Guess(*ranked[0]) if clearly_other else Guess(source, mine))
    return out


def of(ranked: list[tuple[str, float]], language: str) -> float:
    """The probability of `language` in a ranking (0 when it is not there)."""
    return next((p for lang, p in ranked if lang == language), 0.0)


def script_parts(text: str) -> list[str]:
    """The text's letters of each script it has SCRIPT_LETTERS of or more, one text each (other letters blanked),
    when it has letters of two scripts or more."""
    scripts = Counter(script(ch) for ch in text if ch.isalpha())
    if len(scripts) < 2:
        return []
    return ["".join(" " if ch.isalpha() and script(ch) != name else ch for ch in text)
            for name, count in scripts.items() if count >= SCRIPT_LETTERS]


def script(ch: str) -> str:
    """The script of a letter, as Unicode names it (LATIN, CYRILLIC, CJK, HIRAGANA, ...)."""
    return unicodedata.name(ch, "?").split(" ", 1)[0]
