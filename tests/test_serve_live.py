"""A live `xattn serve` on 127.0.0.1: the page in a real browser (Debian's Chromium through Playwright), and
load with faults mixed in (bounded in count and time)."""
import json
import os
import random
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="the serve extra (pip install -e '.[serve]')")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(url: str, body, timeout: float = 30) -> tuple[int, dict]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(url + "/translate", data, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


@contextmanager
def serving(model, log: Path, *flags: str):
    """`xattn serve MODEL` (or a list of models) on a free port until the block ends; yields its URL once /health
    says ok."""
    port = free_port()
    models = [str(m) for m in model] if isinstance(model, (list, tuple)) else [str(model)]
    with log.open("w") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "xattn", "serve", *models, "--port", str(port), "--threads", "1", *flags],
            stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "OMP_NUM_THREADS": "1"})
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            try:
                with urllib.request.urlopen(url + "/health", timeout=1) as r:
                    if r.status == 200:
                        break
            except (urllib.error.URLError, ConnectionError, OSError):
                pass
            if process.poll() is not None:
                raise AssertionError(f"xattn serve exited: {log.read_text()}")
            time.sleep(0.1)
        else:
            raise AssertionError(f"xattn serve did not become healthy: {log.read_text()}")
        yield url
    finally:
        process.terminate()
        process.wait(10)
    assert process.returncode in (0, -15), log.read_text()


@pytest.fixture(scope="module")
def server(numbers_model, tmp_path_factory):
    log = tmp_path_factory.mktemp("serve") / "server.log"
    with serving(numbers_model, log, "--max-chars", "300", "--queue-size", "8", "--batch-wait-ms", "5") as url:
        assert f"at {url}/ (the API and the attention page)" in log.read_text()  # where to point a browser
        yield url


# ------------------------------------------------------------------------------------------ the page

@pytest.fixture
def page(browser, server):
    context = browser.new_context(viewport={"width": 1000, "height": 800})
    page = context.new_page()
    elsewhere, errors = [], []
    page.route("**/*", lambda route: route.continue_() if route.request.url.startswith(server) else
               (elsewhere.append(route.request.url), route.abort()))
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(server + "/")
    yield page
    context.close()
    assert not elsewhere, f"the page tried to reach {elsewhere}"
    assert not errors, errors


def test_the_page_translates_shows_the_heatmap_and_the_links(page, server):
    page.fill("#text", "sieben hundert drei")
    page.click("#go")
    page.wait_for_selector("#result:not([hidden])")  # (wait_for_function would need 'unsafe-eval', which the CSP forbids)
    status, api = post(server, {"q": "sieben hundert drei", "beam_size": 5, "attention": "full", "alignment": True})
    assert status == 200 and page.text_content("#translation") == api["translatedText"]
    result = api["results"][0]
    assert page.text_content("#langs") == "de → en"
    cells = page.locator("#heatmap rect.cell")
    assert cells.count() == len(result["target_tokens"]) * len(result["source_tokens"])
    # hover a cell: the word pair is highlighted and its weight shown
    cells.nth(1).hover()
    assert page.text_content("#pair") == (f"{result['target_tokens'][0]} ← {result['source_tokens'][1]}: "
                                          f"{cells.nth(1).get_attribute('data-weight')}")
    hot = page.locator("#heatmap text.hot")
    assert sorted(hot.all_text_contents()) == sorted([result["target_tokens"][0], result["source_tokens"][1]])
    # switch to head 0 of the last layer: the cells show that head's weights
    layer = len(result["attention"]) - 1
    page.select_option("#layer", str(layer))
    page.select_option("#head", "0")
    head = result["attention"][layer][0]
    assert float(cells.nth(1).get_attribute("data-weight")) == pytest.approx(head[0][1], abs=2e-3)
    page.select_option("#head", "mean")
    mean = sum(h[0][1] for h in result["attention"][layer]) / len(result["attention"][layer])
    assert float(cells.nth(1).get_attribute("data-weight")) == pytest.approx(mean, abs=2e-3)
    assert page.locator("#links line.link").count() == len(result["alignment"])
    page.uncheck("#show-links")
    assert page.locator("#links line.link").count() == 0


def test_the_page_shows_alternatives_and_the_apis_error(page):
    page.fill("#text", "drei")
    page.fill("#alternatives", "2")
    page.click("#go")
    page.wait_for_selector("#alts li >> nth=1")
    page.fill("#text", "drei " * 80)  # 400 characters: over this server's --max-chars 300
    page.click("#go")
    page.wait_for_selector("#error:not([hidden])")
    assert "400 characters, over the limit of 300" in page.text_content("#error")


def translated(browser, server: str, text: str, width: int):
    """A page of `width` CSS pixels that has translated `text`."""
    context = browser.new_context(viewport={"width": width, "height": 740})
    page = context.new_page()
    page.goto(server + "/")
    page.fill("#text", text)
    page.click("#go")
    page.wait_for_selector("#result:not([hidden])")  # (wait_for_function would need 'unsafe-eval', which the CSP forbids)
    return context, page


CLIPPED = """(id) => { const svg = document.getElementById(id), box = svg.getBoundingClientRect();
  return [...svg.querySelectorAll("text")].filter((t) => { const r = t.getBoundingClientRect();
    return r.left < box.left - 0.5 || r.right > box.right + 0.5 || r.top < box.top - 0.5 || r.bottom > box.bottom + 0.5; })
  .map((t) => t.textContent); }"""


@pytest.mark.parametrize("width", [1000, 390, 360])
@pytest.mark.parametrize("text", ["sieben hundert drei und zwanzig",
                                  "sieben hundert drei und zwanzig tausend neun hundert neun und neunzig"])
def test_the_page_fits_every_label_and_the_link_diagram_on_the_screen(browser, server, width, text):
    context, page = translated(browser, server, text, width)
    assert page.evaluate("document.documentElement.scrollWidth") <= width  # wide maps scroll inside their box
    assert page.evaluate(CLIPPED, "heatmap") == [] and page.evaluate(CLIPPED, "links") == []
    links = page.locator("#links").evaluate("(e) => e.getBoundingClientRect().toJSON()")
    assert links["width"] > 0 and 0 <= links["left"] and links["right"] <= width, links
    assert page.locator("#links line.link").count() > 0
    context.close()


def test_the_page_of_a_pruned_model_offers_only_layers_with_heads(browser, tmp_path):
    from tests.conftest import tiny_model_dir

    for heads in ([2, 0], [0, 0]):
        model = tmp_path / f"m{heads[0]}"
        tiny_model_dir(model, n_decoder_layers=2, heads={"cross": heads})  # as `xattn prune` leaves a model
        with serving(model, tmp_path / "log") as url:
            context, page = translated(browser, url, "word1 word2", 1000)
            if any(heads):
                assert page.locator("#layer option").all_text_contents() == ["0", "1 (no heads: pruned)"]
                assert page.locator("#layer option").nth(1).is_disabled() and page.input_value("#layer") == "0"
                assert page.locator("#head option").all_text_contents() == ["mean", "0", "1"]
                assert page.locator("#heatmap rect.cell").count() > 0 and page.locator("#no-attention").is_hidden()
            else:  # nothing to draw, and no request for it (the API would refuse it)
                assert page.locator("#no-attention").is_visible() and page.locator("#attention").is_hidden()
                assert page.text_content("#translation")
            context.close()


# ------------------------------------------------------------------------------------------ load and faults

def disconnect_mid_request(url: str) -> None:
    """Send half a request body, then hang up."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=5) as s:
        s.sendall(b"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n"
                  b'{"q": "dr')


def test_load_with_faults_mixed_in(server):
    texts = ["eins", "zwei", "drei hundert", "vier", "sieben tausend", "neun"]
    expected = {t: post(server, {"q": t})[1]["translatedText"] for t in texts}
    answers, wrong, lock = [], [], threading.Lock()
    deadline = time.time() + 4

    def client(seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(12):
            if time.time() > deadline:
                return
            kind = rng.choice(["good", "good", "good", "big", "malformed", "disconnect"])
            if kind == "disconnect":
                disconnect_mid_request(server)
                continue
            text = rng.choice(texts)
            body = {"q": text} if kind == "good" else {"q": "x" * 500} if kind == "big" else b"{not json"
            status, reply = post(server, body)
            with lock:
                answers.append((kind, status))
                if status == 200 and reply["translatedText"] != expected[text]:
                    wrong.append((text, reply))
                if status != 200 and set(reply) != {"error", "error_type"}:
                    wrong.append((kind, reply))

    threads = [threading.Thread(target=client, args=(seed,)) for seed in range(24)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not wrong, wrong[:3]
    statuses = {status for _, status in answers}
    assert statuses <= {200, 413, 422, 429}, answers
    assert {status for kind, status in answers if kind == "big"} <= {413, 429}
    assert {status for kind, status in answers if kind == "malformed"} <= {422, 429}
    assert sum(status == 200 for _, status in answers) >= 10
    with urllib.request.urlopen(server + "/health", timeout=5) as r:  # it keeps serving
        assert r.status == 200
    assert post(server, {"q": "drei hundert"})[1]["translatedText"] == expected["drei hundert"]


def test_the_page_asks_for_the_key_a_server_requires(browser, numbers_model):
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "xattn", "serve", str(numbers_model), "--port", str(port),
                                "--threads", "1", "--api-key", "k3y", "--max-attention-values", "10"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               env={**os.environ, "OMP_NUM_THREADS": "1"})
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            try:
                if urllib.request.urlopen(url + "/health", timeout=1).status == 200:
                    break
            except OSError:
                time.sleep(0.1)
        context = browser.new_context()
        page = context.new_page()
        page.goto(url + "/")
        page.wait_for_selector("#key-field:not([hidden])")
        page.fill("#text", "drei")
        page.click("#go")
        page.wait_for_selector("#error:not([hidden])")
        assert "API key is required" in page.text_content("#error")
        page.fill("#key", "k3y")
        page.click("#go")  # full attention is over this server's limit: the page falls back to the mean
        page.wait_for_selector("#result:not([hidden])")
        assert page.locator("#head option").all_text_contents() == ["mean"]
        assert page.locator("#heatmap rect.cell").count() > 0
        context.close()
    finally:
        process.terminate()
        process.wait(10)
