"""The interactive attention view: one self-contained HTML file (inline CSS and JavaScript, no network at all).

The viewer is the heatmap script and style that `xattn serve`'s page loads (xattn/serve/static/heatmap.js and
heatmap.css), inlined here, so the page and this file draw attention the same way.

Shapes: L layers, H heads, R rows (queries) and C columns (attended tokens), as in `AttentionMaps`.
Every layer's and head's weights, and each layer's mean of heads, are embedded as JSON (integers, weight
x 10^4); the script builds the heatmap table from them with `textContent`, so no label is ever parsed as HTML,
and a Content-Security-Policy forbids every fetch.

Element ids and classes (stable; tests and users' scripts rely on them; the script draws all but the first
two into #xa-view):
    #xa-title      the page heading               #xa-data     <script type="application/json">: the maps
    #xa-kind       <select>: which map (hidden when there is one)
    #xa-layer      <select>: layer 0..L-1 (a layer without heads, pruned, is shown disabled)
    #xa-head       <select>: "mean" or head 0..H_l-1 of the chosen layer
    #xa-links      <input type=checkbox>: alignment links shown (hidden when the map has none)
    #xa-readout    what the hovered, tapped or focused cell says: "column → row: 0.812"
    #xa-scroll     the scrollable box around       #xa-map      <table>: the heatmap
    #xa-legend     colour scale, masked and link swatches
    th.xa-col[data-col=c]  column labels           th.xa-row[data-row=r]  row labels
    td.xa-cell[data-row=r][data-col=c][data-w]  a cell; data-w is its weight in the shown view, 4 decimals
    .xa-hl         the selected cell (hover, tap, arrow keys) and its row and column labels
    .xa-masked     a cell the query may not attend (the decoder's future)
    .xa-link       a cell that is an alignment link; #xa-map.xa-nolinks hides their marks
    .xa-ws, tr.xa-wr  a column, a row, where a word of several SentencePiece pieces starts
"""
from __future__ import annotations

import functools
import html
import re
from pathlib import Path
from typing import Mapping

import numpy as np

from xattn.analysis.maps import AttentionMaps, HeadChoice, head_mean, heads_per_layer
from xattn.analysis.plots import TITLES
from xattn.errors import ParameterError, XattnError
from xattn.io import atomic_write_text, json_text

EXTENSIONS = (".html", ".htm")
SCALE = 10_000  # weights are embedded as round(weight * SCALE): 4 decimals, and short integers in the JSON
CSP = "default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'"
ASSETS = Path(__file__).resolve().parents[1] / "serve" / "static"  # heatmap.js and heatmap.css


def render(maps: AttentionMaps | Mapping[str, AttentionMaps], title: str | None = None,
           choice: HeadChoice | None = None, links_layer: int | None = None) -> str:
    """The page for one map, or for several (a name -> map each, such as {"cross": ..., "decoder-self": ...}).

    choice: the view shown first (one head or the mean of heads); None is the last layer's mean of heads.
    links_layer: the layer the alignment links were read from, named in the layer picker and the legend.
    """
    named = {TITLES[maps.kind]: maps} if isinstance(maps, AttentionMaps) else \
        {TITLES.get(name, name): m for name, m in maps.items()}
    if not named:
        raise ValueError("render: no attention maps to show")
    first = next(iter(named.values()))
    heads, what = heads_per_layer(first.weights), TITLES[first.kind]
    choice = choice or HeadChoice.nearest(heads, len(heads) - 1, what)
    choice.check(heads, what)
    if choice.heads is not None and len(choice.heads) != 1:
        raise ParameterError("heads", "the HTML view shows one head or the mean of heads; pick it in the page")
    data = {"views": [_view(name, m, links_layer) for name, m in named.items()],
            "initial": {"layer": choice.layer, "head": "mean" if choice.heads is None else choice.heads[0]}}
    fields = {"TITLE": html.escape(title or ", ".join(named), quote=False), "CSP": CSP, "DATA": _script_json(data)}
    page = PAGE_HEAD + STYLE + _asset("heatmap.css") + PAGE_BODY + _asset("heatmap.js") + START + PAGE_END
    return re.sub(r"@(TITLE|CSP|DATA)@", lambda m: fields[m[1]], page)  # one pass: a value is never re-read


def save(page: str, path: str | Path) -> Path:
    """Write a page from `render` to an .html (or .htm) file, atomically."""
    path = Path(path)
    if path.suffix.lower() not in EXTENSIONS:
        raise XattnError(f"{path}: the attention view is an HTML file; name it with one of {', '.join(EXTENSIONS)}")
    atomic_write_text(path, page)
    return path


@functools.cache
def _asset(name: str) -> str:
    """The heatmap's script or style, as `xattn serve` serves it (one viewer for both), to inline here. The
    page's fields are filled after, in one pass, so an asset must not hold one; nor can it end its element."""
    text = (ASSETS / name).read_text(encoding="utf-8")
    if re.search(r"@(TITLE|CSP|DATA)@|</(script|style)|<!--", text, re.I):
        raise ValueError(f"{ASSETS / name} cannot be inlined: it holds a field or closes its element")
    return text


def _script_json(data) -> str:
    """JSON that can sit inside <script>: no "<", ">" or "&" (so no "</script" or "<!--"), no line separators."""
    text = json_text(data, ensure_ascii=False, separators=(",", ":"))
    for ch, escaped in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"), ("\u2028", "\\u2028"),
                        ("\u2029", "\\u2029")):
        text = text.replace(ch, escaped)
    return text


def _view(name: str, maps: AttentionMaps, links_layer: int | None) -> dict:
    """One map as JSON: per layer, its heads' weights (H_l, R*C) and their mean (R*C; null for a layer without
    heads) as integers; masked as a string of 0/1."""
    L, _, R, C = maps.weights.shape
    weights = np.asarray(maps.weights, dtype=np.float64)
    heads, means = heads_per_layer(weights), head_mean(weights)

    def ints(a: np.ndarray) -> list:
        return np.rint(a * SCALE).astype(np.int64).reshape(*a.shape[:-2], R * C).tolist()

    masked = None if maps.masked is None else "".join("1" if m else "0" for m in np.asarray(maps.masked).ravel())
    return {"name": name, "kind": maps.kind, "rows": list(maps.rows), "cols": list(maps.cols),
            "layers": L, "heads": heads, "w": [ints(weights[layer, :n]) for layer, n in enumerate(heads)],
            "mean": [ints(means[layer]) if n else None for layer, n in enumerate(heads)],
            "masked": masked, "links": [[int(c), int(r)] for c, r in maps.links], "linksLabel": maps.links_label,
            "linksLayer": links_layer if maps.links else None,
            **({"rowWords": maps.row_words, "colWords": maps.col_words} if maps.row_words is not None else {})}


PAGE_HEAD = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="@CSP@">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>@TITLE@</title>
"""

STYLE = """<style>
:root { font: 14px/1.4 system-ui, "Noto Sans", "DejaVu Sans", sans-serif; color: #222; background: #fff; }
body { margin: 0; padding: 12px; }
[hidden] { display: none !important; }
h1 { font-size: 1.15rem; margin: 0 0 8px; white-space: pre-line; overflow-wrap: anywhere; }
@media (max-width: 600px) { :root { font-size: 13px; } body { padding: 6px; } }
"""

PAGE_BODY = """</style>
</head>
<body>
<h1 id="xa-title">@TITLE@</h1>
<div id="xa-view"></div>
<noscript><p>This view needs JavaScript to draw the heatmap.</p></noscript>
<script type="application/json" id="xa-data">@DATA@</script>
<script>
"""

START = """
XattnHeatmap.mount(document.getElementById("xa-view"),
                   JSON.parse(document.getElementById("xa-data").textContent));
</script>
"""

PAGE_END = """</body>
</html>
"""
