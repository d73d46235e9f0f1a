"""The page of `xattn serve` in a real browser (Debian's Chromium through Playwright) against a live server on
127.0.0.1 with a tiny model: translating, what a new answer or an error replaces, the settings, the keyboard,
the clipboard, the heatmap (heatmap.js, shared with `xattn attention -o x.html`) and the layout at desktop and
phone widths; with two models, the language pair picker (each pair's model answers and drives the heatmap and the
settings) and detecting the language."""
import json
import urllib.request

import pytest

pytest.importorskip("fastapi", reason="the serve extra (pip install -e '.[serve]')")

from test_serve_live import post, serving  # noqa: E402
from test_serve_models import alone  # noqa: E402  (what a model gives a text by itself)

from xattn.analysis.pieces import piece_words  # noqa: E402

HINT = "hover over or tap a cell, or Tab into the map and use the arrow keys"
LONG = "sieben hundert drei und zwanzig tausend neun hundert neun und neunzig"


@pytest.fixture(scope="module")
def server(numbers_model, tmp_path_factory):
    log = tmp_path_factory.mktemp("page") / "server.log"
    with serving(numbers_model, log, "--max-chars", "300", "--no-access-log") as url:
        yield url


@pytest.fixture
def open_page(browser, server, guard):
    """open_page(width, url, permissions) -> the page of `url` (this module's server), /info read; it may reach
    nothing else, nor raise or log an error but the API's refusals that tests ask for."""
    contexts = []

    def open_(width: int = 1280, url: str = server, permissions: tuple = ()):
        context = browser.new_context(viewport={"width": width, "height": 800}, permissions=list(permissions))
        contexts.append(context)
        page = guard(context.new_page(), lambda u: u.startswith(url), lambda u: u.endswith("/translate"))
        page.goto(url + "/")
        page.wait_for_selector("#pair option", state="attached")  # /info has arrived: pairs, limits, defaults set
        return page

    yield open_
    for context in contexts:
        context.close()


def translate(page, text: str) -> None:
    """Type `text`, press Translate, wait for the answer (a result or an error)."""
    page.fill("#text", text)
    page.click("#go")
    page.wait_for_selector("#busy", state="hidden")  # (wait_for_function would need 'unsafe-eval': the CSP forbids it)


def shown(token: str) -> str:
    """A SentencePiece piece as the heatmap labels it: no word-start mark (a piece of only the mark: a space)."""
    return token.removeprefix("\u2581").replace("\u2581", " ") or "\u2423"


def word_of(tokens: list[str]) -> list[int]:
    """The word of the text each piece belongs to (-1: </s>), as the heatmap counts them."""
    words, out = -1, []
    for i, t in enumerate(tokens):
        words += i == 0 or t.startswith("\u2581")
        out.append(-1 if t == "</s>" else words)
    return out


def readout_weight(page) -> str:
    return page.text_content("#xa-readout").split(": ")[-1].split(" ")[0]


def cell(page, row: int, col: int):
    return page.locator(f'td.xa-cell[data-row="{row}"][data-col="{col}"]')


def test_the_page_translates_shows_the_heatmap_legend_and_links(open_page, server):
    page = open_page()
    translate(page, "sieben hundert drei")
    status, api = post(server, {"q": "sieben hundert drei", "attention": "full", "alignment": True})
    result = api["results"][0]
    assert status == 200 and page.text_content("#translation") == api["translatedText"]
    assert page.text_content("#langs") == "de → en"
    assert (page.text_content("#source-name"), page.text_content("#target-name")) == ("German", "English")
    src, tgt = result["source_tokens"], result["target_tokens"]
    assert page.locator("td.xa-cell").count() == len(src) * len(tgt)
    assert page.locator("th.xa-col").all_text_contents() == [shown(s) for s in src]
    assert page.locator("th.xa-row").all_text_contents() == [shown(t) for t in tgt]
    assert "\u2581" not in page.inner_text("body")
    # hover a cell: the word pair is highlighted and its weight shown
    cell(page, 0, 1).hover()
    readout = page.text_content("#xa-readout")
    assert readout.startswith(shown(src[1])) and f"\u2192 {shown(tgt[0])}" in readout
    assert readout_weight(page) == f"{float(cell(page, 0, 1).get_attribute('data-w')):.3f}"
    assert sorted(page.locator("th.xa-hl").all_text_contents()) == sorted([shown(tgt[0]), shown(src[1])])
    # the map opens on the layer the links come from, and says so
    info = json.load(urllib.request.urlopen(server + "/info"))
    layer = info["alignment"]["layer"]
    assert page.input_value("#xa-layer") == str(layer) and page.input_value("#xa-head") == "mean"
    assert page.locator("#xa-layer option:checked").text_content() == f"layer {layer} (links)"
    assert page.text_content("#xa-links-name") == f"alignment links (from layer {layer})"
    assert page.text_content("#xa-links-label") == f"alignment link ({info['alignment']['method']}, layer {layer})"
    # one head, then the mean again
    page.select_option("#xa-head", "0")
    assert cell(page, 0, 1).get_attribute("data-w") == f"{result['attention'][layer][0][0][1]:.4f}"
    page.select_option("#xa-head", "mean")
    mean = sum(h[0][1] for h in result["attention"][layer]) / len(result["attention"][layer])
    assert float(cell(page, 0, 1).get_attribute("data-w")) == pytest.approx(mean, abs=1e-4)
    # the legend, and the links: on their pieces' cells and as lines between the words
    assert page.locator("#xa-legend").is_visible() and page.locator("#xa-legend .xa-tick").count() == 7
    assert "square-root colour scale" in page.text_content("#xa-legend")
    assert page.locator("#links line.link").count() == len(result["alignment"])
    sw, tw = word_of(src), word_of(tgt)
    marked = {(int(c.get_attribute("data-row")), int(c.get_attribute("data-col")))
              for c in page.locator("td.xa-link").all()}
    assert marked == {(r, c) for i, j in result["alignment"] for r in range(len(tgt)) if tw[r] == j
                      for c in range(len(src)) if sw[c] == i}
    page.uncheck("#xa-links")
    assert page.locator("#xa-map.xa-nolinks").count() == 1


def test_a_new_answer_or_an_error_leaves_nothing_of_the_last(open_page, server):
    page = open_page()
    page.fill("#alternatives", "2")
    translate(page, "drei")
    assert page.locator("#alts li").count() == 2 and page.locator("#others").is_visible()
    cell(page, 0, 0).hover()
    assert page.text_content("#xa-readout") != HINT
    page.fill("#alternatives", "0")
    translate(page, "sieben hundert")
    assert page.text_content("#translation") == post(server, {"q": "sieben hundert"})[1]["translatedText"]
    assert page.text_content("#xa-readout") == HINT and page.locator("#xa-map .xa-hl").count() == 0
    assert page.locator("#alts li").count() == 0 and page.locator("#others").is_hidden()
    # the text changes: what is shown is said to be the old text's
    page.fill("#alternatives", "1")  # the settings change: the same (they were not said to, before)
    assert page.text_content("#stale") == "The settings have changed since: translate again to update this."
    assert page.locator("#stale").is_visible() and page.locator("#copy").is_disabled()
    page.fill("#alternatives", "0")  # back as they were: current again
    assert page.locator("#stale").is_hidden()
    page.fill("#text", "sieben hundert vier")
    assert page.locator("#stale").is_visible() and "stale" in page.get_attribute("#result", "class")
    assert page.text_content("#stale") == "The text has changed since: translate again to update this."
    # an error the page finds itself (no request), then one from the network: each replaces the result
    for make_it_fail, message in ((lambda: page.fill("#text", "drei " * 80),
                                   ("Text: 400 characters, over the limit of 300 on this server; shorten it by 100.")),
                                  (lambda: page.route("**/translate", lambda route: route.abort()),
                                   "The server cannot be reached")):
        translate(page, "drei")
        assert page.locator("#result").is_visible() and page.locator("#error").is_hidden()
        make_it_fail()
        page.click("#go")
        page.wait_for_selector("#error:not([hidden])")
        assert message in page.text_content("#error")
        assert page.locator("#result").is_hidden() and page.text_content("#translation") == ""
        assert page.locator("#attention").is_hidden() and page.locator("#xa-map").count() == 0
        assert page.locator("#links text").count() == 0 and page.locator("#copy").is_disabled()
        assert page.locator("#error-stale").is_hidden()
    page.unroute("**/translate")
    page.fill("#text", "vier")  # the error was the text's before this edit (it stayed as if it were this one's)
    assert "stale" in page.get_attribute("#error", "class") and page.locator("#error-stale").is_visible()
    assert page.text_content("#error-stale") == "The text has changed since: translate again to see whether it " \
        "still holds."
    translate(page, "drei")
    assert page.locator("#error").is_hidden() and page.locator("#error-stale").is_hidden()


def arrived(page, held: list) -> None:
    """Wait until the page's request has reached the route that holds it (`held`): the page shows that it is
    translating as it sends, and on a busy machine the request reaches the route later."""
    while not held:
        page.wait_for_timeout(10)


def test_while_it_translates_the_page_says_so_and_greys_the_last_answer(open_page):
    page = open_page()
    translate(page, "drei")
    held = []
    page.route("**/translate", lambda route: held.append(route))  # answered when the test says
    page.fill("#text", "vier")
    page.click("#go")
    page.wait_for_selector("#busy:not([hidden])")
    assert page.is_disabled("#go") and page.get_attribute("#target-pane", "aria-busy") == "true"
    assert page.evaluate("getComputedStyle(document.getElementById('translation')).opacity") == "0.45"
    readout = page.text_content("#xa-readout")
    cell(page, 0, 0).hover(force=True)  # the greyed map of the last answer: hovering reads nothing out,
    assert page.text_content("#xa-readout") == readout
    page.locator("td.xa-cell[tabindex='0']").focus()  # nor do the keys: it takes no focus while greyed
    page.keyboard.press("ArrowRight")
    page.keyboard.press("ArrowDown")
    assert page.text_content("#xa-readout") == readout
    arrived(page, held)
    page.keyboard.press("Control+Enter")  # no second request while one runs
    page.wait_for_timeout(100)
    assert len(held) == 1
    held[0].continue_()
    page.wait_for_selector("#busy", state="hidden")
    assert page.get_attribute("#target-pane", "aria-busy") == "false" and page.is_enabled("#go")
    assert page.evaluate("getComputedStyle(document.getElementById('translation')).opacity") == "1"
    page.unroute("**/translate")


def test_a_setting_changed_while_it_translates_leaves_the_answer_out_of_date(open_page):
    """The settings an answer was made with are those sent, not those found when it arrives: a beam narrowed while
    the answer of the wider one was coming showed it as the narrower one's."""
    page = open_page()
    held = []
    page.route("**/translate", lambda route: held.append(route))
    page.fill("#beam", "3")
    page.fill("#text", "drei")
    page.click("#go")
    arrived(page, held)
    assert page.locator("#stale").is_hidden()
    page.fill("#beam", "2")
    held[0].continue_()
    page.wait_for_selector("#busy", state="hidden")
    assert page.text_content("#translation") and page.locator("#stale").is_visible()
    assert page.text_content("#stale") == "The settings have changed since: translate again to update this."
    page.fill("#beam", "3")  # back to what was sent: current
    assert page.locator("#stale").is_hidden() and page.locator("#copy").is_enabled()
    page.unroute("**/translate")


def test_a_lone_model_s_page_says_when_the_text_reads_as_another_language(open_page):
    """The page sent the model's source language, so an English text went to a German model and came back as
    nonsense, silently: it asks the server to check (source auto), says what the text reads as, and translates it
    all the same when asked again."""
    page = open_page()
    english = "A man in a blue shirt is standing on a ladder and cleaning the windows."
    translate(page, english)
    said = page.text_content("#error")
    assert said.startswith("The text reads as English (confidence ") and said.endswith(
        "%), and this server translates German to English. To translate it as German all the same, press Translate "
        "again."), said
    assert page.locator("#result").is_hidden()
    page.click("#go")  # all the same
    page.wait_for_selector("#busy", state="hidden")
    assert page.locator("#error").is_hidden() and page.text_content("#translation")
    translate(page, "drei")  # its own language: translated, and no word of the check
    assert page.locator("#error").is_hidden() and page.locator("#detected").is_hidden()
    translate(page, english + " ")  # another text: checked again
    assert page.text_content("#error").startswith("The text reads as English")
    page.route("**/translate", lambda route: route.fulfill(status=400, content_type="application/json", body=json.dumps(
        {"error": "source: auto, and q[0] reads as es (confidence 83.0), not de; give source: de to translate it as de",
         "error_type": "unsupported_language"})))  # a language no model serves: named by the browser, not as "es"
    translate(page, "Un hombre con una camisa azul.")
    assert page.text_content("#error").startswith("The text reads as Spanish (confidence 83%), and this server ")
    page.unroute("**/translate")


def test_the_keyboard_hint_is_left_out_on_a_phone(open_page, browser, server, guard):
    assert open_page().locator("#keys").is_visible()
    context = browser.new_context(viewport={"width": 390, "height": 844}, has_touch=True, is_mobile=True)
    try:
        page = guard(context.new_page(), lambda u: u.startswith(server), lambda u: u.endswith("/translate"))
        page.goto(server + "/")
        page.wait_for_selector("#pair option", state="attached")
        assert page.locator("#keys").is_hidden()  # "Ctrl+Enter translates", where there is no Ctrl to press
    finally:
        context.close()


def test_a_tap_on_a_phone_picks_the_cell_under_the_finger(browser, server, guard):
    """Chromium moves a tap to a target near it on small cells: 16 of 132 taps picked a neighbour (a probe)."""
    context = browser.new_context(viewport={"width": 390, "height": 844}, has_touch=True, is_mobile=True)
    try:
        page = guard(context.new_page(), lambda u: u.startswith(server), lambda u: u.endswith("/translate"))
        page.goto(server + "/")
        page.wait_for_selector("#pair option", state="attached")
        translate(page, "sieben hundert drei und zwanzig tausend neun")  # a map of small cells, on the screen
        cells = page.locator("td.xa-cell")
        missed = []
        cells.first.scroll_into_view_if_needed()
        on_screen = lambda box: box["x"] >= 0 and box["y"] >= 0 and box["x"] + box["width"] <= 390 and \
            box["y"] + box["height"] <= 844  # noqa: E731
        boxes = [(td.get_attribute("data-row"), td.get_attribute("data-col"), td.bounding_box()) for td in cells.all()]
        boxes = [b for b in boxes if on_screen(b[2])][:48]  # (no scrolling between taps)
        for row, col, _ in boxes:
            box = cell(page, int(row), int(col)).bounding_box()  # (the readout above may have moved the map)
            page.touchscreen.tap(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
            picked = page.locator("td.xa-cell.xa-hl")
            if (picked.get_attribute("data-row"), picked.get_attribute("data-col")) != (row, col):
                missed.append((row, col))
        assert len(boxes) == 48 and missed == [], missed
    finally:
        context.close()


def test_ctrl_enter_translates_and_the_counter_counts_characters(open_page):
    page = open_page()
    page.fill("#text", "drei")
    assert page.text_content("#count") == "4 / 300 characters \u00b7 at most 256 tokens a sentence"
    page.fill("#text", "\U0001F642" * 3)  # characters as the server counts them, not UTF-16 units
    assert page.text_content("#count") == "3 / 300 characters \u00b7 at most 256 tokens a sentence"
    page.fill("#text", "x" * 301)
    assert page.text_content("#count") == "301 / 300 characters: 1 too many \u00b7 at most 256 tokens a sentence"
    assert "over" in page.get_attribute("#count", "class")
    page.fill("#text", "drei")
    page.focus("#text")
    with page.expect_response("**/translate"):
        page.keyboard.press("Control+Enter")
    page.wait_for_selector("#result:not([hidden])")
    assert page.text_content("#translation") and page.input_value("#text") == "drei"  # no newline typed


def test_copy_puts_the_translation_on_the_clipboard(open_page):
    page = open_page(permissions=("clipboard-read", "clipboard-write"))
    assert page.locator("#copy").is_disabled()
    translate(page, "sieben hundert drei")
    page.click("#copy")
    page.wait_for_selector("#copy:text-is('Copied')")  # the clipboard answers asynchronously
    assert page.evaluate("navigator.clipboard.readText()") == page.text_content("#translation")
    page.fill("#text", "sieben hundert vier")  # what was copied is not what the text gives now
    assert page.text_content("#copy") == "Copy"
    assert page.locator("#copy").is_disabled()  # the translation shown is an older text's: not copied as this one's
    page.fill("#text", "sieben hundert drei")
    assert page.locator("#copy").is_enabled()
    held = []
    page.route("**/translate", lambda route: held.append(route))
    page.click("#go")
    page.wait_for_selector("#busy:not([hidden])")
    assert page.locator("#copy").is_disabled()  # greyed while the next translation is coming
    arrived(page, held)
    page.unroute("**/translate")
    held[0].continue_()
    page.wait_for_selector("#busy", state="hidden")
    assert page.locator("#copy").is_enabled()


def test_a_text_of_two_lines_is_shown_as_two_lines(open_page):
    """The server translates a text line by line and keeps its line breaks; the page showed them as spaces."""
    page = open_page()
    translate(page, "sieben hundert drei\n\nvier")
    shown_text, sent = page.inner_text("#translation"), page.text_content("#translation")
    assert sent.count("\n") == 2 and shown_text == sent  # innerText is what is seen: the breaks kept


@pytest.mark.parametrize("text", ["\u200b", " \ufeff\n", "\u2060\u00ad", "\u3164", "\u115f\u1160", "\u2800\u2800"])
def test_a_text_of_invisible_characters_is_no_text(open_page, text):
    page = open_page()
    sent = []
    page.on("request", lambda r: r.url.endswith("/translate") and sent.append(r))
    translate(page, text)
    assert page.text_content("#error") == "Type a text to translate first." and not sent


def test_errors_read_in_the_page_s_words_and_say_what_to_do(open_page):
    """The API's names (q[0]) and advice (give source) stay out of the page's errors, which say what to do: a text
    of too many tokens (the server's wording, faked, as this server's character limit keeps texts under it), a
    server that restarted and loads its model (the page says once it is ready), fewer other translations than
    asked for."""
    page = open_page()
    page.route("**/translate", lambda route: route.fulfill(status=413, content_type="application/json", body=json.dumps(
        {"error": "q[0]: 300 source tokens, over the limit of 256", "error_type": "too_many_tokens"})))
    translate(page, "drei")
    assert page.text_content("#error") == "Text: 300 source tokens, over the limit of 256; shorten it (a token is " \
        "a word or a piece of one)."
    page.unroute("**/translate")
    page.route("**/translate", lambda route: route.fulfill(status=503, content_type="application/json", body=json.dumps(
        {"error": "the de→en model is loading", "error_type": "unavailable"})))
    translate(page, "drei")
    assert page.text_content("#error") == "The server is not ready: the de→en model is loading"
    page.wait_for_selector("#error:text-is('The server is ready now: translate again.')", timeout=10000)
    page.unroute("**/translate")
    for status, headers, body, said in (  # the server's own counts and flags stayed in (lower case, after the page's)
            (429, {"Retry-After": "3"}, {"error": "the server is busy: 2 requests ahead (--max-backlog); retry later",
                                          "error_type": "busy"}, "The server is busy: try again in 3 seconds."),
            (429, {"Retry-After": "5"}, {"error": "the server is busy with 4 long requests; retry later, or send a "
                                          "smaller one", "error_type": "busy"},
             "The server is busy: try again in 5 seconds, or with a shorter text."),
            (504, {}, {"error": "no translation within 30 s", "error_type": "timeout"},
             "The translation took longer than the server waits for one: try a shorter text, or fewer other "
             "translations."),
            (502, {}, None, "The server answered with an error (HTTP 502) and no message; try again in a moment."),
            (413, {}, None, "The server answered with an error (HTTP 413) and no message.")):  # the same again: no
        page.route("**/translate", lambda route: route.fulfill(
            status=status, headers=headers, content_type="application/json" if body else "text/html",
            body=json.dumps(body) if body else "<html>Bad Gateway</html>"))
        translate(page, "drei")
        assert page.text_content("#error") == said
        page.unroute("**/translate")
    page.check("#strategy-sample")
    page.fill("#temperature", "0.01")  # the samples nearly all the same (a tiny model's near ties may differ)
    page.fill("#alternatives", "3")
    translate(page, "drei")
    got = page.locator("#alts li").count()
    assert page.text_content("#fewer") == "" if got == 3 else page.text_content("#fewer") == (
        "None of the 3 asked for differed" if got == 0 else f"Only {got} of the 3 asked for differ") + (
        " from the translation and from each other (the samples repeated; a higher temperature varies them more).")


def test_a_word_with_an_unknown_character_keeps_its_links_and_shows_the_character(open_page, server):
    """A source's unknown piece is part of its word (the translation's would be a word, printed " \u2047 "): the
    links stay on their cells, and the piece's label is the character it stands for."""
    text = "sieben\u00b7hundert drei"
    page = open_page()
    translate(page, text)
    result = post(server, {"q": text, "attention": "full", "alignment": True})[1]["results"][0]
    src, tgt = result["source_tokens"], result["target_tokens"]
    assert "<unk>" in src and result["source_words"] == ["sieben\u00b7hundert", "drei"] and result["alignment"]
    _, sw = piece_words(src)
    _, tw = piece_words(tgt, " \u2047 ")
    marked = {(int(c.get_attribute("data-row")), int(c.get_attribute("data-col")))
              for c in page.locator("td.xa-link").all()}
    assert marked == {(r, c) for i, j in result["alignment"] for r in range(len(tgt)) if tw[r] == j
                      for c in range(len(src)) if sw[c] == i}
    unknown = src.index("<unk>")
    assert page.locator("th.xa-col").nth(unknown).text_content() == "\u00b7"
    cell(page, 0, unknown).hover()
    assert page.text_content("#xa-readout").startswith("\u00b7 (in sieben\u00b7hundert) \u2192 ")
    assert "<unk>" not in page.inner_text("#attention")


def test_settings_that_do_not_apply_are_disabled_and_say_why(open_page):
    page = open_page()
    sent = []
    page.on("request", lambda r: r.url.endswith("/translate") and sent.append(r.post_data_json))
    assert page.is_disabled("#temperature") and page.is_disabled("#top-p") and page.is_enabled("#beam")
    assert page.text_content("#sample-note") == "Temperature and top-p apply to sampling only."
    assert page.locator("#sample-note").is_visible() and page.locator("#beam-note").is_hidden()
    translate(page, "drei")
    assert sent[-1]["sampling"] is False and "beam_size" not in sent[-1]  # the model's own beam (2)
    assert "temperature" not in sent[-1] and "top_p" not in sent[-1]
    page.fill("#beam", "3")
    translate(page, "drei")
    assert sent[-1]["beam_size"] == 3
    page.fill("#alternatives", "3")  # a beam of 3 holds 3 translations: 1 + 2 others
    page.click("#go")
    assert page.text_content("#error") == ("Beam width: a beam of 3 keeps 3 translations, too few for 3 others; make "
                                           "it 4 or more, or set it back to the model's own (2): the server widens "
                                           "that to hold them.")
    page.fill("#beam", "1")
    page.fill("#alternatives", "1")
    page.click("#go")
    assert page.text_content("#error") == ("Beam width: a beam of 1 keeps 1 translation, too few for 1 other; make "
                                           "it 2 or more (the model's own, 2, does).")
    page.fill("#alternatives", "3")
    page.fill("#beam", "2")  # the model's own: the server searches wider for the others
    translate(page, "drei")
    assert "beam_size" not in sent[-1] and sent[-1]["alternatives"] == 3 and page.locator("#alts li").count() == 3
    page.fill("#alternatives", "0")
    page.check("#strategy-sample")
    assert page.is_enabled("#temperature") and page.is_enabled("#top-p") and page.is_disabled("#beam")
    assert page.locator("#beam-note").is_visible() and page.locator("#sample-note").is_hidden()
    page.fill("#temperature", "0.7")
    translate(page, "drei")
    assert sent[-1]["sampling"] is True and sent[-1]["temperature"] == 0.7 and "beam_size" not in sent[-1]
    # more alternatives than the server's limits allow: said before anything is sent
    page.fill("#alternatives", "20")
    assert page.text_content("#alternatives-note") == "At most 7 on this server."
    count = len(sent)
    page.click("#go")
    assert page.text_content("#error") == "Other translations: a whole number from 0 to 7 on this server."
    assert len(sent) == count and page.evaluate("document.activeElement.id") == "alternatives"


def test_arrow_keys_move_the_selection_and_the_readout(open_page, server):
    page = open_page()
    translate(page, LONG)
    result = post(server, {"q": LONG})[1]["results"][0]
    src, tgt = result["source_tokens"], result["target_tokens"]
    page.focus("#xa-head")
    for _ in range(3):  # past the links checkbox, if there is one, to the map: one cell is in the tab order
        page.keyboard.press("Tab")
        if page.evaluate("document.activeElement.tagName") == "TD":
            break
    assert page.locator('td.xa-cell[tabindex="0"]').count() == 1

    def at() -> list[str]:
        return page.evaluate("[document.activeElement.dataset.row, document.activeElement.dataset.col]")

    assert at() == ["0", "0"] and page.text_content("#xa-readout").startswith(shown(src[0]))
    assert page.evaluate("document.activeElement.matches(':focus-visible')")
    assert page.evaluate("getComputedStyle(document.activeElement).outlineStyle") == "solid"
    for key, where in (("ArrowRight", [0, 1]), ("ArrowDown", [1, 1]), ("End", [1, len(src) - 1]), ("Home", [1, 0]),
                       ("ArrowUp", [0, 0]), ("ArrowUp", [0, 0]), ("ArrowLeft", [0, 0])):
        page.keyboard.press(key)
        row, col = where
        assert at() == [str(row), str(col)], key
        readout = page.text_content("#xa-readout")
        assert readout.startswith(shown(src[col])) and f"\u2192 {shown(tgt[row])}" in readout, (key, readout)
        assert readout_weight(page) == f"{float(cell(page, row, col).get_attribute('data-w')):.3f}"
        assert page.locator('td.xa-cell[tabindex="0"]').count() == 1


def test_tab_comes_back_to_the_cell_last_shown(open_page):
    page = open_page()
    translate(page, LONG)
    cell(page, 2, 3).hover()
    page.focus("#xa-head")
    for _ in range(3):
        page.keyboard.press("Tab")
        if page.evaluate("document.activeElement.tagName") == "TD":
            break
    assert page.evaluate("[document.activeElement.dataset.row, document.activeElement.dataset.col]") == ["2", "3"]
    assert page.locator('td.xa-cell[tabindex="0"]').count() == 1


INSIDE = """(width) => [...document.querySelectorAll(
    "#links text, th.xa-row, #xa-controls select, #go, #copy, #text, #xa-legend span, #xa-scroll")]
  .filter((e) => { const r = e.getBoundingClientRect();
                   return r.width > 0 && (r.left < -0.5 || r.right > width + 0.5); })
  .map((e) => e.id || e.textContent)"""

OVERLAPS = """() => { const boxes = [...document.querySelectorAll("#links text")].map((t) => t.getBoundingClientRect());
  return boxes.flatMap((a, i) => boxes.slice(i + 1).filter((b) => a.left < b.right - 0.5 && b.left < a.right - 0.5 &&
    a.top < b.bottom - 0.5 && b.top < a.bottom - 0.5)).length; }"""

CLIPPED = """() => [...document.querySelectorAll("th.xa-col span, th.xa-row")]
  .filter((e) => e.scrollWidth > e.clientWidth + 1 || e.scrollHeight > e.clientHeight + 1 ||
                 e.getBoundingClientRect().height < 1).map((e) => e.textContent)"""


@pytest.mark.parametrize("width", [1280, 390, 360])
@pytest.mark.parametrize("text", ["sieben hundert drei und zwanzig", LONG + " und " + LONG])
def test_every_label_is_whole_and_on_the_screen(open_page, width, text):
    page = open_page(width)
    translate(page, text)
    assert page.evaluate("document.documentElement.scrollWidth") <= width  # wide maps scroll inside their box
    assert page.evaluate(INSIDE, width) == [] and page.evaluate(OVERLAPS) == 0 and page.evaluate(CLIPPED) == []
    assert page.locator("#links line.link").count() > 0
    source, target = (page.locator(p).bounding_box() for p in ("#source-pane", "#target-pane"))
    if width >= 1000:  # side by side
        assert source["x"] + source["width"] <= target["x"] and source["y"] == target["y"]
    else:
        assert source["y"] + source["height"] <= target["y"]


def test_the_page_opens_on_the_alignment_layer_and_offers_only_layers_with_heads(open_page, tmp_path):
    from tests.conftest import tiny_model_dir

    for heads in ([2, 0], [0, 0], [2, 2, 2]):
        model = tmp_path / "m".join(map(str, heads))
        tiny_model_dir(model, n_decoder_layers=len(heads), heads={"cross": heads})  # as `xattn prune` leaves a model
        with serving(model, tmp_path / "log") as url:
            page = open_page(1280, url)
            translate(page, "word1 word2")
            info = json.load(urllib.request.urlopen(url + "/info"))
            if heads == [0, 0]:  # nothing to draw, and no request for it (the API would refuse it)
                assert page.locator("#no-attention").is_visible() and page.locator("#attention").is_hidden()
                assert page.text_content("#translation")
                continue
            layer = info["alignment"]["layer"]
            assert page.input_value("#xa-layer") == str(layer) and heads[layer] > 0
            options = page.locator("#xa-layer option")
            assert options.all_text_contents() == [f"layer {i}" + ("" if n else ": no heads (pruned)") +
                                                   (" (links)" if i == layer else "") for i, n in enumerate(heads)]
            assert [o.is_disabled() for o in options.all()] == [n == 0 for n in heads]
            assert page.locator("#xa-head option").all_text_contents() == ["mean of heads", "head 0", "head 1"]
            assert page.locator("td.xa-cell").count() > 0 and page.locator("#no-attention").is_hidden()
        if heads == [2, 2, 2]:
            assert layer == 1  # the second-to-last layer, not the last one drawn by default before


def attention_values(server: str, text: str) -> tuple[int, int]:
    """The values full and mean attention could hold for `text`, as the server bounds them up front."""
    info = json.load(urllib.request.urlopen(server + "/info"))
    a, b, maps, layers = info["decode"]["max_len_a"], info["decode"]["max_len_b"], sum(info["heads"]), info["layers"]
    n = len(post(server, {"q": text})[1]["results"][0]["source_tokens"]) - 1
    per_map = (int(a * (n + 1) + b) + 1) * (n + 1)  # (DecodeConfig.max_output_tokens, and </s>)
    return per_map * maps, per_map * layers


def test_the_page_asks_for_the_key_a_server_requires(open_page, server, numbers_model, tmp_path):
    limit = attention_values(server, "drei")[1]  # the mean, not full attention
    with serving(numbers_model, tmp_path / "log", "--api-key", "k3y", "--max-attention-values", str(limit)) as url:
        page = open_page(1280, url)
        assert page.locator("#key-field").is_visible()
        translate(page, "drei")  # in the page's words, with where to give it (the API's named its fields)
        assert page.text_content("#error") == "This server needs an API key: enter it under Settings (API key)."
        page.fill("#key", "k3y")  # the key is one of the settings the error was asked with
        assert page.locator("#error-stale").is_visible()
        translate(page, "drei")  # full attention is over this server's limit: the page falls back to the mean
        assert page.locator("#xa-head option").all_text_contents() == ["mean of heads"]
        assert page.locator("#mean-only").is_visible()
        assert page.locator("td.xa-cell").count() > 0
        page.fill("#key", "wrong")
        translate(page, "drei")
        assert page.text_content("#error") == "The server does not take this API key: check the API key under " \
            "Settings." and page.locator("#result").is_hidden()


def test_a_text_too_long_for_each_heads_map_shows_the_mean_and_keeps_the_head(open_page, server, numbers_model,
                                                                             tmp_path):
    short, long, longer = "drei", "sieben hundert drei", "Sieben hundert drei. " * 12  # (twelve sentences: one map)
    (full, _), (full_long, mean_long), (_, mean_longer) = (attention_values(server, t) for t in (short, long, longer))
    limit = max(full, mean_long)
    assert full_long > limit and mean_longer > limit
    with serving(numbers_model, tmp_path / "log", "--max-attention-values", str(limit)) as url:
        page = open_page(1280, url)
        translate(page, short)
        page.select_option("#xa-head", "1")
        page.uncheck("#xa-links")
        translate(page, long)
        assert page.locator("#xa-head option").all_text_contents() == ["mean of heads"]
        assert page.locator("#mean-only").is_visible() and page.locator("td.xa-cell").count() > 0
        translate(page, short)
        assert page.input_value("#xa-head") == "1" and page.locator("#mean-only").is_hidden()
        assert not page.is_checked("#xa-links")
        translate(page, longer)  # too long for even the mean (it was unbounded): the translation, and a note
        assert page.text_content("#translation") and page.locator("#error").is_hidden()
        assert page.locator("#too-long").is_visible() and page.locator("#attention").is_hidden()
        assert page.locator("#no-attention").is_hidden()


# ------------------------------------------------------------------------------ several models

GERMAN = "Ein Mann in einem blauen Hemd steht auf einer Leiter."
ENGLISH = "A man in a blue shirt is standing on a ladder."


@pytest.fixture(scope="module")
def en_de_model(tmp_path_factory):
    """An en→de numbers model unlike numbers_model in what the page shows: 3 decoder layers of 4 heads (the links
    from layer 1, not 0), beam 3."""
    from tests.conftest import trained_numbers

    return trained_numbers(tmp_path_factory.mktemp("pairs") / "en-de", "data.src_lang=en", "data.tgt_lang=de",
                           "model.n_decoder_layers=3", "model.n_heads=4", "decode.beam_size=3")


@pytest.fixture(scope="module")
def pairs(numbers_model, en_de_model, tmp_path_factory):
    """A server of two models, de→en (numbers_model) and en→de: its URL and /info's model entries by pair."""
    log = tmp_path_factory.mktemp("pairs-server") / "server.log"
    with serving([numbers_model, en_de_model], log, "--no-access-log") as url:
        models = json.load(urllib.request.urlopen(url + "/info"))["models"]
        yield url, {(m["source"], m["target"]): m for m in models}


def sending(page) -> list[dict]:
    """The bodies of the page's /translate requests, as they go."""
    sent = []
    page.on("request", lambda r: r.url.endswith("/translate") and sent.append(r.post_data_json))
    return sent


def follows(page, model: dict, beam: str | None = None) -> None:
    """The heatmap and the settings are `model`'s: its layers and heads, opened on its links' layer; its beam
    width (or `beam`)."""
    layer = model["alignment"]["layer"]
    assert page.input_value("#xa-layer") == str(layer)
    assert page.locator("#xa-layer option").all_text_contents() == [
        f"layer {i}" + (" (links)" if i == layer else "") for i in range(model["layers"])]
    assert page.locator("#xa-head option").count() == 1 + model["heads"][layer]
    assert page.input_value("#beam") == (str(model["decode"]["beam_size"]) if beam is None else beam)


def test_each_pair_translates_with_its_own_model_and_the_page_follows_it(open_page, pairs, numbers_model,
                                                                         en_de_model):
    url, models = pairs
    page = open_page(1280, url)
    sent = sending(page)
    assert page.locator("#pair-field").is_visible() and page.text_content("#langs") == ""
    assert page.locator("#pair option").all_text_contents() == ["German → English", "English → German",
                                                                "Detect the language"]
    assert models["en", "de"]["alignment"]["layer"] != models["de", "en"]["alignment"]["layer"]
    for pair, directory, text, names in ((("de", "en"), numbers_model, "sieben hundert drei", ("German", "English")),
                                         (("en", "de"), en_de_model, "seven hundred three", ("English", "German")),
                                         (("de", "en"), numbers_model, "vier und zwanzig", ("German", "English"))):
        page.select_option("#pair", label=" → ".join(names))
        assert page.input_value("#beam") == str(models[pair]["decode"]["beam_size"])  # before anything is sent
        assert (page.text_content("#source-name"), page.text_content("#target-name")) == names
        translate(page, text)
        assert (sent[-1]["source"], sent[-1]["target"]) == pair and "beam_size" not in sent[-1]  # the model's own
        assert page.text_content("#translation") == alone(directory, text)
        assert page.get_attribute("#translation", "lang") == pair[1] and page.get_attribute("#text", "lang") == pair[0]
        assert page.locator("#detected").is_hidden() and page.locator("#links line.link").count() > 0
        follows(page, models[pair])
    # 3, en→de's own beam, is one the user sets on de→en (its own is 2): sent, and checked as such
    page.fill("#beam", "3")
    translate(page, "drei")
    assert sent[-1]["beam_size"] == 3
    page.fill("#alternatives", "3")
    page.click("#go")
    assert page.text_content("#error").endswith("make it 4 or more, or set it back to the model's own (2): the server "
                                                "widens that to hold them.")


def test_another_pair_clears_the_answer_and_keeps_the_text(open_page, pairs):
    url, _ = pairs
    page = open_page(1280, url)
    page.fill("#alternatives", "1")
    translate(page, "drei")
    assert page.locator("#result").is_visible() and page.locator("td.xa-cell").count() > 0
    page.select_option("#pair", label="English → German")
    assert page.input_value("#text") == "drei" and page.locator("#placeholder").is_visible()
    assert page.locator("#result").is_hidden() and page.text_content("#translation") == ""
    assert page.locator("#alts li").count() == 0 and page.locator("#attention").is_hidden()
    assert page.locator("#xa-map").count() == 0 and page.locator("#links text").count() == 0
    assert page.locator("#copy").is_disabled() and page.locator("#stale").is_hidden()
    # an answer still coming when the pair changes is the last pair's: dropped, and the button free again
    held = []
    page.route("**/translate", lambda route: held.append(route))
    page.click("#go")
    page.wait_for_selector("#busy:not([hidden])")
    page.select_option("#pair", label="German → English")
    assert page.is_enabled("#go") and page.locator("#busy").is_hidden()
    arrived(page, held)
    with page.expect_response("**/translate"):
        held[0].continue_()
    page.unroute("**/translate")
    assert page.locator("#result").is_hidden() and page.locator("#placeholder").is_visible()
    translate(page, "drei")  # the pair picked now answers
    assert page.locator("#result").is_visible() and page.locator("#alts li").count() == 1


def test_detecting_the_language_goes_to_its_model_and_says_which(open_page, pairs, numbers_model, en_de_model):
    url, models = pairs
    page = open_page(1280, url)
    sent = sending(page)
    page.select_option("#pair", "auto")
    assert page.text_content("#source-name") == "Text (its language is detected)"
    assert page.get_attribute("#text", "lang") is None
    for text, directory, pair, name in ((GERMAN, numbers_model, ("de", "en"), "German"),
                                        (ENGLISH, en_de_model, ("en", "de"), "English")):
        translate(page, text)
        assert sent[-1]["source"] == "auto" and "target" not in sent[-1]
        assert page.text_content("#translation") == alone(directory, text)
        assert page.text_content("#detected").startswith(f"Detected: {name} (confidence ")
        assert page.get_attribute("#translation", "lang") == pair[1]
        follows(page, models[pair], beam="")  # the two models' beams differ: empty, each model's own
        assert "beam_size" not in sent[-1] and page.locator("#beam-own").is_visible()
    page.fill("#beam", "3")  # a beam the user sets goes to whichever model answers
    translate(page, "drei")
    assert sent[-1]["beam_size"] == 3 and page.locator("#result").is_visible()
    page.fill("#beam", "0")
    page.click("#go")
    assert page.text_content("#error") == "Beam width: a whole number from 1 to 16 on this server, or empty for " \
        "each model's own."
    page.fill("#beam", "")
    # no letters: nothing to tell the language by; the 400 shows as any error does
    translate(page, "123 456")
    error = page.text_content("#error")
    assert error.startswith("Source language: no text has letters to tell its language by")
    assert error.endswith("pick the languages above instead of detecting them.")
    assert page.locator("#result").is_hidden() and page.locator("#detected").is_hidden()
    assert page.locator("#attention").is_hidden()
    # a language no model here reads: said in the page's words (the API's said q[0] and "give source")
    translate(page, "Bonjour tout le monde, comment allez-vous aujourd'hui?")
    assert page.text_content("#error") == "Source language: the text was detected as French (fr), not as a source " \
        "language this request could go to (de, en). To translate it anyway, pick a pair above: its model reads " \
        "the text as its source language."


@pytest.mark.parametrize("width", [1280, 390, 360])
def test_the_pair_picker_fits_every_width(open_page, pairs, width):
    url, _ = pairs
    page = open_page(width, url)
    for pair in ("auto", "0"):
        page.select_option("#pair", pair)
        translate(page, "sieben hundert drei und zwanzig")
        assert page.evaluate("document.documentElement.scrollWidth") <= width
        box = page.locator("#pair").bounding_box()
        assert box["x"] >= 0 and box["x"] + box["width"] <= width and page.locator("#pair").is_visible()
        assert page.evaluate(INSIDE, width) == []


def test_while_a_model_loads_the_page_waits_for_every_one(browser, guard, pairs):
    url, _ = pairs
    page = guard(browser.new_page(), lambda u: u.startswith(url), lambda u: u.endswith("/info"))
    loading = [2]  # /info answers 503 twice as the server does while en→de loads, then the server's own answer

    def info(route):
        if loading[0]:
            loading[0] -= 1
            route.fulfill(status=503, headers={"Retry-After": "1"}, content_type="application/json",
                          body=json.dumps({"error": "the en→de model is loading", "error_type": "unavailable"}))
        else:
            route.continue_()
    page.route("**/info", info)
    page.goto(url + "/")
    waiting = "The server is not ready: the en→de model is loading; waiting for it…"
    page.wait_for_selector(f"#status:text-is('{waiting}')")
    assert page.locator("#pair-field").is_hidden() and page.is_disabled("#go")  # nothing sent before /info
    page.wait_for_selector("#pair-field:not([hidden])", timeout=10000)
    assert page.text_content("#status") == "" and loading == [0]
    translate(page, "drei")
    assert page.text_content("#translation")
    page.close()
