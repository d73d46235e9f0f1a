"""`xattn serve` at concurrency 1 against an earlier revision: the same model and sentences, both servers up side by side.

A server's own cost per request is a few milliseconds on a decoding time of about 20, and this machine's speed drifts
by more than that between runs, so a change to the server is measured against the revision before it in one run: the
revision is checked out into a temporary git worktree (removed at the end), each version's `xattn serve` runs from its
own source tree, and every sentence of Multi30k test_2016_flickr (de, the first `--sentences`) is sent to one and then
the other, one request at a time on a keep-alive connection, the order alternating per sentence. Figures: each
version's median latency, the median of the per-sentence ratios new/old and of the differences, and whether the two
answered every sentence alike. With `--clients N`, then throughput: the sentences sent by N clients in flight
(serve_load.py's client) to each server in turns, `--repeats` times, the order alternating; sentences/s of each.

usage: python benchmarks/serve_versions.py --against 600882e [--sentences 400] [--beam 1] [--threads 1]
                                           [--clients 32 --repeats 4] [--out serve_versions]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from common import ROOT, cached_model, model_fingerprint, write_result
from decode_versions import git
from serve_guards import sentences, start_server
from serve_load import MODEL, ask, request_body, run_worker


async def alternate(ports: dict[str, int], texts: list[str], beam: int, warm_up: int = 30) -> dict:
    """Each sentence to every server in turn (the order alternating); each one's latencies and answers."""
    connections = {name: await asyncio.open_connection("127.0.0.1", port) for name, port in ports.items()}
    latency = {name: [] for name in ports}
    answers = {name: [] for name in ports}
    for i, text in enumerate([*texts[:warm_up], *texts]):
        for name in (list(ports) if i % 2 == 0 else list(ports)[::-1]):
            reader, writer = connections[name]
            start = time.perf_counter()
            reply = await ask(reader, writer, "localhost", request_body(text, beam, False))
            if i >= warm_up:
                latency[name].append(time.perf_counter() - start)
                answers[name].append(reply["translatedText"])
    for _, writer in connections.values():
        writer.close()
    return {"latency": latency, "answers": answers}


def throughput(ports: dict[str, int], texts: list[str], beam: int, clients: int, repeats: int, threads: int) -> dict:
    """Each server in turns (the order alternating) translating `texts` sent by `clients` clients in flight:
    sentences/s of each turn, and whether every turn answered alike."""
    rates, answers = {name: [] for name in ports}, set()
    with tempfile.NamedTemporaryFile("w", suffix=".json") as f:
        json.dump(texts, f)
        f.flush()
        for r in range(repeats):
            for name in (list(ports) if r % 2 == 0 else list(ports)[::-1]):
                out = run_worker(["--client", f"http://127.0.0.1:{ports[name]}", f.name, str(beam), str(clients), "0"],
                                 threads)
                rates[name].append(out["sentences_per_s"])
                answers.add(out["answers_sha"])
                print(f"{name} {clients} clients: {out['sentences_per_s']} sentences/s", flush=True)
    return {"clients": clients, "sentences_per_s": rates, "same_answers": len(answers) == 1,
            "new_over_old_median": round(statistics.median(rates["new"]) / statistics.median(rates["old"]), 4)}


@contextmanager
def side_by_side(model: Path, against: str, threads: int, *flags: str) -> Iterator[dict[str, int]]:
    """`xattn serve` of the revision `against` (checked out into a temporary git worktree, removed at the end) and
    of this tree, both up, each with `threads` threads and `flags`: their ports, as {"old": ..., "new": ...}."""
    with tempfile.TemporaryDirectory() as tmp:
        old_root = Path(tmp, f"xattn-{against}")
        git("worktree", "add", "--detach", str(old_root), against)
        servers = []
        try:
            ports = {}
            for name, root in (("old", old_root), ("new", ROOT)):
                server, ports[name] = start_server(model, threads, *flags, root=root)
                servers.append(server)
            yield ports
        finally:
            for server in servers:
                server.terminate()
                server.wait()
            git("worktree", "remove", "--force", str(old_root))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="model directory (default: serve_load.py's, the cached multi30k-de-en model)")
    parser.add_argument("--against", required=True, help="the git revision to compare with")
    parser.add_argument("--sentences", type=int, default=400)
    parser.add_argument("--beam", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1, help="PyTorch threads of each server")
    parser.add_argument("--clients", type=int, help="then throughput with this many clients in flight")
    parser.add_argument("--repeats", type=int, default=4, help="turns of each server with --clients")
    parser.add_argument("--out", default="serve_versions", help="the result's name in benchmarks/results")
    args = parser.parse_args()
    model = Path(args.model).resolve() if args.model else cached_model("multi30k-de-en", MODEL)
    texts = sentences(args.sentences)
    against = git("rev-parse", "--short", args.against)
    with side_by_side(model, against, args.threads) as ports:
        out = asyncio.run(alternate(ports, texts, args.beam))
        if args.clients:
            out["throughput"] = throughput(ports, texts, args.beam, args.clients, args.repeats, args.threads)
    old, new = out["latency"]["old"], out["latency"]["new"]
    figures = {"against": against, "model": model_fingerprint(model) | {"overrides": MODEL}, "sentences": len(texts), "beam": args.beam,
               "threads": args.threads, "old_p50_ms": round(1000 * statistics.median(old), 3),
               "new_p50_ms": round(1000 * statistics.median(new), 3),
               "new_over_old_paired": round(statistics.median(b / a for a, b in zip(old, new)), 4),
               "extra_ms_median": round(1000 * statistics.median(b - a for a, b in zip(old, new)), 3),
               "same_answers": out["answers"]["old"] == out["answers"]["new"]}
    if "throughput" in out:
        figures["throughput"] = out["throughput"]
    print(json.dumps(figures, indent=1))
    write_result(args.out, figures)


if __name__ == "__main__":
    main()
