// The page of `xattn serve`: the language pair (one per model served), the text and its translation side by
// side, the settings that apply to the chosen way of translating, the cross-attention (heatmap.js, shared with
// `xattn attention -o x.html`) and the word alignment. A new answer, an error or another pair replaces everything
// the last answer showed. No framework.
"use strict";
const $ = (id) => document.getElementById(id);
const SVG = "http://www.w3.org/2000/svg";
const FIELDS = {q: "Text", beam_size: "Beam width", alternatives: "Other translations", temperature: "Temperature",
                top_p: "Top-p", sampling: "Sampling", source: "Source language",
                target: "Target language"};  // the API's field names as the page calls them
const AUTO = "auto";  // the pair picker's value for "detect the language" (the API's source: auto)
let server = null;   // GET /info: each model (languages, heads per layer, alignment layer, decoding defaults), limits
let chosen = null;   // the model of the pair picked; null to detect the language (the answer says which model)
let anyway = null;   // a text the lone model is to translate although its language was detected as another
let names = {};      // language names by code (GET /languages)
let shown = null;    // what the page shows: {text, result, model}; null when nothing is
let about = null;    // the text and settings the answer or error shown was asked with: {text, settings}; or null
let heatmap = null;  // the heatmap last drawn and its model: {viewer, model} (its layer and head open the next one)
let ticket = 0;      // the latest translation asked for: an answer to an earlier one is dropped

const DISPLAY = typeof Intl.DisplayNames === "function" ? new Intl.DisplayNames(["en"], {type: "language"}) : null;
const name = (code) => names[code] || known(code) || code;  // the server's names, else the browser's (a language
function known(code) {  //                                      detected that no model served: Spanish, not es)
  try { const n = DISPLAY && DISPLAY.of(code); return n !== code ? n : null; } catch (e) { return null; }
}
const candidates = () => chosen ? [chosen] : server.models;  // the models that may answer
const attends = (model) => model.heads.some((n) => n > 0);   // a model whose every cross head was pruned has none

// ---------------------------------------------------------------------------------------------- settings

const sampling = () => $("strategy-sample").checked;

// The decoding defaults of the pair picked; to detect the language, those of the models that may answer where they
// agree, null where they differ.
function defaults() {
  const all = candidates().map((m) => m.decode);
  return Object.fromEntries(Object.keys(all[0]).map((key) =>
    [key, all.every((d) => d[key] === all[0][key]) ? all[0][key] : null]));
}

function mostAlternatives() {  // what the server's limits allow: n-best of a beam, or samples
  if (!server) return 7;
  const l = server.limits;
  return (sampling() ? l.max_samples : Math.min(l.max_n_best, l.max_beam)) - 1;
}

function strategyChanged() {  // what does not apply to the way chosen is disabled, and the note says why
  $("beam-settings").disabled = sampling();
  $("beam-note").hidden = !sampling();
  $("sample-settings").disabled = !sampling();
  $("sample-note").hidden = sampling();
  $("alternatives").max = mostAlternatives();
  alternativesChanged();
}

function alternativesChanged() {
  const most = mostAlternatives(), asked = Number($("alternatives").value);
  const what = sampling() ? "samples" : "beam search's next best";
  $("alternatives-note").textContent = asked > most ? `At most ${most} on this server.` :
    `0 to ${most}: the ${what}, under the translation.`;
  $("alternatives-note").classList.toggle("over", asked > most);
}

// The first setting that cannot be sent as it is, in plain words with the field to fix; null when all are fine.
function problem(text) {
  if (!/[^\s\p{Cc}\p{Cf}\p{Default_Ignorable_Code_Point}\u2800]/u.test(text)) {  // (Hangul fillers, a braille blank)
    return {field: "text", message: "Type a text to translate first."};
  }
  const chars = [...text].length;  // characters as the server counts them (code points)
  const most = server ? server.limits.max_chars : Infinity;
  if (chars > most) {
    return {field: "text", message: `Text: ${chars} characters, over the limit of ${most} on this server; shorten ` +
            `it by ${chars - most}.`};
  }
  const number = (id) => { const v = $(id).value.trim(); return v === "" ? NaN : Number(v); };
  const mostBeam = server ? server.limits.max_beam : 16;
  const checks = sampling() ? [
    ["temperature", (v) => v > 0, "Temperature: a number above 0 (1 samples as the model predicts)."],
    ["top-p", (v) => v > 0 && v <= 1, "Top-p: a number above 0, at most 1 (1 keeps every word)."],
  ] : [["beam", (v) => (isNaN(v) && eachOwn()) || Number.isInteger(v) && v >= 1 && v <= mostBeam,
        `Beam width: a whole number from 1 to ${mostBeam} on this server` +
        (eachOwn() ? ", or empty for each model's own." : ".")]];
  checks.push(["alternatives", (v) => Number.isInteger(v) && v >= 0 && v <= mostAlternatives(),
               `Other translations: a whole number from 0 to ${mostAlternatives()} on this server.`]);
  const alternatives = number("alternatives"), beam = number("beam");
  if (!sampling() && ownBeam()) {  // a beam the user set must hold the alternatives too
    const own = server && defaults().beam_size;
    const many = (n, one, more) => `${n} ${n === 1 ? one : more}`;
    const back = own ? (own > alternatives ? ` (the model's own, ${own}, does)` : `, or set it back to the model's ` +
                        `own (${own}): the server widens that to hold them`) :
      eachOwn() ? ", or leave it empty: each model's own, which the server widens to hold them" : "";
    checks.push(["beam", () => beam >= alternatives + 1, `Beam width: a beam of ${beam} keeps ` +
                 `${many(beam, "translation", "translations")}, too few for ` +
                 `${many(alternatives, "other", "others")}; make it ${alternatives + 1} or more${back}.`]);
  }
  const bad = checks.find(([id, ok]) => !ok(number(id)));
  return bad ? {field: bad[0], message: bad[2]} : null;
}

// A beam width the user set: not the model's own (nor empty, each model's own)
const ownBeam = () => !server || ($("beam").value.trim() !== "" && Number($("beam").value) !== defaults().beam_size);
// Detecting the language between models of different beam widths: an empty beam width is each model's own
const eachOwn = () => server !== null && defaults().beam_size === null;

function settings() {  // what of the settings a translation was made with (counted: changed since, it is stale),
  return JSON.stringify([$("pair").value, $("alternatives").value, sampling(), $("beam").value,  // the API key
                         $("temperature").value, $("top-p").value, $("key").value]);       // too (an error of it)
}

function counted() {  // the character counter, and whether what is shown is still the text's translation
  const text = $("text").value, chars = [...text].length, most = server ? server.limits.max_chars : null;
  $("count").textContent = most === null ? `${chars} characters` : `${chars} / ${most} characters` +
    (chars > most ? `: ${chars - most} too many` : "") +
    ` \u00b7 at most ${server.limits.max_source_tokens} tokens a sentence`;  // (a token: a word or a piece of one)
  $("copy").textContent = "Copy";  // what was copied is no longer what the text would give
  $("count").classList.toggle("over", most !== null && chars > most);
  // what is shown, an answer or an error, is greyed and said to be out of date once the text or a setting it was
  // asked with has changed (not while the next one is coming: it is greyed as pending then)
  const edited = about !== null && text !== about.text, changed = about !== null && settings() !== about.settings;
  const stale = edited || changed, pending = $("target-pane").classList.contains("pending");
  const what = edited && changed ? "The text and the settings have" : edited ? "The text has" : "The settings have";
  $("result").classList.toggle("stale", stale);
  $("error").classList.toggle("stale", stale);
  for (const [id, shows, end] of [["stale", shown !== null, "update this"], ["error-stale", !$("error").hidden,
                                                                           "see whether it still holds"]]) {
    $(id).hidden = !(stale && shows && !pending);
    $(id).textContent = `${what} changed since: translate again to ${end}.`;
  }
  // only the text's own translation is copied: not one greyed while the next is coming, nor one of an older text
  $("copy").disabled = shown === null || stale || pending;
}

// ---------------------------------------------------------------------------------------------- translating

function request(text) {  // to detect the language: attention only if every model that may answer has some
  const attention = !server || candidates().every(attends);
  // a lone model's server is asked to check the text's language too (source auto, refused when clearly another),
  // unless the user chose to translate this text all the same; a pair picked among several is taken as said
  const said = chosen && (server.models.length > 1 || anyway === text);
  const body = {q: text, source: said ? chosen.source : AUTO, attention: attention ? "full" : "none",
                alignment: attention, alternatives: Number($("alternatives").value), sampling: sampling()};
  if (chosen) body.target = chosen.target;  // else the detected source's one target here (or the server asks)
  if (sampling()) Object.assign(body, {temperature: Number($("temperature").value), top_p: Number($("top-p").value)});
  else if (ownBeam()) body.beam_size = Number($("beam").value);  // left out, the server widens it for alternatives
  return body;
}

async function translate(event) {
  event.preventDefault();
  const text = $("text").value, wrong = problem(text), sent = settings();  // (the settings as sent, not as found
  if (wrong) {                                                              //  when the answer comes)
    fail(wrong.message);
    $(wrong.field).focus();
    return;
  }
  const mine = ++ticket, body = request(text), key = $("key").value;
  busy(true);
  try {
    let [reply, data] = await post(body, key);
    for (const fewer of ["mean", "none"]) {  // attention over the server's limit: the mean of the heads, or none
      if (!(reply.status === 413 && data.error_type === "too_large" && body.attention !== "none")) break;
      body.attention = fewer;
      [reply, data] = await post(body, key);
    }
    if (mine !== ticket) return;
    const other = chosen && data.error_type === "unsupported_language";  // a lone model: the text reads as another
    if (other) {
      anyway = text;
      fail(otherLanguage(data.error || ""), text, sent);
    } else if (!reply.ok) {
      fail(plain(data, reply.status, reply.headers.get("Retry-After"), key) +
           (!chosen && LANGUAGE_ERRORS.includes(data.error_type) ? ADVICE[data.error_type] : ""), text, sent);
    } else {
      show(text, sent, data, body, answering(data));
    }
    if (reply.status === 503 && data.error_type === "unavailable") untilReady(mine);
  } catch (e) {
    if (mine === ticket) fail(`The server cannot be reached (${e.message}).`, text, sent);
  } finally {
    if (mine === ticket) busy(false);
  }
}

function otherLanguage(error) {  // the lone model's server found the text in another language: the page's words
  const [, code, confidence] = error.match(/reads as (\S+) \(confidence ([\d.]+)\)/) || [];
  const read = code ? `The text reads as ${name(code)} (confidence ${Math.round(Number(confidence))}%)` :
    "The text does not read as " + name(chosen.source);
  return `${read}, and this server translates ${name(chosen.source)} to ${name(chosen.target)}. To translate it ` +
    `as ${name(chosen.source)} all the same, press Translate again.`;
}

const LANGUAGE_ERRORS = ["unsupported_language", "language_required"];
const ADVICE = {unsupported_language: ". To translate it anyway, pick a pair above: its model reads the text as its " +
                  "source language.",
                language_required: ": pick the languages above instead of detecting them."};

async function untilReady(mine) {  // a model loads (the server restarted): say when the server can translate again
  for (;;) {
    await new Promise((done) => setTimeout(done, 1000));
    if (mine !== ticket) return;  // another translation or pair since, whose answer speaks for itself
    try { if ((await fetch("/info")).ok) break; } catch (e) { /* not up yet */ }
  }
  if (mine === ticket) $("error").textContent = "The server is ready now: translate again.";
}

function answering(data) {  // the model that answered: the one picked, or the one of the language detected
  if (chosen || !server || !data.detectedLanguage) return chosen;
  return server.models.find((m) => m.source === data.detectedLanguage.language) || null;
}

async function post(body, key) {  // (the key as the request was made: the field may change meanwhile)
  const headers = {"Content-Type": "application/json"};
  if (key) headers.Authorization = `Bearer ${key}`;
  const reply = await fetch("/translate", {method: "POST", headers, body: JSON.stringify(body)});
  let data;
  try { data = await reply.json(); } catch (e) { data = {}; }  // (a proxy's page, say: plain says what it can)
  return [reply, data];
}

function plain(data, status, retry, key) {  // the server's message, with the page's names for the fields it names, the
  //                               page's one text for q[0], and without the API's advice ("give source"), which the
  //                               page's own replaces (translate); busy and timeout in the page's own words, which say
  //                               when to try again (Retry-After) rather than the server's flags and counts
  const again = /^\d+$/.test(retry || "") ? `in ${retry} second${retry === "1" ? "" : "s"}` : "in a moment";
  if (data.error_type === "busy") return `The server is busy: try again ${again}` +
    (/long requests/.test(data.error || "") ? ", or with a shorter text." : ".");
  if (data.error_type === "timeout") return "The translation took longer than the server waits for one: try a " +
    "shorter text, or fewer other translations.";
  if (data.error_type === "unauthorized") return key ? "The server does not take this API key: check " +
    "the API key under Settings." : "This server needs an API key: enter it under Settings (API key).";
  if (!data.error) return `The server answered with an error (HTTP ${status}) and no message` +
    (status === 408 || status === 429 || status >= 500 ? `; try again ${again}.` : ".");  // (else: the same again)
  const message = data.error.replace(/^([a-z_]+)(\[\d+\])?: /,
    (all, field) => FIELDS[field] ? `${FIELDS[field]}: ` : all).replace(/\bq\[0\]/g, "the text")
    .replace(/; give (source|target)$/, "");
  const lead = {unavailable: "The server is not ready: "}[data.error_type] || "";
  const advice = {too_many_tokens: "; shorten it (a token is a word or a piece of one)."}[data.error_type] || "";
  return (lead ? lead + message : message.charAt(0).toUpperCase() + message.slice(1)) + advice;
}

function busy(on) {  // what is shown stays greyed until its replacement (or an error) arrives
  $("go").disabled = on || !server;  // nothing is sent before /info has told the models and limits
  $("busy").hidden = !on;
  $("target-pane").setAttribute("aria-busy", String(on));
  $("target-pane").classList.toggle("pending", on);
  $("attention").classList.toggle("pending", on);
  if ($("xa-map")) $("xa-map").inert = on;  // the last answer's map, greyed: neither hovered nor stepped through
  counted();
}

function clear() {  // nothing of the last answer stays: text, alternatives, heatmap, readout, links
  shown = about = null;
  $("result").hidden = true;
  $("translation").textContent = "";
  $("alts").replaceChildren();
  $("others").hidden = true;
  $("error").hidden = true;
  $("detected").hidden = true;
  $("attention").hidden = true;
  $("no-attention").hidden = true;
  $("too-long").hidden = true;
  $("mean-only").hidden = true;
  $("xa-view").replaceChildren();
  $("links").replaceChildren();
  counted();
}

function fail(message, text = $("text").value, sent = settings()) {  // an error about `text` asked with `sent`
  clear();
  about = {text, settings: sent};
  $("placeholder").hidden = true;
  $("error").textContent = message;
  $("error").hidden = false;
  counted();
}

// The answer to the request `asked` (its body) about `text` with the settings `sent`, from `model` (the one that
// answered; null before /info)
function show(text, sent, data, asked, model) {
  clear();
  const kind = asked.attention;
  const result = data.results[0], detected = data.detectedLanguage;
  shown = {text, result, model};
  about = {text, settings: sent};
  $("placeholder").hidden = true;
  $("result").hidden = false;
  if (detected && !chosen) {  // (a lone model's check of the language: no news when it passed)
    $("detected").textContent = `Detected: ${name(detected.language)} (confidence ${Math.round(detected.confidence)}%)`;
    $("detected").hidden = false;
  }
  $("translation").textContent = result.translatedText;
  if (model) $("translation").lang = model.target;
  const alternatives = (result.alternatives || []).map((a) => a.translatedText);
  $("alts").replaceChildren(...alternatives.map((a) => {
    const li = document.createElement("li");
    li.textContent = a;
    return li;
  }));
  $("others").hidden = alternatives.length === 0 && asked.alternatives === 0;
  const way = asked.sampling ? "the samples repeated; a higher temperature varies them more" :
    "the other hypotheses read the same; a wider beam may find more";
  const got = alternatives.length, many = asked.alternatives;
  $("fewer").textContent = got >= many ? "" : (got ? `Only ${got} of the ${many} asked for differ` :
    `None of the ${many} asked for differed`) + ` from the translation and from each other (${way}).`;
  $("fewer").hidden = alternatives.length >= asked.alternatives;
  counted();
  if (kind === "none") {  // a model without heads; or a text too long for even the mean (many sentences)
    $(asked.alignment ? "too-long" : "no-attention").hidden = false;
    return;
  }
  $("attention").hidden = false;  // before drawing: the heatmap and the links measure what they draw
  $("mean-only").hidden = kind !== "mean";
  const previous = heatmap && heatmap.model === model && heatmap.viewer.choice();
  if (previous && heatmap.meanOnly) previous.head = heatmap.head;  // the head picked before a mean-only map
  const first = model && model.alignment ? model.alignment.layer : result.attention.length - 1;
  const initial = previous || {layer: first, head: "mean"};
  heatmap = {model, meanOnly: kind === "mean", head: initial.head,
             viewer: XattnHeatmap.mount($("xa-view"), {views: [attentionView(result, kind, model)], initial})};
  drawLinks();
}

// ---------------------------------------------------------------------------------------------- attention

// The answer's attention (full: L x H x T x S, null for a head a pruned layer lacks; mean: L x T x S, null for
// a layer without heads) as a heatmap.js view, with the alignment's word links marked on their pieces' cells.
function attentionView(result, kind, model) {
  const scaled = (m) => m.flat().map((x) => Math.round(x * XattnHeatmap.SCALE));
  const layers = kind === "mean" ? result.attention.map((m) => m[0][0] === null ? [] : [m]) :
    result.attention.map((layer) => layer.filter((h) => h[0][0] !== null));
  const mean = layers.map((heads) => heads.length === 0 ? null : scaled(heads[0].map((row, t) => row.map(
    (_, s) => heads.reduce((sum, h) => sum + h[t][s], 0) / heads.length))));
  const heads = kind === "mean" ? layers.map((h, l) => h.length && model ? model.heads[l] : h.length) :
    layers.map((h) => h.length);
  const where = model && model.alignment;
  return {name: "cross-attention", kind: "cross", rows: result.target_tokens, cols: result.source_tokens,
          layers: layers.length, heads, w: kind === "mean" ? null : layers.map((hs) => hs.map(scaled)), mean,
          masked: null, links: linkCells(result), pieces: true, rowWords: result.target_words,
          colWords: result.source_words,
          linksLabel: where ? `alignment link (${where.method}, layer ${where.layer})` : "alignment link",
          linksLayer: where ? where.layer : null};
}

function linkCells(result) {  // [col, row] of every piece of every linked word pair; none if the words disagree
  const src = XattnHeatmap.wordIndex(result.source_tokens, false);  // a source's unknown piece: inside its word
  const tgt = XattnHeatmap.wordIndex(result.target_tokens, true);    // a translation's: a word, printed " \u2047 "
  if (!result.alignment || Math.max(...src) + 1 !== result.source_words.length ||
      Math.max(...tgt) + 1 !== result.target_words.length) return [];
  const cells = [];
  for (const [i, j] of result.alignment) {
    tgt.forEach((wt, r) => { if (wt === j) src.forEach((ws, c) => { if (ws === i) cells.push([c, r]); }); });
  }
  return cells;
}

function el(name, attrs, text) {
  const node = document.createElementNS(SVG, name);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  if (text !== undefined) node.textContent = text;
  return node;
}

function fit(svg) {  // the SVG's box is its drawing's, so that no label is cut off whatever its length
  const box = svg.getBBox(), pad = 2;
  svg.setAttribute("viewBox", `${box.x - pad} ${box.y - pad} ${box.width + 2 * pad} ${box.height + 2 * pad}`);
  svg.setAttribute("width", box.width + 2 * pad);
  svg.setAttribute("height", box.height + 2 * pad);
}

function drawLinks() {
  // source words above target words with a line per link; where a row of words is wider than the box (a phone,
  // a long text), source words in a column on the left and target words on the right instead
  const svg = $("links"), result = shown && shown.result;
  svg.replaceChildren();
  if (!result || !result.alignment) return;
  const where = shown.model && shown.model.alignment;
  $("links-note").textContent = "Each line links a word of the text to a word of the translation" +
    (where ? `, read from layer ${where.layer} of the cross-attention (the ${where.method} method).` : ".");
  const label = (word) => svg.appendChild(el("text", {}, word));
  const src = result.source_words.map(label), tgt = result.target_words.map(label);
  const width = (texts) => texts.map((t) => t.getComputedTextLength());
  const gap = 16, row = (ws) => ws.reduce((a, b) => a + b + gap, -gap), room = svg.parentElement.clientWidth - 8;
  const across = Math.max(row(width(src)), row(width(tgt))) <= room;
  if (!across) [...src, ...tgt].forEach((t) => shorten(t, (room - 70) / 2));  // a word longer than a column
  const [sw, tw] = [width(src), width(tgt)];
  const ends = across ? placeAcross(src, sw, tgt, tw, gap) : placeDown(src, sw, tgt, tw);
  for (const [i, j] of result.alignment) {
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

// ---------------------------------------------------------------------------------------------- the page

async function copy() {
  const text = $("translation").textContent;
  try {
    await navigator.clipboard.writeText(text);
    $("copy").textContent = "Copied";
  } catch (e) {  // no clipboard API (plain http from another machine) or no permission: copy the selection
    const range = document.createRange();
    range.selectNodeContents($("translation"));
    getSelection().removeAllRanges();
    getSelection().addRange(range);
    $("copy").textContent = document.execCommand("copy") ? "Copied" : "Selected: press Ctrl+C";
  }
}

function keys(event) {  // Ctrl+Enter (Cmd+Enter on a Mac) translates from anywhere in the form
  if (event.key !== "Enter" || !(event.ctrlKey || event.metaKey)) return;
  event.preventDefault();
  if (!$("go").disabled) $("form").requestSubmit();
}

async function load() {  // GET /info, again each second while a model loads (it waits for every one)
  for (;;) {
    try {
      const reply = await fetch("/info");
      const data = await reply.json();
      if (reply.ok) { await ready(data); return; }
      $("status").textContent = plain(data, reply.status) + (reply.status === 503 ? "; waiting for it…" : "");
      if (reply.status !== 503) return;
    } catch (e) {
      $("status").textContent = `The server cannot be reached (${e.message}); trying again…`;
    }
    await new Promise((done) => setTimeout(done, 1000));
  }
}

async function ready(data) {  // the models, the limits, whether a key is needed; the first pair picked
  try {
    names = Object.fromEntries((await (await fetch("/languages")).json()).map((l) => [l.code, l.name]));
  } catch (e) { /* the codes stand for the names */ }
  server = data;
  $("status").textContent = "";
  $("go").disabled = false;
  $("key-field").hidden = !server.api_key_required;
  $("beam").max = server.limits.max_beam;
  const several = server.models.length > 1;  // one model: its languages in the heading, nothing to pick
  const pairs = server.models.map((m, i) => new Option(`${name(m.source)} → ${name(m.target)}`, String(i)));
  $("pair").replaceChildren(...pairs, ...several ? [new Option("Detect the language", AUTO)] : []);
  $("pair-field").hidden = !several;
  if (!several) $("langs").textContent = `${server.models[0].source} → ${server.models[0].target}`;
  pick();
}

function pick() {  // the pair picked: its languages, and its model's decoding defaults in the settings
  chosen = $("pair").value === AUTO ? null : server.models[Number($("pair").value)];
  $("source-name").textContent = chosen ? name(chosen.source) : "Text (its language is detected)";
  $("target-name").textContent = chosen ? name(chosen.target) : "Translation";
  if (chosen) $("text").lang = chosen.source;
  else $("text").removeAttribute("lang");
  const own = defaults(), first = candidates()[0].decode;  // where the models differ, the first one's is shown
  $("beam").value = own.beam_size ?? "";  // but the beam width: each model's own
  $("beam").placeholder = eachOwn() ? "own" : "";
  $("beam-own").hidden = !eachOwn();
  $("temperature").value = own.temperature ?? first.temperature;
  $("top-p").value = own.top_p ?? first.top_p;
  $(own.sampling ? "strategy-sample" : "strategy-beam").checked = true;
  strategyChanged();
  counted();
}

function pairChanged() {  // as a new answer does, another pair clears all the last answer showed; the text stays
  ticket++;  // an answer still to come is the last pair's: dropped
  busy(false);
  pick();
  clear();
  $("placeholder").hidden = false;
}

document.addEventListener("DOMContentLoaded", () => {
  $("form").addEventListener("submit", translate);
  $("form").addEventListener("keydown", keys);
  $("form").addEventListener("input", counted);  // the text, and the settings: what is shown may be stale
  $("form").addEventListener("change", counted);
  $("alternatives").addEventListener("input", alternativesChanged);
  for (const id of ["strategy-beam", "strategy-sample"]) $(id).addEventListener("change", strategyChanged);
  $("copy").addEventListener("click", copy);
  $("pair").addEventListener("change", pairChanged);
  if (/Mac|iPhone|iPad/.test(navigator.platform)) $("keys").textContent = "\u2318+Enter translates";
  addEventListener("resize", drawLinks);
  strategyChanged();
  counted();
  load();
});
