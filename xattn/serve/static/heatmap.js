// The attention heatmap of xattn, one script for two pages: `xattn serve` loads it from /static/heatmap.js, and
// `xattn attention -o x.html` writes it inline into its one-file view. XattnHeatmap.mount(root, data) draws into
// `root`: the pickers (map, layer, heads, alignment links), a readout, the heatmap as an HTML table and a legend.
// No framework and no request of any kind: labels go in as text, never as markup.
//
// data: {views: [view, ...], initial: {layer, head, links (optional; false: the links start hidden)}}; each view
//   (one kind of attention of one sentence pair): name, kind ("cross", "decoder-self", "encoder-self"), rows
//   (R labels), cols (C labels), layers (L), heads (heads per layer; 0: pruned), w (per layer, each head's R*C
//   weights x SCALE as integers; null: only the mean is known), mean (per layer, R*C integers, null for a layer
//   without heads), masked ("0"/"1" per cell, or null), links ([[col, row], ...] cells that are alignment links),
//   linksLabel (what made the links, for the legend), linksLayer (the layer the links were read from, or null),
//   pieces (optional: the labels are SentencePiece pieces, or not; by default, when one of them starts with the
//   word-start mark), rowWords and colWords (optional: the words of the text the rows' and the columns' pieces
//   spell, xattn.words).
"use strict";
const XattnHeatmap = (() => {
  const SCALE = 10000;
  // matplotlib's Blues: lightness falls steadily from white to dark blue, so darker always reads as more
  const BLUES = [[247, 251, 255], [222, 235, 247], [198, 219, 239], [158, 202, 225], [107, 174, 214],
                 [66, 146, 198], [33, 113, 181], [8, 81, 156], [8, 48, 107]];
  const TICKS = [0, 0.01, 0.05, 0.1, 0.25, 0.5, 1];
  const WORD_START = "\u2581";  // SentencePiece's mark of a piece that starts a word
  const SPECIALS = ["<s>", "</s>", "<pad>"], UNK = "<unk>";  // pieces of no text; an unknown character's piece
  const UNK_SURFACE = "\u2047";  // what SentencePiece prints for an unknown piece
  const AXES = {"cross": "rows: the translation, each attending over the columns: the source",
                "decoder-self": "rows: the translation, each attending over the columns: the tokens before it",
                "encoder-self": "rows and columns: the source, each row attending over the columns"};
  const HINT = "hover over or tap a cell, or Tab into the map and use the arrow keys";

  // The colour of weight w: on a square-root scale, because a row's weights sum to 1 and spread over the
  // columns, so in a long sentence most weights are a few hundredths; linear, they would all be near white.
  // The square root keeps them apart (0.01 is a tenth of the ramp, 0.25 half of it) and keeps one scale for
  // every row, so a row that looks everywhere a little stays pale, unlike a scale normalised per row.
  function colour(w) {
    const x = Math.sqrt(Math.min(Math.max(w, 0), 1)) * (BLUES.length - 1);
    const i = Math.min(Math.floor(x), BLUES.length - 2);
    return "rgb(" + BLUES[i].map((a, k) => Math.round(a + (BLUES[i + 1][k] - a) * (x - i))).join(",") + ")";
  }

  // Labels as people read them: a SentencePiece piece without its word-start mark (a piece that is only the
  // mark is shown as an open box, a space), and where each word starts. `pieces`: whether the labels are pieces
  // (the first always starts a word, as SentencePiece decodes it); by default, when one of them has the mark.
  // `unkAlone`: an unknown piece ("<unk>") is a word of its own, as in a translation, whose printed text has
  // " \u2047 " there; otherwise (a source, or a reference read teacher-forced) it stands for characters inside its
  // word. `words`: the text's words (xattn.words), when known: each label's word is then the text's own (and the
  // other reading of an unknown piece is taken where only it gives their number), and an unknown piece shows the
  // characters it stands for where its word tells them. -> [{text, start, word, special}]
  function labels(raw, pieces, unkAlone, words) {
    if (pieces === undefined || pieces === null) pieces = raw.some((t) => t.startsWith(WORD_START));
    let out = read(raw, pieces, unkAlone !== false), grouped = groups(out);
    if (words && raw.includes(UNK) && grouped.length !== words.length) {  // a reference's unknown piece is in its
      const other = read(raw, pieces, unkAlone === false);                // word: the words tell
      if (groups(other).length === words.length) [out, grouped] = [other, groups(other)];
    }
    const known = words && grouped.length === words.length;
    grouped.forEach((group, k) => {
      const word = known ? words[k] : group.map((p) => p.bare).join("");
      if (known) spell(group, word);
      for (const l of group) l.word = word;
    });
    out.forEach((l) => { if (l.word === undefined) l.word = l.bare; });
    return out;
  }

  function read(raw, pieces, unkAlone) {  // each label's text and whether a word starts there
    const special = (t) => SPECIALS.includes(t);
    const apart = (t) => special(t) || (unkAlone && t === UNK);  // not part of a word around it
    return raw.map((t, i) => {
      const text = t === UNK && pieces ? UNK_SURFACE : t.replace(/^\u2581/, "").split(WORD_START).join(" ");
      return {text: text || "\u2423", bare: text, special: special(t), unknown: t === UNK, pieces,
              start: !pieces || i === 0 || apart(t) || apart(raw[i - 1]) || t.startsWith(WORD_START)};
    });
  }

  function groups(out) {  // the labels of each word, in order (none for labels that are not pieces of words)
    const all = [];
    out.forEach((l) => {
      if (!l.pieces || l.special) return;
      if (l.start || !all.length) all.push([]);
      all[all.length - 1].push(l);
    });
    return all;
  }

  // An unknown piece shows what it stands for: the characters of its word that its other pieces do not spell
  // (when it is the word's only unknown piece and they spell the rest as they are).
  function spell(group, word) {
    const unknown = group.filter((l) => l.unknown);
    if (unknown.length !== 1) return;
    const at = group.indexOf(unknown[0]);
    const spelled = (part) => part.map((l) => l.bare).join("");
    const before = spelled(group.slice(0, at)), after = spelled(group.slice(at + 1));
    if (word.length > before.length + after.length && word.startsWith(before) && word.endsWith(after)) {
      unknown[0].text = unknown[0].bare = word.slice(before.length, word.length - after.length);
    }
  }

  // The word of the text each piece belongs to, counting only words of the text: -1 for </s> and the like.
  function wordIndex(raw, unkAlone) {
    let word = -1;
    return labels(raw, true, unkAlone).map((l) => l.special ? -1 : (l.start ? ++word : word));
  }

  function el(tag, attrs, text) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
    if (text !== undefined) e.textContent = text;
    return e;
  }

  const range = (n) => Array.from({length: n}, (_, i) => i);

  function options(select, values, names, keep, off) {  // off(value): shown, not selectable
    select.textContent = "";
    values.forEach((v, i) => { const o = new Option(names[i], String(v)); o.disabled = off(v); select.add(o); });
    if (values.map(String).includes(String(keep)) && !off(keep)) select.value = String(keep);
  }

  function skeleton(root) {  // the elements every view has (ids are stable: tests and users' scripts use them)
    const controls = el("div", {id: "xa-controls"});
    const pick = (name, id) => { const l = el("label", {}, name + " "); l.append(el("select", {id})); return l; };
    const kind = pick("map", "xa-kind"), links = el("label", {id: "xa-links-field"});
    kind.hidden = true;
    links.append(el("input", {type: "checkbox", id: "xa-links", checked: ""}), " ", el("span", {id: "xa-links-name"}));
    controls.append(kind, pick("layer", "xa-layer"), pick("heads", "xa-head"), links);
    const readout = el("output", {id: "xa-readout", "aria-live": "polite"}, HINT);
    const scroll = el("div", {id: "xa-scroll"});
    scroll.append(el("table", {id: "xa-map", role: "grid", "aria-label": "attention heatmap",
                               "aria-describedby": "xa-readout"}));
    const legend = el("div", {id: "xa-legend"});
    const ramp = el("span", {id: "xa-ramp"});
    ramp.append(el("span", {}, "attention weight (square-root colour scale):"));
    for (const t of TICKS) {
      const tick = el("span", {class: "xa-tick"});
      const swatch = el("i", {class: "xa-swatch"});
      swatch.style.backgroundColor = colour(t);
      tick.append(swatch, String(t));
      ramp.append(tick);
    }
    const masked = el("span", {id: "xa-legend-masked"}), linked = el("span", {id: "xa-legend-links"});
    masked.append(el("i", {class: "xa-swatch xa-masked"}), " masked: a future position");
    linked.append(el("i", {class: "xa-swatch xa-link"}), " ", el("span", {id: "xa-links-label"}, "alignment link"));
    legend.append(ramp, masked, linked, el("span", {id: "xa-axes"}));
    root.replaceChildren(controls, readout, scroll, legend);
  }

  const MOVES = {ArrowUp: [-1, 0], ArrowDown: [1, 0], ArrowLeft: [0, -1], ArrowRight: [0, 1]};

  class Viewer {  // one mounted view: its elements, the map shown, its cells and the selected one
    constructor(root, data) {
      skeleton(root);
      this.$ = (id) => root.querySelector("#" + id);
      this.data = data;
      [this.kind, this.layer, this.head, this.links, this.readout, this.table] =
        ["xa-kind", "xa-layer", "xa-head", "xa-links", "xa-readout", "xa-map"].map(this.$);
      this.selected = null;
      this.listen();
      options(this.kind, data.views.map((_, i) => i), data.views.map((v) => v.name), 0, () => false);
      this.kind.parentElement.hidden = data.views.length < 2;
      this.links.checked = data.initial.links !== false;
      this.build(data.initial.layer, data.initial.head);
      this.paint();
    }

    choice() {  // the layer and head shown and whether links are, to open the next map on
      return {layer: Number(this.layer.value), head: this.head.value, links: this.links.checked};
    }

    listen() {
      const onCell = (e) => { const td = e.target.closest("td.xa-cell"); if (td) this.show(td); };
      for (const name of ["mouseover", "click", "focusin"]) this.table.addEventListener(name, onCell);
      // a tap: the cell under the finger, not the browser's guess of a target near it (on small cells, a tap
      // highlighted the cell below about one time in eight); the mouse events it would make after are not made
      let down = null;
      const start = (e) => { const t = e.changedTouches[0]; down = [t.clientX, t.clientY]; };
      this.table.addEventListener("touchstart", start, {passive: true});
      this.table.addEventListener("touchend", (e) => {
        const t = e.changedTouches[0], moved = !down || Math.hypot(t.clientX - down[0], t.clientY - down[1]) > 10;
        const hit = document.elementFromPoint(t.clientX, t.clientY), td = hit && hit.closest("td.xa-cell");
        if (moved || !td || !this.table.contains(td)) return;  // (a swipe scrolls the map: no choice)
        e.preventDefault();
        this.show(td);
      });
      this.table.addEventListener("keydown", (e) => this.move(e));
      this.links.addEventListener("change", () => {
        this.table.classList.toggle("xa-nolinks", !this.links.checked);
        if (this.selected) this.show(this.selected);
      });
      this.kind.addEventListener("change", () => {
        this.build(Number(this.layer.value), this.head.value);
        this.paint();
      });
      this.layer.addEventListener("change", () => { this.pickHead(this.head.value); this.paint(); });
      this.head.addEventListener("change", () => this.paint());
    }

    pickLayer(l) {  // layer l, or the last one with heads if it has none (a pruned model)
      const view = this.view, withHeads = range(view.layers).filter((i) => view.heads[i] > 0);
      const keep = view.heads[l] > 0 ? l : withHeads[withHeads.length - 1];
      const name = (i) => "layer " + i + (view.heads[i] ? "" : ": no heads (pruned)") +
        (i === view.linksLayer ? " (links)" : "");
      options(this.layer, range(view.layers), range(view.layers).map(name), keep, (i) => !view.heads[i]);
    }

    pickHead(h) {  // the chosen layer's heads (only the mean when that is all there is), keeping head h
      const n = this.view.w ? this.view.heads[Number(this.layer.value)] || 0 : 0;
      options(this.head, ["mean"].concat(range(n)), ["mean of heads"].concat(range(n).map((i) => "head " + i)), h,
              () => false);
    }

    build(l, h) {  // the pickers, table and legend of the chosen map, keeping layer l and head h if it has them
      const view = this.view = this.data.views[Number(this.kind.value)];
      this.pickLayer(Math.min(l, view.layers - 1));
      this.pickHead(h);
      const sourceRows = view.kind === "encoder-self", sourceCols = view.kind !== "decoder-self";
      this.rows = labels(view.rows, view.pieces, !sourceRows, view.rowWords);
      this.cols = labels(view.cols, view.pieces, !sourceCols, view.colWords);
      this.drawTable();
      const none = view.links.length === 0, $ = this.$;
      this.links.disabled = none;
      $("xa-links-field").hidden = none;
      $("xa-links-name").textContent = "alignment links" +
        (view.linksLayer === null || view.linksLayer === undefined ? "" : " (from layer " + view.linksLayer + ")");
      $("xa-legend-masked").hidden = !(view.masked && view.masked.includes("1"));
      $("xa-legend-links").hidden = none;
      $("xa-links-label").textContent = view.linksLabel;
      $("xa-axes").textContent = AXES[view.kind] || "";
      this.table.classList.toggle("xa-nolinks", !this.links.checked);
      this.selected = null;
      this.readout.textContent = HINT;
    }

    drawTable() {  // one cell per row and column; only the first in the tab order; a gap before each word
      const view = this.view, rows = this.rows, cols = this.cols, table = this.table;
      const gaps = rows.concat(cols).some((x) => !x.start);  // some word is made of several pieces
      const gap = (label, i) => gaps && label.start && i > 0;
      const linked = new Set(view.links.map(([c, r]) => r + "," + c));
      table.textContent = "";
      const top = table.createTHead().insertRow(), corner = top.appendChild(el("th", {class: "xa-corner"}));
      cols.forEach((label, c) => {
        const th = top.appendChild(el("th", {class: "xa-col" + (gap(label, c) ? " xa-ws" : ""), scope: "col"}));
        th.dataset.col = c;
        th.append(el("span", {}, label.text));
      });
      const body = table.createTBody();
      this.cells = rows.map((label, r) => {
        const tr = body.insertRow();
        if (gap(label, r)) tr.className = "xa-wr";
        tr.appendChild(el("th", {class: "xa-row", scope: "row", "data-row": r}, label.text));
        return cols.map((col, c) => {
          const td = tr.appendChild(el("td", {class: "xa-cell" + (gap(col, c) ? " xa-ws" : ""), role: "gridcell",
                                              "data-row": r, "data-col": c, tabindex: r + c === 0 ? "0" : "-1"}));
          if (view.masked && view.masked[r * cols.length + c] === "1") td.classList.add("xa-masked");
          if (linked.has(r + "," + c)) td.classList.add("xa-link");
          return td;
        });
      });
      this.tabbed = this.cells.length && this.cells[0].length ? this.cells[0][0] : null;
      const scroll = this.$("xa-scroll");  // a focused cell scrolls clear of the sticky labels
      scroll.style.scrollPaddingTop = corner.offsetHeight + "px";
      scroll.style.scrollPaddingLeft = corner.offsetWidth + "px";
    }

    paint() {  // colours and data-w for the chosen layer and head; none where no head is left
      const view = this.view, l = Number(this.layer.value), h = this.head.value, C = this.cols.length;
      const w = !view.heads[l] ? null : h === "mean" ? view.mean[l] : view.w[l][Number(h)];
      this.cells.forEach((row, r) => row.forEach((td, c) => {
        if (w) td.dataset.w = (w[r * C + c] / SCALE).toFixed(4); else delete td.dataset.w;
        td.style.backgroundColor = td.classList.contains("xa-masked") || !w ? "" : colour(w[r * C + c] / SCALE);
      }));
      if (!w) this.readout.textContent = "every head of this attention was pruned: nothing to show";
      else if (this.selected) this.show(this.selected);
    }

    show(td) {  // highlight the cell's word pair, say its weight, make it the cell Tab comes back to
      const table = this.table, r = Number(td.dataset.row), c = Number(td.dataset.col);
      table.querySelectorAll(".xa-hl").forEach((e) => e.classList.remove("xa-hl"));
      td.classList.add("xa-hl");
      table.querySelector('th.xa-row[data-row="' + r + '"]').classList.add("xa-hl");
      table.querySelector('th.xa-col[data-col="' + c + '"]').classList.add("xa-hl");
      const value = td.classList.contains("xa-masked") ? "masked (future)" :
        td.dataset.w === undefined ? "no heads (pruned)" : Number(td.dataset.w).toFixed(3);
      const link = td.classList.contains("xa-link") && this.links.checked ? " \u00b7 alignment link" : "";
      const named = (label) => label.word === label.bare ? label.text : label.text + " (in " + label.word + ")";
      this.readout.textContent = named(this.cols[c]) + " \u2192 " + named(this.rows[r]) + ": " + value + link;
      if (this.tabbed !== td) {  // the one cell in the tab order
        if (this.tabbed) this.tabbed.tabIndex = -1;
        td.tabIndex = 0;
        this.tabbed = td;
      }
      this.selected = td;
    }

    move(e) {  // arrow keys move the selection; Home and End go to the row's ends
      const td = e.target.closest("td.xa-cell");
      if (!td || e.altKey || e.metaKey) return;
      let r = Number(td.dataset.row), c = Number(td.dataset.col);
      if (MOVES[e.key]) { r += MOVES[e.key][0]; c += MOVES[e.key][1]; }
      else if (e.key === "Home") c = 0;
      else if (e.key === "End") c = this.cols.length - 1;
      else return;
      e.preventDefault();
      const clamp = (x, n) => Math.min(Math.max(x, 0), n - 1);
      this.cells[clamp(r, this.rows.length)][clamp(c, this.cols.length)].focus();
    }
  }

  const mount = (root, data) => new Viewer(root, data);  // -> the viewer; its choice() is the layer and head shown

  return {mount: mount, colour: colour, labels: labels, wordIndex: wordIndex, SCALE: SCALE};
})();
