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

function draw() {
  if (!current || !current.attention) return;
  const weights = view(), rows = current.target_tokens, cols = current.source_tokens;
  const cell = 22, left = 8 + 7 * Math.max(...rows.map((r) => r.length)), top = 8 + 7 * Math.max(...cols.map((c) => c.length));
  const svg = $("heatmap");
  svg.replaceChildren();
  svg.setAttribute("width", left + cell * cols.length + 8);
  svg.setAttribute("height", top + cell * rows.length + 8);
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
  const svg = $("links"), src = current.source_words, tgt = current.target_words;
  svg.replaceChildren();
  if (!$("show-links").checked) { svg.setAttribute("height", 0); return; }
  const width = Math.max(src.length, tgt.length) * 80 + 20;
  svg.setAttribute("width", width);
  svg.setAttribute("height", 90);
  const x = (i, n) => 10 + (i + 0.5) * (width - 20) / n;
  src.forEach((w, i) => svg.append(el("text", {x: x(i, src.length), y: 14, "text-anchor": "middle"}, w)));
  tgt.forEach((w, j) => svg.append(el("text", {x: x(j, tgt.length), y: 84, "text-anchor": "middle"}, w)));
  for (const [i, j] of current.alignment) {
    svg.append(el("line", {class: "link", x1: x(i, src.length), y1: 20, x2: x(j, tgt.length), y2: 70}));
  }
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
