"""How much of offline throughput a continuous batch of n sentences can reach, with no server around it: the
bound under which `xattn serve` works with n clients (issue 21's goal: 70% of offline at 32 clients, greedy).

In one process, on the Multi30k de->en preset model and the 1,000 test_2016_flickr sentences, greedy:
- offline: one `Translator.translate` call over all of them (length-sorted token-budget batches);
- stream n: `Translator.stream` kept at n sentences, a new one joining as soon as one ends (what the server's
  continuous batch does with n clients, minus HTTP and the event loop); its outputs are checked against offline;
- the linear layers alone: every linear layer a decoder step runs (each decoder layer's and the output
  projection, as the decoding copy packs them) timed at n rows and at the offline call's mean rows per decoder
  step, as time per row. Their ratio is a ceiling on the stream's share from the arithmetic alone: the rest of a
  step (attention over padded pools, per-operation overhead) only lowers it.
The parts take turns within each of `--repeats` repetitions; figures are medians.

usage: python benchmarks/stream_bound.py [--repeats 3] [--rows 32 128] [--threads 1]
"""
from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time

import torch

from common import cached_model, model_fingerprint, write_result
from serve_guards import sentences


def streamed(translator, cfg, texts: list[str], n: int) -> list[str]:
    """Translate `texts` through a stream kept at `n` sentences; the texts in input order."""
    stream, out, waiting = translator.stream(cfg), {}, list(enumerate(texts))[::-1]

    def add(k: int) -> None:
        joining = [waiting.pop() for _ in range(min(k, len(waiting)))]
        if joining:
            stream.add([t for _, t in joining], [i for i, _ in joining])
    add(n)
    while len(stream):
        ended = stream.step()
        for tag, result in ended:
            out[tag] = result.text
        add(len(ended))
    return [out[i] for i in range(len(texts))]


def step_linears(model) -> list[torch.nn.Module]:
    """The linear layers of one greedy decoder step of the decoding copy `model`, in the order they run (the
    cross-attention's key and value projections run once per sentence, not per step: left out; a self-attention
    with one product for q, k and v runs that instead of its three)."""
    layers = []
    for layer in model.decoder.layers:
        cross, own = layer.cross_attn, layer.self_attn
        skip = {id(cross.k_proj), id(cross.v_proj)}
        if getattr(own, "qkv", None) is not None:
            skip |= {id(own.q_proj), id(own.k_proj), id(own.v_proj)}
        layers += [m for m in layer.modules() if id(m) not in skip and hasattr(m, "out_features")
                   and not list(m.children())]
    return layers + [model.generator]


def linear_time_per_row(layers: list, rows: int, repeats: int = 50) -> float:
    """Seconds per row of running every layer in `layers` once on `rows` rows (median of `repeats`)."""
    with torch.inference_mode():
        inputs = [torch.randn(rows, first_width(m)) for m in layers]
        for m, x in zip(layers, inputs):
            m(x)
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            for m, x in zip(layers, inputs):
                m(x)
            times.append(time.perf_counter() - start)
    return statistics.median(times) / rows


def first_width(module) -> int:
    """The input width of a linear layer of the decoding copy (nn.Linear, PackedLinear, or the output's FastOutput)."""
    if hasattr(module, "in_features"):
        return module.in_features
    return getattr(module, "fast", module).row_weight.shape[1]


def mean_rows(translator, cfg, texts: list[str]) -> float:
    """The offline call's mean rows per decoder step (rows reaching the output projection)."""
    counts = []
    handle = translator.inference.current().generator.register_forward_pre_hook(
        lambda _, args: counts.append(args[0].reshape(-1, args[0].shape[-1]).shape[0]))
    try:
        translator.translate(texts, cfg)
    finally:
        handle.remove()
    return sum(counts) / len(counts)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--rows", type=int, nargs="+", default=[32, 128])
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    import xattn
    import xattn.allocator

    model = cached_model("multi30k-de-en", [])
    xattn.allocator.keep_freed_memory()  # as the server (and `xattn translate`) sets the process's allocator
    translator = xattn.load(model)
    cfg = dataclasses.replace(translator.decode_config, beam_size=1)
    texts = sentences(1000)
    translator.translate(texts[:100], cfg)  # warm-up
    reference = [t.text for t in translator.translate(texts, cfg)]
    rows_offline = mean_rows(translator, cfg, texts)
    layers = step_linears(translator.inference.current())
    runs: dict = {"offline": [], **{f"stream{n}": [] for n in args.rows}}
    same = True
    for r in range(args.repeats):
        parts = list(runs) if r % 2 == 0 else list(runs)[::-1]
        for part in parts:
            start = time.perf_counter()
            out = translator.translate(texts, cfg) if part == "offline" else None
            got = [t.text for t in out] if out is not None else streamed(translator, cfg, texts, int(part[6:]))
            runs[part].append(len(texts) / (time.perf_counter() - start))
            same &= got == reference
            print(f"repeat {r + 1} {part}: {runs[part][-1]:.1f} sentences/s", flush=True)
    offline = statistics.median(runs["offline"])
    per_row_offline = linear_time_per_row(layers, round(rows_offline))
    summary = {"offline_sentences_per_s": round(offline, 1), "offline_mean_rows_per_step": round(rows_offline, 1),
               "same_translations_as_offline": same}
    for n in args.rows:
        rate = statistics.median(runs[f"stream{n}"])
        per_row = linear_time_per_row(layers, n)
        summary[f"stream{n}"] = {"sentences_per_s": round(rate, 1), "share_of_offline": round(rate / offline, 3),
                                 "linear_us_per_row": round(1e6 * per_row, 2),
                                 "linear_us_per_row_offline_rows": round(1e6 * per_row_offline, 2),
                                 "linear_ceiling_share": round(per_row_offline / per_row, 3)}
    write_result("stream_bound", {"model": model_fingerprint(model), "threads": args.threads, "repeats": args.repeats,
                                  "sentences": len(texts), "summary": summary, "runs": runs})
    print(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
