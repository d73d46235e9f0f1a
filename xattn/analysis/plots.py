"""Static attention heatmaps (matplotlib: PNG, SVG, PDF), one view or every layer and head in a grid.

Shapes: L layers, H heads, R rows (queries, down) and C columns (attended tokens, across), as in
`AttentionMaps`. Figures are plain `matplotlib.figure.Figure` objects: pyplot is never imported, so no
display is opened and nothing is left in a global figure list.
"""
from __future__ import annotations

import unicodedata
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from xattn.analysis.fonts import fonts_for
from xattn.analysis.maps import AttentionMaps, HeadChoice, head_mean, heads_per_layer
from xattn.errors import XattnError
from xattn.io import atomic_write

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

FORMATS = {".png": "png", ".svg": "svg", ".pdf": "pdf"}  # extension -> matplotlib's format
DPI = 120
MAX_FONT, MIN_FONT = 10.0, 7.0  # points; labels shrink from MAX_FONT with sentence length, never below MIN_FONT
CELL = 1.5                      # a cell's side in label line heights, so that neighbouring labels never touch
CMAP, MASKED_COLOR, LINK_COLOR = "Blues", "#c8c8c8", "#d62728"
TITLES = {"cross": "cross-attention", "decoder-self": "decoder self-attention",
          "encoder-self": "encoder self-attention"}
AXES = {"cross": ("source", "target"), "decoder-self": ("target", "target"), "encoder-self": ("source", "source")}


def figure(maps: AttentionMaps, choice: HeadChoice | None = None, grid: bool = False,
           title: str | None = None) -> Figure:
    """A heatmap of `maps`: rows (queries) down, columns (attended tokens) across, weights 0 to 1.

    choice: the (R, C) view to draw, `choice.select(maps.weights)`; None is the last layer's mean of heads
    (in a pruned model, of the last layer with heads).
    grid: instead, every layer (rows of panels) x every head, plus each layer's mean (the last column),
    labelled "layer l, head h" (0-based), with one colour bar.
    Masked cells (the decoder's future) are grey and hatched; `maps.links` are outlined squares.
    """
    if grid and choice is not None:
        raise ValueError("figure: choose a view (choice) or every layer and head (grid), not both")
    heads, what = heads_per_layer(maps.weights), TITLES[maps.kind]
    choice = choice or HeadChoice.nearest(heads, len(heads) - 1, what)
    choice.check(heads, what)
    with fonts_for([*maps.rows, *maps.cols, title or ""]):
        if grid:
            return _grid(maps, title or f"{TITLES[maps.kind]}, every layer and head")
        return _single(maps, choice, title or f"{TITLES[maps.kind]}, {choice}")


def save(fig: Figure, path: str | Path) -> Path:
    """Write `fig` to `path` in the format its extension names (.png, .svg, .pdf), atomically."""
    path = Path(path)
    fmt = FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise XattnError(f"{path}: cannot write a figure as {path.suffix or 'a file without an extension'}; "
                         f"use one of {', '.join(FORMATS)}")
    atomic_write(path, lambda tmp: fig.savefig(tmp, format=fmt, dpi=DPI))
    return path


# ---------------------------------------------------------------------------------------- layout

def _font_size(n: int) -> float:
    """Label size in points for a map with `n` rows or columns: 10 up to 8 tokens, 7 from 32 on."""
    return float(np.clip(MAX_FONT - (n - 8) / 8, MIN_FONT, MAX_FONT))


def _text_width(labels: list[str], size: float) -> float:
    """Inches the longest label needs at `size` points (wide East Asian characters count as one em)."""
    ems = [sum(1.0 if unicodedata.east_asian_width(ch) in "WF" else 0.62 for ch in label) for label in labels]
    return max(ems, default=0.0) * size / 72


def _cell(size: float) -> float:
    """A cell's side in inches for labels of `size` points."""
    return CELL * 1.2 * size / 72


def _figsize(maps: AttentionMaps, size: float, panels: tuple[int, int] = (1, 1)) -> tuple[float, float]:
    """(width, height) in inches: `panels` (rows, cols) of R x C cells, the labels, title, colour bar, legend."""
    R, C = len(maps.rows), len(maps.cols)
    cell = _cell(size)
    label_w, label_h = _text_width(maps.rows, size), _text_width(maps.cols, size) * 0.87  # columns at 60 degrees
    panel_title = 0.25 if panels != (1, 1) else 0.0
    width = panels[1] * (C * cell + 0.1) + label_w + 1.6
    legend = [h.get_label() for h in _legend(maps)]  # one row of entries under the map
    width = max(width, sum(_text_width([label], size) + 0.7 for label in legend))
    height = panels[0] * (R * cell + panel_title + 0.1) + label_h + 1.1 + 0.35 * bool(legend)
    return width, height


def _wrap(fig: Figure, title: str, size: float) -> str:
    """`title` broken into lines that fit the figure's width; the figure grows by the lines added."""
    import textwrap

    width = max(40, int(fig.get_figwidth() * 72 / (0.6 * size)))
    lines = [wrapped for line in title.splitlines() for wrapped in textwrap.wrap(line, width) or [""]]
    fig.set_figheight(fig.get_figheight() + (len(lines) - 1) * 1.3 * size / 72)
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------- drawing

def _single(maps: AttentionMaps, choice: HeadChoice, title: str) -> Figure:
    from matplotlib.figure import Figure

    size = _font_size(max(len(maps.rows), len(maps.cols)))
    fig = Figure(figsize=_figsize(maps, size), layout="constrained")
    ax = fig.add_subplot()
    image = _heatmap(ax, maps, choice.select(maps.weights), size)
    _label(ax, maps, size, rows=True, cols=True)
    ax.set_title(_wrap(fig, title, size + 1), fontsize=size + 1)
    fig.colorbar(image, ax=ax, label="attention weight", fraction=0.05, pad=0.02, aspect=40)
    _add_legend(fig, maps, size)
    return fig


def _grid(maps: AttentionMaps, title: str) -> Figure:
    from matplotlib.figure import Figure

    L, H = maps.weights.shape[:2]
    size = MIN_FONT
    fig = Figure(figsize=_figsize(maps, size, (L, H + 1)), layout="constrained")
    axes = fig.subplots(L, H + 1, sharex=True, sharey=True, squeeze=False)
    means = head_mean(maps.weights)  # (L, R, C); a pruned head, or the mean of a layer without heads, is NaN: blank
    for layer in range(L):
        for head in range(H + 1):
            ax = axes[layer, head]
            mean = head == H
            view = means[layer] if mean else maps.weights[layer, head]
            image = _heatmap(ax, maps, view, size)
            gone = view.size and np.isnan(view).all()
            ax.set_title(f"layer {layer}, " + ("mean" if mean else f"head {head}") + (" (pruned)" if gone else ""),
                         fontsize=size + 1)
            _label(ax, maps, size, rows=head == 0, cols=layer == L - 1)
    fig.suptitle(_wrap(fig, title, MAX_FONT), fontsize=MAX_FONT)
    fig.colorbar(image, ax=axes, label="attention weight", fraction=0.03, pad=0.01, aspect=40)
    _add_legend(fig, maps, size)
    return fig


def _heatmap(ax: Axes, maps: AttentionMaps, view: np.ndarray, size: float):
    """Draw one (R, C) view on `ax`: the image, masked cells hatched, links outlined; returns the image."""
    import matplotlib

    cmap = matplotlib.colormaps[CMAP].with_extremes(bad=MASKED_COLOR)
    data = np.ma.masked_array(view, mask=maps.masked if maps.masked is not None else False)
    image = ax.imshow(data, cmap=cmap, vmin=0.0, vmax=1.0, aspect="auto", interpolation="nearest")
    if maps.masked is not None:
        _hatch(ax, maps.masked)
    if maps.links:
        cols, rows = zip(*maps.links)
        marker = (0.75 * _cell(size) * 72) ** 2  # points^2
        ax.scatter(cols, rows, s=marker, marker="s", facecolors="none", edgecolors=LINK_COLOR, linewidths=1.2)
    return image


def _hatch(ax: Axes, masked: np.ndarray) -> None:
    """Hatch each run of masked cells in a row (for the decoder's future: one run per row)."""
    from matplotlib.patches import Rectangle

    for r, row in enumerate(np.asarray(masked, dtype=bool)):
        edges = np.flatnonzero(np.diff(np.concatenate([[0], row.astype(np.int8), [0]])))  # run starts, ends
        for start, end in zip(edges[::2], edges[1::2]):
            ax.add_patch(Rectangle((start - 0.5, r - 0.5), end - start, 1, fill=False, hatch="///",
                                   edgecolor="#8c8c8c", linewidth=0))


def _label(ax: Axes, maps: AttentionMaps, size: float, rows: bool, cols: bool) -> None:
    unit = "words" if maps.words else "pieces"
    col_name, row_name = AXES[maps.kind]
    ax.set_xticks(range(len(maps.cols)), maps.cols if cols else [], rotation=60, ha="right",
                  rotation_mode="anchor", fontsize=size)
    ax.set_yticks(range(len(maps.rows)), maps.rows if rows else [], fontsize=size)
    ax.tick_params(length=2, pad=2)
    if cols:
        ax.set_xlabel(f"{col_name} {unit}" + (" (attended)" if maps.kind != "cross" else ""), fontsize=size + 1)
    if rows:
        ax.set_ylabel(f"{row_name} {unit}", fontsize=size + 1)


def _legend(maps: AttentionMaps) -> list:
    """Legend entries for what a colour alone does not say: masked cells, alignment links."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    handles = []
    if maps.masked is not None and maps.masked.any():
        handles.append(Patch(facecolor=MASKED_COLOR, hatch="///", edgecolor="#8c8c8c",
                             label="masked: a future position, cannot be attended"))
    if maps.links:
        handles.append(Line2D([], [], linestyle="none", marker="s", markerfacecolor="none",
                              markeredgecolor=LINK_COLOR, label=maps.links_label))
    return handles


def _add_legend(fig: Figure, maps: AttentionMaps, size: float) -> None:
    handles = _legend(maps)
    if handles:
        fig.legend(handles=handles, loc="outside lower center", ncols=len(handles), fontsize=size, frameon=False)
