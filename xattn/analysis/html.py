"""The interactive attention view: one self-contained HTML file (inline CSS and JavaScript, no network at all).

Shapes: L layers, H heads, R rows (queries) and C columns (attended tokens), as in `AttentionMaps`.
Every layer's and head's weights, and each layer's mean of heads, are embedded as JSON (integers, weight
x 10^4); the page builds the heatmap table from them with `textContent`, so no label is ever parsed as HTML,
and a Content-Security-Policy forbids every fetch.

Element ids and classes (stable; tests and users' scripts rely on them):
    #xa-title      the page heading               #xa-data     <script type="application/json">: the maps
    #xa-kind       <select>: which map (hidden when there is one)
    #xa-layer      <select>: layer 0..L-1 (a layer without heads, pruned, is shown disabled)
    #xa-head       <select>: "mean" or head 0..H_l-1 of the chosen layer
    #xa-links      <input type=checkbox>: alignment links shown (disabled when the map has none)
    #xa-readout    what the hovered (or tapped) cell says: "column → row: 0.812"
    #xa-scroll     the scrollable box around       #xa-map      <table>: the heatmap
    #xa-legend     colour scale, masked and link swatches
    th.xa-col[data-col=c]  column labels           th.xa-row[data-row=r]  row labels
    td.xa-cell[data-row=r][data-col=c][data-w]  a cell; data-w is its weight in the shown view, 4 decimals
    .xa-hl         the hovered cell and its row and column labels
    .xa-masked     a cell the query may not attend (the decoder's future)
    .xa-link       a cell that is an alignment link; #xa-map.xa-nolinks hides their marks
"""
from __future__ import annotations

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


def render(maps: AttentionMaps | Mapping[str, AttentionMaps], title: str | None = None,
           choice: HeadChoice | None = None) -> str:
    """The page for one map, or for several (a name -> map each, such as {"cross": ..., "decoder-self": ...}).

    choice: the view shown first (one head or the mean of heads); None is the last layer's mean of heads.
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
    data = {"views": [_view(name, m) for name, m in named.items()],
            "initial": {"layer": choice.layer, "head": "mean" if choice.heads is None else choice.heads[0]}}
    fields = {"TITLE": html.escape(title or ", ".join(named), quote=False), "CSP": CSP, "DATA": _script_json(data)}
    page = PAGE_HEAD + STYLE + PAGE_BODY + SCRIPT + PAGE_END
    return re.sub(r"@(TITLE|CSP|DATA)@", lambda m: fields[m[1]], page)  # one pass: a value is never re-read


def save(page: str, path: str | Path) -> Path:
    """Write a page from `render` to an .html (or .htm) file, atomically."""
    path = Path(path)
    if path.suffix.lower() not in EXTENSIONS:
        raise XattnError(f"{path}: the attention view is an HTML file; name it with one of {', '.join(EXTENSIONS)}")
    atomic_write_text(path, page)
    return path


def _script_json(data) -> str:
    """JSON that can sit inside <script>: no "<", ">" or "&" (so no "</script" or "<!--"), no line separators."""
    text = json_text(data, ensure_ascii=False, separators=(",", ":"))
    for ch, escaped in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"), ("\u2028", "\\u2028"),
                        ("\u2029", "\\u2029")):
        text = text.replace(ch, escaped)
    return text


def _view(name: str, maps: AttentionMaps) -> dict:
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
            "masked": masked, "links": [[int(c), int(r)] for c, r in maps.links], "linksLabel": maps.links_label}


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
#xa-controls { display: flex; flex-wrap: wrap; gap: 8px 16px; align-items: center; margin: 0 0 6px; }
#xa-controls label { white-space: nowrap; }
select { font: inherit; padding: 2px 4px; max-width: 100%; }
#xa-readout { display: block; min-height: 1.5em; margin: 2px 0 6px; font-variant-numeric: tabular-nums; }
#xa-scroll { overflow: auto; max-width: 100%; max-height: 78vh; border: 1px solid #ddd; }
#xa-map { border-collapse: collapse; }
#xa-map th { font-weight: normal; font-size: 12px; white-space: nowrap; background: #fff; }
th.xa-row { position: sticky; left: 0; z-index: 1; text-align: right; padding: 0 6px; }
th.xa-col { position: sticky; top: 0; z-index: 1; vertical-align: bottom; padding: 4px 0; }
th.xa-col span { display: inline-block; writing-mode: vertical-rl; text-orientation: sideways;
  transform: rotate(180deg); }
th.xa-corner { position: sticky; left: 0; top: 0; z-index: 2; }
td.xa-cell { width: 22px; min-width: 22px; height: 22px; padding: 0; border: 1px solid #fff; }
td.xa-masked, .xa-swatch.xa-masked {
  background: repeating-linear-gradient(45deg, #b4b4b4 0 2px, #e6e6e6 2px 6px); }
td.xa-link, .xa-swatch.xa-link { outline: 2px solid #d62728; outline-offset: -5px; }
#xa-map.xa-nolinks td.xa-link { outline: none; }
#xa-map th.xa-hl { background: #ffe08a; font-weight: bold; }
td.xa-hl { box-shadow: inset 0 0 0 2px #222; }
#xa-legend { display: flex; flex-wrap: wrap; gap: 6px 16px; align-items: center; margin: 8px 0 0; font-size: 12px; }
#xa-legend span { display: inline-flex; align-items: center; gap: 4px; }
.xa-swatch { display: inline-block; width: 16px; height: 16px; border: 1px solid #ccc; }
.xa-ramp { display: inline-block; width: 120px; height: 12px; border: 1px solid #ccc;
  background: linear-gradient(to right, #f7fbff, #c6dbef, #6baed6, #2171b5, #08306b); }
@media (max-width: 600px) {
  :root { font-size: 13px; }
  body { padding: 6px; }
  #xa-controls { gap: 6px 10px; }
  #xa-controls label { flex: 1 1 40%; }
  td.xa-cell { width: 18px; min-width: 18px; height: 18px; }
  #xa-map th { font-size: 11px; }
}
</style>
</head>
"""

PAGE_BODY = """<body>
<h1 id="xa-title">@TITLE@</h1>
<div id="xa-controls">
<label hidden>map <select id="xa-kind"></select></label>
<label>layer <select id="xa-layer"></select></label>
<label>heads <select id="xa-head"></select></label>
<label><input type="checkbox" id="xa-links" checked> alignment links</label>
</div>
<output id="xa-readout">hover over or tap a cell</output>
<div id="xa-scroll"><table id="xa-map"></table></div>
<p id="xa-legend">
<span>0 <i class="xa-ramp"></i> 1 attention weight (row attends to column)</span>
<span id="xa-legend-masked" hidden><i class="xa-swatch xa-masked"></i> masked: a future position</span>
<span id="xa-legend-links" hidden><i class="xa-swatch xa-link"></i> <span id="xa-links-label">alignment link</span></span>
</p>
<noscript><p>This view needs JavaScript to draw the heatmap.</p></noscript>
<script type="application/json" id="xa-data">@DATA@</script>
"""

SCRIPT = """<script>
"use strict";
(() => {
  const data = JSON.parse(document.getElementById("xa-data").textContent);
  const $ = (id) => document.getElementById(id);
  const kind = $("xa-kind"), layer = $("xa-layer"), head = $("xa-head"), links = $("xa-links");
  const readout = $("xa-readout"), table = $("xa-map");
  const RAMP = [[247, 251, 255], [198, 219, 239], [107, 174, 214], [33, 113, 181], [8, 48, 107]];
  let view = null, cells = [], hovered = null;

  function colour(w) {  // the weight's colour on RAMP, 0 (white) to 1 (dark blue), as matplotlib's Blues
    const x = Math.min(Math.max(w, 0), 1) * (RAMP.length - 1), i = Math.min(Math.floor(x), RAMP.length - 2);
    const rgb = RAMP[i].map((a, k) => Math.round(a + (RAMP[i + 1][k] - a) * (x - i)));
    return "rgb(" + rgb.join(",") + ")";
  }
  const range = (n) => Array.from({length: n}, (_, i) => i);
  function options(select, values, labels, keep, off = () => false) {  // off(value): shown, not selectable
    select.textContent = "";
    values.forEach((v, i) => { const o = new Option(labels[i], String(v)); o.disabled = off(v); select.add(o); });
    if (values.map(String).includes(String(keep)) && !off(keep)) select.value = String(keep);
  }
  function pickLayer(l) {  // layer l, or the last one with heads if it has none (a pruned model)
    const withHeads = range(view.layers).filter((i) => view.heads[i] > 0);
    const keep = view.heads[l] > 0 ? l : withHeads[withHeads.length - 1];
    options(layer, range(view.layers), range(view.layers).map((i) => "layer " + i + (view.heads[i] ? "" :
            ": no heads (pruned)")), keep, (i) => !view.heads[i]);
  }
  function pickHead(h) {  // the chosen layer's heads, keeping head h if it has it
    const n = view.heads[Number(layer.value)] || 0;
    options(head, ["mean"].concat(range(n)), ["mean of heads"].concat(range(n).map((i) => "head " + i)), h);
  }
  function el(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    return e;
  }
  function build(l, h) {  // the table and pickers for the chosen map, keeping layer l and head h if it has them
    view = data.views[Number(kind.value)];
    pickLayer(Math.min(l, view.layers - 1));
    pickHead(h);
    const linked = new Set(view.links.map(([c, r]) => r + "," + c));
    table.textContent = "";
    const top = table.createTHead().insertRow();
    top.appendChild(el("th", "xa-corner"));
    view.cols.forEach((label, c) => {
      const th = top.appendChild(el("th", "xa-col"));
      th.dataset.col = c;
      th.appendChild(el("span", "", label));
    });
    const body = table.createTBody();
    cells = view.rows.map((label, r) => {
      const tr = body.insertRow(), th = tr.appendChild(el("th", "xa-row", label));
      th.dataset.row = r;
      return view.cols.map((_, c) => {
        const td = tr.appendChild(el("td", "xa-cell"));
        td.dataset.row = r; td.dataset.col = c;
        if (view.masked && view.masked[r * view.cols.length + c] === "1") td.classList.add("xa-masked");
        if (linked.has(r + "," + c)) td.classList.add("xa-link");
        return td;
      });
    });
    links.disabled = view.links.length === 0;
    $("xa-legend-masked").hidden = !(view.masked && view.masked.includes("1"));
    $("xa-legend-links").hidden = view.links.length === 0;
    $("xa-links-label").textContent = view.linksLabel;
    hovered = null;
    readout.textContent = "hover over or tap a cell";
  }
  function paint() {  // colours and data-w for the chosen layer and head; none where no head is left
    const l = Number(layer.value), h = head.value, C = view.cols.length;
    const w = !view.heads[l] ? null : h === "mean" ? view.mean[l] : view.w[l][Number(h)];
    cells.forEach((row, r) => row.forEach((td, c) => {
      if (w) td.dataset.w = (w[r * C + c] / 10000).toFixed(4); else delete td.dataset.w;
      td.style.backgroundColor = td.classList.contains("xa-masked") || !w ? "" : colour(w[r * C + c] / 10000);
    }));
    if (!w) readout.textContent = "every head of this attention was pruned: nothing to show";
    else if (hovered) show(hovered);
  }
  function show(td) {  // highlight the cell's word pair and say its weight
    table.querySelectorAll(".xa-hl").forEach((e) => e.classList.remove("xa-hl"));
    const r = Number(td.dataset.row), c = Number(td.dataset.col);
    td.classList.add("xa-hl");
    table.querySelector('th.xa-row[data-row="' + r + '"]').classList.add("xa-hl");
    table.querySelector('th.xa-col[data-col="' + c + '"]').classList.add("xa-hl");
    const value = td.classList.contains("xa-masked") ? "masked (future)" :
      td.dataset.w === undefined ? "no heads (pruned)" : Number(td.dataset.w).toFixed(3);
    readout.textContent = view.cols[c] + " \\u2192 " + view.rows[r] + ": " + value;
    hovered = td;
  }
  const onCell = (e) => { const td = e.target.closest("td.xa-cell"); if (td) show(td); };
  table.addEventListener("mouseover", onCell);
  table.addEventListener("click", onCell);
  links.addEventListener("change", () => table.classList.toggle("xa-nolinks", !links.checked));
  kind.addEventListener("change", () => { build(Number(layer.value), head.value); paint(); });
  layer.addEventListener("change", () => { pickHead(head.value); paint(); });
  head.addEventListener("change", paint);

  options(kind, data.views.map((_, i) => i), data.views.map((v) => v.name), 0);
  kind.parentElement.hidden = data.views.length < 2;
  build(data.initial.layer, data.initial.head);
  paint();
})();
</script>
"""

PAGE_END = """</body>
</html>
"""
