"""`xattn serve` driven by real LibreTranslate clients (libretranslatepy, deep-translator), on loopback: a real
server process, the clients' own HTTP (deep-translator sends every field in the query string of a POST): translate,
languages, keys, detect, source auto; and a file uploaded as LibreTranslate documents it, then downloaded."""
import pytest

libretranslatepy = pytest.importorskip("libretranslatepy", reason="the test extra (pip install -e '.[test]')")
deep_translator = pytest.importorskip("deep_translator", reason="the test extra (pip install -e '.[test]')")

import xattn  # noqa: E402

from test_serve_live import serving  # noqa: E402

KEY = "k3y"


@pytest.fixture(scope="module")
def server(numbers_model, tmp_path_factory):
    log = tmp_path_factory.mktemp("clients") / "server.log"
    with serving(numbers_model, log, "--api-key", KEY, "--no-access-log") as url:
        yield url + "/"


def test_libretranslatepy_translates_and_lists_languages(server, numbers_model):
    api = libretranslatepy.LibreTranslateAPI(server, api_key=KEY)
    alone = xattn.load(numbers_model)
    expected = alone.translate(["drei"], alone.decode_config)[0].text
    assert api.translate("drei", "de", "en") == expected
    assert {"code": "de", "name": "German", "targets": ["en"]} in api.languages()
    with pytest.raises(Exception, match="403|API key"):
        libretranslatepy.LibreTranslateAPI(server, api_key="wrong").translate("drei", "de", "en")


def test_deep_translator_translates_through_the_query_string(server, numbers_model):
    from deep_translator import LibreTranslator

    alone = xattn.load(numbers_model)
    expected = alone.translate(["vier"], alone.decode_config)[0].text
    translator = LibreTranslator(source="de", target="en", api_key=KEY, custom_url=server)
    assert translator.translate("vier") == expected
    assert translator.translate_batch(["vier", "vier"]) == [expected, expected]


def test_libretranslatepy_on_a_server_of_two_models(numbers_model, numbers_model_en_de, tmp_path):
    with serving([numbers_model, numbers_model_en_de], tmp_path / "server.log", "--no-access-log") as url:
        api = libretranslatepy.LibreTranslateAPI(url)
        assert api.languages() == [{"code": "de", "name": "German", "targets": ["en"]},
                                   {"code": "en", "name": "English", "targets": ["de"]}]
        for model, text, source, target in ((numbers_model, "drei", "de", "en"),
                                            (numbers_model_en_de, "three", "en", "de")):
            translator = xattn.load(model)
            assert api.translate(text, source, target) == translator.translate([text], translator.decode_config)[0].text
        with pytest.raises(Exception, match="400"):
            api.translate("drei", "de", "fr")


def test_libretranslatepy_detects(server):
    api = libretranslatepy.LibreTranslateAPI(server, api_key=KEY)
    answer = api.detect("Ein Mann in einem blauen Hemd steht auf einer Leiter und putzt die Fenster.")
    assert answer[0]["language"] == "de" and 50 < answer[0]["confidence"] <= 100
    assert api.detect("Un homme en chemise bleue est debout sur une échelle.")[0]["language"] == "fr"


def test_deep_translator_with_source_auto(server, numbers_model):
    from deep_translator import LibreTranslator
    from deep_translator.exceptions import ServerException

    alone = xattn.load(numbers_model)
    expected = alone.translate(["siebenhundertzwölf"], alone.decode_config)[0].text
    translator = LibreTranslator(source="auto", target="en", api_key=KEY, custom_url=server)
    assert translator.translate("siebenhundertzwölf") == expected
    with pytest.raises(ServerException, match="BAD_REQUEST"):  # 400: clearly English, the client must name the source
        translator.translate("A man in a blue shirt is standing on a ladder and cleaning the windows.")


def test_a_file_uploaded_as_libretranslate_documents_it_and_downloaded_from_the_url_given(server, numbers_model):
    import requests  # deep-translator's own dependency

    alone = xattn.load(numbers_model)
    want = [t.text for t in alone.translate(["drei", "vier"], alone.decode_config)]
    reply = requests.post(server + "translate_file", files={"file": ("zahlen.txt", "drei\n\nvier\n".encode())},
                          data={"source": "de", "target": "en", "api_key": KEY}, timeout=30)
    assert reply.status_code == 200, reply.text
    url = reply.json()["translatedFileUrl"]
    assert url.startswith(server + "download_file/")
    got = requests.get(url, timeout=30)
    assert got.status_code == 200 and got.text == f"{want[0]}\n\n{want[1]}\n"
    assert 'filename="zahlen_en.txt"' in got.headers["content-disposition"]
