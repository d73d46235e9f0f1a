import json
import re
from html.parser import HTMLParser

import numpy as np
import pytest

from xattn.analysis.html import render, save
from xattn.analysis.maps import AttentionMaps, HeadChoice
from xattn.errors import XattnError

HOSTILE = ["<script>alert(1)</script>", "a & b", "</script><!--", "chat"]


def rows_sum_to_one(w: np.ndarray) -> np.ndarray:
    return (w / w.sum(axis=-1, keepdims=True)).astype(np.float32)


def cross_maps() -> AttentionMaps:
    """2 layers x 3 heads, 3 target rows x 4 source columns (labels that are HTML), every weight different."""
    w = rows_sum_to_one(np.arange(1, 2 * 3 * 3 * 4 + 1, dtype=np.float64).reshape(2, 3, 3, 4) ** 1.5)
    return AttentionMaps(w, rows=["cat", "\"q'", "猫"], cols=HOSTILE, links=[(3, 0), (0, 2)])


def decoder_self_maps() -> AttentionMaps:
    masked = np.triu(np.ones((3, 3), dtype=bool), k=1)  # True = a future position
    w = np.array([[[1, 0, 0], [0.25, 0.75, 0], [0.1, 0.3, 0.6]],
                  [[1, 0, 0], [0.5, 0.5, 0], [0.3, 0.3, 0.4]]], dtype=np.float32)  # (H, R, C)
    return AttentionMaps(w[None], rows=["cat", "\"q'", "猫"], cols=["cat", "\"q'", "猫"],
                         kind="decoder-self", masked=masked)


class Elements(HTMLParser):
    """Every start tag with its attributes, and the text inside each <script> and <style>."""

    def __init__(self, text: str):
        super().__init__(convert_charrefs=True)
        self.tags, self.raw, self._open = [], {"script": [], "style": []}, None
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        self._open = tag if tag in self.raw else None

    def handle_endtag(self, tag):
        self._open = None

    def handle_data(self, data):
        if self._open:
            self.raw[self._open].append(data)


def data_of(text: str) -> dict:
    return json.loads(re.search(r'<script type="application/json" id="xa-data">(.*?)</script>', text, re.S)[1])


def test_no_external_resource_of_any_kind():
    text = render({"cross": cross_maps(), "decoder-self": decoder_self_maps()})
    page = Elements(text)
    names = [tag for tag, _ in page.tags]
    assert "link" not in names and "iframe" not in names and "img" not in names
    for tag, attrs in page.tags:
        assert not {"src", "href", "action", "formaction", "srcset", "poster"} & set(attrs), (tag, attrs)
    styles, scripts = "".join(page.raw["style"]), "".join(page.raw["script"])
    assert "url(" not in styles and "@import" not in styles
    assert not re.search(r"\bimport\b|fetch\(|XMLHttpRequest|WebSocket|EventSource|sendBeacon", scripts)
    assert not re.search(r"https?:|[\"'(=]\s*//", text), "a URL"
    csp = [a["content"] for t, a in page.tags if t == "meta" and a.get("http-equiv") == "Content-Security-Policy"]
    assert csp and "default-src 'none'" in csp[0]


def test_hostile_labels_stay_text():
    text = render(cross_maps(), title="<b>bold</b> & co")
    page = Elements(text)
    assert [a for t, a in page.tags if t == "script"] == [{"type": "application/json", "id": "xa-data"}, {}]
    assert "<b>" not in text and "<h1 id=\"xa-title\">&lt;b&gt;bold&lt;/b&gt; &amp; co</h1>" in text
    assert "<!--" not in text and text.lower().count("</script") == 2
    data = data_of(text)
    assert data["views"][0]["cols"] == HOSTILE and data["views"][0]["rows"] == ["cat", "\"q'", "猫"]
    placeholders = AttentionMaps(np.ones((1, 1, 1, 1), np.float32), rows=["@TITLE@"], cols=["@DATA@"])
    text = render(placeholders, title="@DATA@")
    assert '<h1 id="xa-title">@DATA@</h1>' in text and data_of(text)["views"][0]["rows"] == ["@TITLE@"]


def test_weights_embedded_to_four_decimals():
    maps = cross_maps()
    (view,) = data_of(render(maps))["views"]
    assert (view["layers"], view["heads"]) == (2, [3, 3])
    w = np.array(view["w"]).reshape(2, 3, 3, 4) / 10_000
    np.testing.assert_allclose(w, maps.weights, atol=0.5e-4)
    np.testing.assert_allclose(np.array(view["mean"]).reshape(2, 3, 4) / 10_000, maps.weights.mean(axis=1),
                               atol=0.5e-4)
    assert view["links"] == [[3, 0], [0, 2]] and view["masked"] is None


def test_initial_view_and_its_errors():
    assert data_of(render(cross_maps()))["initial"] == {"layer": 1, "head": "mean"}
    assert data_of(render(cross_maps(), choice=HeadChoice(0, (2,))))["initial"] == {"layer": 0, "head": 2}
    with pytest.raises(XattnError, match="one head or the mean"):
        render(cross_maps(), choice=HeadChoice(0, (0, 1)))
    with pytest.raises(XattnError, match=r"layer 0 has no head 3 \(its cross-attention heads: 0 to 2\)"):
        render(cross_maps(), choice=HeadChoice(0, (3,)))


def pruned_maps(heads: list[int]) -> AttentionMaps:
    """cross_maps' labels; layer l has heads[l] heads (NaN for the rest, as model.stack_layers pads them)."""
    w = rows_sum_to_one(np.random.default_rng(2).random((len(heads), max(heads, default=0), 3, 4)))
    for layer, n in enumerate(heads):
        w[layer, n:] = np.nan
    return AttentionMaps(w, rows=["cat", "\"q'", "猫"], cols=HOSTILE)


def test_a_pruned_model_embeds_each_layers_own_heads():
    maps = pruned_maps([0, 3, 1])
    (view,) = data_of(render(maps))["views"]
    assert view["heads"] == [0, 3, 1] and [len(w) for w in view["w"]] == [0, 3, 1]
    assert view["mean"][0] is None
    np.testing.assert_allclose(np.array(view["mean"][2]) / 10_000, maps.weights[2, 0].ravel(), atol=0.5e-4)
    assert data_of(render(maps))["initial"] == {"layer": 2, "head": "mean"}  # the last layer with heads
    with pytest.raises(XattnError, match=r"layer 0 has no cross-attention heads left \(pruned\); layers with heads: 1, 2"):
        render(maps, choice=HeadChoice(0))
    with pytest.raises(XattnError, match=r"this model has no cross-attention heads left \(all pruned\)"):
        render(pruned_maps([0, 0]))


def test_save_wants_an_html_name(tmp_path):
    page = render(cross_maps())
    assert save(page, tmp_path / "view.HTML").read_text(encoding="utf-8") == page
    with pytest.raises(XattnError, match=r"view\.png: .*\.html, \.htm"):
        save(page, tmp_path / "view.png")
    assert [p.name for p in tmp_path.iterdir()] == ["view.HTML"]


# ---------------------------------------------------------------------------------------- in a browser

@pytest.fixture
def open_view(browser, tmp_path, guard):
    """open_view(maps, width) -> the page showing `maps`, from a file; any other request is refused and recorded,
    as is any request at all that the route did not see, and every script error."""
    pages, attempts = [], []

    def open_(maps, width: int = 1000, **options):
        path = save(render(maps, **options), tmp_path / "view.html")
        url = path.as_uri()
        page = guard(browser.new_page(viewport={"width": width, "height": 800}), lambda u: u == url)
        pages.append(page)
        page.on("request", lambda request: request.url == url or attempts.append(request.url))
        page.goto(url)
        return page

    yield open_
    for page in pages:
        page.close()
    assert not attempts, f"the page tried the network: {attempts}"


def cell(page, row: int, col: int):
    return page.locator(f'td.xa-cell[data-row="{row}"][data-col="{col}"]')


def test_hover_shows_the_word_pair_and_the_weight(open_view):
    maps = cross_maps()
    page = open_view(maps)
    cell(page, 2, 0).hover()
    assert page.locator("th.xa-hl").all_inner_texts() == [HOSTILE[0], "猫"]
    assert page.locator('th.xa-row[data-row="2"]').get_attribute("class") == "xa-row xa-hl"
    expected = maps.weights[1, :, 2, 0].mean()
    assert page.inner_text("#xa-readout") == f"{HOSTILE[0]} \u2192 猫: {expected:.3f} \u00b7 alignment link"
    cell(page, 2, 1).hover()  # not a link
    assert page.inner_text("#xa-readout") == f"{HOSTILE[1]} \u2192 猫: {maps.weights[1, :, 2, 1].mean():.3f}"
    assert page.locator("#xa-map script").count() == 0  # the label is text, not an element


def test_layer_and_head_picker_change_the_cell(open_view):
    maps = cross_maps()
    page = open_view(maps)
    assert page.locator("#xa-kind").is_hidden()
    assert page.locator("#xa-head option").all_inner_texts() == ["mean of heads", "head 0", "head 1", "head 2"]
    assert cell(page, 1, 3).get_attribute("data-w") == f"{maps.weights[1, :, 1, 3].mean():.4f}"
    page.select_option("#xa-layer", "0")
    page.select_option("#xa-head", "2")
    assert cell(page, 1, 3).get_attribute("data-w") == f"{maps.weights[0, 2, 1, 3]:.4f}"
    cell(page, 1, 3).hover()
    assert page.inner_text("#xa-readout") == f"chat \u2192 \"q': {maps.weights[0, 2, 1, 3]:.3f}"
    page.select_option("#xa-head", "mean")
    assert cell(page, 1, 3).get_attribute("data-w") == f"{maps.weights[0, :, 1, 3].mean():.4f}"
    assert page.inner_text("#xa-readout") == f"chat \u2192 \"q': {maps.weights[0, :, 1, 3].mean():.3f}"


def test_links_toggle(open_view):
    page = open_view(cross_maps())
    outline = "(e) => getComputedStyle(e).outlineStyle"
    assert page.locator("td.xa-link").count() == 2
    assert cell(page, 0, 3).evaluate(outline) == "solid" and cell(page, 0, 2).evaluate(outline) == "none"
    page.uncheck("#xa-links")
    assert cell(page, 0, 3).evaluate(outline) == "none"
    page.check("#xa-links")
    assert cell(page, 0, 3).evaluate(outline) == "solid"


def test_decoder_self_future_cells_are_marked(open_view):
    page = open_view({"cross": cross_maps(), "decoder-self": decoder_self_maps()})
    page.select_option("#xa-kind", "1")
    assert page.locator("td.xa-masked").count() == 3
    background = "(e) => getComputedStyle(e).backgroundImage"
    assert "repeating-linear-gradient" in cell(page, 0, 2).evaluate(background)
    assert cell(page, 2, 0).evaluate(background) == "none"
    assert page.locator("#xa-links").is_disabled() and page.locator("#xa-legend-masked").is_visible()
    cell(page, 0, 1).hover()
    assert page.inner_text("#xa-readout") == "\"q' \u2192 cat: masked (future)"
    cell(page, 2, 0).hover()
    assert page.inner_text("#xa-readout") == "cat \u2192 猫: 0.200"  # (0.1 + 0.3) / 2


def test_narrow_screen_scrolls_the_map_not_the_page(open_view):
    n = 60
    labels = [f"\u2581piece{i}" for i in range(n)]
    w = rows_sum_to_one(np.random.default_rng(0).random((1, 2, n, n)))
    page = open_view(AttentionMaps(w, rows=labels, cols=labels, kind="encoder-self"), width=360)
    assert page.evaluate("document.documentElement.scrollWidth") <= 360
    box = page.locator("#xa-scroll")
    assert box.evaluate("(e) => e.scrollWidth > e.clientWidth && e.scrollHeight > e.clientHeight")
    for control in ("#xa-layer", "#xa-head", "#xa-links"):
        right = page.locator(control).evaluate("(e) => e.getBoundingClientRect().right")
        assert right <= 360, control


def test_a_layer_without_heads_cannot_be_picked_and_each_layer_offers_its_own_heads(open_view):
    maps = pruned_maps([0, 3, 1])
    page = open_view(maps)
    options = page.locator("#xa-layer option")
    assert options.all_inner_texts() == ["layer 0: no heads (pruned)", "layer 1", "layer 2"]
    assert [o.is_disabled() for o in options.all()] == [True, False, False]
    assert page.input_value("#xa-layer") == "2"
    assert page.locator("#xa-head option").all_inner_texts() == ["mean of heads", "head 0"]
    assert cell(page, 1, 3).get_attribute("data-w") == f"{maps.weights[2, 0, 1, 3]:.4f}"
    page.select_option("#xa-layer", "1")
    assert page.locator("#xa-head option").all_inner_texts() == ["mean of heads", "head 0", "head 1", "head 2"]
    page.select_option("#xa-head", "2")
    assert cell(page, 1, 3).get_attribute("data-w") == f"{maps.weights[1, 2, 1, 3]:.4f}"
    page.select_option("#xa-layer", "2")  # head 2 is gone: back to the mean
    assert page.input_value("#xa-head") == "mean"


LONG = "siebenhundertdreiundzwanzigtausendvierhundertneunundneunzig"


@pytest.mark.parametrize("width", [1000, 390])
def test_no_label_is_clipped(open_view, width):
    w = rows_sum_to_one(np.random.default_rng(3).random((1, 2, 3, 3)))
    page = open_view(AttentionMaps(w, rows=["seven", LONG, "</s>"], cols=[LONG, "zwei", "</s>"]), width=width)
    clipped = page.evaluate("""() => [...document.querySelectorAll("th.xa-col span, th.xa-row, #xa-title")]
        .filter((e) => e.scrollWidth > e.clientWidth + 1 || e.scrollHeight > e.clientHeight + 1 ||
                       e.getBoundingClientRect().height < 1)
        .map((e) => e.textContent)""")
    assert clipped == []
    label = page.locator('th.xa-col[data-col="0"] span').evaluate("(e) => e.getBoundingClientRect().height")
    row = page.locator('th.xa-row[data-row="1"]').evaluate("(e) => e.getBoundingClientRect().width")
    assert label > 0.5 * row  # the whole word, about as long standing as lying
    assert page.evaluate("document.documentElement.scrollWidth") <= width


def test_the_view_inlines_the_heatmap_script_and_style_the_server_serves():
    from xattn.analysis.html import ASSETS

    text = render(cross_maps())
    for name in ("heatmap.js", "heatmap.css"):
        assert (ASSETS / name).read_text(encoding="utf-8") in text, name


def pieces_maps() -> AttentionMaps:
    """SentencePiece labels: "Ein Hund ." -> "A dog ." with a word of two pieces on each side."""
    rows, cols = ["\u2581A", "\u2581do", "g", "\u2581.", "</s>"], ["\u2581Ein", "\u2581Hu", "nd", "\u2581", ".", "</s>"]
    w = rows_sum_to_one(np.random.default_rng(4).random((2, 2, len(rows), len(cols))))
    return AttentionMaps(w, rows=rows, cols=cols, links=[(1, 1), (2, 1)])


def test_pieces_are_labelled_as_words_start_not_with_the_raw_mark(open_view):
    page = open_view(pieces_maps())
    assert page.locator("th.xa-col").all_inner_texts() == ["Ein", "Hu", "nd", "\u2423", ".", "</s>"]
    assert page.locator("th.xa-row").all_inner_texts() == ["A", "do", "g", ".", "</s>"]
    assert "\u2581" not in page.inner_text("body")
    starts = "(s) => [...document.querySelectorAll(s)].map((e) => e.dataset.col || e.firstChild.dataset.row)"
    assert page.evaluate(starts, "th.xa-col.xa-ws") == ["1", "3", "5"]  # a gap before each word but the first
    assert page.evaluate(starts, "tr.xa-wr") == ["1", "3", "4"]
    cell(page, 2, 2).hover()  # a piece is read out with its word
    assert page.inner_text("#xa-readout").startswith("nd (in Hund) \u2192 g (in dog): ")


def test_an_unknown_piece_shows_the_character_its_word_has(open_view):
    """A source's unknown piece is part of its word and shows what it stands for; a translation's is a word of its
    own, printed as SentencePiece prints it."""
    cols = ["\u2581Hut", "<unk>", "Mantel", "\u2581", "<unk>", "</s>"]  # "Hut·Mantel 😀"
    rows = ["\u2581A", "<unk>", "</s>"]                                  # "A ⁇"
    w = rows_sum_to_one(np.random.default_rng(5).random((1, 2, len(rows), len(cols))))
    page = open_view(AttentionMaps(w, rows=rows, cols=cols, row_words=["A", "\u2047"],
                                   col_words=["Hut\u00b7Mantel", "\U0001F600"]))
    assert page.locator("th.xa-col").all_inner_texts() == ["Hut", "\u00b7", "Mantel", "\u2423", "\U0001F600", "</s>"]
    assert page.locator("th.xa-row").all_inner_texts() == ["A", "\u2047", "</s>"]
    starts = "(s) => [...document.querySelectorAll(s)].map((e) => e.dataset.col || e.firstChild.dataset.row)"
    assert page.evaluate(starts, "th.xa-col.xa-ws") == ["3", "5"] and page.evaluate(starts, "tr.xa-wr") == ["1", "2"]
    cell(page, 0, 1).hover()
    assert page.inner_text("#xa-readout").startswith("\u00b7 (in Hut\u00b7Mantel) \u2192 A: ")
    cell(page, 1, 4).hover()
    assert page.inner_text("#xa-readout").startswith("\U0001F600 \u2192 \u2047: ")  # the whole word
    # a reference read teacher-forced is tokenized word by word: its unknown piece is inside its word, as the
    # reference's words say
    rows = ["\u2581Hut", "<unk>", "Mantel", "</s>"]
    w = rows_sum_to_one(np.random.default_rng(6).random((1, 2, len(rows), len(cols))))
    page = open_view(AttentionMaps(w, rows=rows, cols=cols, row_words=["Hut\u00b7Mantel"],
                                   col_words=["Hut\u00b7Mantel", "\U0001F600"]))
    assert page.locator("th.xa-row").all_inner_texts() == ["Hut", "\u00b7", "Mantel", "</s>"]
    cell(page, 1, 0).hover()
    assert page.inner_text("#xa-readout").startswith("Hut (in Hut\u00b7Mantel) \u2192 \u00b7 (in Hut\u00b7Mantel): ")


def test_colours_are_on_a_square_root_scale_that_the_legend_shows(open_view):
    w = np.array([[0.25, 0.25, 0.5, 0.0], [1.0, 0.0, 0.0, 0.0]], dtype=np.float32)
    page = open_view(AttentionMaps(w[None, None], rows=["a", "b"], cols=["w", "x", "y", "z"]))
    colour = "(e) => getComputedStyle(e).backgroundColor"
    # sqrt(0.25) = 0.5: the middle of the 9 colours (rgb(107, 174, 214)), not a quarter of the way
    assert cell(page, 0, 0).evaluate(colour) == "rgb(107, 174, 214)"
    assert cell(page, 1, 0).evaluate(colour) == "rgb(8, 48, 107)" and cell(page, 0, 3).evaluate(colour) == \
        "rgb(247, 251, 255)"
    ticks = page.locator("#xa-legend .xa-tick")
    assert ticks.all_inner_texts() == ["0", "0.01", "0.05", "0.1", "0.25", "0.5", "1"]
    assert ticks.nth(4).locator(".xa-swatch").evaluate(colour) == "rgb(107, 174, 214)"
    assert "square-root colour scale" in page.inner_text("#xa-legend")


def test_arrow_keys_move_the_selection_with_focus_shown(open_view):
    maps = pieces_maps()
    page = open_view(maps)
    page.focus("#xa-links")
    page.keyboard.press("Tab")  # into the map: its first cell, the only one in the tab order
    at = "[document.activeElement.dataset.row, document.activeElement.dataset.col]"
    assert page.evaluate(at) == ["0", "0"] and page.inner_text("#xa-readout").startswith("Ein \u2192 A: ")
    assert page.evaluate("getComputedStyle(document.activeElement).outlineStyle") == "solid"
    for key, (row, col) in (("ArrowDown", (1, 0)), ("ArrowRight", (1, 1)), ("ArrowRight", (1, 2)),
                            ("End", (1, 5)), ("ArrowRight", (1, 5)), ("Home", (1, 0)), ("ArrowUp", (0, 0))):
        page.keyboard.press(key)
        assert page.evaluate(at) == [str(row), str(col)], key
        assert page.locator("td.xa-hl").get_attribute("data-row") == str(row)
        assert page.inner_text("#xa-readout").endswith(
            f": {maps.weights[1, :, row, col].mean():.3f}" + (" \u00b7 alignment link" if (col, row) in maps.links
                                                                else ""))
    page.keyboard.press("Tab")  # and out again: one stop for the whole map
    assert page.evaluate("document.activeElement.tagName") != "TD"


def test_the_layer_the_links_come_from_is_named(open_view):
    page = open_view(pieces_maps(), links_layer=0)
    assert page.locator("#xa-layer option").all_inner_texts() == ["layer 0 (links)", "layer 1"]
    assert page.inner_text("#xa-links-name") == "alignment links (from layer 0)"
