"""A request's texts as the sentences the model translates, and their translations joined back into texts.

Translation models are trained on single sentences: given a paragraph, one translates its first sentence and
stops, so a text of several lines or sentences came back cut to its first, silently. LibreTranslate (through
argostranslate) splits every text into sentences and joins their translations; so does `xattn serve`. Each text is
cut into lines (at \n), each line into sentences by sentencex (rules and abbreviations for about 300 languages,
in the model's source language; its boundaries are kept only where whitespace, or a full stop of a script written
without spaces such as 。, separates two sentences, so that `3.50` or `z.B.` stay whole). The translations are
joined by the whitespace that separated their sentences (a line break stays a line break); the text's own leading
and trailing whitespace are not kept, as a single sentence's never were.

A text of several sentences is answered as one translation: its tokens are its sentences' in turn (each with its
</s>), its attention the sentences' maps along the diagonal (zero between sentences: each was translated alone),
its word links the sentences' links in the text's word numbering, its score the sum of theirs (as argostranslate
scores joined hypotheses), and its k-th alternative the sentences' k-th alternatives joined (a sentence with fewer
distinct alternatives gives its first translation there).
"""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

import numpy as np
import sentencex

from xattn.analysis.maps import head_mean
from xattn.translation import Translation, distinct
from xattn.words import split_words


UNSPACED_STOPS = "。！？｡．︒"
"""Sentence-final marks of scripts written without spaces: a boundary right after one needs no whitespace."""
UNSPACED = {"zh", "ja", "th", "lo", "km", "my", "bo", "yue", "wuu"}
"""Target languages written without spaces between sentences: their sentences' translations are joined with nothing
where the source's had no whitespace between them (other languages get a space there)."""
ITEM = re.compile(r"\btexts\[(\d+)\]")  # a sentence as the translator names it
LINE_BREAKS = re.compile("(\r\n|[\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029])")
"""Where a text's lines end: what str.splitlines breaks at (a line that ends without a full stop, then a \r or a
U+2028, went to the model as one sentence with the next)."""


@dataclass(frozen=True)
class Joined:
    """One text's translation, made of its sentences', with the words its links number (LibreTranslate's fields and
    xattn's `results` are built from it)."""
    translation: Translation
    source_words: list[str]
    target_words: list[str]
    links: list[tuple[int, int]] | None = None  # (source word, target word), from 0, when alignment was asked for


@dataclass(frozen=True)
class Split:
    """A request's texts as sentences: `sentences` is what the model translates, in order."""
    sentences: list[str]
    owner: list[int]            # the text each sentence belongs to
    gaps: list[list[str]]       # per text, the whitespace between its sentences (one fewer than its sentences)
    names: list[str]            # how an error names each sentence: q[i], or q[i]: sentence k of a text of several

    @classmethod
    def of(cls, texts: list[str], language: str) -> Split:
        """`texts` cut into sentences by the rules of `language` (ISO 639; sentencex falls back to English rules
        for one it does not know). A text with no sentence (empty, or blank) is one empty sentence, translated
        empty."""
        sentences, owner, gaps, names = [], [], [], []
        for i, text in enumerate(texts):
            parts, between = split_text(text, language)
            sentences += parts
            owner += [i] * len(parts)
            gaps.append(between)
            names += [f"q[{i}]"] if len(parts) == 1 else [f"q[{i}]: sentence {k}" for k in range(1, len(parts) + 1)]
        return cls(sentences, owner, gaps, names)

    def rename(self, message: str) -> str:
        """A message of the translator's, naming sentences as texts[j], naming them as the request does."""
        return ITEM.sub(lambda m: self.names[int(m[1])] if int(m[1]) < len(self.names) else m[0], message)

    def join(self, translations: list[Translation], target: str, links: list[list[tuple[int, int]]] | None = None,
             attention: str = "none") -> list[Joined]:
        """Each text's translation from its sentences' (`translations`, with their word `links` when asked).
        `attention`: the maps the answer carries, the only ones joined: none (alignment's links are the sentences'
        own: a joined map would be memory spent on nothing, growing with the square of the sentences), each layer's
        mean of heads (`mean`: each sentence's heads averaged before their maps are joined, a (L, 1, T, S) map whose
        mean of heads is that mean, not after, in a map H times as large), or `full`. Alternatives carry none."""
        if attention != "full":
            translations = [t if t.cross_attention is None else dataclasses.replace(
                t, cross_attention=head_mean(t.cross_attention)[:, None] if attention == "mean" else None)
                for t in translations]
        by_text: list[list[int]] = [[] for _ in self.gaps]
        for j, i in enumerate(self.owner):
            by_text[i].append(j)
        return [joined([translations[j] for j in js], [self.sentences[j] for j in js], gaps, target,
                       None if links is None else [links[j] for j in js])
                for js, gaps in zip(by_text, self.gaps)]


def split_text(text: str, language: str) -> tuple[list[str], list[str]]:
    """A text's sentences (stripped) and the whitespace between them."""
    sentences, gaps, pending = [], [], ""
    for line in LINE_BREAKS.split(text):
        for segment in ([line] if LINE_BREAKS.fullmatch(line) else sentencex.segment(language, line)):
            body = segment.strip()
            if not body:
                pending += segment
                continue
            lead = segment[:len(segment) - len(segment.lstrip())]
            if sentences and not (pending + lead) and not sentences[-1].endswith(tuple(UNSPACED_STOPS)):
                sentences[-1] += body  # no whitespace between: one sentence (3.50, z.B., "Hallo.Welt")
            else:
                if sentences:
                    gaps.append(pending + lead)
                sentences.append(body)
            pending = segment[len(lead) + len(body):]
    return (sentences, gaps) if sentences else ([""], [])


def joined(parts: list[Translation], texts: list[str], gaps: list[str], target: str,
           links: list[list[tuple[int, int]]] | None) -> Joined:
    """One text's translation from its sentences' translations `parts` (of `texts`, separated by `gaps`)."""
    source_words = [w for text in texts for w in split_words(text)]
    target_words = [w for part in parts for w in split_words(part.text)]
    if len(parts) == 1:
        return Joined(parts[0], source_words, target_words, links[0] if links is not None else None)
    first = together(parts, gaps, target)
    options = [[p, *distinct(p, p.alternatives)] for p in parts]  # each sentence's distinct ones, its first first
    alternatives = [together([o[k] if k < len(o) else o[0] for o in options], gaps, target, with_maps=False)
                    for k in range(max(map(len, options)))] if any(p.alternatives for p in parts) else []
    if links is not None:  # each sentence's words numbered after the words of those before it
        links = offset_links(links, [len(split_words(t)) for t in texts], [len(split_words(p.text)) for p in parts])
    return Joined(dataclasses.replace(first, alternatives=alternatives), source_words, target_words, links)


def together(parts: list[Translation], gaps: list[str], target: str, with_maps: bool = True) -> Translation:
    """The translations of a text's sentences as one (no alternatives; with their maps joined, but for an
    alternative's, which no answer carries, and whose sentences' maps need not be alike, a sentence's
    first translation standing in for an alternative it lacks: `with_maps` False)."""
    text = parts[0].text
    for gap, part in zip(gaps, parts[1:]):
        text += (gap or ("" if target in UNSPACED else " ")) + part.text
    maps = [p.cross_attention for p in parts]
    return dataclasses.replace(parts[0], text=text, score=sum(p.score for p in parts),
                               src_tokens=[t for p in parts for t in p.src_tokens],
                               tgt_tokens=[t for p in parts for t in p.tgt_tokens],
                               cross_attention=diagonal(maps) if with_maps and all(m is not None for m in maps) else None,
                               self_attention=None, relaxed=any(p.relaxed for p in parts), alternatives=[])


def diagonal(maps: list[np.ndarray]) -> np.ndarray:
    """(L, H, T_k, S_k) maps -> (L, H, sum T, sum S) with each along the diagonal and 0 elsewhere (NaN, a head
    its layer lacks, stays NaN throughout)."""
    L, H = maps[0].shape[:2]
    out = np.zeros((L, H, sum(m.shape[2] for m in maps), sum(m.shape[3] for m in maps)), dtype=maps[0].dtype)
    out[np.isnan(maps[0]).all(axis=(2, 3))] = np.nan
    t = s = 0
    for m in maps:
        out[:, :, t:t + m.shape[2], s:s + m.shape[3]] = m
        t, s = t + m.shape[2], s + m.shape[3]
    return out


def offset_links(links: list[list[tuple[int, int]]], source_words: list[int],
                 target_words: list[int]) -> list[tuple[int, int]]:
    """Each sentence's links (its own word numbers) in the numbering of the whole text."""
    out, i0, j0 = [], 0, 0
    for found, n, m in zip(links, source_words, target_words):
        out += [(i + i0, j + j0) for i, j in found]
        i0, j0 = i0 + n, j0 + m
    return out
