"""`xattn serve` under an open-loop overload, against an earlier revision: requests arrive at a fixed rate, whether
or not the earlier ones have been answered (as from many independent users), faster than the model translates them.

What a server should do then: answer as much as the model can translate, each answer in time, and refuse the rest at
once (429) so that their clients can retry or go elsewhere; not admit everything to have most of it time out (504)
after using the model's time. Each scenario (`--scenarios`, TEXTS:BEAM:RATE:SECONDS each: sentences per request, beam
size, requests per second, seconds of arrivals) runs against the revision `--against` (checked out into a temporary
git worktree) and this tree, in turns, `--repeats` times, the order alternating; each request on a new connection,
its sentences drawn from Multi30k test_2016_flickr (de). Figures per run: how many requests got each status (429s by
the reason their message gives: the queue's count, the cap on long requests, the backlog's time, or its deadline
check), the latency of the answered ones (median, max), the refused ones' (max), and the sentences answered per
second of the run (arrivals and every answer). A scenario of a high rate for a fraction of a second (16:5:1000:0.1,
100 requests) is a burst sent at once. Scenarios joined by + run at once, each with its own figures
(16:5:1000:0.1+1:5:4:30: the burst, while one-sentence requests keep arriving). `--flags` go to both servers
(`--flags=--timeout=5`). Both servers stay up for every run, unless `--fresh` starts them anew for each: a server that
has answered nothing yet expects its searches to run as long as their sources (serve/backlog.py's LIKELY).

usage: python benchmarks/serve_overload.py --against 9e9c092 [--scenarios 4:5:20:30 16:5:5:30 1:1:200:15]
                                           [--repeats 2] [--threads 1] [--flags=...] [--fresh]
                                           [--out serve_overload]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import time
from collections import Counter
from pathlib import Path

from common import cached_model, model_fingerprint, write_result
from decode_versions import git
from serve_guards import sentences
from serve_load import MODEL
from serve_versions import side_by_side


REASONS = {"requests waiting": "queue", "long requests": "long", "translation ahead": "backlog",
           "translation left": "deadline"}
"""What a 429's message says it was for: the queue's count, the cap on long calls, the backlog's time on arrival, or
its later check of the work admitted against its deadline."""


async def one(port: int, body: bytes) -> tuple[int | str, float]:
    """POST /translate on a new connection: its status (a 429 with its reason, REASONS; or the error's name) and
    latency."""
    start = time.perf_counter()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST /translate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body)
        await writer.drain()
        head = await reader.readuntil(b"\r\n\r\n")
        answer = await reader.read()
        writer.close()
        status: int | str = int(head.split()[1])
        if status == 429:
            error = json.loads(answer)["error"]
            status = f"429 {next((why for words, why in REASONS.items() if words in error), 'other')}"
    except (OSError, asyncio.IncompleteReadError) as e:
        status = type(e).__name__
    return status, time.perf_counter() - start


async def open_loop(port: int, texts: list[str], n: int, beam: int, rate: float, seconds: float, seed: int) -> dict:
    """Requests of `n` sentences at `rate` a second for `seconds`; figures of the run."""
    draw = random.Random(seed)
    start, tasks = time.perf_counter(), []
    while (now := time.perf_counter() - start) < seconds:
        body = json.dumps({"q": draw.sample(texts, n), "source": "de", "target": "en", "beam_size": beam}).encode()
        tasks.append(asyncio.ensure_future(one(port, body)))
        await asyncio.sleep(max(0.0, len(tasks) / rate - now))
    outcomes = await asyncio.gather(*tasks)
    wall = time.perf_counter() - start
    statuses = Counter(str(status) for status, _ in outcomes)
    answered = sorted(t for status, t in outcomes if status == 200)
    refused = [t for status, t in outcomes if str(status).startswith("429")]
    return {"requests": len(outcomes), "statuses": dict(statuses), "wall_s": round(wall, 1),
            "answered_sentences_per_s": round(len(answered) * n / wall, 1),
            "answered_p50_s": round(statistics.median(answered), 2) if answered else None,
            "answered_max_s": round(answered[-1], 2) if answered else None,
            "refused_max_s": round(max(refused), 3) if refused else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="model directory (default: serve_load.py's, the cached multi30k-de-en model)")
    parser.add_argument("--against", required=True, help="the git revision to compare with")
    parser.add_argument("--scenarios", nargs="+", default=["4:5:20:30", "16:5:5:30", "1:1:200:15"],
                        help="TEXTS:BEAM:RATE:SECONDS")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1, help="PyTorch threads of each server")
    parser.add_argument("--flags", default="", help="flags for both servers, separated by spaces")
    parser.add_argument("--fresh", action="store_true",
                        help="start both servers anew for every run (else once: only the first run is on servers "
                             "that have answered nothing, whose deadline check goes by backlog.LIKELY)")
    parser.add_argument("--out", default="serve_overload", help="the result's name in benchmarks/results")
    args = parser.parse_args()
    scenarios = {key: [dict(zip(("texts", "beam", "rate", "seconds"), map(float, part.split(":"))))
                       for part in key.split("+")] for key in args.scenarios}
    model = Path(args.model).resolve() if args.model else cached_model("multi30k-de-en", MODEL)
    texts = sentences(1000)
    against = git("rev-parse", "--short", args.against)
    runs: dict = {key: {"old": [], "new": []} for key in scenarios}

    async def together(port: int, parts: list[dict], seed: int) -> dict | list[dict]:
        figures = await asyncio.gather(*(open_loop(port, texts, int(s["texts"]), int(s["beam"]), s["rate"],
                                                   s["seconds"], seed=seed) for s in parts))
        return figures[0] if len(figures) == 1 else figures
    def run(ports: dict[str, int], r: int, key: str) -> None:
        for name in (("old", "new") if r % 2 == 0 else ("new", "old")):
            figures = asyncio.run(together(ports[name], scenarios[key], seed=r))
            runs[key][name].append(figures)
            print(f"repeat {r + 1} {key} {name}: {figures}", flush=True)
            time.sleep(2)  # (every request has ended: answered, refused or timed out)
    if args.fresh:
        for r in range(args.repeats):
            for key in runs:
                with side_by_side(model, against, args.threads, *args.flags.split()) as ports:
                    run(ports, r, key)
    else:
        with side_by_side(model, against, args.threads, *args.flags.split()) as ports:
            for r in range(args.repeats):
                for key in runs:
                    run(ports, r, key)
    write_result(args.out, {"against": against, "model": model_fingerprint(model) | {"overrides": MODEL},
                            "threads": args.threads, "flags": args.flags, "fresh": args.fresh,
                            "scenarios": "TEXTS:BEAM:RATE:SECONDS", "runs": runs})


if __name__ == "__main__":
    main()
