// The page of `xattn serve`: translate on submit, draw the cross-attention as an SVG heatmap with a layer
// and head picker, highlight the word pair under the pointer, draw the alignment links. No framework.
"use strict";
const $ = (id) => document.getElementById(id);
const SVG = "http://www.w3.org/2000/svg";
let current = null;  // the last result: tokens, attention (L x H x T x S), alignment, words
let info = null;  // the model: GET /info (languages, cross-attention heads per layer)

function el(name, attrs, text) {
  const node = document.createElementNS(SVG, name);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  if (text !== undefined) node.textContent = text;
  return node;
}

function showError(message) {
  $("error").textContent = message;
  $("error").hidden = false;
}

async function translate(event) {
  event.preventDefault();
  $("error").hidden = true;
  const attention = !info || info.heads.some((n) => n > 0);  // a model whose every cross head was pruned has none
  const body = {q: $("text").value, attention: attention ? "full" : "none", alignment: attention,
                alternatives: Number($("alternatives").value) || 0};
  if ($("sample").checked) {
    Object.assign(body, {sampling: true, temperature: Number($("temperature").value), top_p: Number($("top-p").value)});
  } else {
    body.beam_size = Number($("beam").value);
  }
  $("go").disabled = true;
  try {
    let [reply, data] = await post(body);
    if (reply.status === 413 && data.error_type === "too_large") {  // full attention over the server's limit
      body.attention = "mean";
      [reply, data] = await post(body);
    }
    if (!reply.ok) { showError(data.error || `HTTP ${reply.status}`); return; }
    show(data.results[0], data.alternatives || [], body.attention);
  } catch (e) {
    showError(`the server cannot be reached (${e.message})`);
  } finally {
    $("go").disabled = false;
  }
}

async function post(body) {
  const headers = {"Content-Type": "application/json"};
  if ($("key").value) headers.Authorization = `Bearer ${$("key").value}`;
  const reply = await fetch("/translate", {method: "POST", headers, body: JSON.stringify(body)});
  let data;
  try { data = await reply.json(); } catch (e) { data = {error: `HTTP ${reply.status} without a JSON body`}; }
  return [reply, data];
}

function show(result, alternatives, kind) {
  current = result;
  result.kind = kind;  // none, mean or full
  $("result").hidden = false;
  $("translation").textContent = result.translatedText;
  $("alts").replaceChildren(...alternatives.map((a) => { const li = document.createElement("li"); li.textContent = a; return li; }));
  $("attention").hidden = kind === "none";
  $("no-attention").hidden = kind !== "none";
  if (kind === "none") return;
  if (kind === "mean") result.attention = result.attention.map((layer) => [layer]);  // one "head": the mean
  // each layer's heads: those not null (a pruned layer has fewer, maybe none, and its mean is null)
  result.heads = result.attention.map((layer) => layer.filter((h) => h[0] && h[0][0] !== null).length);
  const layers = result.attention.length, withHeads = [...Array(layers).keys()].filter((l) => result.heads[l] > 0);
  const wanted = Number($("layer").value || layers - 1);
  const keep = result.heads[wanted] > 0 ? wanted : withHeads[withHeads.length - 1];
  $("layer").replaceChildren(...[...Array(layers).keys()].map((l) => {
    const option = new Option(result.heads[l] ? String(l) : `${l} (no heads: pruned)`, String(l));
    option.disabled = !result.heads[l];
    return option;
  }));
  $("layer").value = String(keep);
  heads();
  draw();
}

function heads() {  // the head picker: the chosen layer's own heads
  const n = current.kind === "mean" ? 0 : current.heads[Number($("layer").value)];
  $("head").replaceChildren(new Option("mean", "mean"), ...[...Array(n).keys()].map((h) => new Option(String(h), String(h))));
}

function view() {
  // the chosen layer's (T, S) weights: one head, or the mean of the heads the layer has
  const layer = current.attention[Number($("layer").value)];
  const head = $("head").value;
  if (head !== "mean") return layer[Number(head)];
  const present = layer.slice(0, current.heads[Number($("layer").value)]);
  return layer[0].map((row, t) => row.map((_, s) => present.reduce((sum, h) => sum + h[t][s], 0) / present.length));
}

function fit(svg) {  // the SVG's box is its drawing's, so that no label is cut off whatever its length
  const box = svg.getBBox(), pad = 2;
  svg.setAttribute("viewBox", `${box.x - pad} ${box.y - pad} ${box.width + 2 * pad} ${box.height + 2 * pad}`);
  svg.setAttribute("width", box.width + 2 * pad);
  svg.setAttribute("height", box.height + 2 * pad);
}

function draw() {
  if (!current || !current.attention) return;
  const weights = view(), rows = current.target_tokens, cols = current.source_tokens;
  const cell = 22, left = 8 + 7 * Math.max(...rows.map((r) => r.length)), top = 8 + 7 * Math.max(...cols.map((c) => c.length));
  const svg = $("heatmap");
  svg.replaceChildren();
  cols.forEach((c, s) => svg.append(el("text", {x: left + cell * s + cell / 2, y: top - 4, "data-col": s,
    transform: `rotate(-60 ${left + cell * s + cell / 2} ${top - 4})`}, c)));
  rows.forEach((r, t) => svg.append(el("text", {x: left - 4, y: top + cell * t + cell * 0.7, "text-anchor": "end", "data-row": t}, r)));
  weights.forEach((row, t) => row.forEach((w, s) => {
    const shade = Math.round(255 * (1 - w));
    const rect = el("rect", {class: "cell", x: left + cell * s, y: top + cell * t, width: cell - 1, height: cell - 1,
                             fill: `rgb(${shade},${shade},255)`, "data-row": t, "data-col": s, "data-weight": w.toFixed(3)});
    rect.addEventListener("mouseenter", () => hover(t, s, w));
    svg.append(rect);
  }));
  fit(svg);
  drawLinks();
}

function hover(t, s, w) {
  for (const node of $("heatmap").querySelectorAll(".hot")) node.classList.remove("hot");
  for (const node of $("heatmap").querySelectorAll(`text[data-row="${t}"], text[data-col="${s}"], rect[data-row="${t}"][data-col="${s}"]`)) {
    node.classList.add("hot");
  }
  $("pair").textContent = `${current.target_tokens[t]} ← ${current.source_tokens[s]}: ${w.toFixed(3)}`;
}

function drawLinks() {
  // source words above target words with a line per link; where a row of words is wider than the box (a phone),
  // source words in a column on the left and target words on the right instead
  const svg = $("links");
  svg.replaceChildren();
  if (!$("show-links").checked || !current.alignment) { svg.setAttribute("width", 0); svg.setAttribute("height", 0); return; }
  const label = (word) => svg.appendChild(el("text", {}, word));
  const src = current.source_words.map(label), tgt = current.target_words.map(label);
  const width = (texts) => texts.map((t) => t.getComputedTextLength());
  const gap = 16, row = (ws) => ws.reduce((a, b) => a + b + gap, -gap), room = svg.parentElement.clientWidth - 4;
  const across = Math.max(row(width(src)), row(width(tgt))) <= room;
  if (!across) [...src, ...tgt].forEach((t) => shorten(t, (room - 70) / 2));  // a word longer than a column
  const [sw, tw] = [width(src), width(tgt)];
  const ends = across ? placeAcross(src, sw, tgt, tw, gap) : placeDown(src, sw, tgt, tw);
  for (const [i, j] of current.alignment) {
    svg.append(el("line", {class: "link", x1: ends[0][i][0], y1: ends[0][i][1], x2: ends[1][j][0], y2: ends[1][j][1]}));
  }
  fit(svg);
}

function shorten(text, most) {  // cut a word to `most` pixels with an ellipsis; the whole word is its tooltip
  if (text.getComputedTextLength() <= most) return;
  const word = text.textContent;
  let keep = word.length;
  while (keep > 1 && text.getSubStringLength(0, keep) > most - 12) keep--;
  text.textContent = word.slice(0, keep) + "\u2026";
  text.append(el("title", {}, word));
}

function placeAcross(src, sw, tgt, tw, gap) {  // two rows, each spread over the wider one's width
  const total = Math.max(...[sw, tw].map((ws) => ws.reduce((a, b) => a + b + gap, -gap)));
  return [[src, sw, 14, 20], [tgt, tw, 84, 70]].map(([texts, ws, y, end]) => {
    const spare = (total - ws.reduce((a, b) => a + b, 0)) / Math.max(texts.length - 1, 1);
    let x = texts.length > 1 ? 0 : (total - (ws[0] || 0)) / 2;
    return texts.map((t, k) => {
      const middle = x + ws[k] / 2;
      t.setAttribute("x", middle); t.setAttribute("y", y); t.setAttribute("text-anchor", "middle");
      x += ws[k] + spare;
      return [middle, end];
    });
  });
}

function placeDown(src, sw, tgt, tw) {  // two columns: source words right-aligned on the left, target words on the right
  const line = 22, left = Math.max(...sw, 0), right = left + 70;
  const place = (t, k, x, anchor) => { t.setAttribute("x", x); t.setAttribute("y", 16 + line * k); t.setAttribute("text-anchor", anchor); };
  src.forEach((t, k) => place(t, k, left, "end"));
  tgt.forEach((t, k) => place(t, k, right, "start"));
  return [src.map((_, k) => [left + 4, 12 + line * k]), tgt.map((_, k) => [right - 4, 12 + line * k])];
}

async function languages() {
  try {
    const reply = await fetch("/info");
    const data = await reply.json();
    if (reply.ok) {
      info = data;
      $("langs").textContent = `${info.source} → ${info.target}`;
      $("key-field").hidden = !info.api_key_required;
    }
    else showError(data.error || `HTTP ${reply.status}`);
  } catch (e) { showError(`the server cannot be reached (${e.message})`); }
}

document.addEventListener("DOMContentLoaded", () => {
  $("form").addEventListener("submit", translate);
  $("layer").addEventListener("change", () => { heads(); draw(); });
  $("head").addEventListener("change", draw);
  $("show-links").addEventListener("change", drawLinks);
  languages();
});
