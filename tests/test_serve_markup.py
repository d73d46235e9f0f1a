"""`format: html` (xattn/serve/markup.py): HTML read into blocks of text and inline elements, the markup written
back as it came, the inline elements carried over to a translation by its word links, and the server's answers."""
import pytest

from xattn.words import split_words, strip_separators

pytest.importorskip("fastapi", reason="the serve extra (pip install -e '.[serve]')")
from xattn.serve.markup import Translated, parse  # noqa: E402


def unchanged(page):
    """Each block's own text as its translation, each word linked to itself."""
    out = []
    for block in page.blocks:
        words = split_words(block.text)
        out.append(Translated(strip_separators(block.text), words, words, [(i, i) for i in range(len(words))]))
    return out


@pytest.mark.parametrize("document", [
    "<p>Ein <b>großer</b> Hund läuft.</p>",
    "Nur Text &lt;b&gt; &amp; ohne Tags",
    '<!DOCTYPE html>\n<html><head><meta charset="utf-8"><title>Titel hier</title><style>p > b {color: red}</style>'
    '<script>if (a < b && c) x("<p>");</script></head>\n<body>\n<p class="x">Hallo <a href="/x?a=1&amp;b=2">liebe '
    '<i>Welt</i></a> &amp; mehr<img src=a.png alt="Bild"> ende</p>\n<pre>nicht  <b>hier</b>\n  auch nicht</pre>'
    '<!-- ein Kommentar --><div>A<br>B<br/>C</div></body></html>',
    '<p><b></b>x <span translate="no">Acme Inc</span> y <code>ls -l</code></p>',
    "<p><code>ls</code> zeigt <b> </b> Dateien <!--c--></p>",
    "<p> <b>fett</b> </p>", "<ul><li>eins</li><li>zwei <em>drei</em></li></ul>",
    '<div class="notranslate">Name <b>bleibt</b></div><p>Text</p>', "<svg><text>nein</text><svg>x</svg></svg> ja",
    "", "<br>", "   ", "<p>\xa0</p>", "x </b> y", "<td>1&nbsp;000 €</td>", "<td>&nbsp;&nbsp;Unterpunkt</td>",
    '<p><a href="/"><img src="logo.png"> Startseite</a></p>', "<p>x</p><style>p{color:red}",
    '<p><a href="/p">Produkt <span translate="no">XY-200</span></a> kaufen</p>', "<p translate>Hallo</p>",
    "<p>Preis:&nbsp;<img src=x></p>", "<nav><a href=/>Start</a> › <a href=/b>Blog</a></nav><p>›</p>",
])
def test_markup_comes_back_as_it_was_written_around_an_unchanged_text(document):
    """The reading loses nothing: with each block's text as its own translation the page comes back the same, but
    for what a browser shows the same (character references written out, white space in a block as one space)."""
    import html
    page = parse(document)
    back = page.render(unchanged(page))
    assert " ".join(html.unescape(back).split()) == " ".join(html.unescape(document).split()), back


def rendered(document: str) -> str:
    page = parse(document)
    return page.render(unchanged(page))


def test_markup_comes_back_in_its_place_exactly():
    """Atoms stay inside the elements they stood in (a logo inside its link), and white space at a block's edges,
    `&nbsp;` too, stays as it was."""
    for document in ['<p><a href="/"><img src="logo.png"> Startseite</a></p>', "<td>\xa0\xa0Unterpunkt</td>",
                     '<p><a href="/p">Produkt <span translate="no">XY-200</span></a> kaufen</p>',
                     "<p>Preis:\xa0<img src=x></p>", "<p>x</p><style>p{color:red}", "<p>a <b>b <img> c</b> d</p>",
                     "<p><!--x--> a <code>b</code></p>"]:
        assert rendered(document) == document


def test_an_inline_element_a_block_boundary_cuts_ends_there_and_opens_again():
    """As a browser reopens it: written open, its words in the next block were taken into what the translation
    put after it."""
    assert rendered('<p>Bitte <a href="/x">hier klicken<br>oder anrufen</a> bitte</p>') == \
        '<p>Bitte <a href="/x">hier klicken</a><br><a href="/x">oder anrufen</a> bitte</p>'
    assert rendered("<p>Hallo <b>Welt<p>weiter") == "<p>Hallo <b>Welt</b><p><b>weiter</b>"
    assert rendered("<ul><li>eins</li><li>zwei <em>drei</li></ul>") == "<ul><li>eins</li><li>zwei <em>drei</em></li></ul>"


def test_kept_text_is_escaped_as_the_parser_read_it():
    """Python's newer parsers read textarea and title as RCDATA: their references decoded, with cdata_elem set.
    Written out raw, `&lt;/textarea&gt;&lt;img ...&gt;` became markup."""
    from xattn.serve.markup import Reader
    reader = Reader()
    reader.cdata_elem, reader._escapable = "textarea", True
    assert reader._raw("</textarea><img src=x onerror=alert(1)>") == \
        "&lt;/textarea&gt;&lt;img src=x onerror=alert(1)&gt;"
    reader._escapable = False  # script, style: as they came
    assert reader._raw('if (a < b) x("<p>");') == 'if (a < b) x("<p>");'
    page = parse("<textarea>&lt;/textarea&gt;&lt;img src=x&gt;</textarea><p>Text</p>")
    assert "<img" not in page.render(unchanged(page))


def test_what_is_translated_and_what_is_not():
    page = parse('<html><head><title>Der Titel</title><script>var x = "nein";</script></head><body><p>Ein '
                 '<b>großer</b> Hund &amp; <code>x</code> eine Katze.</p><pre>bleibt</pre><p translate="no">auch</p>'
                 '<ul><li>eins</li><li>zwei</li></ul><p>a<br>b</p></body></html>')
    assert [b.text.strip() for b in page.blocks] == ["Der Titel", "Ein großer Hund & eine Katze.", "eins", "zwei",
                                                    "a", "b"]
    # an element kept whole ends where its end tag, left out, would be; a block of no letter or digit stays as it is;
    # a script written as if void opens as a browser opens it; a button's text is part of its sentence
    assert [b.text for b in parse('<ul><li translate="no">Acme<li>Apfel</ul><p>Text</p>').blocks] == ["Apfel", "Text"]
    assert [b.text for b in parse('<p translate="no">a<br>b</p><div>c</div>').blocks] == ["c"]
    assert [b.text for b in parse("<p>›</p><p> | </p><p>—2</p>").blocks] == ["—2"]
    assert [b.text for b in parse('<script src=a.js/>var x = "Hallo";</script><p>Text</p>').blocks] == ["Text"]
    assert [b.text for b in parse("<p>Klicken Sie auf <button>Senden</button>, um fortzufahren.</p>").blocks] == \
        ["Klicken Sie auf Senden, um fortzufahren."]
    assert [b.text for b in parse("<p>Hallo <svg><text>nein</text></svg> Welt</p>").blocks] == ["Hallo Welt"]


def links_page(source_html, translation, links):
    page = parse(source_html)
    (block,) = page.blocks
    return page.render([Translated(translation, split_words(block.text), split_words(translation), links)])


def test_a_request_naming_a_text_in_a_value_is_answered_with_its_error(client):
    """The error of a page's block names the page; a value quoting `q[5]` was taken for a block's name: a 500."""
    r = client.post("/translate", json={"q": "<p>Hallo</p>", "format": "html", "stopping": "q[5]"})
    assert r.status_code == 422 and "'q[5]'" in r.json()["error"], r.text
    r = client.post("/translate", json={"q": "<br>", "format": "html", "beam_size": 100000})
    assert r.status_code == 422 and "beam_size" in r.json()["error"], r.text  # a page of no text is checked too


def test_inline_elements_follow_their_words_through_the_links():
    html = '<p>Ein <b>großer</b> <a href="h">Hund</a> läuft<img src=x>.</p>'
    assert links_page(html, "Le chien grand court.", [(0, 0), (2, 1), (1, 2), (3, 3)]) == \
        '<p>Le <a href="h">chien</a> <b>grand</b> court.<img src=x></p>'
    # a word linked to two: the first; an element whose words come apart: written once for each run of them
    assert links_page(html, "Der Hund, groß, läuft.", [(0, 0), (2, 1), (1, 2), (3, 3), (2, 3)]) == \
        '<p>Der <a href="h">Hund,</a> <b>groß,</b> <a href="h">läuft.</a><img src=x></p>'
    # words linked to none take what their linked neighbours share; at the edges, what holds every source word
    assert links_page("<p><b>Alles fett hier</b></p>", "All bold here now", [(1, 1), (2, 2)]) == \
        "<p><b>All bold here now</b></p>"
    assert links_page("<p>Ein <b>Hund</b></p>", "A dog", [(1, 1)]) == "<p>A <b>dog</b></p>"
    assert links_page("<p><i>x <b>y</b> z</i></p>", "z q y", [(2, 0), (1, 2)]) == "<p><i>z q <b>y</b></i></p>"


def test_kept_markup_follows_the_translation_of_the_word_before_it_with_its_spacing():
    html = '<p>Run <code>ls</code> now<img src=a> and <!--x-->then</p>'
    assert links_page(html, "Maintenant lancez et puis", [(0, 1), (1, 0), (2, 2), (3, 3)]) == \
        '<p>Maintenant<img src=a> lancez <code>ls</code> et <!--x-->puis</p>'
    assert links_page("<p><img src=a> Hallo</p>", "Hello", [(0, 0)]) == "<p><img src=a> Hello</p>"
    assert links_page("<p>Hallo <br>", "Hello", [(0, 0)]) == "<p>Hello <br>"


def test_an_element_no_target_word_took_is_not_lost():
    """A link on a word whose translation is linked to another source word, or to none, vanished with its href."""
    assert links_page("<p>Das ist <b>sehr</b> gut</p>", "That is very good", [(0, 0), (1, 1), (3, 3)]) == \
        "<p>That is <b>very</b> good</p>"
    assert links_page('<p>Ruf <b>uns</b> <a href="h">heute</a> an</p>', "Call us today", [(0, 0), (1, 1), (1, 2), (2, 2)]) \
        == '<p>Call <b>us <a href="h">today</a></b></p>'


def test_the_translation_is_escaped_as_html():
    assert links_page("<p>a &lt; b</p>", "a < b & <c>", [(0, 0), (1, 1), (2, 2)]) == "<p>a &lt; b &amp; &lt;c&gt;</p>"


@pytest.fixture(scope="module")
def client(numbers_model):
    from tests.test_serve import started
    from xattn.serve.app import create_app
    c = started(create_app(str(numbers_model)))
    yield c
    c.__exit__(None, None, None)


def text_of(answer: str) -> str:
    import html
    import re
    return " ".join(html.unescape(re.sub(r"<[^>]*>", " ", answer)).split())


def test_the_server_translates_html_as_its_text_and_keeps_the_markup(client):
    plain = client.post("/translate", json={"q": ["drei vier", "zwei", "eins"]}).json()["translatedText"]
    page = '<div class="t"><p>drei <b>vier</b></p>\n<p>zwei<img src="x.png"></p><pre>drei</pre><p>eins</p></div>'
    r = client.post("/translate", json={"q": page, "format": "html", "source": "de", "target": "en"})
    assert r.status_code == 200, r.text
    body = r.json()
    answer = body["translatedText"]
    assert text_of(answer) == " ".join([plain[0], plain[1], "drei", plain[2]])
    assert answer.startswith('<div class="t"><p>') and answer.endswith("<p>" + plain[2] + "</p></div>")
    assert '<img src="x.png">' in answer and "<pre>drei</pre>" in answer
    assert answer.count("<b>") == answer.count("</b>") and answer.count("<p>") == 3
    assert set(body["results"][0]) == {"translatedText", "score"} and body["results"][0]["translatedText"] == answer
    # as LibreTranslate's clients send it: a form; a list of pages; and the language told by the text, not the tags
    form = client.post("/translate", data={"q": page, "format": "html", "source": "auto", "target": "en"}).json()
    assert form["translatedText"] == answer and form["detectedLanguage"]["language"] == "de"
    both = client.post("/translate", json={"q": [page, "<br>"], "format": "html"}).json()
    assert both["translatedText"] == [answer, "<br>"]


def test_a_page_is_within_a_requests_characters_not_its_items(client):
    """A page of more blocks than a request may have texts is one text; one with no text is answered as it is."""
    many = "".join(f"<li>{w}</li>" for w in ["eins", "zwei", "drei"] * 12)
    r = client.post("/translate", json={"q": f"<ul>{many}</ul>", "format": "html"})
    assert r.status_code == 200, r.text
    assert r.json()["translatedText"].count("<li>") == 36
    empty = client.post("/translate", json={"q": "<p> <img src=a> </p>", "format": "html"}).json()
    assert empty["translatedText"] == "<p> <img src=a> </p>"


PIECES = ["<p>", "</p>", "<b>", "</b>", '<a href="x">', "</a>", "<br>", "<img src=y>", "<code>", "</code>",
          '<span translate="no">', "</span>", "<!--c-->", "<ul>", "<li>", "</li>", "</ul>", "<div>", "</div>",
          "<em>", "</em>", "<script>", "</script>", "<textarea>", "</textarea>", "<title>", "</title>", "<button>",
          "</button>", " Hallo ", " Welt ", " eins zwei ", " ", "\n", " &amp; ", " &nbsp; ", " &lt; ", " . ", " › ", " 3,50 "]
"""Tags, and text set apart by spaces (an atom inside a word follows the word's translation: its order in an
unchanged text is not kept, nor meant to be)."""


def visible(document: str) -> str:
    import html
    import re
    return " ".join(html.unescape(re.sub(r"<[^>]*>", "", document)).split())


def test_any_tag_soup_comes_back_with_its_text_and_never_raises():
    """Reading and writing back, each block its own translation: the text a page holds is the same, whatever the
    markup around it (hypothesis: any sequence of tags, text, references and comments)."""
    from hypothesis import given, settings, strategies as st

    @settings(max_examples=400)
    @given(st.lists(st.sampled_from(PIECES), max_size=30))
    def check(pieces):
        document = "".join(pieces)
        assert visible(rendered(document)) == visible(document), document
    check()


def test_any_links_place_the_markup_without_losing_a_translated_word():
    """Whatever the alignment links (any pairs, any number of target words), the writing back never fails and every
    word of each block's translation is in the page, in order (hypothesis)."""
    import html
    import re

    from hypothesis import given, settings, strategies as st

    @settings(max_examples=300)
    @given(st.lists(st.sampled_from(PIECES), max_size=25), st.lists(st.sampled_from(["A", "big", "dog", "<x>", "&"]),
                                                                    max_size=6), st.data())
    def check(pieces, words, data):
        page = parse("".join(pieces))
        out = []
        for block in page.blocks:
            source = split_words(block.text)
            links = data.draw(st.lists(st.tuples(st.integers(0, len(source)), st.integers(0, len(words))),
                                       max_size=8))
            out.append(Translated(" ".join(words), source, list(words), links))
        written = html.unescape(re.sub(r"<[^>]*>", " ", page.render(out)))
        for block in page.blocks:
            at = 0
            for word in words:
                at = written.index(word, at) + len(word)
    check()


def test_a_words_punctuation_goes_where_its_source_words_went():
    """Words carry their punctuation (`Wiese.`): the full stop after a link went into the link with the word."""
    assert links_page('<p>über die <a href="/w">grüne Wiese</a>.</p>', "across the green grass.",
                      [(0, 0), (1, 1), (2, 2), (3, 3)]) == '<p>across the <a href="/w">green grass</a>.</p>'
    assert links_page("<p>„<b>Hund</b>“</p>", "“dog”", [(0, 0)]) == "<p>“<b>dog</b>”</p>"
    assert links_page("<p><b>Wiese.</b></p>", "grass.", [(0, 0)]) == "<p><b>grass.</b></p>"
    assert links_page("<p><b>Wiese</b></p>", "grass.", [(0, 0)]) == "<p><b>grass.</b></p>"  # none in the source
