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

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from xattn.translator import Translation

Source = Union["Translation", PairAttention, AttentionMaps]

__all__ = ["AlignSettings", "AttentionMaps", "HeadChoice", "PairAttention", "attention_links", "figure",
           "format_links", "html_page", "maps_of", "symmetrise", "teacher_forced"]


def maps_of(source: Source, kind: str = "cross", words: bool = False,
            links: Sequence[tuple[int, int]] = ()) -> AttentionMaps:
    """AttentionMaps of a Translation (translated with return_attention=True; return_self_attention for
    decoder-self), of a PairAttention (teacher_forced), or the maps themselves."""
    if isinstance(source, AttentionMaps):
        return source
    pair = source if isinstance(source, PairAttention) else PairAttention.from_translation(source)
    return pair.maps(kind, words=words, links=links)


def figure(source: Source, kind: str = "cross", words: bool = False, choice: HeadChoice | None = None,
           grid: bool = False, title: str | None = None, links: Sequence[tuple[int, int]] = ()) -> Figure:
    """A heatmap (matplotlib Figure) of one layer's heads (`choice`, default: the last layer's mean) or, with
    `grid`, of every layer and head. `links` (source word i, target word j) are outlined."""
    from xattn.analysis import plots

    return plots.figure(maps_of(source, kind, words, links), choice, grid=grid, title=title)


def html_page(source: Source, kind: str = "cross", words: bool = False, choice: HeadChoice | None = None,
         title: str | None = None, links: Sequence[tuple[int, int]] = ()) -> str:
    """The self-contained interactive page (layer/head picker, hover, links) as HTML text."""
    from xattn.analysis.html import render

    return render(maps_of(source, kind, words, links), title=title, choice=choice)
