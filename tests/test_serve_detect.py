"""`xattn serve`: language identification (xattn/serve/detect.py, POST /detect, `source: auto` on /translate)
and plain-text files (POST /translate_file, GET /download_file/NAME; xattn/serve/files.py)."""
import dataclasses
from urllib.parse import urlsplit

import pytest

pytest.importorskip("fastapi", reason="the serve extra (pip install -e '.[serve]')")

from xattn.serve import detect  # noqa: E402
from xattn.serve.app import create_app  # noqa: E402
from xattn.serve.files import Document, Store  # noqa: E402
from xattn.serve.limits import ApiError, Limits  # noqa: E402

from test_serve import client, error, running_where, started  # noqa: E402,F401 - client: a server on the numbers model

CLEAR = {  # Multi30k-like captions (written for this test) and a few other languages
    "en": "A man in a blue shirt is standing on a ladder and cleaning the windows.",
    "de": "Ein Mann in einem blauen Hemd steht auf einer Leiter und putzt die Fenster.",
    "fr": "Un homme en chemise bleue est debout sur une échelle et nettoie les fenêtres.",
    "cs": "Muž v modré košili stojí na žebříku a myje okna.",
    "es": "Un hombre con una camisa azul está de pie en una escalera limpiando las ventanas.",
    "it": "Un uomo con una camicia blu è in piedi su una scala e pulisce le finestre.",
}
ENGLISH = CLEAR["en"]


@pytest.fixture(scope="module")
def small(numbers_model):
    """A server with small limits: 3 texts, 300 characters, 12 source tokens a request, 2 requests waiting."""
    limits = dataclasses.replace(Limits(), max_items=3, max_chars=300, max_source_tokens=12, queue_size=2)
    c = started(create_app(str(numbers_model), limits, api_key="k3y"))
    yield c
    c.__exit__(None, None, None)


def translations(client, texts: list[str]) -> list[str]:
    reply = client.post("/translate", json={"q": texts, "source": "de"})
    assert reply.status_code == 200, reply.text
    return reply.json()["translatedText"]


# ------------------------------------------------------------------------------------------ the identifier

def test_clear_sentences_are_identified_open_set_and_among_candidates():
    guesses = detect.identify(list(CLEAR.values()))
    assert [g.language for g in guesses] == list(CLEAR)
    assert all(0.5 < g.confidence <= 1 for g in guesses)
    among = detect.identify(list(CLEAR.values()), ["de", "en", "fr", "cs", "es", "it", "digits"])  # digits: unknown
    assert [g.language for g in among] == list(CLEAR)
    assert detect.identify([CLEAR["es"]], ["de", "en"])[0].language in ("de", "en")  # the candidates only
    assert detect.identify(["1234 !?", ""], None) == [(detect.UNDETERMINED, 0.0)] * 2
    assert detect.identify([ENGLISH], ["digits"]) == [(detect.UNDETERMINED, 0.0)]
    ranked = detect.ranking(CLEAR["fr"])
    assert ranked[0].language == "fr" and abs(sum(g.confidence for g in ranked) - 1) < 1e-3
    assert [g.confidence for g in ranked] == sorted((g.confidence for g in ranked), reverse=True)


def test_source_auto_refuses_only_long_texts_the_identifier_gives_the_source_almost_no_chance():
    long_english, short_english = ENGLISH, "A man on a ladder."  # 13 letters: under MIN_LETTERS
    assert sum(ch.isalpha() for ch in short_english) < detect.MIN_LETTERS
    refused, short, german = detect.as_source([long_english, short_english, CLEAR["de"]], "de")
    assert refused.language == "en" and refused.confidence > 0.9
    assert short.language == "de" and 0 <= short.confidence <= 1  # unsure on so little: taken as the source
    assert german.language == "de" and german.confidence > 0.9
    assert detect.as_source(["neunhundertsiebenundachtzigtausendsechshundertvierundfünfzig"], "de")[0].language == "de"
    assert detect.as_source([long_english], "digits") == [("digits", 0.0)]  # a source it does not know: never refused


@pytest.mark.parametrize("text, language", [("こんにちは世界、元気ですか", "ja"), ("Привет, как дела?", "ru"),
                                            ("안녕하세요 세계", "ko"), ("שלום עולם", "he"), ("谢谢你", None)])
def test_source_auto_refuses_a_short_text_in_another_script(text, language):
    """Under MIN_LETTERS letters, but in a script the source is not written in: the identifier rules the source
    out (at most RULED_OUT), so it is refused however short (a Japanese question went to a German model as German)."""
    assert sum(ch.isalpha() for ch in text) < detect.MIN_LETTERS
    (guess,) = detect.as_source([text], "de")
    assert guess.language != "de" and guess.language == (language or guess.language)
    for own, source in (("Hund", "de"), ("Un kayakiste", "fr"), ("NYPD", "en"), ("Taiwanec", "cs"), ("Ein Hund", "de")):
        assert detect.as_source([own], source)[0].language == source  # short texts of the source itself: taken
    assert detect.as_source(["Un chien"], "de")[0].language == "de"  # the same script: too short to tell, taken
    for own, source in (("Moskau (Москва)", "de"), ("Herr Иванов", "de"), ("Athen (Αθήνα)", "de"),
                        ("Salut Дима", "fr"), ("Milá Ольга", "cs"), ("Hund 狗", "de")):  # a name in another script
        assert detect.as_source([own], source)[0].language == source, own  # (these were refused, as sr, bg, el...)


# ------------------------------------------------------------------------------------------ POST /detect

def test_detect_answers_like_libretranslate(client):
    for lang, text in CLEAR.items():
        for reply in (client.post("/detect", json={"q": text}), client.post("/detect", data={"q": text})):
            assert reply.status_code == 200, reply.text
            answer = reply.json()
            assert answer[0]["language"] == lang and 50 < answer[0]["confidence"] <= 100
            assert all(set(a) == {"language", "confidence"} for a in answer) and 1 <= len(answer) <= 5
            assert [a["confidence"] for a in answer] == sorted((a["confidence"] for a in answer), reverse=True)
            assert all(a["confidence"] >= 1 for a in answer[1:])
    both = client.post("/detect", json={"q": [CLEAR["de"], "Ein Hund."]}).json()  # a list: taken together
    assert both[0]["language"] == "de"
    assert client.post("/detect", json={"q": "1234"}).json() == [{"language": "und", "confidence": 0.0}]
    assert client.post("/detect?q=" + CLEAR["fr"].replace(" ", "+")).json()[0]["language"] == "fr"


def test_detect_reads_requests_as_translate_does(small):
    error(small.post("/detect", json={"q": ENGLISH}), 403, "an API key is required", "unauthorized")
    assert small.post("/detect", json={"q": ENGLISH}, headers={"Authorization": "Bearer k3y"}).status_code == 200
    error(small.post("/detect", json={"q": "x" * 301, "api_key": "k3y"}), 413, "q: 301 characters, over the limit "
          "of 300", "too_many_characters")
    error(small.post("/detect", json={"q": ["a"] * 4, "api_key": "k3y"}), 413, "q: 4 texts", "too_many_items")
    error(small.post("/detect", json={"q": [], "api_key": "k3y"}), 422, "q: an empty list", "invalid_request")
    error(small.post("/detect", json={"api_key": "k3y"}), 422, "q: Field required", "invalid_request")
    error(small.post("/detect", json={"q": "a", "source": "de", "api_key": "k3y"}), 422, "source: Extra inputs")


# ------------------------------------------------------------------------------------------ source: auto

def test_source_auto_translates_the_source_language_and_refuses_another_clearly_detected(client):
    texts = ["drei", "siebenhundertzwölf", "neunhundertsiebenundachtzigtausendsechshundertvierundfünfzig"]
    expected = translations(client, texts)
    for body in ({"q": texts, "source": "auto"}, {"q": texts}):  # auto is the default
        reply = client.post("/translate", json=body).json()
        assert reply["translatedText"] == expected
        assert [d["language"] for d in reply["detectedLanguage"]] == ["de"] * 3
    single = client.post("/translate", json={"q": texts[2]}).json()["detectedLanguage"]
    assert single["language"] == "de" and 0 <= single["confidence"] <= 100
    for q, where in ((ENGLISH, "q[0]"), (["drei", ENGLISH], "q[1]")):
        error(client.post("/translate", json={"q": q}), 400, f"source: auto, and {where} reads as en (confidence",
              "unsupported_language")
    reply = client.post("/translate", json={"q": ENGLISH, "source": "auto"})
    assert "not as this model's source language de; give the source language explicitly" in reply.json()["error"]
    assert client.post("/translate", json={"q": ENGLISH, "source": "de"}).status_code == 200  # asked for: done
    assert client.post("/translate", json={"q": "A man on a ladder."}).json()["detectedLanguage"]["language"] == "de"
    error(client.post("/translate", json={"q": ["drei", "こんにちは世界、元気ですか"]}), 400,
          "source: auto, and q[1] reads as ja (confidence", "unsupported_language")


# ------------------------------------------------------------------------------------------ POST /translate_file

def upload(client, text: bytes | str, name: str = "zahlen.txt", **fields):
    data = text.encode() if isinstance(text, str) else text
    return client.post("/translate_file", files={"file": (name, data, "text/plain")}, data=fields)


def download(client, reply) -> tuple[str, str]:
    assert reply.status_code == 200, reply.text
    url = reply.json()["translatedFileUrl"]
    got = client.get(urlsplit(url).path)
    assert got.status_code == 200 and got.headers["content-type"] == "text/plain; charset=utf-8"
    return got.content.decode(), got.headers["content-disposition"]


def test_a_file_is_translated_line_by_line_keeping_its_lines(client):
    text = "drei\n\n  vier  \r\nsiebenhundertzwölf\n   \neins"
    want = translations(client, ["drei", "vier", "siebenhundertzwölf", "eins"])
    translated, disposition = download(client, upload(client, "\ufeff" + text, source="de", target="en"))
    assert translated == f"{want[0]}\n\n  {want[1]}  \r\n{want[2]}\n   \n{want[3]}"
    assert disposition == 'attachment; filename="zahlen_en.txt"'
    assert download(client, upload(client, text))[0] == translated  # source auto on the whole text, default target
    _, disposition = download(client, upload(client, "drei", name="C:\\Zählen.TXT"))
    assert disposition == "attachment; filename*=utf-8''Z%C3%A4hlen_en.TXT"


def test_a_files_lines_are_identified_off_the_event_loop(client, monkeypatch):
    """`source: auto` identifies each line of a file, thousands in a 5,000-character one: on the event loop, that
    held up every other client, /health included."""
    from xattn.serve import models as models_module

    where, identify = [], models_module.detected_source

    def detected_source(*args, **kwargs):
        where.append(running_where())
        return identify(*args, **kwargs)
    monkeypatch.setattr(models_module, "detected_source", detected_source)
    download(client, upload(client, "drei\nvier\n"))
    assert where == ["thread"]


def test_a_file_name_not_in_the_body_s_charset_is_a_422_not_mojibake(client):
    """A Latin-1 file name (raw \xe4) was read as Latin-1 by the parser, and the download named `äÿ_en.txt`."""
    def body(name: bytes, field: bytes = b'name="file"; filename="', more: bytes = b"") -> bytes:
        return (b"--b\r\nContent-Disposition: form-data; " + field + name + b'"\r\n'
                b"Content-Type: text/plain\r\n\r\ndrei\r\n" + more + b"--b--\r\n")
    kind = {"Content-Type": "multipart/form-data; boundary=b"}
    for field in (b'name="file"; filename="', b'NAME = "file"; FILENAME = "'):  # as the parser reads them: any case
        error(client.post("/translate_file", content=body(b"\xe4\xff.txt", field), headers=kind), 422,
              "file: its file name: not UTF-8 (multipart/form-data)", "invalid_request")
    second = b'--b\r\nContent-Disposition: form-data; Name="file"; FileName = "b.txt"\r\n\r\nvier\r\n'
    error(client.post("/translate_file", content=body(b"a.txt", more=second), headers=kind), 422,
          "file: one file too many")  # (it was a 500: the file went uncounted)
    error(client.post("/translate", content=body(b"a.txt", b'name="q"; FILENAME="'), headers=kind), 422,
          "q: a file, where this route takes text fields only")
    _, disposition = download(client, client.post("/translate_file", content=body("Zähler.txt".encode()), headers=kind))
    assert disposition == "attachment; filename*=utf-8''Z%C3%A4hler_en.txt"


def test_a_file_of_more_lines_than_a_request_may_have_is_one_request(small):
    """Its lines are one request's texts, whatever --max-items (7 lines where a request may have 3), translated as
    /translate translates them; it takes one place in the queue (2 may wait here)."""
    lines = ["drei", "vier", "fünf", "sechs", "sieben", "acht", "neun"]  # 7 lines, 3 texts a request
    want = []
    for part in (lines[:3], lines[3:6], lines[6:]):
        want += small.post("/translate", json={"q": part, "source": "de", "api_key": "k3y"}).json()["translatedText"]
    translated, _ = download(small, upload(small, "\n".join(lines) + "\n", api_key="k3y"))
    assert translated == "\n".join(want) + "\n"


@pytest.mark.parametrize("content, name, fields, status, fragment", [
    ("drei", "zahlen.pdf", {}, 400, "file: .pdf is not supported; send a .txt file"),
    ("drei", "zahlen", {}, 400, "file: a name without extension is not supported"),
    (b"drei \xff vier", "zahlen.txt", {}, 422, "file: not UTF-8 text (byte 0xff at offset 5)"),
    (b"\xef\xbb\xbfdrei \xe4", "zahlen.txt", {}, 422, "file: not UTF-8 text (byte 0xe4 at offset 8)"),  # a BOM first
    (b"drei\x00\x01\x02", "zahlen.txt", {}, 422, "file: binary data (a NUL byte at offset 4)"),
    ("drei\n".encode("utf-16"), "zahlen.txt", {}, 422, "file: UTF-16 text (its byte-order mark); send it as UTF-8"),
    ("drei\n".encode("utf-16-be").join([b"\xfe\xff", b""]), "zahlen.txt", {}, 422, "file: UTF-16 text"),
    ("\n  \n", "zahlen.txt", {}, 422, "file: no text to translate"),
    ("drei\n" * 61, "zahlen.txt", {}, 413, "file: 305 characters, over the limit of 300"),
    ("drei\nvier\n" + "drei " * 20, "zahlen.txt", {}, 413, "file: line 3: 20 source tokens, over the limit of 12"),
    ("drei", "zahlen.txt", {"target": "fr"}, 400, "target: French (fr) is not supported; this server translates de→en"),
    ("drei", "zahlen.txt", {"beam_size": "2"}, 422, "beam_size: Extra inputs are not permitted"),
    (ENGLISH, "notes.txt", {}, 400, "source: auto, and file reads as en"),
    ("Ein Mann in einem blauen Hemd steht auf einer Leiter.\nZwei Hunde spielen im Schnee.\n" + ENGLISH, "notes.txt",
     {}, 400, "source: auto, and file: line 3 reads as en"),  # the whole text reads as German, its last line does not
])
def test_files_that_cannot_be_translated_are_a_4xx_naming_the_field(small, content, name, fields, status, fragment):
    error(upload(small, content, name, api_key="k3y", **fields), status, fragment)


def test_translate_file_checks_the_key_and_needs_a_file(small):
    error(upload(small, "drei"), 403, "an API key is required", "unauthorized")
    error(small.post("/translate_file", data={"api_key": "k3y", "file": "drei"}), 422, "file: a text field, not a file")
    error(small.post("/translate_file", data={"api_key": "k3y", "source": "de"}), 422, "file: missing")
    two = [("file", ("a.txt", b"drei")), ("file", ("b.txt", b"vier"))]
    error(small.post("/translate_file", files=two, data={"api_key": "k3y"}), 422,
          "file: one file too many: this route takes 1 (`file`)")
    error(small.post("/translate", files={"q": ("a.txt", b"drei")}, data={"api_key": "k3y"}), 422,
          "q: a file, where this route takes text fields only")  # /translate takes no file (it said: body: Too many)
    error(small.get("/download_file/nothing-here"), 404, "/download_file/nothing-here: no such file", "not_found")
    paths = small.get("/openapi.json").json()["paths"]
    assert "file" in paths["/translate_file"]["post"]["requestBody"]["content"]["multipart/form-data"]["schema"][
        "properties"]
    assert "q" in paths["/detect"]["post"]["requestBody"]["content"]["application/json"]["schema"]["properties"]


def test_the_store_of_translated_files_is_bounded_in_count_bytes_and_time():
    now = [0.0]
    store = Store(files=3, total_bytes=10, seconds=60, clock=lambda: now[0])
    names = [store.put(f"{i}.txt", b"abc") for i in range(4)]  # 4 files: the oldest goes
    assert store.get(names[0]) is None and store.get(names[3]) == ("3.txt", b"abc") and store.size() == 9
    big = store.put("big.txt", b"x" * 8)  # 8 + 3 + 3 bytes > 10: the oldest go until it fits
    assert store.size() == 8 and store.get(big) == ("big.txt", b"x" * 8)
    huge = store.put("huge.txt", b"x" * 50)  # over the budget alone: kept, as the newest
    assert store.get(huge) == ("huge.txt", b"x" * 50) and store.get(big) is None
    now[0] = 61.0
    assert store.get(huge) is None and store.size() == 0
    assert len({store.put("a.txt", b"") for _ in range(3)}) == 3


def test_a_document_keeps_every_line_ending_and_blank_line():
    text = "a b \r\n\n  c\rd\n\t\n e\x0cf\n"
    document = Document.parse(text)
    assert document.texts() == (["a b", "c\rd", "e\x0cf"], [1, 3, 5])  # a line ends at \n alone, as translate reads
    assert document.rebuild(["A B", "CD", "E"]) == "A B \r\n\n  CD\n\t\n E\n"
    assert document.rebuild(["a b", "c\rd", "e\x0cf"]) == text
    assert Document.parse("\n\n").rebuild([]) == "\n\n"
    with pytest.raises(ApiError, match=r"file: no text to translate \(every line is blank\)"):
        Document.parse("").texts()
    assert Document.parse("eins\r").texts() == (["eins"], [1])
    with pytest.raises(ApiError, match=r"file: lines end in a carriage return alone"):  # as translate refuses them
        Document.parse("eins\rzwei\r")


def test_an_error_about_one_of_a_file_s_lines_names_the_line_wherever_the_message_names_it(numbers_model):
    """The file's lines are a request's texts: q[i] inside a message (the index among its non-blank lines) became
    the file's line number only at the message's start."""
    c = started(create_app(str(numbers_model), dataclasses.replace(Limits(), max_output_tokens=12)))
    try:
        reply = upload(c, "drei\n\nvier hundert drei und zwanzig tausend sieben hundert\n", source="de", target="en")
        assert reply.status_code == 422 and "(line 3 and </s>)" in reply.json()["error"], reply.text
        # (the model's own max_len_a and max_len_b: the line is what is too long, not a field the request set)
        assert reply.json()["error"].startswith("file: line 3: max_len_a * 39") and "q[" not in reply.json()["error"]
    finally:
        c.__exit__(None, None, None)


def test_a_file_s_whole_work_is_bounded_up_front(numbers_model):
    """Each part of a file was checked against --max-work as it ran, never the file: 2,500 one-word lines ran for
    20 s (work 162,500 over a limit of 100,000) while every beam request waited."""
    limits = dataclasses.replace(Limits(), max_items=3, max_work=500)
    c = started(create_app(str(numbers_model), limits))
    try:
        assert upload(c, "drei\n" * 3, source="de", target="en").status_code == 200  # within the work
        reply = upload(c, "drei\n" * 40, source="de", target="en")
        error(reply, 413, "file: its lines ask for up to", "too_much_work")
        assert "(40 lines x 2 hypotheses" in reply.json()["error"] and reply.json()["error"].endswith(
            "; send a shorter file")  # not "a smaller beam": a file takes the model's
    finally:
        c.__exit__(None, None, None)
