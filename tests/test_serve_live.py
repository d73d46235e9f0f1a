"""A live `xattn serve` on 127.0.0.1 under load with faults mixed in (bounded in count and time); `serving`
starts one for the other live tests (the page: test_serve_page.py; real clients: test_serve_clients.py)."""
import json
import os
import random
import re
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
    """`xattn serve MODEL` (or a list of models) on a free port, the one it prints (--port 0: a port found free
    beforehand could be taken by the other test worker's server meanwhile), until the block ends; yields its URL once
    /health says ok."""
    models = [str(m) for m in model] if isinstance(model, (list, tuple)) else [str(model)]
    with log.open("w") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "xattn", "serve", *models, "--port", "0", "--threads", "1", *flags],
            stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        url, deadline = None, time.monotonic() + 120  # a bound against hanging, not a timing check
        while True:
            if url is None and (printed := re.search(r" at (http://127\.0\.0\.1:\d+)/", log.read_text())):
                url = printed[1]
            try:
                if url is not None:
                    with urllib.request.urlopen(url + "/health", timeout=5) as r:
                        if r.status == 200:
                            break
            except (urllib.error.URLError, ConnectionError, OSError):
                pass
            if process.poll() is not None:
                raise AssertionError(f"xattn serve exited: {log.read_text()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"xattn serve did not become healthy: {log.read_text()}")
            time.sleep(0.1)
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


def test_the_address_to_open_is_one_a_browser_can_open():
    """A server on every interface printed http://0.0.0.0:8000/, which is no address to open."""
    from xattn.cli.serve import address

    assert address("127.0.0.1", 8000) == "http://127.0.0.1:8000/ (the API and the attention page)"
    assert address("::1", 80).startswith("http://[::1]:80/ (")
    assert address("0.0.0.0", 8000) == "http://127.0.0.1:8000/ (the API and the attention page; on every interface: " \
        "from another machine, this one's name or address)"
    assert address("::", 8000).startswith("http://[::1]:8000/ (the API and the attention page; on every interface")


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
