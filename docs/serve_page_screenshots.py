"""The screenshots of `xattn serve`'s page in the README: docs/serve-page.png (desktop, 1280 CSS pixels wide) and
docs/serve-page-phone.png (a phone, 390 wide), of a real translation in Debian's Chromium.

    python docs/serve_page_screenshots.py ~/.cache/xattn/bench/multi30k-de-en-7c9a3791819f

It starts `xattn serve MODEL` on a free port of 127.0.0.1, translates SENTENCE, moves the heatmap's selection
with the arrow keys (so the readout and the focus show), takes each page whole, and writes the PNGs with a
palette of 256 colours (a fifth of the size, the same to the eye).
"""
from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from PIL import Image
from playwright.sync_api import sync_playwright

SENTENCE = "Ein kleines Mädchen in einem rosa Kleid spielt mit einem roten Ball auf der Wiese."
DOCS = Path(__file__).resolve().parent
SHOTS = {"serve-page.png": 1280, "serve-page-phone.png": 390}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(url: str, process: subprocess.Popen) -> None:
    for _ in range(600):
        if process.poll() is not None:
            sys.exit(f"xattn serve exited with {process.returncode}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=1):
                return
        except OSError:
            time.sleep(0.2)
    sys.exit("xattn serve did not become ready in 2 minutes")


def shoot(browser, url: str, width: int, path: Path, sentence: str) -> None:
    page = browser.new_page(viewport={"width": width, "height": 800}, device_scale_factor=1)
    page.goto(url + "/")
    page.wait_for_selector("#langs:not(:empty)")
    page.fill("#text", sentence)
    page.focus("#text")
    page.keyboard.press("Control+Enter")
    page.wait_for_selector("#result:not([hidden])")
    page.focus('td.xa-cell[tabindex="0"]')
    for key in ("ArrowDown", "ArrowDown", "ArrowRight", "ArrowRight"):  # the third target piece, third source piece
        page.keyboard.press(key)
    page.screenshot(path=str(path), full_page=True)
    page.close()
    Image.open(path).convert("RGB").quantize(256, method=Image.Quantize.MEDIANCUT).save(path, optimize=True)
    print(f"{path}: {path.stat().st_size // 1024} KB")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model", help="model directory")
    p.add_argument("--sentence", default=SENTENCE)
    p.add_argument("--out", type=Path, default=DOCS, help="directory for the PNGs (default: docs/)")
    args = p.parse_args()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    process = subprocess.Popen([sys.executable, "-m", "xattn", "serve", args.model, "--port", str(port),
                                "--threads", "1", "--no-access-log"], env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        wait_ready(url, process)
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox", "--disable-gpu"])
            for name, width in SHOTS.items():
                shoot(browser, url, width, args.out / name, args.sentence)
            browser.close()
    finally:
        process.terminate()
        process.wait(10)


if __name__ == "__main__":
    main()
