"""`xattn serve`: the request edge cases (nesting, repeated keys, invalid bytes in a form, settings that cannot
hold together, work over its bound), what LibreTranslate accepts and clients send (fields in the query string,
`alternatives` as text, an empty format, `secret`, `?api_key=`), the access log and /metrics."""
import asyncio
import json
import logging

import pytest

pytest.importorskip("fastapi", reason="the serve extra (pip install -e '.[serve]')")
from starlette.datastructures import Headers  # noqa: E402
from starlette.requests import ClientDisconnect  # noqa: E402

from xattn.serve.app import create_app  # noqa: E402
from xattn.serve.reading import read_request  # noqa: E402
from xattn.serve.limits import ApiError, Limits  # noqa: E402

from test_serve import error, started  # noqa: E402


@pytest.fixture(scope="module")
def client(numbers_model):
    c = started(create_app(str(numbers_model)))
    yield c
    c.__exit__(None, None, None)


@pytest.fixture(scope="module")
def keyed(numbers_model):
    c = started(create_app(str(numbers_model), api_key="s3cret"))
    yield c
    c.__exit__(None, None, None)


def post_raw(client, body: bytes, kind: str = "application/json", url: str = "/translate"):
    return client.post(url, content=body, headers={"Content-Type": kind})


@pytest.mark.parametrize("body, kind, status, fragment", [
    (b"[" * 20_000 + b"]" * 20_000, "application/json", 422, "body: nested too deeply"),
    (b'{"q": "drei", "q": "vier"}', "application/json", 422, "q: given twice in the body"),
    (b'{"q": "drei", "beam_size": {"a": 1, "a": 2}}', "application/json", 422,
     "beam_size: 'a': given twice in the body"),  # the field it is in (it named `a` alone)
    (b'{"q": ["drei", {"x": {"a": 1, "a": 2}}]}', "application/json", 422, "q[1].x: 'a': given twice"),
    (b'{"q": "drei", "sampling": true, "num_samples": 2, "n_best": 8}', "application/json", 422,
     "n_best: applies to beam search, not to sampling"),  # not "raise the beam", which sampling then refuses
    (b'{"q": "drei", "beam_size": NaN}', "application/json", 422, "NaN is not JSON"),
    (b"q=vier%FFzig", "application/x-www-form-urlencoded", 422, "q: not UTF-8 once percent-decoded"),
    (b"q=vier&q", "application/x-www-form-urlencoded", 422, "q: given without `=` and a value (body)"),
    (b"q=vier%2zig", "application/x-www-form-urlencoded", 422, "q: a malformed percent escape '%2z' (body)"),
    (b'{"q": "drei", "min_len": 40}', "application/json", 422, "min_len: 40 is above the 14 output tokens"),
    (json.dumps({"q": ["drei"] * 32, "beam_size": 16, "max_len_b": 500}).encode(), "application/json", 413,
     "over the limit of 256000"),
    (b'{"q": "drei \\u0000"}', "application/json", 422, "q[0]: holds a NUL character"),
    (b'{"q": "drei", "sampling": true, "temperature": 1e400}', "application/json", 422,
     "temperature: too large a number"),
    (b'{"q": "drei", "sampling": true, "seed": 1' + b"0" * 5000 + b"}", "application/json", 422,
     "seed: too large a number"),
    (b'{"q": "drei", "sampling": true, "seed": -1}', "application/json", 422,
     "seed: must be in [0, 9223372036854775807]"),
    ('{"q": "drei", "alternatives": "\u00b3"}'.encode(), "application/json", 422, "alternatives: '³' is not a whole"),
    (b'{"q": "drei", "max_len_a": 0.1, "max_len_b": 0}', "application/json", 422,
     "q[0]: max_len_b: the maximum output length leaves a sentence of"),
    (b'{"q": "drei", "api_key": "\\udc80"}', "application/json", 422, "api_key: holds a lone surrogate"),
    (b'{"q": ["drei", 2]}', "application/json", 422, "q[1]: Input should be a valid string"),
    (b'{"q": "drei", "": 5}', "application/json", 422, '"": Extra inputs are not permitted'),  # was "body: ..."
    (b'{"q": "drei", "' + b"x" * 50_000 + b'": 5}', "application/json", 422,  # the 50 KB name came back whole
     "x" * 60 + "… (50000 characters): Extra inputs are not permitted"),
    (b"q=drei&=5", "application/x-www-form-urlencoded", 422, '"": Extra inputs are not permitted'),
    (b'{"q": "drei", "extra": {"x": [1e400]}}', "application/json", 422, "extra.x[0]: too large a number"),
    (b'--b\r\nContent-Disposition: form-data; name=q\r\n\r\nEin \xff Hund\r\n--b--\r\n',
     "multipart/form-data; boundary=b", 422, "q: not UTF-8 (multipart/form-data)"),
    (b"q=drei&beam_size=1_0", "application/x-www-form-urlencoded", 422, "beam_size: '1_0' is not a whole number"),
    (b"q=drei&alignment=maybe", "application/x-www-form-urlencoded", 422, "alignment: 'maybe' is not true or false"),
    (b'{"q": "drei"}', "application/x-www-form-urlencoded", 422, "body: JSON, sent as a form"),
    (b'--b\r\nContent-Disposition: form-data; name="q"\r\n\r\nEin \xff Hund\r\n--b--\r\n',
     "multipart/form-data; boundary=b", 422, "q: not UTF-8 (multipart/form-data)"),
    (b'--b\r\nContent-Disposition: form-data; name="sour\xffce"\r\n\r\nde\r\n--b--\r\n',
     "multipart/form-data; boundary=b", 422, "a multipart field name: not UTF-8"),
    (b'--b\r\nContent-Disposition: form-data; name="q"\r\n\r\nEin Hund.\r\n--b\r\nContent-Disposition: form-data; '
     b'name="alignment"\r\n\r\ntrue', "multipart/form-data; boundary=b", 422,  # 200 without alignment, before
     "body: the multipart form ends before its closing boundary"),
    (b'--b\r\nContent-Disposition: form-data; name="q"\r\n\r\nEin Hund.\r\n--b\r\nContent-Disp',
     "multipart/form-data; boundary=b", 422, "the multipart form ends before its closing boundary"),
    (b'--b\r\nContent-Disposition: form-data; name="q"\r\nContent-Transfer-Encoding: base64\r\n\r\nRWluIEh1bmQu\r\n'
     b'--b--\r\n', "multipart/form-data; boundary=b", 422, "q: Content-Transfer-Encoding base64 is not supported"),
    # the Content-Type read as the parser reads it: RFC 2231's boundary*= and charset*= are left out (a 500 with a
    # traceback), and of two boundaries the last is the parser's (the checks read the first: Latin-1 went through)
    (b'--b\r\nContent-Disposition: form-data; name="q"\r\n\r\nEin Hund.\r\n--b--\r\n',
     "multipart/form-data; boundary*=utf-8''b", 422, "body: Missing boundary in multipart"),
    (b'--b\r\nContent-Disposition: form-data; name="q"\r\n\r\nEin \xe4 Hund.\r\n--b--\r\n',
     "multipart/form-data; boundary=b; charset*=utf-8''latin-1", 422, "q: not UTF-8 (multipart/form-data)"),
    (b'--d\r\nContent-Disposition: form-data; name="q"\r\n\r\nEin Hund l\xe4uft.\r\n--d--\r\n--a\r\n'
     b'Content-Disposition: form-data; name="x"\r\n\r\ny\r\n--a--\r\n', "multipart/form-data; boundary=a; boundary=d",
     422, "q: not UTF-8 (multipart/form-data)"),
])
def test_bodies_that_cannot_be_taken_as_sent_are_a_4xx_naming_the_field(client, body, kind, status, fragment):
    error(post_raw(client, body, kind), status, fragment)


def test_null_is_an_optional_field_left_out_whichever_it_is(client):
    plain = client.post("/translate", json={"q": "drei"}).json()
    nulls = dict.fromkeys(("source", "target", "format", "alternatives", "attention", "alignment", "api_key", "secret",
                           "beam_size", "min_len"))
    reply = client.post("/translate", json={"q": "drei", **nulls})
    assert reply.status_code == 200 and reply.json() == plain, reply.text
    error(client.post("/translate", json={"q": None}), 422, "q: ")  # a required one stays required


def test_two_content_types_are_a_422_not_the_first_one(client):
    headers = [(b"Content-Type", b"application/json"), (b"Content-Type", b"application/x-www-form-urlencoded")]
    error(client.post("/translate", content=b'{"q": "drei"}', headers=headers), 422, "Content-Type: given 2 times")


def test_a_request_within_every_other_limit_is_bounded_by_its_work(client):
    reply = client.post("/translate", json={"q": ["drei"] * 32, "beam_size": 16, "max_len_b": 500})
    error(reply, 413, "32 texts x 16 hypotheses", "too_much_work")
    assert client.post("/translate", json={"q": ["drei"] * 32, "beam_size": 5}).status_code == 200
    # alternatives beyond the model's beam widen a second search, after the first: both count (only the wider did)
    reply = client.post("/translate", json={"q": ["drei"] * 32, "alternatives": 7, "max_len_b": 259})  # 8 alone: 206,080
    error(reply, 413, "32 texts x 2 + 8 hypotheses", "too_much_work")
    assert client.post("/translate", json={"q": ["drei"] * 32, "beam_size": 8, "max_len_b": 259}).status_code == 200


def test_the_work_bound_weighs_each_output_token_by_its_position(client):
    """A step reads every position before it, so at position 500 a row costs about 8x what it does at the start:
    12 texts x beam 16 x 512 tokens (98,304 rows x steps, within the old bound of 100,000) ran past the 30 s
    timeout; 32 x 16 x 195 (99,840) took about 20 s. By positions, the first is refused and the second is not."""
    from xattn.serve.work import REACH, positioned

    assert positioned(1) == 1 and positioned(REACH) == REACH + (REACH + 1) // 2  # the last token there weighs 2
    long = {"q": ["drei"] * 12, "beam_size": 16, "min_len": 500, "max_len_a": 0, "max_len_b": 512}
    error(client.post("/translate", json=long), 413, "the request asks for up to 492288 units of decoding work "
          "(12 texts x 16 hypotheses x their maximum output tokens, a token at position t weighing 1 + t/64), over "
          "the limit of 256000", "too_much_work")


def test_an_empty_text_has_no_minimum_length_to_reach(client):
    """An empty text is translated empty whatever min_len says (as translate does): the other texts' maximum
    lengths bound min_len, not its own."""
    refused = client.post("/translate", json={"q": "drei", "min_len": 1000}).json()["error"]
    most = int(refused.split("is above the ")[1].split(" ")[0])  # the longest output "drei" may have
    reply = client.post("/translate", json={"q": ["", "drei"], "min_len": most})
    assert reply.status_code == 200, reply.text
    assert reply.json()["translatedText"][0] == ""
    error(client.post("/translate", json={"q": ["", "drei"], "min_len": most + 1}), 422,
          f"q[1]: min_len: {most + 1} is above the {most} output tokens the maximum output length allows")


def test_fields_in_the_query_string_as_deep_translator_sends_them(client):
    reply = client.post("/translate?q=drei&source=de&target=en&format=text")  # no body at all
    assert reply.status_code == 200, reply.text
    assert reply.json()["translatedText"] == client.post("/translate", json={"q": "drei"}).json()["translatedText"]
    error(client.post("/translate?q=drei", json={"q": "vier"}), 422, "q: given in both the query string and the body")
    error(client.post("/translate?q=vier%FFzig"), 422, "q: not UTF-8 once percent-decoded (query string)")
    error(client.post("/translate?q=drei&source=de&q"), 422, "q: given without `=` and a value (query string)")
    error(client.post("/translate?q=drei%ZZ&source=de"), 422, "q: a malformed percent escape '%ZZ' (query string)")
    long = "A" * 30_000  # a field's name is shown cut, as everywhere (the whole name came back)
    for url, fragment in ((f"/translate?{long}", "given without `=`"), (f"/translate?{long}=%ZZ", "a malformed percent"),
                          (f"/translate?q=drei&{long}=%FF", "not UTF-8 once percent-decoded")):
        reply = client.post(url)
        assert reply.status_code == 422 and len(reply.content) < 300 and fragment in reply.json()["error"], reply.text[:200]
        assert reply.json()["error"].startswith("A" * 60 + "… (30000 characters): ")
    reply = client.post("/translate?q=drei&&source=de&")  # empty fields: nothing
    assert reply.status_code == 200 and reply.json()["translatedText"] == client.post(
        "/translate", json={"q": "drei"}).json()["translatedText"]


def test_query_string_fields_beside_a_json_body_are_read_as_text(client):
    reply = client.post("/translate?beam_size=3&alignment=true", json={"q": "drei"})
    assert reply.status_code == 200, reply.text
    assert "alignment" in reply.json()["results"][0]
    assert reply.json()["translatedText"] == client.post("/translate", json={"q": "drei", "beam_size": 3}).json()[
        "translatedText"]
    for fields in (b"q=drei&beam_size=3&alignment=on", b"q=drei&beam_size=3.0&alignment=t"):  # as pydantic read them
        form = post_raw(client, fields, "application/x-www-form-urlencoded")
        assert form.status_code == 200 and "alignment" in form.json()["results"][0], form.text
    error(post_raw(client, b"q=drei&sampling=1&temperature=1e400", "application/x-www-form-urlencoded"), 422,
          "temperature: '1e400' is too large a number")


def test_every_route_refuses_a_body_that_is_not_an_object_of_valid_text(client):
    for url in ("/translate", "/translate_file", "/detect"):
        for body in (b"[1]", b"null", b'"drei"', b"7"):
            reply = post_raw(client, body, url=url)
            assert reply.status_code == 422, (url, body, reply.text)
        assert post_raw(client, b"", url=url).status_code == 422  # nothing at all: the field it needs is named
    error(post_raw(client, b'{"q": "drei \\ud800"}', url="/detect"), 422, "q: holds a lone surrogate ('\\ud800')")
    error(client.post("/translate", content=b'{"q": "drei"}', headers={"Content-Type": "application/json",
                                                                        "Content-Encoding": "gzip"}),
          415, "Content-Encoding: gzip is not supported", "unsupported_media")
    twice = [("Content-Type", "application/json"), ("Content-Encoding", "identity"), ("Content-Encoding", "gzip")]
    error(client.post("/translate", content=b'{"q": "drei"}', headers=twice), 415, "Content-Encoding: gzip")
    too_large = post_raw(client, b"x" * 200_000)
    assert too_large.status_code == 413 and too_large.headers["connection"] == "close"  # its body is left unread
    for path in ("/health", "/", "/languages", "/info", "/metrics"):
        assert client.head(path).status_code == 200, path
    error(client.post("/translate/", json={"q": "drei"}), 404, "")  # not an empty 307


def test_alternatives_never_change_the_first_translation_of_a_seeded_sampling_request(client):
    texts = ["drei", "vier hundert", "sieben und zwanzig", "neun tausend", "zwei", "acht und achtzig"]
    alone = client.post("/translate", json={"q": texts, "sampling": True, "seed": 3}).json()
    asked = client.post("/translate", json={"q": texts, "sampling": True, "seed": 3, "alternatives": 2}).json()
    assert asked["translatedText"] == alone["translatedText"]
    assert all(len(alts) <= 2 for alts in asked["alternatives"]) and any(asked["alternatives"])


def test_what_libretranslate_accepts_is_accepted(client):
    reply = client.post("/translate", json={"q": "drei", "alternatives": "2", "format": "", "secret": "x"})
    assert reply.status_code == 200, reply.text
    assert len(reply.json()["alternatives"]) == 2
    error(client.post("/translate", json={"q": "drei", "alternatives": "zwei"}), 422, "alternatives")
    # LibreTranslate's int(alternatives) takes the number 2.0 too (refused here while the text "2.0" was taken)
    assert len(client.post("/translate", json={"q": "drei", "alternatives": 2.0}).json()["alternatives"]) == 2
    error(client.post("/translate", json={"q": "drei", "alternatives": 2.5}), 422, "alternatives")


def test_the_key_may_come_in_the_query_string(keyed):
    assert keyed.post("/translate?api_key=s3cret", json={"q": "drei"}).status_code == 200
    for body_key, bearer in (("s3cret", "a-proxy-token"), ("other", "s3cret")):  # either may hold it
        reply = keyed.post("/translate", json={"q": "drei", "api_key": body_key},
                           headers={"Authorization": f"Bearer {bearer}"})
        assert reply.status_code == 200, reply.text
    error(keyed.post("/translate", json={"q": "drei", "api_key": "x"}, headers={"Authorization": "Bearer y"}), 403,
          "invalid API key")
    error(post_raw(keyed, b'{"q": "drei", "api_key": "\\ud800"}'), 422, "api_key: holds a lone surrogate")
    error(keyed.post("/translate?api_key=wrong", json={"q": "drei"}), 403, "invalid API key")
    assert keyed.post("/translate?api_key=s3cret&q=drei").status_code == 200
    for headers in ([("Authorization", "Bearer a-proxy-token"), ("Authorization", "Bearer s3cret")],
                    [("Authorization", "Bearer s3cret"), ("Authorization", "Bearer a-proxy-token")]):
        assert keyed.post("/translate", json={"q": "drei"}, headers=headers).status_code == 200  # any header, in any order
    headers = [("Authorization", "Bearer x"), ("Authorization", "Basic s3cret")]  # only Bearer tokens count
    error(keyed.post("/translate", json={"q": "drei"}, headers=headers), 403, "invalid API key")


def test_a_key_beyond_ascii_works_in_a_header_sent_as_utf8_or_as_latin1(numbers_model):
    """A header's bytes arrive decoded as Latin-1: curl sends `Bearer sécret` as UTF-8 (403 before), requests as
    Latin-1; both give the key, as the body and the query string do."""
    keyed = started(create_app(str(numbers_model), api_key="sécret"))
    try:
        for raw in ("Bearer sécret".encode(), "Bearer sécret".encode("latin-1")):
            reply = keyed.post("/translate", json={"q": "drei"}, headers=[(b"Authorization", raw)])
            assert reply.status_code == 200, (raw, reply.text)
        assert keyed.post("/translate", json={"q": "drei", "api_key": "sécret"}).status_code == 200
        error(keyed.post("/translate", json={"q": "drei"}, headers=[(b"Authorization", "Bearer secret".encode())]),
              403, "invalid API key")
    finally:
        keyed.__exit__(None, None, None)


def test_too_many_texts_in_a_multipart_form_are_a_413_as_in_json(client):
    """Past 64 parts the multipart parser's own 422 ("Too many fields") came first, where JSON, a form and the query
    string get the 413 of too many texts."""
    for texts in (33, 70):
        reply = client.post("/translate", files=[("q", (None, "drei"))] * texts)
        assert reply.status_code == 413 and reply.json() == {"error": f"q: {texts} texts, over the limit of 32",
                                                             "error_type": "too_many_items"}, reply.text


def counter(text: str, name: str) -> int:
    return int(next(line for line in text.splitlines() if line.startswith(name + " ")).split()[1])


def test_every_request_is_one_log_line_and_counted_in_metrics(client, caplog):
    before = client.get("/metrics").text  # (the module's client served other tests' requests)
    with caplog.at_level(logging.INFO, logger="xattn.serve.access"):
        assert client.post("/translate", json={"q": ["drei", "vier"], "beam_size": 1}).status_code == 200
        assert client.post("/translate", json={"q": "drei", "beam_size": 0}).status_code == 422
        # a malformed field, refused before the others were read: its line had neither texts nor characters
        assert client.post("/translate", json={"q": "vier", "beam_size": "3"}).status_code == 422
        assert client.post("/detect", json={"q": ["vier", "sechs"], "colour": "red"}).status_code == 422
        assert client.post("/translate_file", data={"colour": "red"}, files={"file": ("b.txt", b"acht\n")}).status_code \
            == 422
        assert client.post("/translate", json={"q": 5}).status_code == 422  # no text: neither
        # refused while the fields were read (a key twice, a number too large, a bad escape in the query string, a
        # field in both): read leniently for the line; they had neither
        for kwargs in (dict(content=b'{"q": "vier", "beam_size": 3, "beam_size": 4}'),
                       dict(content=b'{"q": "vier", "beam_size": 1e400}'),
                       dict(content=b"q=vier&beam_size=3&beam_size=4",
                            headers={"Content-Type": "application/x-www-form-urlencoded"}),
                       dict(params={"beam_size": "3"}, json={"q": "vier", "beam_size": 3})):
            assert client.post("/translate", **kwargs).status_code == 422, kwargs
        assert client.post("/translate?beam_size=%ZZ", json={"q": "vier"}).status_code == 422
        assert client.get("/no/such/page").status_code == 404
        assert client.post("/detect", json={"q": ["drei", "vier"]}).status_code == 200
        assert client.post("/translate", json={"q": ["x" * 3000] * 2}).status_code == 413
        big = "Ein\x0cHund.\n\n" + "x" * 6000  # two lines: a line ends at \n alone (not at \x0c, as splitlines)
        assert client.post("/translate_file", files={"file": ("a.txt", big.encode())}).status_code == 413
    lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == "xattn.serve.access"]
    refused_file = next(x for x in lines if x["route"] == "/translate_file" and x["status"] == 413)
    assert refused_file["status"] == 413 and refused_file["texts"] == 2 and refused_file["characters"] == len(big)
    refused = [x for x in lines if x["status"] == 422]  # the texts and characters of every line, refused too
    assert [(x["route"], x.get("texts"), x.get("characters")) for x in refused] == [
        ("/translate", 1, 4), ("/translate", 1, 4), ("/detect", 2, 9), ("/translate_file", 1, 5),
        ("/translate", None, None), *[("/translate", 1, 4)] * 5]
    assert not any("batch" in x for x in refused)
    detected = next(x for x in lines if x["route"] == "/detect" and x["status"] == 200)
    assert detected["texts"] == 2 and detected["characters"] == 8
    large = next(x for x in lines if x["status"] == 413)
    assert large["texts"] == 2 and large["characters"] == 6000
    ok = next(x for x in lines if x["status"] == 200)
    assert ok["route"] == "/translate" and ok["texts"] == 2 and ok["characters"] == 8 and ok["batch"] == "stream"
    assert ok["model"] == "de-en"
    assert ok["output_tokens"] > 0 and ok["ms"] > 0 and isinstance(ok["id"], int)
    assert {"/translate", "other"} <= {x["route"] for x in lines}
    text = client.get("/metrics").text
    assert 'xattn_requests_total{route="/translate",status="200"}' in text
    assert 'xattn_requests_total{route="/translate",status="422"}' in text
    assert 'xattn_requests_total{route="other",status="404"}' in text
    assert 'xattn_request_seconds_bucket{route="/translate",le="+Inf"}' in text
    assert 'xattn_stream_sentences_count{model="de-en"}' in text and 'xattn_queue_depth{model="de-en"} 0' in text
    assert 'xattn_model_ready{model="de-en"} 1' in text
    assert int(next(line for line in text.splitlines()
                    if line.startswith('xattn_output_tokens_total{model="de-en"}')).split()[1]) > 0
    answered = [x for x in lines if x["status"] == 200 and x.get("model") == "de-en"]  # the counters: theirs only
    for metric, field in (("xattn_texts_total", "texts"), ("xattn_characters_total", "characters")):
        name = f'{metric}{{model="de-en"}}'
        assert counter(text, name) - counter(before, name) == sum(x[field] for x in answered) > 0


def test_a_client_gone_mid_body_is_a_499_with_no_line_of_its_own(caplog):
    """Its access line (status 499, error client_gone) is the one line it gets (test_serve_connections.py)."""
    class Gone:
        method, scope = "POST", {"query_string": b""}
        headers = Headers({"content-type": "application/json"})

        class url:
            path = "/translate"

        async def stream(self):
            yield b'{"q": "dr'
            raise ClientDisconnect()

    with caplog.at_level(logging.INFO, logger="xattn.serve"):
        with pytest.raises(ApiError) as e:
            asyncio.run(read_request(Gone(), Limits()))
    assert e.value.error_type == "client_gone" and e.value.status == 499
    assert caplog.records == []


def test_a_server_bug_is_a_json_500_with_cors_an_access_line_and_a_one_line_traceback(numbers_model, caplog):
    """An exception no handler answers (here a route that raises): the JSON error of every answer, with the CORS
    headers the page needs to read it, `error: internal` in its access line, and the traceback as one JSON line of
    the log (Starlette's handler of last resort answered outside both, logging some 85 plain lines)."""
    app = create_app(str(numbers_model), cors_origin="http://page.example")

    async def boom():
        raise RuntimeError("a bug")
    app.add_api_route("/boom", boom)
    c = started(app)
    try:
        with caplog.at_level(logging.INFO, logger="xattn.serve"):
            reply = c.get("/boom", headers={"Origin": "http://page.example"})
    finally:
        c.__exit__(None, None, None)
    assert reply.status_code == 500 and reply.json() == {"error": "internal error (RuntimeError)",
                                                         "error_type": "internal"}
    assert reply.headers["access-control-allow-origin"] == "http://page.example"
    lines = [json.loads(r.getMessage()) for r in caplog.records if r.name.startswith("xattn.serve")]
    access = next(x for x in lines if x.get("route") == "/boom")
    bug = next(x for x in lines if x.get("event") == "internal_error")
    assert access["status"] == 500 and access["error"] == "internal"
    assert bug["id"] == access["id"] and "RuntimeError: a bug" in bug["traceback"]
    assert all("\n" not in r.getMessage() for r in caplog.records if r.name.startswith("xattn.serve"))
