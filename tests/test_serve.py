"""`xattn serve` through an in-process client: every endpoint, every error status, LibreTranslate's fields,
and the batcher (concurrent requests share translate calls, each gets what translate([its text]) gives)."""
import dataclasses
import json
import logging
import math
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

pytest.importorskip("fastapi", reason="the serve extra (pip install -e '.[serve]')")
from fastapi.testclient import TestClient  # noqa: E402

import xattn  # noqa: E402
from xattn.serve import models as models_module  # noqa: E402
from xattn.serve.app import create_app  # noqa: E402
from xattn.serve.limits import Limits  # noqa: E402


def started(app) -> TestClient:
    client = TestClient(app)
    client.__enter__()
    for _ in range(3000):  # a bound against hanging (the model and the language identifier load), not a timing check
        if client.get("/health").status_code == 200:
            return client
        time.sleep(0.02)
    raise AssertionError(client.get("/health").json())


@pytest.fixture(scope="module")
def client(numbers_model):
    c = started(create_app(str(numbers_model)))
    yield c
    c.__exit__(None, None, None)


def error(response, status: int, fragment: str, error_type: str | None = None):
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error", "error_type"} and fragment in body["error"], body
    assert error_type is None or body["error_type"] == error_type


def test_translate_answers_like_libretranslate_and_like_translate(client, numbers_model):
    translator = xattn.load(numbers_model)
    expected = translator.translate(["drei"], translator.decode_config)[0]
    r = client.post("/translate", json={"q": "drei", "source": "de", "target": "en"})
    assert r.status_code == 200
    body = r.json()
    assert body["translatedText"] == expected.text and "detectedLanguage" not in body and "alternatives" not in body
    result = body["results"][0]
    assert result["source_tokens"] == expected.src_tokens and result["target_tokens"] == expected.tgt_tokens
    assert result["source_words"] == ["drei"] and "attention" not in result and "alignment" not in result
    form = client.post("/translate", data={"q": "drei", "source": "auto", "target": "en"}).json()
    assert form["translatedText"] == expected.text
    assert form["detectedLanguage"]["language"] == "de"  # the model's, with the identifier's confidence in it
    assert 0 <= form["detectedLanguage"]["confidence"] <= 100
    many = client.post("/translate", json={"q": ["drei", "vier"], "source": "auto", "target": "en",
                                           "alternatives": 2}).json()
    assert isinstance(many["translatedText"], list) and len(many["alternatives"]) == 2
    assert all(len(a) == 2 for a in many["alternatives"]) and len(many["detectedLanguage"]) == 2


def test_alternatives_never_change_the_first_translation(client):
    """The model's beam is 2: three alternatives come from a wider search, the first from the model's own."""
    texts = ["drei", "vier", "siebenhundertzwölf", "einundzwanzig", "neun"]
    plain = client.post("/translate", json={"q": texts}).json()["translatedText"]
    for alternatives in (1, 3, 7):
        body = client.post("/translate", json={"q": texts, "alternatives": alternatives}).json()
        assert body["translatedText"] == plain
        for first, alts in zip(body["translatedText"], body["alternatives"]):
            assert len(alts) == alternatives and first not in alts and len(set(alts)) == alternatives


def test_a_greedy_models_alternatives_take_the_beams_settings_the_first_translation_does_not_use(numbers_model,
                                                                                                 tmp_path):
    """A model that searches greedily: the beam settings of a request asking for alternatives (coverage_penalty,
    stopping) go to the wider search that finds them; the first translation is the model's greedy one."""
    import shutil

    greedy = tmp_path / "greedy"
    shutil.copytree(numbers_model, greedy)
    config = (greedy / "config.yaml").read_text()
    (greedy / "config.yaml").write_text(config.replace("  beam_size: 2\n", "  beam_size: 1\n"))
    c = started(create_app(str(greedy)))
    try:
        plain = c.post("/translate", json={"q": ["drei", "vier"]}).json()["translatedText"]
        for extra in ({"coverage_penalty": 0.2}, {"stopping": "early"}):
            reply = c.post("/translate", json={"q": ["drei", "vier"], "alternatives": 2, **extra})
            assert reply.status_code == 200, reply.text
            assert reply.json()["translatedText"] == plain
    finally:
        c.__exit__(None, None, None)


def test_constraints_that_leave_no_token_are_a_result_that_says_so(client):
    for extra in ({"beam_size": 1}, {"beam_size": 2}, {"sampling": True, "seed": 1}):
        r = client.post("/translate", json={"q": ["drei", "vier"], "no_repeat_ngram_size": 1, "min_len": 200,
                                            "max_len_b": 300, **extra})
        assert r.status_code == 200, r.text
        assert all(res["relaxed"] is True and math.isfinite(res["score"]) for res in r.json()["results"])
    assert "relaxed" not in client.post("/translate", json={"q": "drei"}).json()["results"][0]


def test_attention_and_alignment_on_request(client, numbers_model):
    translator = xattn.load(numbers_model)
    expected = translator.translate(["sieben hundert"], translator.decode_config, return_attention=True)[0]
    full = client.post("/translate", json={"q": "sieben hundert", "attention": "full", "alignment": True}).json()
    result = full["results"][0]
    L, H, T, S = expected.cross_attention.shape
    assert [len(result["attention"]), len(result["attention"][0]), len(result["attention"][0][0])] == [L, H, T]
    assert result["attention"][0][0][0] == pytest.approx(expected.cross_attention[0, 0, 0].tolist(), abs=1e-4)
    assert all(0 <= i < 2 and 0 <= j < len(result["target_words"]) for i, j in result["alignment"])
    mean = client.post("/translate", json={"q": "sieben hundert", "attention": "mean"}).json()["results"][0]
    assert mean["attention"][0][0] == pytest.approx(expected.cross_attention[0, :, 0].mean(0).tolist(), abs=1e-4)


def test_languages_info_health_openapi_and_the_page(client):
    assert client.get("/languages").json() == [{"code": "de", "name": "German", "targets": ["en"]},
                                                {"code": "en", "name": "English", "targets": []}]
    info = client.get("/info").json()
    assert info["source"] == "de" and info["target"] == "en" and info["limits"]["max_items"] == 32
    assert client.get("/health").json() == {"status": "ok", "models": [{"model": "model", "source": "de",
                                                                         "target": "en", "status": "ready"}]}
    assert info["models"] == [{k: v for k, v in info.items() if k not in ("models", "limits", "api_key_required")}]
    schema = client.get("/openapi.json").json()
    assert "q" in schema["paths"]["/translate"]["post"]["requestBody"]["content"]["application/json"]["schema"][
        "properties"]
    for path, kind in (("/", "text/html"), ("/static/app.js", "text/javascript"), ("/static/app.css", "text/css"),
                       ("/static/heatmap.js", "text/javascript"), ("/static/heatmap.css", "text/css"),
                       ("/static/favicon.svg", "image/svg+xml")):
        page = client.get(path)
        assert page.status_code == 200 and "default-src 'self'" in page.headers["content-security-policy"]
        assert page.headers["content-type"].startswith(kind)
        assert page.headers["cache-control"] == "no-cache" and page.headers["x-content-type-options"] == "nosniff"
        # revalidated: the same ETag gets a 304 with no body (it got the whole file again), another one the file
        same = client.get(path, headers={"If-None-Match": f'"x", W/{page.headers["etag"]}'})
        assert same.status_code == 304 and same.content == b"" and same.headers["etag"] == page.headers["etag"]
        assert client.get(path, headers={"If-None-Match": "*"}).status_code == 304  # any version
        assert client.get(path, headers={"If-None-Match": '"other"'}).content == page.content
        text = page.text.replace("http://www.w3.org/2000/svg", "")  # the SVG namespace is a name, not a request
        assert "http://" not in text and "https://" not in text and "//cdn" not in text
    assert '<link rel="icon" href="/static/favicon.svg"' in client.get("/").text
    assert client.get("/docs").status_code == 404  # no interactive docs page: it would load its assets from a CDN
    error(client.get("/static/../app.py"), 404, "")


@pytest.mark.parametrize("body, status, fragment, error_type", [
    ({"q": "drei", "target": "fr"}, 400, "target: French (fr) is not supported; this server translates de→en",
     "unsupported_language"),
    ({"q": "drei", "source": "de", "target": "fr"}, 400, "target: French (fr) is not available as a target language "
     "from German (de); this server translates de→en", "unsupported_language"),
    ({"q": "drei", "source": "cs"}, 400, "source: Czech (cs) is not supported; this server translates de→en (or give "
     "source auto)", "unsupported_language"),
    ({"q": "drei", "source": "xx"}, 400, "source: 'xx' is not supported", "unsupported_language"),
    ({"q": "drei", "format": "xml"}, 400, "format: 'xml' is not supported; send text or html", "unsupported_format"),
    ({"q": "drei", "format": "html", "alternatives": 1}, 422, "alternatives: not available with format html",
     "invalid_request"),
    ({"q": "<p>drei</p>", "format": "html", "alignment": True}, 422, "alignment: not available with format html",
     "invalid_request"),
    ({"q": ["<p>eins</p>", "<p>zwei</p><p>" + "drei " * 300 + "</p>"], "format": "html"}, 413,
     "q[1]: block 2: 300 source tokens, over the limit of 256", "too_many_tokens"),
    ({"q": ["eins"] * 33}, 413, "q: 33 texts, over the limit of 32", "too_many_items"),
    ({"q": "drei " * 1001}, 413, "characters, over the limit of 5000", "too_many_characters"),
    ({"q": "drei " * 300}, 413, "q[0]: 300 source tokens, over the limit of 256", "too_many_tokens"),
    ({"q": "drei", "beam_size": 17}, 422, "beam_size: 17, over the limit of 16", "limit_exceeded"),
    ({"q": "drei", "beam_size": 0}, 422, "beam_size: must be in [1, 1024]", "invalid_request"),
    ({"q": "drei", "n_best": 9, "beam_size": 9}, 422, "n_best: 9, over the limit of 8", "limit_exceeded"),
    ({"q": "drei", "sampling": True, "num_samples": 9}, 422, "num_samples: 9, over the limit of 8", "limit_exceeded"),
    ({"q": "drei", "max_len_b": 600}, 422, "over the limit of 512", "limit_exceeded"),
    ({"q": "drei", "max_len_a": 500, "max_len_b": 12, "min_len": 1000}, 422,  # the source's </s> counts, as in search
     "max_len_b: max_len_a * 2 source tokens (q[0] and </s>) + max_len_b allows 1012 output tokens, over the limit of "
     "512", "limit_exceeded"),
    ({"q": "drei", "max_len_a": 5, "max_len_b": 503}, 422, "allows 513 output tokens, over the limit of 512",
     "limit_exceeded"),
    ({"q": "drei", "beem_size": 2}, 422, "beem_size: Extra inputs are not permitted", "invalid_request"),
    ({"q": 5}, 422, "q: expected a text or a list of texts, got int", "invalid_request"),  # ("a valid string")
    ({"source": "de"}, 422, "q: Field required", "invalid_request"),
    ({"q": []}, 422, "q: an empty list", "invalid_request"),
    ({"q": "drei", "attention": "some"}, 422, "attention: Input should be 'none', 'mean' or 'full'", "invalid_request"),
    ([1, 2], 422, "must be a JSON object", "invalid_request"),
    ({"q": "drei", "beam_size": 2, "alternatives": 3}, 422, "beam_size: 2 is too few for 3 alternatives",
     "invalid_request"),
    ({"q": "drei", "n_best": 2, "beam_size": 4, "alternatives": 3}, 422, "n_best: 2 is too few", "invalid_request"),
    ({"q": "drei", "temperature": 0.5}, 422, "temperature: applies to sampling only", "invalid_request"),
    ({"q": "drei", "beam_size": 1, "coverage_penalty": 0.2}, 422,
     "coverage_penalty: applies to beam search with beam_size 2 or more", "invalid_request"),
    ({"q": "drei", "beam_size": True}, 422, "beam_size: Input should be a valid integer", "invalid_request"),
    ({"q": "drei", "beam_size": "3"}, 422, "beam_size: Input should be a valid integer", "invalid_request"),
    ({"q": "drei", "sampling": True, "beam_size": 3}, 422, "beam_size: applies to beam search, not to sampling",
     "invalid_request"),
    ({"q": "drei", "length_penalty": 1e300}, 422, "length_penalty: must be in [0, 10]", "invalid_request"),
    ({"q": "drei", "coverage_penalty": 1e300}, 422, "coverage_penalty: must be in [0, 10]", "invalid_request"),
    ({"q": "drei", "shortlist": True}, 422, "shortlist: this model has no shortlist", "invalid_request"),
])
def test_every_client_mistake_is_a_json_error_with_its_status(client, body, status, fragment, error_type):
    error(client.post("/translate", json=body), status, fragment, error_type)


def test_malformed_and_oversized_bodies(client):
    error(client.post("/translate", content=b"{bad json", headers={"Content-Type": "application/json"}), 422,
          "body: not valid JSON", "invalid_request")
    error(client.post("/translate", content=b"\xff\xfe", headers={"Content-Type": "application/x-www-form-urlencoded"}),
          422, "not UTF-8")
    error(client.post("/translate", content=b"x" * 200_000, headers={"Content-Type": "application/json"}), 413,
          "the body is over", "too_large")
    error(client.get("/translate"), 405, "Method Not Allowed", "method_not_allowed")
    refused = client.post("/health")
    assert refused.status_code == 405 and refused.headers["allow"] == "GET, HEAD"  # (HEAD was left out)
    assert client.get("/translate").headers["allow"] == "POST"
    json_body = {"Content-Type": "application/json"}
    for raw in (b"null", b"null ", b"[1]", b'"drei"', b"5", b"true"):  # a JSON null is a body, not no body
        for route in ("/translate?q=drei", "/translate", "/detect?q=drei"):
            kind = {b"[": "array", b'"': "string", b"5": "number", b"t": "boolean"}.get(raw[:1], "null")
            error(client.post(route, content=raw, headers=json_body), 422,
                  f"body: must be a JSON object of fields (or a form), not a JSON {kind}", "invalid_request")
    assert client.post("/translate?q=drei", content=b"", headers=json_body).status_code == 200  # no body: the query's
    lone_surrogate = b'{"q": "drei \\ud800"}'  # valid JSON, but no text the tokenizer can take
    error(client.post("/translate", content=lone_surrogate, headers={"Content-Type": "application/json"}), 422, "q: ",
          "invalid_request")


def test_api_key_and_cors(numbers_model, caplog):
    c = started(create_app(str(numbers_model), api_key="s3cret", cors_origin="http://example.org"))
    caplog.set_level(logging.INFO, logger="xattn.serve.access")
    try:
        error(c.post("/translate", json={"q": "drei"}), 403, "an API key is required", "unauthorized")
        error(c.post("/translate", json={"q": "drei", "api_key": "wrong"}), 403, "invalid API key", "unauthorized")
        # the key first, as LibreTranslate: a client without it learned of the fields' rules (422 naming beam_size)
        for route, body in (("/translate", {"q": "drei", "beam_size": "x"}), ("/detect", {"q": 5}),
                            ("/translate", {"q": "drei", "colour": "red", "api_key": 7})):
            error(c.post(route, json=body), 403, "an API key is required", "unauthorized")
        error(c.post("/translate_file", data={"beam_size": "x"}, files={"file": ("a.txt", b"drei\n")}), 403,
              "an API key is required", "unauthorized")
        assert c.post("/translate", json={"q": "drei", "api_key": "s3cret"}).status_code == 200
        assert c.post("/translate", json={"q": "drei"}, headers={"Authorization": "Bearer s3cret"}).status_code == 200
        ok = c.post("/translate", json={"q": "drei", "api_key": "s3cret"}, headers={"Origin": "http://example.org"})
        assert ok.headers["access-control-allow-origin"] == "http://example.org"
        assert c.get("/info").json()["api_key_required"] is True
        ask = {"Access-Control-Request-Method": "POST"}
        preflight = c.options("/translate", headers={"Origin": "http://example.org", **ask})
        assert preflight.status_code == 200 and preflight.headers["access-control-allow-origin"] == "http://example.org"
        error(c.options("/translate", headers={"Origin": "http://other.org", **ask}), 400,  # was plain text
              "CORS preflight refused: Disallowed CORS origin", "cors_refused")
        error(c.options("/translate", headers={"Origin": "http://example.org", **ask,
                                               "Access-Control-Request-Headers": "x-custom"}), 400,
              "Disallowed CORS headers", "cors_refused")
        error(c.options("/no/such/page", headers={"Origin": "http://example.org", **ask}), 404,  # was a plain 200
              "Not Found", "not_found")
        assert c.get("/openapi.json").status_code == 200
        metrics = c.get("/metrics").text  # 3 POSTs and a preflight; preflights passed by them, /openapi.json was other
        for route, status, count in (("/translate", 200, 4), ("/translate", 400, 2), ("/openapi.json", 200, 1)):
            assert f'xattn_requests_total{{route="{route}",status="{status}"}} {count}' in metrics, metrics
        assert 'route="other",status="404"' in metrics and 'route="other",status="200"' not in metrics
        lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == "xattn.serve.access"]
        assert [x.get("error") for x in lines if x["status"] == 400] == ["cors_refused"] * 2
    finally:
        c.__exit__(None, None, None)


def test_a_full_attention_response_has_a_size_limit(numbers_model):
    c = started(create_app(str(numbers_model), dataclasses.replace(Limits(), max_attention_values=1000)))
    try:
        error(reply := c.post("/translate", json={"q": ["drei vier"] * 20, "attention": "full"}), 413,
              "attention: full attention could hold up to", "too_large")
        full = int(re.search(r"up to (\d+) values", reply.json()["error"])[1])
    finally:
        c.__exit__(None, None, None)
    # mean attention, a map per layer where full has one per head, is bounded by the same limit (a text of many
    # sentences makes one map: tests/test_serve_sentences.py)
    c = started(create_app(str(numbers_model), dataclasses.replace(Limits(), max_attention_values=full - 1)))
    try:
        assert c.post("/translate", json={"q": ["drei vier"] * 20, "attention": "mean"}).status_code == 200
    finally:
        c.__exit__(None, None, None)


def test_a_model_directory_is_named_by_the_directory_it_stands_for(tmp_path, monkeypatch):
    """`xattn serve .` showed the model as "" in /health, /info, and the access log."""
    from xattn.serve.models import directory_name

    (tmp_path / "de-en").mkdir()
    monkeypatch.chdir(tmp_path / "de-en")
    assert directory_name(".") == directory_name("./") == directory_name("../de-en") == "de-en"
    assert directory_name("..") == tmp_path.name


def test_no_cors_header_by_default(client):
    response = client.post("/translate", json={"q": "drei"}, headers={"Origin": "http://example.org"})
    assert "access-control-allow-origin" not in response.headers


class Gate:
    """Replaces Model so that loading and translating wait until released."""

    def __init__(self):
        self.load, self.translate = threading.Event(), threading.Event()


@pytest.fixture
def gated(numbers_model, monkeypatch):
    gate = Gate()
    real = models_module.Model

    class Slow(real):
        def __init__(self, *args):
            gate.load.wait(10)
            super().__init__(*args)

        def translate(self, texts, settings):
            gate.translate.wait(10)
            return super().translate(texts, settings)

    monkeypatch.setattr(models_module, "Model", Slow)
    return gate


def test_503_while_loading_then_429_when_the_queue_is_full_and_504_past_the_timeout(numbers_model, gated, caplog):
    limits = dataclasses.replace(Limits(), queue_size=1, timeout_s=0.5, batch_wait_ms=0)
    caplog.set_level(logging.INFO, logger="xattn.serve.access")
    with TestClient(create_app(str(numbers_model), limits)) as c:
        response = c.get("/health")
        assert response.status_code == 503 and response.headers["retry-after"] == "1"
        assert response.json() == {"error": "the de→en model is loading", "error_type": "unavailable", "models": [
            {"model": "model", "source": "de", "target": "en", "status": "loading"}]}
        error(c.post("/translate", json={"q": "drei"}), 503, "the de→en model is loading", "unavailable")
        error(c.get("/info"), 503, "the de→en model is loading", "unavailable")
        lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == "xattn.serve.access"]
        assert [(x["route"], x["status"], x.get("error")) for x in lines] == [  # /health's line had no error
            ("/health", 503, "unavailable"), ("/translate", 503, "unavailable"), ("/info", 503, "unavailable")]
        assert c.get("/languages").status_code == 200  # from config.yaml, before the model has loaded
        gated.load.set()
        for _ in range(3000):  # a bound against hanging, not a timing check
            if c.get("/health").status_code == 200:
                break
            time.sleep(0.02)
        with ThreadPoolExecutor(4) as pool:  # one translating (blocked), one queued, the rest turned away
            futures = [pool.submit(c.post, "/translate", json={"q": "drei"}) for _ in range(4)]
            time.sleep(0.3)
            codes = sorted(f.result().status_code for f in futures)
        assert 429 in codes and codes.count(504) >= 1, codes
        busy = next(f.result() for f in futures if f.result().status_code == 429)
        error(busy, 429, "the server is busy", "busy")
        assert busy.headers["retry-after"] == "1"
        error(next(f.result() for f in futures if f.result().status_code == 504), 504, "no translation within 0.5 s")
        lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == "xattn.serve.access"]
        assert all("batch" not in x for x in lines if x["status"] == 429)  # turned away: it joined none
        assert all(x["batch"] in ("stream", "call") and x["texts"] == 1 for x in lines if x["status"] == 504)
        gated.translate.set()  # the batcher drains the queue (skipping what timed out) and keeps serving
        codes = []
        for _ in range(100):
            codes.append(c.post("/translate", json={"q": "drei"}).status_code)
            if codes[-1] == 200:
                break
            time.sleep(0.02)
        assert codes[-1] == 200 and set(codes) <= {200, 429, 504}, codes  # (504: one slowed past 0.5 s by load)


def test_concurrent_requests_share_batches_and_get_what_translate_gives_each(numbers_model):
    limits = dataclasses.replace(Limits(), batch_wait_ms=100)
    texts = ["eins", "zwei", "drei hundert", "vier", "fünf tausend", "sechs", "sieben", "acht neun",
             "neun", "zehn", "elf", "zwölf"]
    with TestClient(create_app(str(numbers_model), limits)) as c:
        while c.get("/health").status_code != 200:
            time.sleep(0.02)
        calls_before = app_state_calls(c)
        with ThreadPoolExecutor(len(texts)) as pool:
            replies = list(pool.map(lambda t: c.post("/translate", json={"q": t, "beam_size": 3}), texts))
        calls = app_state_calls(c) - calls_before
    translator = xattn.load(numbers_model)
    cfg = dataclasses.replace(translator.decode_config, beam_size=3)
    for text, reply in zip(texts, replies):
        alone = translator.translate([text], cfg)[0]
        assert reply.json()["translatedText"] == alone.text
        assert reply.json()["results"][0]["score"] == pytest.approx(alone.score, abs=1e-4)
    assert calls < len(texts), calls


def app_state_calls(client) -> int:
    """Translate calls the app's batcher has made so far."""
    return client.app.state.xattn.served[0].model.batcher.calls


def test_a_request_the_model_refuses_does_not_fail_the_requests_batched_with_it(numbers_model, monkeypatch):
    real = models_module.Model

    class Picky(real):
        def translate(self, texts, settings):
            if "boom" in texts:
                raise xattn.XattnError("boom: this text cannot be translated")
            return super().translate(texts, settings)

    monkeypatch.setattr(models_module, "Model", Picky)
    with TestClient(create_app(str(numbers_model), dataclasses.replace(Limits(), batch_wait_ms=100))) as c:
        while c.get("/health").status_code != 200:
            time.sleep(0.02)
        with ThreadPoolExecutor(4) as pool:
            replies = list(pool.map(lambda t: c.post("/translate", json={"q": t}), ["eins", "boom", "zwei", "drei"]))
    assert [r.status_code for r in replies] == [200, 422, 200, 200]
    error(replies[1], 422, "q: boom: this text cannot be translated", "invalid_request")


def test_alternatives_over_the_limit_name_alternatives(client):
    error(client.post("/translate", json={"q": "drei", "alternatives": 20}), 422,
          "alternatives: 20, over the limit of 7", "limit_exceeded")


def test_the_limits_hold_for_the_settings_the_search_uses_and_name_the_models_own():
    """A model whose beam is above --max-beam: a sampling request was refused for the beam it does not use (a 422
    naming beam_size, which it could not send back, since sampling refuses beam settings); a search request is
    told the beam is the model's own, which it can lower."""
    from xattn.serve.api import parse_request, plan
    from xattn.serve.limits import ApiError

    model, limits = xattn.DecodeConfig(beam_size=5, n_best=5, num_samples=6), dataclasses.replace(
        Limits(), max_beam=4, max_n_best=4, max_samples=6)
    plan(parse_request({"q": "x", "sampling": True}), model, limits, lambda t: [3], 1)
    plan(parse_request({"q": "x", "beam_size": 4}), model, limits, lambda t: [3], 1)
    with pytest.raises(ApiError, match=r"^beam_size: 5, over the limit of 4 \(the model's own setting; send a smaller"):
        plan(parse_request({"q": "x"}), model, limits, lambda t: [3], 1)
    with pytest.raises(ApiError, match=r"^n_best: 5, over the limit of 4$"):
        plan(parse_request({"q": "x", "beam_size": 5, "n_best": 5}), model, dataclasses.replace(limits, max_beam=5),
             lambda t: [3], 1)
    with pytest.raises(ApiError, match=r"^num_samples: 7, over the limit of 6$"):
        plan(parse_request({"q": "x", "sampling": True, "num_samples": 7}), model, limits, lambda t: [3], 1)


def test_a_model_whose_own_min_len_its_positions_cannot_hold_is_refused_at_start(numbers_model, tmp_path):
    """Every request that left min_len to such a model was refused for it (or, before, cut short silently)."""
    import shutil

    from xattn.serve.models import Models

    model = tmp_path / "model"
    shutil.copytree(numbers_model, model)
    config = (model / "config.yaml").read_text().replace("  positions: sinusoidal\n", "  positions: learned\n")
    (model / "config.yaml").write_text(config.replace("  max_positions: 1024\n", "  max_positions: 101\n")
                                       .replace("  min_len: 0\n", "  min_len: 101\n"))
    with pytest.raises(xattn.XattnError, match=r"config.yaml: decode.min_len: 101 is above the 100 output tokens the "
                                               r"model's 101 learned positions hold"):
        Models.read([str(model)])


def test_a_text_longer_than_learned_positions_is_413():
    from xattn.serve.api import parse_request, plan
    from xattn.serve.limits import ApiError

    with pytest.raises(ApiError) as e:
        plan(parse_request({"q": "a b c"}), xattn.DecodeConfig(), Limits(), lambda t: [3], 4, 3)
    assert e.value.status == 413 and "do not fit the model's 3 positions" in e.value.message
    with pytest.raises(ApiError, match=r"^min_len: 8 is above the 7 output tokens the model's 8 learned"):
        plan(parse_request({"q": "a b c", "min_len": 8}), xattn.DecodeConfig(), Limits(), lambda t: [3], 4, 8)
    plan(parse_request({"q": "a b c", "min_len": 7}), xattn.DecodeConfig(), Limits(), lambda t: [3], 4, 8)


def test_the_full_attention_limit_counts_the_target_positions_the_search_allows():
    """A text of 10 tokens and </s>, with max_len_a 3: the search may give floor(3 * 11) = 33 tokens and </s>, so
    full attention holds up to 34 x 11 = 374 values per map. The limit counted 3 * 10 + 1 = 31 rows (341 values)
    and let such answers past a limit of 350."""
    from xattn.serve.api import parse_request, plan
    from xattn.serve.limits import ApiError

    cfg, request = xattn.DecodeConfig(max_len_a=3, max_len_b=0), parse_request({"q": "x", "attention": "full"})
    with pytest.raises(ApiError, match="could hold up to 374 values, over the limit of 373"):
        plan(request, cfg, dataclasses.replace(Limits(), max_attention_values=373), lambda t: [10], 1)
    plan(request, cfg, dataclasses.replace(Limits(), max_attention_values=374), lambda t: [10], 1)
    # an empty text is translated empty, with no step: 32 of them at beam 16 and max_len_b 500 were too much work
    empty, wide = parse_request({"q": [""] * 32, "attention": "full"}), xattn.DecodeConfig(beam_size=16, max_len_b=500)
    split, settings = plan(empty, wide, dataclasses.replace(Limits(), max_attention_values=32), lambda t: [0] * 32, 1)
    assert settings.work == 0


def test_multipart_forms_and_a_lowercase_bearer(numbers_model):
    c = started(create_app(str(numbers_model), api_key="k"))
    try:
        ok = c.post("/translate", data={"q": "drei"}, headers={"Authorization": "bearer k"})
        assert ok.status_code == 200
        multipart = c.post("/translate", files={"q": (None, "drei"), "api_key": (None, "k")})
        assert multipart.status_code == 200 and multipart.json()["translatedText"] == ok.json()["translatedText"]
        error(c.post("/translate", files={"q": ("a.txt", b"drei"), "api_key": (None, "k")}), 422,
              "q: a file, where this route takes text fields only")
        form = {"Content-Type": "application/x-www-form-urlencoded", "Authorization": "Bearer k"}
        typed = c.post("/translate", content=b"q=drei&beam_size=3&alternatives=1", headers=form)  # text, converted
        assert typed.status_code == 200 and len(typed.json()["alternatives"]) == 1
        error(c.post("/translate", content=b"q=drei&beam_size=2&beam_size=5", headers=form), 422,
              "beam_size: given 2 times in the form", "invalid_request")
        error(c.post("/translate?q=drei&beam_size=2&beam_size=5", headers={"Authorization": "Bearer k"}), 422,
              "beam_size: given 2 times in the query string", "invalid_request")  # (it said "in the form")
        assert c.post("/translate", content=b"q=drei&q=vier", headers=form).json()["translatedText"][1]
    finally:
        c.__exit__(None, None, None)


def test_the_request_takes_every_decoding_setting():
    from xattn.serve.api import DECODE_FIELDS, TranslateRequest

    assert set(DECODE_FIELDS) <= set(TranslateRequest.model_fields)
    assert "max_tokens" not in TranslateRequest.model_fields  # the server's batch budget is its own


def test_a_model_that_fails_to_load_is_503_with_the_reason_and_the_command_exits_2(numbers_model, tmp_path):
    import shutil
    import subprocess
    import sys

    broken = tmp_path / "broken"
    shutil.copytree(numbers_model, broken)
    data = bytearray((broken / "model.safetensors").read_bytes())
    data[-8:] = b"\x00\x00\xc0\x7f" * 2  # NaN in the last tensor
    (broken / "model.safetensors").write_bytes(bytes(data))
    with TestClient(create_app(str(broken))) as c:
        for _ in range(200):
            body = c.get("/health").json()
            if "failed" in body["error"]:
                break
            time.sleep(0.02)
        assert "the de→en model failed to load" in body["error"] and "model.safetensors" in body["error"]
        assert body["models"][0]["status"] == "failed"
    out = subprocess.run([sys.executable, "-m", "xattn", "serve", str(broken), "--port", "0"], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert "the model failed to load" in out.stderr


@pytest.mark.parametrize("flags, message", [
    (["--port", "{busy}"], "--host 127.0.0.1 --port {busy}: cannot listen there (Address already in use)"),
    (["--host", "256.1.1.1"], "--host 256.1.1.1: not an address to listen on"),
    (["--port", "70000"], "--port: 70000 is not a port (0 for any free one, or 1 to 65535)"),
    (["--timeout", "inf"], "--timeout: must be a finite number > 0, got inf"),  # (it said "must be > 0")
    (["--batch-wait-ms", "-1"], "--batch-wait-ms: must be >= 0, got -1.0"),
    (["--cors-origin", "https://example.org/page"], "--cors-origin: 'https://example.org/page' is not an origin"),
    (["--cors-origin", "example.org"], "--cors-origin: 'example.org' is not an origin"),
    (["--api-key", ""], "--api-key: an empty key"),
    # a model's own beam over the limit: every request that left it to the model was refused for it
    (["--max-beam", "1", "--max-n-best", "1"], "config.yaml: decode.beam_size: 2 is above the server's limit of 1 "
                                               "(max_beam, --max-beam); raise the limit, or lower the model's setting"),
    (["--max-n-best", "12", "--max-beam", "10"], "--max-n-best: 12 is above --max-beam (10)"),
    (["--api-key", "key "], "--api-key: an empty key, or one with spaces around it"),
])
def test_an_address_or_origin_that_cannot_be_used_is_one_line(numbers_model, capsys, flags, message):
    import socket

    from xattn.cli.main import main

    with socket.socket() as busy:  # checked before anything loads: the command never starts a server here
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = str(busy.getsockname()[1])
        assert main(["serve", str(numbers_model), *[f.replace("{busy}", port) for f in flags]]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message.replace("{busy}", port) in err, err


def test_a_batch_never_goes_over_the_batch_size_except_one_larger_request():
    import asyncio

    from xattn.decoding import done
    from xattn.serve.batcher import Batcher

    calls = []

    def translate(texts, settings):
        calls.append(list(texts))
        return done([t.upper() for t in texts])

    async def main():
        batcher = Batcher(translate, max_batch=4, max_wait=0.0)
        jobs = [["a", "b", "c"], ["d", "e", "f"], ["g"], ["h", "i", "j", "k", "l"], ["m"]]
        # queued before the collector starts, so that it finds them all waiting
        pending = [asyncio.ensure_future(batcher.submit(texts, "greedy")) for texts in jobs]
        await asyncio.sleep(0)
        batcher.start()
        results = await asyncio.gather(*pending)
        await batcher.stop()
        return jobs, results

    jobs, results = asyncio.run(main())
    assert results == [[t.upper() for t in texts] for texts in jobs]  # every request answered, none split
    assert [len(c) for c in calls] == [3, 4, 5, 1]  # abc | def+g | the five alone | m


# ------------------------------------------------------------------------------ pruned cross-attention

def pruned_client(path, heads: list[int]) -> TestClient:
    from tests.conftest import tiny_model_dir

    tiny_model_dir(path, n_decoder_layers=2, heads={"cross": heads})  # as `xattn prune` leaves a model
    return started(create_app(str(path)))


@pytest.mark.parametrize("heads", [[2, 0], [0, 1]])
def test_a_layer_without_heads_is_null_in_the_attention_and_skipped_by_the_alignment(tmp_path, heads):
    c = pruned_client(tmp_path / "m", heads)
    try:
        info = c.get("/info").json()
        assert info["heads"] == heads and info["alignment"]["layer"] == heads.index(max(heads))
        body = {"q": "word1 word2 word3", "alignment": True, "beam_size": 3, "coverage_penalty": 0.5}
        mean = c.post("/translate", json={**body, "attention": "mean"}).json()["results"][0]["attention"]
        full = c.post("/translate", json={**body, "attention": "full"}).json()["results"][0]["attention"]
        assert [len(layer) for layer in full] == [max(heads)] * 2
        for layer, n in enumerate(heads):
            present = [head[0][0] is not None for head in full[layer]]
            assert present == [True] * n + [False] * (max(heads) - n)
            if n:
                assert all(sum(row) == pytest.approx(1, abs=1e-3) for row in mean[layer])
            else:
                assert all(w is None for row in mean[layer] for w in row)  # no heads, no mean: null, not 0
    finally:
        c.__exit__(None, None, None)


def test_a_model_without_cross_heads_translates_and_refuses_what_needs_them_naming_the_field(tmp_path):
    c = pruned_client(tmp_path / "m", [0, 0])
    try:
        assert c.get("/info").json()["alignment"] is None
        assert c.post("/translate", json={"q": "word1 word2"}).status_code == 200
        for field, body in (("attention", {"attention": "mean"}), ("attention", {"attention": "full"}),
                            ("alignment", {"alignment": True}), ("coverage_penalty", {"coverage_penalty": 0.5})):
            error(c.post("/translate", json={"q": "word1 word2", **body}), 422,
                  f"{field}: every cross-attention head of this model was pruned", "invalid_request")
    finally:
        c.__exit__(None, None, None)


def test_alternatives_are_distinct_texts_best_first(numbers_model):
    """Samples repeat and two hypotheses can print the same text: the alternatives are the others whose texts
    differ from the translation's and from each other's, best first, fewer when there are fewer."""
    from xattn.serve.api import TranslateRequest, result_of, with_alternatives
    from xattn.serve.sentences import Joined

    one = xattn.load(numbers_model).translate(["drei"])[0]
    named = {text: dataclasses.replace(one, text=text, score=score)
             for text, score in (("a", -1.0), ("b", -2.0), ("c", -3.0))}
    a, b, c = named.values()
    listed = [a, dataclasses.replace(b), a, dataclasses.replace(a, score=-0.5), b, c]  # a first, then repeats
    out = result_of(Joined(dataclasses.replace(a, alternatives=listed), ["drei"], ["a"]), TranslateRequest(q="drei"))
    assert [(x["translatedText"], x["score"]) for x in out["alternatives"]] == [("b", -2.0), ("c", -3.0)]
    first = with_alternatives([a], [dataclasses.replace(a, alternatives=[a, b, b, a, c])], 1)[0]
    assert [x.text for x in first.alternatives] == ["a", "b"]
    assert [x.text for x in with_alternatives([a], [dataclasses.replace(a, alternatives=[b, a, b])], 3)[0]
            .alternatives] == ["a", "b"]


def running_where() -> str:
    """"loop" when called on an event loop's thread, else "thread"."""
    import asyncio

    try:
        asyncio.get_running_loop()
        return "loop"
    except RuntimeError:
        return "thread"


def test_an_answer_with_attention_is_encoded_off_the_event_loop(client, monkeypatch):
    """Full attention runs to megabytes of JSON (a second of encoding at the limit): encoded on the event loop, it held
    up every other client, /health included, for as long."""
    from xattn.serve import app as app_module

    where = []

    def json_text(*args, **kwargs):
        where.append(running_where())
        return encode(*args, **kwargs)
    encode = app_module.json_text
    monkeypatch.setattr(app_module, "json_text", json_text)
    for body in ({"q": "drei", "attention": "full"}, {"q": "drei", "alignment": True}, {"q": "drei"}):
        assert client.post("/translate", json=body).status_code == 200
    assert where == ["thread", "thread", "loop"]  # a plain answer is quicker encoded where it is


def test_a_models_n_best_follows_a_smaller_beam_down_in_the_cli_and_the_server(numbers_model, tmp_path, capsys):
    """A model saved with n-best 3 and a request or command line asking for a beam of 2: 2-best lists, in both front
    ends (the CLI dropped to 1-best lines, the server refused, naming n_best, which its client never sent)."""
    import shutil

    from xattn.cli.main import main

    model = tmp_path / "nbest"
    shutil.copytree(numbers_model, model)
    config = (model / "config.yaml").read_text()
    assert "  beam_size: 2\n" in config and "  n_best: 1\n" in config
    (model / "config.yaml").write_text(config.replace("  beam_size: 2\n", "  beam_size: 4\n")
                                       .replace("  n_best: 1\n", "  n_best: 3\n"))
    src = tmp_path / "in.de"
    src.write_text("drei hundert\n")
    assert main(["translate", str(model), "-i", str(src), "--beam", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and all(line.startswith("0 ||| ") for line in lines)
    assert main(["translate", str(model), "-i", str(src)]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 3  # the model's own n-best where the beam holds it
    c = started(create_app(str(model)))
    try:
        reply = c.post("/translate", json={"q": "drei hundert", "beam_size": 2})
        assert reply.status_code == 200, reply.text
        assert reply.json()["translatedText"] == lines[0].split(" ||| ")[1]
        assert c.post("/translate", json={"q": "drei hundert", "beam_size": 1}).status_code == 200
    finally:
        c.__exit__(None, None, None)


@pytest.mark.parametrize("mid_call", [False, True])
def test_a_request_the_backlog_refuses_on_arrival_joined_no_batch_one_stopped_mid_call_did(numbers_model, caplog,
                                                                                            mid_call):
    """The access line's batch: left out for a 429 on arrival; kept for one the backlog stopped once it ran (its
    work would end past its timeout), which used the translating thread (a review: it was dropped for both)."""
    from xattn.serve.backlog import Overloaded

    c = started(create_app(str(numbers_model)))
    try:
        batcher = c.app.state.xattn.served[0].model.batcher

        async def refused(*args, **kwargs):
            raise Overloaded(40.0, 3.0, to_timeout=mid_call)
        batcher.submit = refused
        with caplog.at_level(logging.INFO, logger="xattn.serve.access"):
            assert c.post("/translate", json={"q": "drei"}).status_code == 429
        line = next(json.loads(r.getMessage()) for r in caplog.records if r.name == "xattn.serve.access")
        assert ("batch" in line) == mid_call and line["texts"] == 1
    finally:
        c.__exit__(None, None, None)
