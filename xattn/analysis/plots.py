"""Static attention heatmaps (matplotlib: PNG, SVG, PDF), one view or every layer and head in a grid.

Shapes: L layers, H heads, R rows (queries, down) and C columns (attended tokens, across), as in
`AttentionMaps`. Figures are plain `matplotlib.figure.Figure` objects: pyplot is never imported, so no
display is opened and nothing is left in a global figure list.
"""
from __future__ import annotations

import warnings
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
MAX_CELLS = 40_000
"""Cells a figure may draw (pieces x pieces x panels): its memory grows with them (a probe: 100 words took 0.59 GB,
300 words 2.5 GB and a 6,760 x 9,992-pixel image, 1,100 words about 24 GB before the system killed it); the HTML
view draws any size."""
MAX_FONT, MIN_FONT = 10.0, 7.0  # points; labels shrink from MAX_FONT with sentence length, never below MIN_FONT
CELL = 1.5                      # a cell's side in label line heights, so that neighbouring labels never touch
CMAP, MASKED_COLOR, LINK_COLOR = "Blues", "#c8c8c8", "#d62728"
LINK_INSET = 0.1                # a link's outline sits this far (in cells) inside its cells
TITLES = {"cross": "cross-attention", "decoder-self": "decoder self-attention",
          "encoder-self": "encoder self-attention"}
AXES = {"cross": ("source", "target"), "decoder-self": ("target", "target"), "encoder-self": ("source", "source")}


def figure(maps: AttentionMaps, choice: HeadChoice | None = None, grid: bool = False,
           title: str | None = None) -> Figure:
    """A heatmap of `maps`: rows (queries) down, columns (attended tokens) across, weights 0 to 1.

    choice: the (R, C) view to draw, `choice.select(maps.weights)`; None is the last layer's mean of heads
    (in a pruned model, of the last layer with heads). grid: instead, every layer (a row of panels, labelled
    "layer l" on the left) x every head and the layer's mean (columns headed "head h", "mean of heads"; 0-based),
    with one colour bar; a head a pruned layer lacks is an empty panel marked "pruned".
    Masked cells (the decoder's future) are grey and hatched; `maps.links` are outlined. The figure is made
    as large as its text needs: the title wraps to its width, and nothing is cut off at the edges.
    """
    if grid and choice is not None:
        raise ValueError("figure: choose a view (choice) or every layer and head (grid), not both")
    heads, what = heads_per_layer(maps.weights), TITLES[maps.kind]
    panels = len(heads) * (max(heads) + 1) if grid else 1
    if (cells := len(maps.rows) * len(maps.cols) * panels) > MAX_CELLS:
        raise XattnError(f"a figure of {len(maps.rows)} x {len(maps.cols)} pieces" + (f" in {panels} panels" if grid
                         else "") + f" would draw {cells} cells, over the {MAX_CELLS} a PNG, SVG or PDF takes (its "
                         "memory grows with them: a 300-word sentence took 2.5 GB); write it as .html, or draw "
                         "a shorter text")
    import matplotlib

    choice = choice or HeadChoice.nearest(heads, len(heads) - 1, what)
    choice.check(heads, what)
    # text as written: matplotlib reads a line with two $ as math ("5 $ or 10 $" garbled, "$ } $" an error)
    with fonts_for([*maps.rows, *maps.cols, title or ""]), warnings.catch_warnings(), \
            matplotlib.rc_context({"text.parse_math": False}):
        warnings.filterwarnings("ignore", "Glyph .* missing from font")  # said once, by fonts_for and by save
        if grid:
            fig = _grid(maps, heads, title or f"{what}, every layer and head")
        else:
            fig = _single(maps, choice, title or f"{what}, {choice}")
        _fit(fig)
    return fig


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
    """Inches the widest of `labels` takes at `size` points, measured in the current fonts."""
    from matplotlib.font_manager import FontProperties
    from matplotlib.textpath import TextToPath

    font, measure = FontProperties(size=size), TextToPath()
    return max((measure.get_text_width_height_descent(label, font, ismath=False)[0] for label in labels),
               default=0.0) / 72


def _cell(size: float) -> float:
    """A cell's side in inches for labels of `size` points."""
    return CELL * 1.2 * size / 72


def _figsize(maps: AttentionMaps, size: float, panels: tuple[int, int] = (1, 1),
             headings: list[str] = ()) -> tuple[float, float]:
    """(width, height) in inches: `panels` (rows, cols) of R x C cells, each at least as wide as the widest of
    `headings` (a grid's column headings, which then take a line above, as its row labels do on the left),
    the labels, title, colour bar, legend."""
    R, C = len(maps.rows), len(maps.cols)
    cell, line = _cell(size), 1.4 * (size + 1) / 72 * bool(headings)
    panel_w = max(C * cell, _text_width(list(headings), size + 1) + 0.15)
    label_w, label_h = _text_width(maps.rows, size), _text_width(maps.cols, size) * 0.87  # columns at 60 degrees
    width = panels[1] * (panel_w + 0.1) + label_w + 1.6 + 2 * line  # a grid's "layer l" and its axis name
    legend = [h.get_label() for h in _legend(maps)]  # one row of entries under the map
    width = max(width, sum(_text_width([label], size) + 0.7 for label in legend))
    height = panels[0] * (R * cell + 0.1) + line + label_h + 1.1 + 0.35 * bool(legend)
    return width, height


def _wrap(fig: Figure, title: str, size: float, widest: float = 6.0) -> str:
    """`title` broken at spaces into lines that fit the figure's width, once a narrower figure has grown to
    fit its longest line (up to `widest` inches); the figure grows by the lines added."""
    fig.set_figwidth(max(fig.get_figwidth(), min(_text_width(title.splitlines(), size) + 0.3, widest)))
    room = fig.get_figwidth() - 0.3
    lines = []
    for line in title.splitlines():
        current = ""
        for word in line.split(" "):
            longer = f"{current} {word}" if current else word
            if current and _text_width([longer], size) > room:
                lines.append(current)
                longer = word
            current = longer
        lines.append(current)
    fig.set_figheight(fig.get_figheight() + (len(lines) - 1) * 1.3 * size / 72)
    return "\n".join(lines)


def _fit(fig: Figure, margin: float = 0.05) -> None:
    """Grow `fig` until everything drawn lies inside it: the layout shrinks panels, not a word longer than the
    figure or a label wider than its estimate, which would be cut off at the edge."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    for _ in range(3):
        renderer = FigureCanvasAgg(fig).get_renderer()
        fig.draw_without_rendering()
        box = fig.get_tightbbox(renderer)  # inches
        width, height = fig.get_size_inches()
        over_x = max(0.0, -box.x0) + max(0.0, box.x1 - width)
        over_y = max(0.0, -box.y0) + max(0.0, box.y1 - height)
        if over_x <= 0 and over_y <= 0:
            return
        fig.set_size_inches(width + 2 * over_x + margin * (over_x > 0), height + 2 * over_y + margin * (over_y > 0))


# ---------------------------------------------------------------------------------------- drawing

def _single(maps: AttentionMaps, choice: HeadChoice, title: str) -> Figure:
    from matplotlib.figure import Figure

    size = _font_size(max(len(maps.rows), len(maps.cols)))
    fig = Figure(figsize=_figsize(maps, size), layout="constrained")
    ax = fig.add_subplot()
    image = _heatmap(ax, maps, choice.select(maps.weights), size)
    _ticks(ax, maps, size)
    x_name, y_name = _axis_names(maps)
    ax.set_xlabel(x_name, fontsize=size + 1)
    ax.set_ylabel(y_name, fontsize=size + 1)
    fig.suptitle(_wrap(fig, title, size + 1), fontsize=size + 1)
    fig.colorbar(image, ax=ax, label="attention weight", fraction=0.05, pad=0.02, aspect=40)
    _add_legend(fig, maps, size)
    return fig


def _grid(maps: AttentionMaps, heads: list[int], title: str) -> Figure:
    """Rows of panels, one per layer: its heads, then its mean; a head the layer lacks (pruned) is empty."""
    from matplotlib.figure import Figure

    L, H = len(heads), max(heads)
    size = MIN_FONT
    names = [f"head {h}" for h in range(H)] + ["mean of heads"]
    fig = Figure(figsize=_figsize(maps, size, (L, H + 1), names), layout="constrained")
    axes = fig.subplots(L, H + 1, sharex=True, sharey=True, squeeze=False)  # inner tick labels hidden
    means = head_mean(maps.weights)  # (L, R, C); NaN for a layer without heads
    for layer, n in enumerate(heads):
        for col, ax in enumerate(axes[layer]):
            if col < n or (col == H and n):
                image = _heatmap(ax, maps, maps.weights[layer, col] if col < H else means[layer], size)
            else:
                _empty(ax, "no heads (pruned)" if col == H else "pruned", size)
            _ticks(ax, maps, size)  # shown on the outer panels only
        axes[layer, 0].set_ylabel(f"layer {layer}", fontsize=size + 1, fontweight="bold")
    for col, ax in enumerate(axes[0]):
        ax.set_title(names[col], fontsize=size + 1)
    x_name, y_name = _axis_names(maps)
    for ax in axes[-1]:
        ax.set_xlabel(x_name, fontsize=size + 1)
    fig.supylabel(y_name, fontsize=size + 1)
    fig.suptitle(_wrap(fig, title, MAX_FONT), fontsize=MAX_FONT)
    fig.colorbar(image, ax=axes, label="attention weight", fraction=0.03, pad=0.01, aspect=40)
    _add_legend(fig, maps, size)
    return fig


def _empty(ax: Axes, text: str, size: float) -> None:
    """A panel without weights (a head a pruned layer lacks): blank, saying why."""
    ax.set_facecolor("#f2f2f2")
    ax.text(0.5, 0.5, text, transform=ax.transAxes, ha="center", va="center", fontsize=size, color="#666666")


def _heatmap(ax: Axes, maps: AttentionMaps, view: np.ndarray, size: float):
    """Draw one (R, C) view on `ax`: the image, masked cells hatched, links outlined; returns the image."""
    import matplotlib
    from matplotlib.patches import Rectangle

    cmap = matplotlib.colormaps[CMAP].with_extremes(bad=MASKED_COLOR)
    data = np.ma.masked_array(view, mask=maps.masked if maps.masked is not None else False)
    image = ax.imshow(data, cmap=cmap, vmin=0.0, vmax=1.0, aspect="auto", interpolation="nearest")
    if maps.masked is not None:
        _hatch(ax, maps.masked)
    for col, row, width, height in _boxes(maps.links, view.shape):
        ax.add_patch(Rectangle((col - 0.5 + LINK_INSET, row - 0.5 + LINK_INSET), width - 2 * LINK_INSET,
                               height - 2 * LINK_INSET, fill=False, edgecolor=LINK_COLOR, linewidth=1.4, gid="link"))
    return image


def _runs(row: np.ndarray) -> list[tuple[int, int]]:
    """(start, end) of each run of True in a 1-D bool array."""
    edges = np.flatnonzero(np.diff(np.concatenate([[0], row.astype(np.int8), [0]])))
    return list(zip(edges[::2].tolist(), edges[1::2].tolist()))


def _hatch(ax: Axes, masked: np.ndarray) -> None:
    """Hatch each run of masked cells in a row (for the decoder's future: one run per row)."""
    from matplotlib.patches import Rectangle

    for r, row in enumerate(np.asarray(masked, dtype=bool)):
        for start, end in _runs(row):
            ax.add_patch(Rectangle((start - 0.5, r - 0.5), end - start, 1, fill=False, hatch="///",
                                   edgecolor="#8c8c8c", linewidth=0))


def _boxes(cells, shape: tuple[int, int]) -> list[tuple[int, int, int, int]]:
    """Cells (col, row) -> rectangles (col, row, width, height) that outline them: a row's run of adjacent
    cells, merged with the same run in the rows below it, so a word link at the piece level (its source
    pieces x its target pieces) is one rectangle, not a square on each cell."""
    marked = np.zeros(shape, dtype=bool)  # (R, C)
    for col, row in cells:
        marked[row, col] = True
    growing: dict[tuple[int, int], list[int]] = {}
    boxes = []
    for r, row in enumerate(marked):
        runs = _runs(row)
        boxes += [growing.pop(run) for run in list(growing) if run not in runs]
        for start, end in runs:
            growing.setdefault((start, end), [start, r, end - start, 0])[3] += 1
    return sorted(tuple(box) for box in boxes + list(growing.values()))


def _ticks(ax: Axes, maps: AttentionMaps, size: float) -> None:
    ax.set_xticks(range(len(maps.cols)), maps.cols, rotation=60, ha="right", rotation_mode="anchor", fontsize=size)
    ax.set_yticks(range(len(maps.rows)), maps.rows, fontsize=size)
    ax.tick_params(length=2, pad=2)


def _axis_names(maps: AttentionMaps) -> tuple[str, str]:
    """What the columns and the rows are: ("source pieces", "target pieces") and the like."""
    unit = "words" if maps.words else "pieces"
    col_name, row_name = AXES[maps.kind]
    return f"{col_name} {unit}" + (" (attended)" if maps.kind != "cross" else ""), f"{row_name} {unit}"


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
