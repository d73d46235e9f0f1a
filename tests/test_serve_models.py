"""`xattn serve` with several models (xattn/serve/models.py): each request routed by source and target to its
model, which answers what its own Translator gives; pairs no model serves, and choices a request leaves open, are
a 400 naming the field; /languages, /health, /info and /metrics cover every model; one model loading while the
other serves; two models with one pair, or one that cannot load, stop the command with one line."""
import json
import logging
import shutil
import threading
import time

import pytest

pytest.importorskip("fastapi", reason="the serve extra (pip install -e '.[serve]')")
from fastapi.testclient import TestClient  # noqa: E402

import xattn  # noqa: E402
from xattn.serve import models as models_module  # noqa: E402
from xattn.serve.app import create_app  # noqa: E402
from xattn.serve.limits import ApiError  # noqa: E402
from xattn.serve.models import Models, Served  # noqa: E402

from test_serve import error, started  # noqa: E402


@pytest.fixture(scope="module")
def client(numbers_model, numbers_model_en_de):
    c = started(create_app([str(numbers_model), str(numbers_model_en_de)]))
    yield c
    c.__exit__(None, None, None)


def alone(model_dir, text: str) -> str:
    translator = xattn.load(model_dir)
    return translator.translate([text], translator.decode_config)[0].text


def test_each_request_is_answered_by_the_model_of_its_pair(client, numbers_model, numbers_model_en_de, caplog):
    with caplog.at_level(logging.INFO, logger="xattn.serve.access"):
        de_en = client.post("/translate", json={"q": "drei", "source": "de", "target": "en"}).json()
        en_de = client.post("/translate", json={"q": "three", "source": "en"}).json()  # en has one target here
        auto = client.post("/translate", json={"q": ["three", "four"], "source": "auto", "target": "de"}).json()
    assert de_en["translatedText"] == alone(numbers_model, "drei") and "detectedLanguage" not in de_en
    assert en_de["translatedText"] == alone(numbers_model_en_de, "three")
    assert auto["translatedText"] == [en_de["translatedText"], alone(numbers_model_en_de, "four")]
    assert [d["language"] for d in auto["detectedLanguage"]] == ["en", "en"]  # the only model into de
    assert all(0 <= d["confidence"] <= 100 for d in auto["detectedLanguage"])
    lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == "xattn.serve.access"]
    assert [line["model"] for line in lines] == ["de-en", "en-de", "en-de"]


@pytest.mark.parametrize("body, fragment, error_type", [
    ({"source": "de", "target": "fr"}, "target: French (fr) is not available as a target language from German (de); "
     "this server translates de→en, en→de", "unsupported_language"),
    ({"source": "fr", "target": "en"}, "source: French (fr) is not supported; this server translates de→en, en→de "
     "(or give source auto)", "unsupported_language"),
    ({"source": "de", "target": "de"}, "target: German (de) is not available as a target language from German (de)",
     "unsupported_language"),
    ({"source": "auto", "target": "cs"}, "target: Czech (cs) is not supported; this server translates de→en, en→de",
     "unsupported_language"),
])
def test_a_pair_no_model_serves_or_a_choice_left_open_is_400_naming_the_field(client, body, fragment, error_type):
    error(client.post("/translate", json={"q": "drei", **body}), 400, fragment, error_type)


def test_auto_between_two_models_goes_by_the_language_identifier(client, numbers_model, numbers_model_en_de):
    german = "Ein Mann in einem blauen Hemd steht auf einer Leiter."
    english = "A man in a blue shirt is standing on a ladder."
    for body in ({"source": "auto"}, {}):  # source is auto when left out
        de = client.post("/translate", json={"q": german, **body}).json()
        assert de["translatedText"] == alone(numbers_model, german) and de["detectedLanguage"]["language"] == "de"
    en = client.post("/translate", json={"q": english}).json()
    assert en["translatedText"] == alone(numbers_model_en_de, english) and en["detectedLanguage"]["language"] == "en"
    error(client.post("/translate", json={"q": [german, english]}), 400,
          "source: the texts were detected as de, en; one request is translated by one model", "language_required")
    spanish = "El perro corre por el parque con una pelota roja."  # nearer one candidate than the other, but neither
    error(client.post("/translate", json={"q": spanish}), 400, "source: q[0] was detected as Spanish (es), not as a source "
          "language this request could go to (de, en); give source", "unsupported_language")


def test_a_file_s_lines_are_routed_as_the_texts_of_a_list(client):
    """With source auto, a file's lines in two languages translated, the German one by the en->de model: the file
    was routed by its whole text, then each line checked only against that one language. A file of blank lines is
    that 422 whatever the models (it was a 400 asking for source with several)."""
    german = "Ein Mann in einem blauen Hemd steht auf einer Leiter."
    english = ["A man in a blue shirt is standing on a ladder.", "Two dogs are running through the tall grass."]
    text = "\n".join([*english, german]) + "\n"
    answer = client.post("/translate_file", files={"file": ("notes.txt", text.encode(), "text/plain")})
    error(answer, 400, "source: the texts were detected as de, en; one request is translated by one model",
          "language_required")
    same = client.post("/translate_file", files={"file": ("notes.txt", "\n".join(english).encode(), "text/plain")})
    assert same.status_code == 200, same.text
    blank = client.post("/translate_file", files={"file": ("blank.txt", b"\n  \n", "text/plain")})
    error(blank, 422, "file: no text to translate (every line is blank)", "invalid_request")


def test_languages_health_info_and_metrics_cover_every_model(client):
    assert client.get("/languages").json() == [{"code": "de", "name": "German", "targets": ["en"]},
                                                {"code": "en", "name": "English", "targets": ["de"]}]
    assert client.get("/health").json() == {"status": "ok", "models": [
        {"model": "model", "source": "de", "target": "en", "status": "ready"},
        {"model": "model", "source": "en", "target": "de", "status": "ready"}]}
    info = client.get("/info").json()
    assert "source" not in info and info["api_key_required"] is False and info["limits"]["max_items"] == 32
    assert [(m["source"], m["target"], m["status"]) for m in info["models"]] == [("de", "en", "ready"),
                                                                                ("en", "de", "ready")]
    assert all(m["layers"] == 1 and m["heads"] == [2] and m["decode"]["beam_size"] == 2 for m in info["models"])
    before = client.get("/metrics").text
    assert client.post("/translate", json={"q": "three", "source": "en", "beam_size": 3}).status_code == 200
    text = client.get("/metrics").text
    for model in ("de-en", "en-de"):
        assert f'xattn_queue_depth{{model="{model}"}} 0' in text and f'xattn_model_ready{{model="{model}"}} 1' in text
    assert count(text, 'xattn_batch_sentences_count{model="en-de"}') == count(before, 'xattn_batch_sentences_count'
                                                                                      '{model="en-de"}') + 1
    assert count(text, 'xattn_batch_sentences_count{model="de-en"}') == count(before, 'xattn_batch_sentences_count'
                                                                                      '{model="de-en"}')
    assert count(text, 'xattn_output_tokens_total{model="en-de"}') > count(before, 'xattn_output_tokens_total'
                                                                                   '{model="en-de"}')


def count(exposition: str, series: str) -> float:
    return float(next(line for line in exposition.splitlines() if line.startswith(series + " ")).split()[1])


def test_a_model_serves_while_the_other_loads_and_health_names_the_one_loading(numbers_model, numbers_model_en_de,
                                                                              monkeypatch):
    release, real = threading.Event(), models_module.Model

    class SlowEnDe(real):
        def __init__(self, model_dir, *args):
            if model_dir == str(numbers_model_en_de):
                release.wait(30)
            super().__init__(model_dir, *args)

    monkeypatch.setattr(models_module, "Model", SlowEnDe)
    with TestClient(create_app([str(numbers_model), str(numbers_model_en_de)])) as c:
        for _ in range(3000):  # a bound against hanging, not a timing check
            if c.get("/health").json()["models"][0]["status"] == "ready":
                break
            time.sleep(0.02)
        health = c.get("/health")
        assert health.status_code == 503 and health.headers["retry-after"] == "1"
        assert health.json() == {"error": "the en→de model is loading", "error_type": "unavailable", "models": [
            {"model": "model", "source": "de", "target": "en", "status": "ready"},
            {"model": "model", "source": "en", "target": "de", "status": "loading"}]}
        ok = c.post("/translate", json={"q": "drei", "source": "de"})
        assert ok.status_code == 200 and ok.json()["translatedText"] == alone(numbers_model, "drei")
        error(c.post("/translate", json={"q": "three", "source": "en"}), 503, "the en→de model is loading",
              "unavailable")
        error(c.get("/info"), 503, "the en→de model is loading", "unavailable")
        assert 'xattn_model_ready{model="en-de"} 0' in c.get("/metrics").text
        release.set()
        for _ in range(3000):  # a bound against hanging, not a timing check
            if c.get("/health").status_code == 200:
                break
            time.sleep(0.02)
        assert c.post("/translate", json={"q": "three", "source": "en"}).json()["translatedText"] == \
            alone(numbers_model_en_de, "three")


def test_two_models_of_one_pair_stop_the_command_with_one_line_naming_both(numbers_model, tmp_path, capsys):
    from xattn.cli.main import main

    twin = tmp_path / "twin"
    shutil.copytree(numbers_model, twin)
    assert main(["serve", str(numbers_model), str(twin), "--port", "1"]) == 2  # refused before the port is tried
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert f"{numbers_model} and {twin}: both translate de→en; serve one model per language pair" in err


def test_a_model_that_cannot_load_stops_a_server_of_several(numbers_model, numbers_model_en_de, tmp_path):
    import subprocess
    import sys

    broken = tmp_path / "broken"
    shutil.copytree(numbers_model_en_de, broken)
    (broken / "model.safetensors").write_bytes(b"not weights")
    out = subprocess.run([sys.executable, "-m", "xattn", "serve", str(numbers_model), str(broken), "--port",
                          "0", "--threads", "1", "--no-access-log"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert f"{broken}: the model failed to load: " in out.stderr, out.stderr


# ------------------------------------------------------------------------------ routing alone

def own(text: str, language: str) -> float:
    """The identifier's own confidence in `language` for `text` (percent), as a lone model reports it."""
    from xattn.serve.api import detected_source

    return detected_source([text], language)[0][1]


def detecting(language_of):
    """A language detector (texts, candidates) -> [(language, confidence)] from a table of texts."""
    def language(text: str) -> str:  # several texts joined by lines: the first line's that has one
        return next((language_of[line] for line in text.split("\n") if language_of[line] != "und"), "und")
    return lambda texts, candidates: [(language(t), 90.0) for t in texts]


@pytest.fixture
def three():
    return [Served("a", "de", "en"), Served("b", "en", "de"), Served("c", "de", "fr")]


def test_a_text_without_letters_goes_with_the_others_and_alone_asks_for_source(three):
    models = Models(three, detecting({"three": "en", "drei": "de", "123": "und", "": "und"}))
    route = models.route("auto", None, ["123", "three", ""])
    assert route.served.path == "b" and route.detected == [("en", 0.0), ("en", own("three", "en")), ("en", 0.0)]
    with pytest.raises(ApiError, match="source: no text has letters to tell its language by; give source"):
        models.route("auto", None, ["123", ""])


def test_routing_by_source_and_target(three):
    models = Models(three)
    assert models.route("de", "fr", ["x"]).served.path == "c"
    assert models.route("en", None, ["x"]).served.path == "b"  # the only target en has here
    route = models.route("auto", "en", ["x", "y"])  # only de->en goes into en
    assert route.served.path == "a" and [language for language, _ in route.detected] == ["de", "de"]
    with pytest.raises(ApiError, match=r"target: German \(de\) translates to en, fr on this server; give target"):
        models.route("de", None, ["x"])
    assert [row["code"] for row in models.languages()] == ["de", "en", "fr"]
    assert models.languages()[0]["targets"] == ["en", "fr"] and models.languages()[2]["targets"] == []


def test_auto_asks_the_language_detection_when_several_models_could_take_the_texts(three):
    german, english = "dreihundert vierundzwanzig Hunde", "three hundred and twenty four dogs"  # 20 letters or more
    models = Models(three, detecting({"three": "en", "drei": "de", "vier": "de", german: "de", english: "en"}))
    route = models.route("auto", None, ["three"])
    assert route.served.path == "b" and route.detected == [("en", own("three", "en"))]
    assert models.route("auto", "fr", ["drei"]).served.path == "c"  # one model into fr: nothing to detect
    with pytest.raises(ApiError, match="target: German .de. translates to en, fr on this server; give target"):
        models.route("auto", None, ["drei", "vier"])
    with pytest.raises(ApiError, match="source: the texts were detected as de, en; one request is translated by one "
                       "model") as e:
        models.route("auto", None, [german, english])
    assert e.value.status == 400
    elsewhere = Models(three[:2], detecting({"qapla": "tlh"}))
    with pytest.raises(ApiError, match=r"source: the text was detected as 'tlh', which no model here translates"):
        elsewhere.route("auto", None, ["qapla"])
    with pytest.raises(ApiError, match=r"source: the texts were detected as 'tlh', which no model here translates"):
        elsewhere.route("auto", None, ["qapla", "qapla"])


def test_several_models_report_the_identifier_s_own_confidence_and_short_texts_go_with_the_long():
    """With several candidate models, detectedLanguage gave the confidence renormalised among their languages: French
    read as English at 98.99 (the identifier: 1.5) on a server of de->en, en->de and cs->en, and 1.5 with
    target=de. It is the identifier's own now, whichever models are served. And a short text, where the identifier
    is often unsure (`un`: en as much as fr), no longer gets a batch of one language refused as mixed."""
    served = [Served("a", "de", "en"), Served("b", "en", "de"), Served("c", "cs", "en"), Served("d", "fr", "de")]
    models = Models(served)
    french = "cent quarante mille huit cent quatre-vingt-onze"
    several = models.route("auto", None, [french]).detected
    alone = Models([Served("d", "fr", "de")]).route("auto", None, [french]).detected
    assert several == alone == [("fr", own(french, "fr"))]
    route = models.route("auto", "de", ["vingt et un mille cinq cent six", "vingt-deux mille", "un"])
    assert route.served.path == "d" and [lang for lang, _ in route.detected] == ["fr"] * 3
    with pytest.raises(ApiError, match="source: the texts were detected as de, fr"):  # long texts of two languages
        models.route("auto", None, ["vingt et un mille cinq cent six", "Ein Mann steht auf einer Leiter im Garten."])
    for texts, i in ((["こんにちは世界、元気ですか"], 0), (["vingt-deux mille", "Привет, как дела?"], 1)):
        with pytest.raises(ApiError, match=fr"source: q\[{i}\] was detected as \w+ \((ja|ru)\), not as a source language"):
            models.route("auto", None, texts)  # short, but in a script none of the sources is written in


def test_short_texts_alone_choose_their_language_together():
    """Short texts of one language, each of which the identifier may take for another ('Hallo' is en at 65%),
    were refused as mixed; when no text is long, they choose together."""
    models = Models([Served("a", "de", "en"), Served("b", "en", "de")])
    route = models.route("auto", None, ["Hallo", "Ein Hund.", "Danke schön", "Die Katze", "Gut"])
    assert route.served.path == "a" and {lang for lang, _ in route.detected} == {"de"}


def test_two_models_of_one_pair_are_refused_naming_both():
    with pytest.raises(xattn.XattnError, match="a and c: both translate de→en"):
        Models([Served("a", "de", "en"), Served("b", "en", "de"), Served("c", "de", "en")])


def test_language_codes_are_read_as_libretranslate_reads_them():
    """`DE` or `zh-Hans` (LibreTranslate's /languages lists variants so since 1.6) were refused as unsupported: codes
    were matched as written."""
    from xattn.serve.models import Models, Served
    models = Models([Served("a", "de", "en"), Served("b", "zh", "en"), Served("c", "pb", "en")])
    assert [models.code(c) for c in ("DE", "En", "zh-Hans", "ZH-HANS", "pt-BR", "Auto")] == \
        ["de", "en", "zh", "zh", "pb", "auto"]
    assert [models.code(c) for c in ("zh-Hant", "xx", "de-DE")] == ["zh-Hant", "xx", "de-DE"]  # not served: as given
    assert models.pick(models.code("ZH-hans"), models.code("EN")).path == "b"


def test_a_request_in_capitals_is_routed_as_in_lower_case(client):
    same = client.post("/translate", json={"q": "drei", "source": "de", "target": "en"}).json()["translatedText"]
    r = client.post("/translate", json={"q": "drei", "source": "DE", "target": "En"})
    assert r.status_code == 200 and r.json()["translatedText"] == same, r.text
    assert client.post("/translate", json={"q": "drei", "source": "AUTO"}).json()["translatedText"] == same
