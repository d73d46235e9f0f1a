"""Where translation time goes: a torch.profiler breakdown of xattn decoding by operator.

Translates Multi30k test_2016_flickr (or its first --sentences) with greedy and beam 5, once
unprofiled for the wall time and once under torch.profiler, and writes the operators' shares of
self CPU time to results/decode_profile[_int8].json. The profiler adds a fixed cost per operator,
so the shares of small operators are overstated; the wall time is the unprofiled one.

usage: python benchmarks/profile_decode.py [--model runs/bench/multi30k-de-en] [--sentences 1000] [--quantize int8]
"""
from __future__ import annotations

import argparse
import time

from common import data_dir, write_result
from torch.profiler import ProfilerActivity, profile

from xattn.config import DecodeConfig
from xattn.datasets import multi30k
from xattn.translator import Translator


def breakdown(prof, top: int) -> list[dict]:
    """The `top` operators by self CPU time, with their share of the total."""
    events = [e for e in prof.key_averages() if e.self_cpu_time_total > 0]
    total = sum(e.self_cpu_time_total for e in events)
    events.sort(key=lambda e: -e.self_cpu_time_total)
    return [{"op": e.key, "share": round(e.self_cpu_time_total / total, 3), "calls": e.count,
             "self_ms": round(e.self_cpu_time_total / 1000, 1)} for e in events[:top]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="runs/bench/multi30k-de-en")
    parser.add_argument("--sentences", type=int, default=1000)
    parser.add_argument("--quantize", choices=["int8"], default=None)
    parser.add_argument("--top", type=int, default=15)
    args = parser.parse_args()
    texts = [s for s, _ in multi30k("de", "en", "test_2016_flickr", data_dir())][: args.sentences]
    translator = Translator.from_dir(args.model, device="cpu", quantize=args.quantize)
    figures = {}
    for beam in (1, 5):
        cfg = DecodeConfig(beam_size=beam, n_best=1)
        translator.translate(texts[:50], cfg)  # warm up
        start = time.perf_counter()
        translator.translate(texts, cfg)
        wall = time.perf_counter() - start
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            translator.translate(texts, cfg)
        mode = "greedy" if beam == 1 else "beam5"
        figures[mode] = {"wall_s": round(wall, 2), "sentences_per_s": round(len(texts) / wall, 1),
                         "ops": breakdown(prof, args.top)}
        print(mode, f"{wall:.2f} s")
        for row in figures[mode]["ops"]:
            print(f"  {row['share']:6.1%}  {row['calls']:7d}  {row['op']}")
    figures["settings"] = {"sentences": len(texts), "model": args.model, "quantize": args.quantize}
    print("->", write_result("decode_profile" + (f"_{args.quantize}" if args.quantize else ""), figures))


if __name__ == "__main__":
    main()
