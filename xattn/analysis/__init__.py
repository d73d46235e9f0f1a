"""Analysis of attention: maps of sentence pairs, heatmaps (static and interactive), word alignment and AER,
per-head rankings, diagnostics.

From Python, the quickest way in:

    tr = xattn.load("runs/multi30k-de-en")
    res = tr.translate(["Ein Hund rennt ."], xattn.DecodeConfig(beam_size=5), return_attention=True)
    fig = xattn.analysis.figure(res[0], words=True)          # a matplotlib Figure
    page = xattn.analysis.html_page(res[0])                        # one self-contained HTML page, as text
    pair = xattn.analysis.teacher_forced(tr, ["Ein Hund rennt ."], ["A dog runs ."])[0]
    links = xattn.analysis.attention_links(pair, xattn.analysis.AlignSettings(xattn.analysis.HeadChoice(1)))
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Sequence, Union

from xattn.analysis.alignment import AlignSettings, attention_links, format_links, symmetrise
from xattn.analysis.maps import AttentionMaps, HeadChoice, PairAttention, teacher_forced
from xattn.errors import ParameterError

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from xattn.translator import Translation

Source = Union["Translation", PairAttention, AttentionMaps]

__all__ = ["AlignSettings", "AttentionMaps", "HeadChoice", "PairAttention", "attention_links", "figure",
           "format_links", "html_page", "maps_of", "symmetrise", "teacher_forced"]


def maps_of(source: Source, kind: str | None = None, words: bool | None = None,
            links: Sequence[tuple[int, int]] = ()) -> AttentionMaps:
    """AttentionMaps of a Translation (translated with return_attention=True; return_self_attention for
    decoder-self), of a PairAttention (teacher_forced), or the maps themselves. `kind` (default cross) and `words`
    (default False) are the maps' own for AttentionMaps."""
    from xattn.translator import Translation

    if isinstance(source, AttentionMaps):  # made already: settings other than its own would be ignored
        for name, given, own in (("kind", kind, source.kind), ("words", words, source.words)):
            if given is not None and given != own:
                raise ParameterError(name, f"{given!r}, where the AttentionMaps given are {own!r}; make the maps with "
                                     "it (maps_of), or leave it out")
        if links:
            raise ParameterError("links", "AttentionMaps carry their own links (maps.links); give links with a "
                                 "Translation or a PairAttention")
        return source
    if not isinstance(source, (Translation, PairAttention)):
        raise ParameterError("source", "a Translation (translated with return_attention=True), a PairAttention "
                             f"(teacher_forced) or AttentionMaps, got {type(source).__name__}")
    pair = source if isinstance(source, PairAttention) else PairAttention.from_translation(source)
    return pair.maps("cross" if kind is None else kind, words=False if words is None else words, links=links)


def _check_view(choice: HeadChoice | None, title: str | None, **flags: bool) -> None:
    """A ParameterError naming the first of a figure's or page's own settings of the wrong type."""
    if choice is not None and not isinstance(choice, HeadChoice):
        raise ParameterError("choice", f"a HeadChoice or None, got {type(choice).__name__}")
    if title is not None and not isinstance(title, str):
        raise ParameterError("title", f"a string or None, got {type(title).__name__}")
    for name, value in flags.items():
        if not isinstance(value, bool):  # (any true value drew the grid)
            raise ParameterError(name, f"True or False, got {value!r}")


def figure(source: Source, kind: str | None = None, words: bool | None = None, choice: HeadChoice | None = None,
           grid: bool = False, title: str | None = None, links: Sequence[tuple[int, int]] = ()) -> Figure:
    """A heatmap (matplotlib Figure) of one layer's heads (`choice`, default: the last layer's mean) or, with
    `grid`, of every layer and head. `links` (source word i, target word j) are outlined. `kind`, `words`: as in
    maps_of."""
    from xattn.analysis import plots

    _check_view(choice, title, grid=grid)
    return plots.figure(maps_of(source, kind, words, links), choice, grid=grid, title=title)


def html_page(source: Source, kind: str | None = None, words: bool | None = None, choice: HeadChoice | None = None,
         title: str | None = None, links: Sequence[tuple[int, int]] = ()) -> str:
    """The self-contained interactive page (layer/head picker, hover, links) as HTML text. `kind`, `words`: as in
    maps_of."""
    from xattn.analysis.html import render

    _check_view(choice, title)
    return render(maps_of(source, kind, words, links), title=title, choice=choice)
