"""`xattn serve` under load: throughput and latency against offline batch translation, on the same model.

Model: Multi30k de->en, trained to its preset's budget (the model of decode_speed.py, in the benchmark cache). Sentences:
test_2016_flickr (de), 1,000, sent one per request, naming source and target as LibreTranslate's API requires
(`source: auto`, the default, would add language identification to every request). Every part runs in its own
process with THREADS PyTorch threads: the server (`xattn serve`), the offline baseline (one `Translator.translate`
call over all the sentences, same settings), the direct single-sentence baseline (`translate([s])` per sentence, in one
process) and the client (a single-threaded asyncio process keeping CONCURRENCY requests in flight, whose CPU
time is reported). Greedy, beam 5, and greedy over the model's lexical shortlist (`shortlist: true` in each
request, DecodeConfig.shortlist offline; counted with `xattn shortlist` when the model has none); concurrency
1, 8, 32 and 128; REPEATS interleaved repetitions, medians. With `--parts guards` (or by default, after the
throughput), the production cases of serve_guards.py: a flood, slow clients, a small request beside the
largest (results/serve_guards.json).
Bars (greedy): at concurrency 32 the server reaches >= 70% of offline throughput; at concurrency 1 its p50
latency is <= 1.1x the direct single-sentence call's, both taken sentence by sentence in turns by one process
(`paired`: the separate c1 and direct runs lie minutes apart, and this machine's speed drifts by tens of percent
between them).

usage: python benchmarks/serve_load.py [--repeats 3] [--sentences 1000] [--threads 1] [--parts throughput guards]
"""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

from common import ROOT, cached_model, data_dir, model_fingerprint, write_result
import serve_guards
from serve_guards import rss_mb, sentences

MODEL: list[str] = []
MODES = {"greedy": (1, False), "beam5": (5, False), "greedy_shortlist": (1, True)}
"""mode -> (beam size, shortlist)"""
CONCURRENCY = (1, 8, 32, 128)


# ----------------------------------------------------------------------------------------- workers

def request_body(text: str, beam: int, shortlist: bool) -> bytes:
    return json.dumps({"q": text, "source": "de", "target": "en", "beam_size": beam,
                       **({"shortlist": True} if shortlist else {})}).encode()


async def ask(reader, writer, host: str, body: bytes) -> dict:
    """One POST /translate on a keep-alive connection: a few lines of HTTP/1.1 on asyncio streams (a client
    library's own CPU time per request, httpx: about 4 ms here, would be added to every latency measured on
    this 2-core machine)."""
    writer.write(b"POST /translate HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (host.encode(), len(body), body))
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length:"))
    reply = json.loads(await reader.readexactly(length))
    if status != 200:
        raise SystemExit(f"HTTP {status}: {reply}")
    return reply


def client_worker(url: str, texts_file: str, beam: int, concurrency: int, shortlist: bool) -> None:
    """Send every sentence as one request, `concurrency` in flight over as many keep-alive connections; print
    JSON figures."""
    texts = json.loads(Path(texts_file).read_text())
    host, port = url.removeprefix("http://").split(":")

    async def run() -> dict:
        latencies, answers = [], {}
        queue = list(enumerate(texts))[::-1]

        async def worker():
            reader, writer = await asyncio.open_connection(host, int(port))
            while queue:
                i, text = queue.pop()
                start = time.perf_counter()
                answers[i] = (await ask(reader, writer, host, request_body(text, beam, shortlist)))["translatedText"]
                latencies.append(time.perf_counter() - start)
            writer.close()
        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return {"wall_s": time.perf_counter() - start, "latencies": latencies,
                "answers": [answers[i] for i in range(len(texts))]}

    out = asyncio.run(run())
    usage = resource.getrusage(resource.RUSAGE_SELF)
    lat = sorted(out["latencies"])
    print(json.dumps({"wall_s": round(out["wall_s"], 3), "sentences_per_s": round(len(texts) / out["wall_s"], 1),
                      "p50_ms": round(1000 * lat[len(lat) // 2], 2), "p99_ms": round(1000 * lat[int(0.99 * (len(lat) - 1))], 2),
                      "client_cpu_s": round(usage.ru_utime + usage.ru_stime, 2),
                      "answers_sha": hash_texts(out["answers"])}))


def offline_worker(model: str, texts_file: str, beam: int, single: bool, shortlist: bool) -> None:
    """One translate call over all the sentences (or, `single`, one call per sentence); print JSON figures."""
    import xattn
    import xattn.allocator

    texts = json.loads(Path(texts_file).read_text())
    xattn.allocator.keep_freed_memory()  # as the server (and `xattn translate`) sets the process's allocator
    translator = xattn.load(model)
    cfg = dataclasses.replace(translator.decode_config, beam_size=beam, shortlist=shortlist)
    translator.translate(texts[:50], cfg)  # warm up
    if single:
        latencies, answers = [], []
        for text in texts:
            start = time.perf_counter()
            answers.append(translator.translate([text], cfg)[0].text)
            latencies.append(time.perf_counter() - start)
        lat = sorted(latencies)
        print(json.dumps({"p50_ms": round(1000 * lat[len(lat) // 2], 2), "p99_ms": round(1000 * lat[int(0.99 * (len(lat) - 1))], 2),
                          "sentences_per_s": round(len(texts) / sum(latencies), 1), "answers_sha": hash_texts(answers)}))
        return
    start = time.perf_counter()
    answers = [t.text for t in translator.translate(texts, cfg)]
    wall = time.perf_counter() - start
    print(json.dumps({"wall_s": round(wall, 3), "sentences_per_s": round(len(texts) / wall, 1),
                      "answers_sha": hash_texts(answers)}))


def paired_worker(model: str, url: str, texts_file: str, beam: int, shortlist: bool) -> None:
    """Concurrency 1 against the direct call, sentence by sentence: each sentence is translated by
    `translate([s])` in this process and by one request to the server, in turns (which goes first alternates),
    never both at once; so the two latencies of a sentence are taken a few milliseconds apart, and the machine's
    drifts in speed (tens of percent here within a minute) fall on both. Print JSON figures."""
    import xattn
    import xattn.allocator

    texts = json.loads(Path(texts_file).read_text())
    host, port = url.removeprefix("http://").split(":")
    xattn.allocator.keep_freed_memory()  # as the server (and `xattn translate`) sets the process's allocator
    translator = xattn.load(model)
    cfg = dataclasses.replace(translator.decode_config, beam_size=beam, shortlist=shortlist)
    translator.translate(texts[:50], cfg)  # warm up

    async def run() -> dict:
        reader, writer = await asyncio.open_connection(host, int(port))
        direct, server, answers = [], [], []
        for i, text in enumerate(texts):
            for side in ("direct", "server") if i % 2 == 0 else ("server", "direct"):
                start = time.perf_counter()
                if side == "direct":
                    answers.append(translator.translate([text], cfg)[0].text)
                else:
                    reply = await ask(reader, writer, host, request_body(text, beam, shortlist))
                took = time.perf_counter() - start
                (direct if side == "direct" else server).append(took)
            if reply["translatedText"] != answers[-1]:
                raise SystemExit(f"sentence {i}: the server answered {reply['translatedText']!r}, "
                                 f"translate gave {answers[-1]!r}")
        writer.close()
        return {"direct": direct, "server": server, "answers": answers}

    out = asyncio.run(run())
    p50 = {side: statistics.median(out[side]) for side in ("direct", "server")}
    print(json.dumps({"direct_p50_ms": round(1000 * p50["direct"], 2), "server_p50_ms": round(1000 * p50["server"], 2),
                      "p50_over_direct": round(p50["server"] / p50["direct"], 3),
                      "median_sentence_ratio": round(statistics.median(s / d for s, d in zip(out["server"], out["direct"])), 3),
                      "extra_ms_median": round(1000 * statistics.median(s - d for s, d in zip(out["server"], out["direct"])), 2),
                      "answers_sha": hash_texts(out["answers"])}))


def hash_texts(texts: list[str]) -> str:
    import hashlib

    return hashlib.sha256("\n".join(texts).encode()).hexdigest()[:16]


# ------------------------------------------------------------------------------------------ driver

def run_worker(args: list[str], threads: int) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True, env=env,
                         cwd=ROOT / "benchmarks")
    if out.returncode:
        raise SystemExit(f"worker {args[:2]} failed: {out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def start_server(model: Path, threads: int) -> tuple[subprocess.Popen, str]:
    """`xattn serve` with a queue deep enough for 128 clients, and its URL."""
    server, port = serve_guards.start_server(model, threads, "--queue-size", "1024")
    return server, f"http://127.0.0.1:{port}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--sentences", type=int, default=1000)
    ap.add_argument("--threads", type=int, default=1, help="PyTorch threads of the server and of the baselines")
    ap.add_argument("--parts", nargs="+", choices=("throughput", "guards"), default=("throughput", "guards"))
    ap.add_argument("--client", nargs=5, help=argparse.SUPPRESS)
    ap.add_argument("--offline", nargs=5, help=argparse.SUPPRESS)
    ap.add_argument("--paired", nargs=5, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.client:
        client_worker(args.client[0], args.client[1], int(args.client[2]), int(args.client[3]), args.client[4] == "1")
        return 0
    if args.paired:
        paired_worker(args.paired[0], args.paired[1], args.paired[2], int(args.paired[3]), args.paired[4] == "1")
        return 0
    if args.offline:
        offline_worker(args.offline[0], args.offline[1], int(args.offline[2]), args.offline[3] == "single",
                       args.offline[4] == "1")
        return 0
    model = cached_model("multi30k-de-en", MODEL)
    if "throughput" in args.parts:
        throughput(args, model)
    if "guards" in args.parts:
        from serve_guards import run_guards

        guards = run_guards(model, args.threads)
        write_result("serve_guards", {"model": model_fingerprint(model) | {"overrides": MODEL}, "threads": args.threads,
                                      **guards})
        print(json.dumps(guards, indent=1))
    return 0


def throughput(args, model: Path) -> None:
    if not (model / "shortlist.safetensors").is_file():
        from xattn.cli.main import main as cli_main
        if cli_main(["shortlist", str(model), "--data-dir", data_dir()]) != 0:
            raise SystemExit("could not count a shortlist for the model")
    texts_file = Path(os.environ.get("TMPDIR", "/tmp")) / f"serve_load_{os.getpid()}.json"
    texts_file.write_text(json.dumps(sentences(args.sentences)))
    runs: dict = {mode: {"offline": [], "direct": [], "paired": [], **{f"c{c}": [] for c in CONCURRENCY}}
                  for mode in MODES}
    server, url = start_server(model, args.threads)
    try:
        for r in range(args.repeats):
            order = list(MODES) if r % 2 == 0 else list(MODES)[::-1]
            for mode in order:
                beam, shortlist = str(MODES[mode][0]), str(int(MODES[mode][1]))
                parts = [("offline", ["--offline", str(model), str(texts_file), beam, "batch", shortlist]),
                         ("direct", ["--offline", str(model), str(texts_file), beam, "single", shortlist])]
                parts += [(f"c{c}", ["--client", url, str(texts_file), beam, str(c), shortlist]) for c in CONCURRENCY]
                parts.append(("paired", ["--paired", str(model), url, str(texts_file), beam, shortlist]))
                for name, worker in (parts if r % 2 == 0 else parts[::-1]):
                    figures = run_worker(worker, args.threads if name in ("offline", "direct", "paired") else 1)
                    if name.startswith("c") or name == "paired":
                        figures["server_rss_mb_after"] = rss_mb(server.pid)
                    runs[mode][name].append(figures)
                    print(f"repeat {r + 1} {mode} {name}: {figures}", flush=True)
    finally:
        server.terminate()
        server.wait(10)
        texts_file.unlink(missing_ok=True)
    summary = {}
    for mode, parts in runs.items():
        med = lambda name, key: statistics.median(x[key] for x in parts[name])  # noqa: E731
        offline = med("offline", "sentences_per_s")
        summary[mode] = {"offline_sentences_per_s": offline, "direct_p50_ms": med("direct", "p50_ms"),
                         "direct_p99_ms": med("direct", "p99_ms"),
                         "server": {f"c{c}": {"sentences_per_s": med(f"c{c}", "sentences_per_s"),
                                              "share_of_offline": round(med(f"c{c}", "sentences_per_s") / offline, 3),
                                              "p50_ms": med(f"c{c}", "p50_ms"), "p99_ms": med(f"c{c}", "p99_ms"),
                                              "client_cpu_s": med(f"c{c}", "client_cpu_s"),
                                              "server_rss_mb_after": max(x["server_rss_mb_after"] for x in parts[f"c{c}"])}
                                    for c in CONCURRENCY},
                         "same_translations_as_offline": all(x["answers_sha"] == parts["offline"][0]["answers_sha"]
                                                              for name in parts for x in parts[name])}
        summary[mode]["c1_p50_over_direct"] = round(summary[mode]["server"]["c1"]["p50_ms"] / summary[mode]["direct_p50_ms"], 3)
        summary[mode]["c1_paired"] = {key: med("paired", key) for key in ("direct_p50_ms", "server_p50_ms", "p50_over_direct",
                                                                          "median_sentence_ratio", "extra_ms_median")}
    bars = {f"{mode}: c32_share_of_offline >= 0.70": summary[mode]["server"]["c32"]["share_of_offline"] >= 0.70
            for mode in ("greedy", "greedy_shortlist")}
    bars["greedy: c1 paired p50_over_direct <= 1.1"] = summary["greedy"]["c1_paired"]["p50_over_direct"] <= 1.1
    summary["greedy_shortlist"]["over_greedy"] = {
        "offline": round(summary["greedy_shortlist"]["offline_sentences_per_s"] / summary["greedy"]["offline_sentences_per_s"], 3),
        "c32": round(summary["greedy_shortlist"]["server"]["c32"]["sentences_per_s"]
                     / summary["greedy"]["server"]["c32"]["sentences_per_s"], 3)}
    write_result("serve_load", {"model": model_fingerprint(model) | {"overrides": MODEL}, "sentences": args.sentences,
                                "threads": args.threads, "repeats": args.repeats, "summary": summary, "bars_greedy": bars,
                                "runs": runs})
    print(json.dumps({"summary": summary, "bars_greedy": bars}, indent=1))


if __name__ == "__main__":
    sys.exit(main())
