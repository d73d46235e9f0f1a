"""What each of issue 21's decoding speed-ups is worth: the same process, model and sentences, with one of them
switched off at a time, interleaved.

Switches: `attention` (a decoding step's few queries through the fused kernel again: attention.FEW_QUERIES = 0),
`compaction` (greedy copies every cache as soon as one row finishes: ancestral.COMPACT huge). Each setting
translates the 1,000 sentences of Multi30k test_2016_flickr (de) `--repeats` times, taking turns, greedy and
beam 5, float32; medians, the ratio of "all on" over each switch-off, and whether the outputs are the same.

usage: python benchmarks/decode_ablation.py --model DIR [--repeats 5] [--out decode_ablation]
"""
from __future__ import annotations

import argparse
import importlib
import statistics
import time

from common import data_dir, model_fingerprint, write_result

import xattn
import xattn.attention as attention
from xattn.datasets import multi30k

ancestral = importlib.import_module("xattn.decoding.ancestral")
DEFAULTS = {"FEW_QUERIES": attention.FEW_QUERIES, "COMPACT": ancestral.COMPACT}
SETTINGS = {"all_on": {}, "attention_off": {"FEW_QUERIES": 0}, "compaction_off": {"COMPACT": 10 ** 9}}


def switch(changes: dict) -> None:
    values = DEFAULTS | changes
    attention.FEW_QUERIES, ancestral.COMPACT = values["FEW_QUERIES"], values["COMPACT"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default="decode_ablation")
    args = ap.parse_args()
    texts = [s for s, _ in multi30k("de", "en", "test_2016_flickr", data_dir())]
    translator = xattn.Translator.from_dir(args.model, device="cpu")
    figures = {}
    for mode, beam in (("greedy", 1), ("beam5", 5)):
        cfg = xattn.DecodeConfig(beam_size=beam)
        settings = SETTINGS if beam == 1 else {k: v for k, v in SETTINGS.items() if k != "compaction_off"}
        times, outputs = {name: [] for name in settings}, {}
        translator.translate(texts[:50], cfg)
        for r in range(args.repeats):
            for name in (list(settings) if r % 2 == 0 else list(settings)[::-1]):
                switch(settings[name])
                start = time.perf_counter()
                outputs[name] = [t.text for t in translator.translate(texts, cfg)]
                times[name].append(round(time.perf_counter() - start, 3))
        switch({})
        base = statistics.median(times["all_on"])
        figures[mode] = {name: {"median_s": statistics.median(t), "times_s": t,
                                "all_on_speed_over_this": round(statistics.median(t) / base, 3),
                                "same_outputs_as_all_on": sum(a == b for a, b in zip(outputs[name], outputs["all_on"]))}
                         for name, t in times.items()}
        print(mode, {k: v["all_on_speed_over_this"] for k, v in figures[mode].items()}, flush=True)
    figures["settings"] = {"sentences": len(texts), "repeats": args.repeats, "model": model_fingerprint(args.model),
                           "switches": SETTINGS}
    print("->", write_result(args.out, figures))


if __name__ == "__main__":
    main()
