"""`xattn serve --long-after`: beam-5 throughput against the batcher always waiting for a call, and one-sentence
requests beside a request just under `--long-work`.

The batcher waits for a translate call to end before it collects the next batch (so that requests arriving
meanwhile share one), unless its work is over `--long-work`, or it is still running after `--long-after` seconds per
request it serves. This compares servers that differ only in that flag, in turns, on the
benchmark model (the one of serve_load.py), 1 thread:
- AFTER seconds per request (the default 0.1, or what `--after` gives), against 1000 (the collector always waits for
  a call within `--long-work`, as before the flag);
- beam-5 throughput at concurrency 8 and 32 (serve_load.py's client, SENTENCES test sentences, one per request);
- beside: 10 one-sentence beam-5 requests alone, one after another, then 10 more while a request just under
  `--long-work` runs (8 samples x 512 tokens with min_len 505: 4,096 steps of work, one sentence, seconds long).

usage: python benchmarks/serve_long_after.py [--repeats 2] [--sentences 400] [--after 0.1]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from pathlib import Path

import serve_guards
import serve_load
from common import cached_model, model_fingerprint, write_result

HEAVY = {"q": "Ein Mann fährt Fahrrad.", "source": "de", "target": "en", "sampling": True, "num_samples": 8,
         "max_len_a": 0, "max_len_b": 512, "min_len": 505}  # 8 x 512 = 4,096: just within --long-work


async def beside(port: int, texts: list[str]) -> dict:
    """Seconds of one-sentence beam-5 requests alone, then beside HEAVY (sent 0.3 s before them)."""
    async def post(body: dict) -> float:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        start = time.perf_counter()
        reply = await serve_load.ask(reader, writer, "127.0.0.1", json.dumps(body).encode())
        writer.close()
        if "translatedText" not in reply:
            raise SystemExit(f"the server answered {reply}")
        return time.perf_counter() - start

    def small(text: str) -> dict:
        return {"q": text, "source": "de", "target": "en", "beam_size": 5}
    alone = [await post(small(t)) for t in texts[:10]]
    heavy = asyncio.ensure_future(post(HEAVY))
    await asyncio.sleep(0.3)
    near = [await post(small(t)) for t in texts[10:20]]
    return {"alone_p50_s": round(statistics.median(alone), 3), "beside_p50_s": round(statistics.median(near), 3),
            "beside_max_s": round(max(near), 3), "heavy_s": round(await heavy, 2)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--sentences", type=int, default=400)
    ap.add_argument("--after", default="0.1", help="--long-after of the server compared with 1000 (always waiting)")
    ap.add_argument("--out", default="serve_long_after")
    args = ap.parse_args()
    model = cached_model("multi30k-de-en", [])  # serve_load.py's
    texts_file = Path(os.environ.get("TMPDIR", "/tmp")) / f"serve_long_after_{os.getpid()}.json"
    texts_file.write_text(json.dumps(serve_guards.sentences(args.sentences)))
    small = serve_guards.sentences(20)
    runs: dict[str, dict[str, list]] = {}
    try:
        for _ in range(args.repeats):
            for after in (args.after, "1000"):
                server, port = serve_guards.start_server(model, 1, "--queue-size", "1024", "--long-after", after)
                url, run = f"http://127.0.0.1:{port}", runs.setdefault(after, {})
                try:
                    for c in (8, 32):
                        out = serve_load.run_worker(["--client", url, str(texts_file), "5", str(c), "0"], 1)
                        run.setdefault(f"beam5_c{c}", []).append(out)
                        print(f"--long-after {after} beam 5 c{c}: {out}", flush=True)
                    out = asyncio.run(beside(port, small))
                    run.setdefault("beside", []).append(out)
                    print(f"--long-after {after} beside: {out}", flush=True)
                finally:
                    server.terminate()
                    server.wait()
    finally:
        texts_file.unlink(missing_ok=True)
    summary = {after: {"beam5_c8_sentences_per_s": [o["sentences_per_s"] for o in run["beam5_c8"]],
                       "beam5_c32_sentences_per_s": [o["sentences_per_s"] for o in run["beam5_c32"]],
                       "beside_max_s": [o["beside_max_s"] for o in run["beside"]],
                       "beside_p50_over_alone": [round(o["beside_p50_s"] / o["alone_p50_s"], 2) for o in run["beside"]]}
               for after, run in runs.items()}
    print(json.dumps(summary, indent=1))
    write_result(args.out, {"model": model_fingerprint(model), "sentences": args.sentences, "repeats": args.repeats,
                            "summary": summary, "runs": runs})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
