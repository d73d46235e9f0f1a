"""`xattn serve` driven by real LibreTranslate clients (libretranslatepy, deep-translator), on loopback: a real
server process, the clients' own HTTP (deep-translator sends every field in the query string of a POST)."""
import os
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

libretranslatepy = pytest.importorskip("libretranslatepy", reason="the test extra (pip install -e '.[test]')")
deep_translator = pytest.importorskip("deep_translator", reason="the test extra (pip install -e '.[test]')")

import xattn  # noqa: E402

KEY = "k3y"


@pytest.fixture(scope="module")
def server(numbers_model):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = os.environ | {"OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "xattn", "serve", str(numbers_model), "--port", str(port),
                             "--threads", "1", "--api-key", KEY, "--no-access-log"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/"
    try:
        for _ in range(300):
            try:
                with urllib.request.urlopen(url + "health", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.1)
        else:
            raise AssertionError("the server did not start")
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


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
