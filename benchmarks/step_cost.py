"""What a decoder step costs a row by its position in the output: the figure behind `xattn serve`'s work bound, which
weighs a token at position t by 1 + t / REACH (xattn/serve/api.py, `positioned`).

Beam search with `min_len` holding every hypothesis to the full length, on copies of one sentence (so every row runs to
the end), through `Translator.translate_steps` (one decoder step per `next()`, as the server's engine runs them); each
step timed on one thread, the medians of five steps around each position, per row. The fit: microseconds per row-step
= a + b * t by least squares over every step after the first, and a / b, the position at which a row's step costs
twice what it does at the start.

usage: python benchmarks/step_cost.py [--model DIR] [--steps 310]   (writes results/step_cost.json)
"""
from __future__ import annotations

import argparse
import statistics
import time

from common import cached_model, model_fingerprint, write_result

SENTENCE = "Ein Hund rennt durch den Park und spielt mit einem Ball."
SHAPES = ((12, 16), (32, 16))
"""(texts, beam): 192 and 512 rows a step."""


def step_times(translator, texts: int, beam: int, steps: int) -> list[float]:
    from xattn.config import DecodeConfig

    cfg = DecodeConfig(beam_size=beam, n_best=1, min_len=steps - 10, max_len_a=0, max_len_b=steps)
    run = translator.translate_steps([SENTENCE] * texts, cfg)
    times, start = [], time.perf_counter()
    try:
        while True:
            next(run)
            now = time.perf_counter()
            times.append(now - start)
            start = now
    except StopIteration:
        return times


def fit(us_per_row: list[float]) -> tuple[float, float]:
    """(a, b) of a + b * t over steps t = 1.. (the first, which encodes, left out)."""
    ts = list(range(1, len(us_per_row)))
    ys = us_per_row[1:]
    mt, my = statistics.mean(ts), statistics.mean(ys)
    b = sum((t - mt) * (y - my) for t, y in zip(ts, ys)) / sum((t - mt) ** 2 for t in ts)
    return my - b * mt, b


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", help="model directory (default: the cached multi30k-de-en model)")
    ap.add_argument("--steps", type=int, default=310)
    args = ap.parse_args()
    import torch
    import xattn
    from xattn.config import DecodeConfig

    torch.set_num_threads(1)
    model = args.model or cached_model("multi30k-de-en", [])
    translator = xattn.load(model)
    translator.translate([SENTENCE], DecodeConfig(beam_size=5))  # warm up
    shapes = {}
    for texts, beam in SHAPES:
        times = step_times(translator, texts, beam, args.steps)
        rows = texts * beam
        per_row = [1e6 * t / rows for t in times]
        a, b = fit(per_row)
        at = {t: round(statistics.median(per_row[t:t + 5]), 1) for t in (5, 50, 100, 150, 200, 250, args.steps - 15)}
        shapes[f"{texts}x{beam}"] = {"rows": rows, "steps": len(times), "seconds": round(sum(times), 2),
                                     "us_per_row_step_at": at, "fit_us": [round(a, 1), round(b, 3)],
                                     "doubles_at_position": round(a / b, 1)}
        print(f"{texts} x beam {beam}: {shapes[f'{texts}x{beam}']}", flush=True)
    write_result("step_cost", {"model": model_fingerprint(model), "threads": 1, "shapes": shapes})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
