"""`xattn serve` driven by real LibreTranslate clients (libretranslatepy, deep-translator), on loopback: a real
server process, the clients' own HTTP (deep-translator sends every field in the query string of a POST)."""
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
