"""`xattn serve` against what production traffic does (run by serve_load.py --parts guards, or alone):

- flood: FLOOD connections keep sending one-sentence greedy requests for FLOOD_S seconds; meanwhile a fresh
  client asks /health every 0.25 s. Figures: /health latency (p50, max; a probe without an answer within 5 s
  counts as failed), the flood's answers by status, and no 5xx.
- slow: the server under a 256-file limit (as the issue's report); SLOW connections send a request head one
  byte a second; meanwhile a normal request every second for 18 s. Figures: how the normal requests fare (status,
  latency) and when the slow connections were closed.
- beside: a one-sentence request's latency (greedy and beam 5) alone, and while the largest request the default
  limits allow runs (32 texts x beam 16 x max_len_b 195: 252,416 of the 256,000 work, a token at position t weighing
  1 + t/64): the ratio (goal <= 3).
- over_limit: a server of OVER_LIMIT connections at most; OVER idle connections open as fast as they can (in a thread),
  and from the same moment a fresh client asks /health every 0.05 s for OVER_S seconds. Figures: each probe's status
  and latency by when it was sent (no connection there is quiet long enough to give its place: /health is answered
  from the reserve of connections held over the limit, serve/connections.py).
- models: a server of three models (the benchmark model as de-en, and linked copies of it as fr-en and cs-en, each
  loaded as a model of its own, with its own translating thread); a one-sentence request to de-en (greedy and
  beam 5) alone, and while fr-en and cs-en each run the largest request of beside: the ratio (goal <= 3, as for
  one model: no model's work may stall another's).
- cold: COLD_CLIENTS clients send beam-5 requests of one sentence each to a fresh server, COLD_SENTENCES in all,
  then the same again: throughput and p99 of the first (cold) and the second (warm) pass, and the translate
  calls each made (a fair scheduler keeps the cold pass's batches as full as the warm one's).
Every part starts its own server; the server's resident memory is read after each.

usage: python benchmarks/serve_guards.py [--threads 1] [--parts beside flood slow over_limit models cold] [--out NAME]
(writes results/serve_guards.json, or results/NAME.json)
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from common import ROOT, cached_model, data_dir, model_fingerprint, write_result

FLOOD, FLOOD_S, SLOW = 500, 10.0, 300
OVER_LIMIT, OVER, OVER_S = 64, 300, 3.0
COLD_CLIENTS, COLD_SENTENCES = 32, 1000
LARGE = {"beam_size": 16, "max_len_a": 0, "max_len_b": 195, "min_len": 150}


def sentences(n: int) -> list[str]:
    from xattn.datasets import load_pairs

    return [s for s, _ in load_pairs("multi30k", "de", "en", "test_2016_flickr", data_dir())][:n]


def start_server(model: Path, threads: int, *flags: str, files: int | None = None, root: Path = ROOT,
                 also: tuple[Path, ...] = ()) -> tuple[subprocess.Popen, int]:
    """`xattn serve MODEL [ALSO...]` of the source tree `root` on a free port, once /health answers; and the port."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    def limit_files():
        if files is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (files, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONPATH": str(root)}
    # run from `root` too: `python -m` puts the working directory ahead of PYTHONPATH, so a script started from a
    # checkout's root (not from benchmarks/, as the earlier results were) ran that checkout's server for both
    server = subprocess.Popen([sys.executable, "-m", "xattn", "serve", str(model), *map(str, also), "--port", str(port),
                               "--threads", str(threads), "--no-access-log", *flags], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=limit_files, cwd=root)
    for _ in range(600):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
                if r.status == 200:
                    return server, port
        except OSError:
            time.sleep(0.1)
    server.kill()
    raise SystemExit("the server did not start")


def rss_mb(pid: int) -> float:
    line = next(l for l in Path(f"/proc/{pid}/status").read_text().splitlines() if l.startswith("VmRSS:"))
    return round(int(line.split()[1]) / 1024, 1)


def request(port: int, method: str, path: str, body: dict | None = None, timeout: float = 5.0) -> tuple[int, float]:
    """(status, seconds) of one request on a fresh connection; status 0 when it got no answer."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data, {"Content-Type": "application/json"},
                                 method=method)
    start = time.perf_counter()
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            r.read()
            return r.status, time.perf_counter() - start
    except urllib.error.HTTPError as e:
        return e.code, time.perf_counter() - start
    except OSError:
        return 0, time.perf_counter() - start


# ------------------------------------------------------------------------------------------ flood

def flood_worker(port: int, text: str, connections: int, seconds: float) -> None:
    """Keep `connections` connections sending requests for `seconds`; print the answers' statuses as JSON."""
    body = json.dumps({"q": text}).encode()
    request_bytes = (b"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    statuses: dict[str, int] = {}
    end = time.monotonic() + seconds

    async def one():
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            statuses["refused"] = statuses.get("refused", 0) + 1
            return
        try:
            while time.monotonic() < end:
                writer.write(request_bytes)
                head = await reader.readuntil(b"\r\n\r\n")
                status = head.split(b" ", 2)[1].decode()
                statuses[status] = statuses.get(status, 0) + 1
                length = next(int(l.split(b":", 1)[1]) for l in head.split(b"\r\n") if l.lower().startswith(b"content-length:"))
                await reader.readexactly(length)
                if b"connection: close" in head.lower():
                    return
        except (OSError, asyncio.IncompleteReadError):
            statuses["closed"] = statuses.get("closed", 0) + 1
        finally:
            writer.close()

    async def run():
        await asyncio.gather(*(one() for _ in range(connections)))
    asyncio.run(run())
    print(json.dumps(statuses))


def flood(model: Path, threads: int, text: str) -> dict:
    server, port = start_server(model, threads)
    try:
        idle = [request(port, "GET", "/health")[1] for _ in range(10)]
        worker = subprocess.Popen([sys.executable, __file__, "--flood-worker", str(port), text],
                                  stdout=subprocess.PIPE, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
        time.sleep(1.0)  # the connections open
        probes = []
        while worker.poll() is None and len(probes) < int((FLOOD_S - 1.5) / 0.25):
            probes.append(request(port, "GET", "/health"))
            time.sleep(0.25)
        statuses = json.loads(worker.communicate(timeout=120)[0].strip().splitlines()[-1])
        answered = [s for status, s in probes if status == 200]
        return {"connections": FLOOD, "seconds": FLOOD_S, "flood_statuses": statuses,
                "health_idle_p50_ms": round(1000 * statistics.median(idle), 2),
                "health_probes": len(probes), "health_ok": len(answered),
                "health_p50_ms": round(1000 * statistics.median(answered), 1) if answered else None,
                "health_max_ms": round(1000 * max(s for _, s in probes), 1),
                "health_statuses": sorted({status for status, _ in probes}),
                "server_rss_mb_after": rss_mb(server.pid)}
    finally:
        server.terminate()
        server.wait(10)


# ------------------------------------------------------------------------------------------ slow clients

def slow(model: Path, threads: int, text: str) -> dict:
    server, port = start_server(model, threads, files=256)
    sockets, opened, refused = [], time.monotonic(), 0
    try:
        for _ in range(SLOW):
            try:
                sock = socket.create_connection(("127.0.0.1", port), timeout=2)
                sock.sendall(b"POST /translate HTTP/1.1\r\nHost: x\r\n")
                sockets.append(sock)
            except OSError:
                refused += 1
        stop = threading.Event()

        def trickle():  # one byte a second on each still open; note when each was closed
            while not stop.wait(1.0):
                for sock in sockets:
                    if sock.fileno() != -1:
                        try:
                            sock.sendall(b"X")
                        except OSError:
                            closed.append(time.monotonic() - opened)
                            sock.close()
        closed: list[float] = []
        threading.Thread(target=trickle, daemon=True).start()
        normal = []
        for _ in range(18):
            status, seconds = request(port, "POST", "/translate", {"q": text})
            normal.append({"at_s": round(time.monotonic() - opened, 1), "status": status, "ms": round(1000 * seconds, 1)})
            time.sleep(max(0.0, 1.0 - seconds))
        stop.set()
        return {"slow_connections": SLOW, "server_files": 256, "normal_requests": normal,
                "normal_ok": sum(r["status"] == 200 for r in normal),
                "slow_closed_by_server": len(closed), "slow_closed_median_s": round(statistics.median(closed), 1) if closed else None,
                "server_rss_mb_after": rss_mb(server.pid)}
    finally:
        for sock in sockets:
            sock.close()
        server.terminate()
        server.wait(10)


# ------------------------------------------------------------------------------------------ over the limit

def over_limit(model: Path, threads: int, root: Path = ROOT) -> dict:
    server, port = start_server(model, threads, "--max-connections", str(OVER_LIMIT), root=root)
    sockets: list[socket.socket] = []
    try:
        start = time.monotonic()

        def crowd():
            for _ in range(OVER):
                try:
                    sockets.append(socket.create_connection(("127.0.0.1", port), timeout=2))
                except OSError:
                    pass
        opener = threading.Thread(target=crowd)
        opener.start()
        probes = []
        while time.monotonic() - start < OVER_S:
            at = time.monotonic() - start
            status, seconds = request(port, "GET", "/health", timeout=2.0)
            probes.append({"at_s": round(at, 2), "status": status, "ms": round(1000 * seconds, 1)})
            time.sleep(0.05)
        opener.join()
        return {"max_connections": OVER_LIMIT, "idle_connections": OVER, "opened": len(sockets), "probes": probes,
                "health_ok": sum(p["status"] == 200 for p in probes), "health_statuses": sorted({p["status"] for p in probes}),
                "health_max_ms": max(p["ms"] for p in probes), "server_rss_mb_after": rss_mb(server.pid)}
    finally:
        for sock in sockets:
            sock.close()
        server.terminate()
        server.wait(10)


# ------------------------------------------------------------------------------------------ beside the largest

def small_beside(port: int, texts: list[str], small: dict, large: list[dict]) -> dict:
    """One-sentence requests (`small` with each of 20 texts) alone, then while the `large` requests run (each on a
    thread of its own, begun a second before): their latencies, the ratio, and how the large ones ended."""
    bodies = [dict(small, q=t) for t in texts[:20]]
    alone = [request(port, "POST", "/translate", b, 60) for b in bodies]
    results: dict = {}
    runners = [threading.Thread(target=lambda i=i, body=body: results.update({i: request(port, "POST", "/translate",
                                                                                      body, 600)}))
               for i, body in enumerate(large)]
    for runner in runners:
        runner.start()
    time.sleep(1.0)
    near = [request(port, "POST", "/translate", b, 60) for b in bodies]
    still_running = all(runner.is_alive() for runner in runners)
    for runner in runners:
        runner.join()
    p50 = lambda xs: statistics.median(s for _, s in xs)  # noqa: E731
    return {"alone_p50_ms": round(1000 * p50(alone), 1), "beside_p50_ms": round(1000 * p50(near), 1),
            "beside_max_ms": round(1000 * max(s for _, s in near), 1), "ratio": round(p50(near) / p50(alone), 2),
            "large_still_running_after": still_running,
            "large": [{"status": results[i][0], "seconds": round(results[i][1], 1)} for i in range(len(large))],
            "statuses": sorted({s for s, _ in alone + near})}


SMALL = {"greedy": {}, "beam5": {"beam_size": 5}}


def beside(model: Path, threads: int, texts: list[str]) -> dict:
    from xattn.serve.work import positioned

    server, port = start_server(model, threads, "--timeout", "600")
    try:
        out = {name: small_beside(port, texts, body, [{"q": texts[100:132], **LARGE}]) for name, body in SMALL.items()}
        out["large_request"] = {"texts": 32, **LARGE, "work": 32 * LARGE["beam_size"] * positioned(LARGE["max_len_b"])}
        out["server_rss_mb_after"] = rss_mb(server.pid)
        return out
    finally:
        server.terminate()
        server.wait(10)


# ------------------------------------------------------------------------------------------ beside other models

OTHER_SOURCES = ("fr", "cs")
"""The source languages of the benchmark model's copies in `models` (each a model of its own to the server)."""


def copy_as(model: Path, source: str, into: Path) -> Path:
    """`model` under another language pair (`source`-en): its files linked, its config.yaml rewritten."""
    out = into / f"{model.name}-{source}"
    out.mkdir()
    for path in model.iterdir():
        if path.name != "config.yaml":
            (out / path.name).symlink_to(path)
    lines = (model / "config.yaml").read_text().splitlines()
    (out / "config.yaml").write_text("\n".join(f"  src_lang: {source}" if line.strip().startswith("src_lang:") else line
                                               for line in lines) + "\n")
    return out


def models(model: Path, threads: int, texts: list[str], root: Path = ROOT) -> dict:
    with tempfile.TemporaryDirectory() as into:
        others = tuple(copy_as(model, source, Path(into)) for source in OTHER_SOURCES)
        server, port = start_server(model, threads, "--timeout", "600", also=others, root=root)
        try:
            large = [{"q": texts[100:132], "source": source, "target": "en", **LARGE} for source in OTHER_SOURCES]
            out = {name: small_beside(port, texts, dict(body, source="de", target="en"), large)
                   for name, body in SMALL.items()}
            out["large_requests"] = [f"{source}-en" for source in OTHER_SOURCES]
            out["server_rss_mb_after"] = rss_mb(server.pid)
            return out
        finally:
            server.terminate()
            server.wait(10)


# ------------------------------------------------------------------------------------------ a cold start

def calls_made(port: int) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        line = next(x for x in r.read().decode().splitlines() if x.startswith("xattn_batch_sentences_count"))
    return int(float(line.rsplit(" ", 1)[1]))


def cold(model: Path, threads: int) -> dict:
    texts_file = Path(os.environ.get("TMPDIR", "/tmp")) / f"serve_cold_{os.getpid()}.json"
    texts_file.write_text(json.dumps(sentences(COLD_SENTENCES)))
    server, port = start_server(model, threads, "--queue-size", "1024")
    out: dict = {"clients": COLD_CLIENTS, "sentences": COLD_SENTENCES, "beam_size": 5}
    try:
        for name in ("cold", "warm"):
            before = calls_made(port)
            run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "serve_load.py"), "--client",
                                  f"http://127.0.0.1:{port}", str(texts_file), "5", str(COLD_CLIENTS), "0"],
                                 capture_output=True, text=True, cwd=ROOT / "benchmarks",
                                 env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)})
            if run.returncode:
                raise SystemExit(f"cold-start client failed: {run.stderr[-2000:]}")
            figures = json.loads(run.stdout.strip().splitlines()[-1])
            out[name] = {"sentences_per_s": figures["sentences_per_s"], "p50_ms": figures["p50_ms"],
                         "p99_ms": figures["p99_ms"], "translate_calls": calls_made(port) - before}
        out["cold_over_warm"] = round(out["cold"]["sentences_per_s"] / out["warm"]["sentences_per_s"], 3)
        out["server_rss_mb_after"] = rss_mb(server.pid)
        return out
    finally:
        server.terminate()
        server.wait(10)
        texts_file.unlink(missing_ok=True)


PARTS = ("beside", "flood", "slow", "over_limit", "models", "cold")


def run_guards(model: Path, threads: int, parts: tuple[str, ...] = PARTS, root: Path = ROOT) -> dict:
    texts = sentences(200)
    run = {"beside": lambda: beside(model, threads, texts), "flood": lambda: flood(model, threads, texts[0]),
           "slow": lambda: slow(model, threads, texts[0]), "over_limit": lambda: over_limit(model, threads, root),
           "models": lambda: models(model, threads, texts, root),
           "cold": lambda: cold(model, threads)}
    results = {part: run[part]() for part in parts}
    goals = {}
    if "flood" in results:
        goals["health_within_1s_during_flood"] = results["flood"]["health_ok"] == results["flood"]["health_probes"] \
            and results["flood"]["health_max_ms"] <= 1000
        goals["no_5xx"] = not any(str(s).startswith("5") for s in results["flood"]["flood_statuses"])
    if "beside" in results:
        goals["small_beside_large_within_3x"] = all(results["beside"][m]["ratio"] <= 3 for m in ("greedy", "beam5"))
        goals["no_5xx"] = goals.get("no_5xx", True) and all(s < 500 for m in ("greedy", "beam5")
                                                             for s in results["beside"][m]["statuses"])
    if "models" in results:
        goals["small_beside_other_models_within_3x"] = all(results["models"][m]["ratio"] <= 3
                                                           for m in ("greedy", "beam5"))
        goals["no_5xx"] = goals.get("no_5xx", True) and all(s < 500 for m in ("greedy", "beam5")
                                                             for s in results["models"][m]["statuses"])
    if "over_limit" in results:
        goals["health_answered_over_the_limit"] = results["over_limit"]["health_statuses"] == [200] \
            and results["over_limit"]["health_max_ms"] <= 1000
    results["goals"] = goals
    return results


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS))
    ap.add_argument("--out", default="serve_guards", help="results/NAME.json to write")
    ap.add_argument("--root", type=Path, default=ROOT, help="the source tree whose server over_limit and models run (a "
                    "worktree of an earlier commit, to compare; the other parts always run this one's)")
    ap.add_argument("--flood-worker", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.flood_worker:
        flood_worker(int(args.flood_worker[0]), args.flood_worker[1], FLOOD, FLOOD_S)
        return 0
    model = cached_model("multi30k-de-en", [])
    results = run_guards(model, args.threads, tuple(args.parts), args.root)
    write_result(args.out, {"model": model_fingerprint(model), "threads": args.threads, "root": str(args.root),
                            **results})
    print(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
