"""Translation speed and BLEU: xattn against Hugging Face `generate` and CTranslate2, on the same weights.

One run, one machine: the de->en Multi30k model of benchmarks/train_multi30k.py, exported to a
MarianMTModel directory and to CTranslate2 (float32 and int8); Multi30k test_2016_flickr (1,000
sentences); greedy and beam 5; batch translation, text in and text out (tokenization included).
Each system runs `--repeats` times per setting, the systems taking turns within each repetition so
that the machine's slow spells hit them alike; the median time gives sentences/s. A CTranslate2
translator exists only during its own turns (loaded and warmed up untimed), because its idle
threads slowed the PyTorch systems. `--compile` adds
xattn with a torch.compile'd decoder step and writes results/decode_speed_compile.json instead.

`xattn_workers` and `xattn_int8_workers` split each call into one part per thread, decoded at once on a thread
each (`Translator.workers`); `ct2_inter` and `ct2_int8_inter` are CTranslate2 the same way (`inter_threads` =
threads, `intra_threads=1`): every core on a batch of its own, against the systems above, which share all threads
on one batch at a time.

`xattn_early_stopping` is xattn with `stopping="early"` (a sentence ends once 5 hypotheses have finished, the
rule of fairseq and CTranslate2), beam 5 only: what the default exact rule costs and gains.

The `_shortlist` systems decode over the model's lexical shortlist (xattn/shortlist.py; counted here with
`xattn shortlist` when the model has none); `ct2_vmap` and `ct2_int8_vmap` are CTranslate2 with the same
lists as its vocabulary map (exported as vmap.txt, `use_vmap=True`): the same restriction on both sides.

Settings shared by all: max length 1.5 * source + 10 tokens (HF and CT2 per batch: longest source),
length penalty 1.0 (xattn: GNMT ((5+len)/6)^1; HF and CT2: their own length normalisation), the same
number of CPU threads. Batching: xattn its token budget (8000 source positions x beam); HF
length-sorted batches of 64 sentences; CTranslate2 its token budget (8000 / beam), sorted internally.

usage: python benchmarks/decode_speed.py [--model runs/bench/multi30k-de-en] [--repeats 5] [--compile] [--out NAME]
       [--systems NAME ...]  (a subset, e.g. the four settings of issue 21: xattn xattn_int8 ct2 ct2_int8)
(threads: PyTorch's default, all cores; OMP_NUM_THREADS=1 compares the engines on one core)
"""
from __future__ import annotations

import argparse
import gc
import statistics
import tempfile
import time
from pathlib import Path

import torch
from common import data_dir, model_fingerprint, write_result

from xattn.allocator import keep_freed_memory
from xattn.config import DecodeConfig
from xattn.datasets import multi30k
from xattn.evaluation import evaluate
from xattn.interop.ct2 import export_ct2
from xattn.cli.main import main as cli_main
from xattn.interop.marian import export_marian
from xattn.shortlist import FILE as SHORTLIST
from xattn.translator import Translator


BEAM_ONLY = {"xattn_early_stopping"}
"""Systems that differ from `xattn` only in beam search: not timed greedy."""


def xattn_system(model_dir: Path, quantize: str | None, compile: bool = False, stopping: str = "exact",
                 shortlist: bool = False, workers: int = 1):
    translator = Translator.from_dir(model_dir, device="cpu", quantize=quantize, compile=compile, workers=workers)

    def run(texts: list[str], beam: int) -> list[str]:
        cfg = DecodeConfig(beam_size=beam, n_best=1, shortlist=shortlist,
                           **({"stopping": stopping} if beam > 1 else {}))
        return [t.text for t in translator.translate(texts, cfg)]
    return run


def hf_system(hf_dir: Path):
    from transformers import MarianMTModel, MarianTokenizer

    tokenizer = MarianTokenizer.from_pretrained(hf_dir)
    model = MarianMTModel.from_pretrained(hf_dir).eval()

    def run(texts: list[str], beam: int) -> list[str]:
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        out = [""] * len(texts)
        for start in range(0, len(order), 64):
            batch = [texts[i] for i in order[start:start + 64]]
            enc = tokenizer(batch, return_tensors="pt", padding=True)
            limit = int(1.5 * enc["input_ids"].shape[1] + 10)
            with torch.inference_mode():
                ids = model.generate(**enc, num_beams=beam, do_sample=False, max_new_tokens=limit,
                                     length_penalty=1.0, early_stopping=True)
            for i, text in zip(order[start:start + 64], tokenizer.batch_decode(ids, skip_special_tokens=True)):
                out[i] = text
        return out
    return run


class CT2System:
    """CTranslate2, loaded only for its own turns: while a ctranslate2.Translator exists, its idle
    worker threads slowed PyTorch's decoding by about 20% on the 2-core machine (benchmarks/README.md)."""

    def __init__(self, ct2_dir: Path, threads: int, vmap: bool = False, inter: int = 1):
        import sentencepiece as spm

        self.dir, self.threads, self.vmap, self.inter, self.translator = ct2_dir, threads, vmap, inter, None
        self.source = spm.SentencePieceProcessor(model_file=str(ct2_dir / "source.spm"))
        self.target = spm.SentencePieceProcessor(model_file=str(ct2_dir / "target.spm"))

    def load(self, warm_up: list[str], beam: int) -> None:
        import ctranslate2

        self.translator = ctranslate2.Translator(str(self.dir), device="cpu", inter_threads=self.inter,
                                                 intra_threads=max(1, self.threads // self.inter))
        self(warm_up, beam)

    def unload(self) -> None:
        self.translator = None
        gc.collect()
        torch.set_num_threads(self.threads)  # its constructor set this thread's OpenMP threads to intra_threads

    def __call__(self, texts: list[str], beam: int) -> list[str]:
        pieces = [p + ["</s>"] for p in self.source.encode(texts, out_type=str)]
        results = self.translator.translate_batch(
            pieces, beam_size=beam, max_batch_size=8000 // beam, batch_type="tokens",
            max_decoding_length=max(int(1.5 * len(p) + 10) for p in pieces), length_penalty=1.0,
            suppress_sequences=[["<pad>"], ["<s>"]], use_vmap=self.vmap)
        return [self.target.decode_pieces(r.hypotheses[0]) for r in results]


def shortlist_settings(model: Path) -> dict:
    from safetensors import safe_open

    with safe_open(str(model / SHORTLIST), "np") as f:
        return {k: v for k, v in (f.metadata() or {}).items() if k != "tokenizers"}


SYSTEMS = ("xattn", "xattn_int8", "xattn_early_stopping", "xattn_shortlist", "xattn_int8_shortlist", "hf_generate",
           "ct2", "ct2_int8", "ct2_vmap", "ct2_int8_vmap", "xattn_workers", "xattn_int8_workers", "ct2_inter",
           "ct2_int8_inter", "xattn_compiled")
"""Every system main can time (the last four with more than one thread, the last with --compile)."""
SPEED_RATIOS = {  # name: (system, over system), sentences/s; each where both were timed
    "xattn_over_hf": ("xattn", "hf_generate"), "xattn_over_ct2": ("xattn", "ct2"),
    "xattn_int8_over_ct2_int8": ("xattn_int8", "ct2_int8"),
    "xattn_shortlist_over_ct2": ("xattn_shortlist", "ct2"),
    "xattn_int8_shortlist_over_ct2_int8": ("xattn_int8_shortlist", "ct2_int8"),
    "xattn_shortlist_over_ct2_vmap": ("xattn_shortlist", "ct2_vmap"),
    "xattn_int8_shortlist_over_ct2_int8_vmap": ("xattn_int8_shortlist", "ct2_int8_vmap"),
    "shortlist_speedup": ("xattn_shortlist", "xattn"),
    "xattn_workers_over_ct2_inter": ("xattn_workers", "ct2_inter"),
    "xattn_int8_workers_over_ct2_int8_inter": ("xattn_int8_workers", "ct2_int8_inter"),
    "xattn_workers_over_xattn": ("xattn_workers", "xattn"),
    "xattn_int8_workers_over_xattn_int8": ("xattn_int8_workers", "xattn_int8"),
    "ct2_inter_over_ct2": ("ct2_inter", "ct2"), "ct2_int8_inter_over_ct2_int8": ("ct2_int8_inter", "ct2_int8"),
    "exact_over_early_stopping": ("xattn", "xattn_early_stopping")}
"""Ratios of speed (workers: every core a part of its own; exact over early: what the exact stopping rule costs
against fairseq's and CT2's)."""
BLEU_COSTS = {"int8_bleu_cost": ("xattn", "xattn_int8"), "shortlist_bleu_cost": ("xattn", "xattn_shortlist"),
              "exact_stopping_bleu_gain": ("xattn", "xattn_early_stopping")}
SAME_OUTPUTS = {"shortlist_same_outputs": ("xattn", "xattn_shortlist"), "workers_same_outputs": ("xattn", "xattn_workers")}


def ratios(row: dict, outputs: dict, mode: str, sentences: int) -> dict:
    """One mode's ratios, BLEU differences and shares of equal outputs, between the systems timed."""
    out = {}
    for name, (a, b) in SPEED_RATIOS.items():
        if a in row and b in row:
            out[name] = round(row[a]["sentences_per_s"] / row[b]["sentences_per_s"], 3)
    for name, (a, b) in BLEU_COSTS.items():
        if a in row and b in row:
            out[name] = round(row[a]["bleu"] - row[b]["bleu"], 2)
    for name, (a, b) in SAME_OUTPUTS.items():
        if a in row and b in row:
            out[name] = round(sum(x == y for x, y in zip(outputs[(a, mode)], outputs[(b, mode)])) / sentences, 4)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="runs/bench/multi30k-de-en")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--compile", action="store_true", help="also time xattn with torch.compile")
    parser.add_argument("--out", help="result name (default decode_speed, or decode_speed_compile with --compile)")
    parser.add_argument("--systems", nargs="+", metavar="NAME",
                        help=f"time only these systems (of {', '.join(SYSTEMS)}); default all")
    args = parser.parse_args()
    if unknown := sorted(set(args.systems or ()) - set(SYSTEMS)):
        parser.error(f"--systems: no system {', '.join(unknown)} (of {', '.join(SYSTEMS)})")
    keep_freed_memory()  # as `xattn translate` runs (xattn.allocator); the setting is the process's, every engine's
    threads = torch.get_num_threads()
    pairs = multi30k("de", "en", "test_2016_flickr", data_dir())
    texts, refs = [s for s, _ in pairs], [t for _, t in pairs]
    if not (Path(args.model) / SHORTLIST).is_file():
        if cli_main(["shortlist", args.model, "--data-dir", data_dir()]) != 0:
            raise SystemExit("could not count a shortlist for the model")
    with tempfile.TemporaryDirectory() as tmp:
        hf_dir, ct2_dir, ct2_int8_dir = Path(tmp, "hf"), Path(tmp, "ct2"), Path(tmp, "ct2-int8")
        export_marian(args.model, hf_dir)
        export_ct2(args.model, ct2_dir)  # with the shortlist as vmap.txt, used only by the _vmap systems
        export_ct2(args.model, ct2_int8_dir, quantization="int8")
        model = Path(args.model)
        systems = {"xattn": xattn_system(model, None), "xattn_int8": xattn_system(model, "int8"),
                   "xattn_early_stopping": xattn_system(model, None, stopping="early"),
                   "xattn_shortlist": xattn_system(model, None, shortlist=True),
                   "xattn_int8_shortlist": xattn_system(model, "int8", shortlist=True),
                   "hf_generate": hf_system(hf_dir), "ct2": CT2System(ct2_dir, threads),
                   "ct2_int8": CT2System(ct2_int8_dir, threads), "ct2_vmap": CT2System(ct2_dir, threads, vmap=True),
                   "ct2_int8_vmap": CT2System(ct2_int8_dir, threads, vmap=True)}
        if threads > 1:  # (on one thread these are the systems above)
            systems |= {"xattn_workers": xattn_system(model, None, workers=threads),
                        "xattn_int8_workers": xattn_system(model, "int8", workers=threads),
                        "ct2_inter": CT2System(ct2_dir, threads, inter=threads),
                        "ct2_int8_inter": CT2System(ct2_int8_dir, threads, inter=threads)}
        if args.compile:
            systems["xattn_compiled"] = xattn_system(Path(args.model), None, compile=True)
        if args.systems:
            systems = {name: run for name, run in systems.items() if name in args.systems}
        figures, outputs = {}, {}
        for beam in (1, 5):
            mode = "greedy" if beam == 1 else "beam5"
            timed = {name: run for name, run in systems.items() if beam > 1 or name not in BEAM_ONLY}
            for run in timed.values():
                if not isinstance(run, CT2System):
                    run(texts[:50], beam)  # warm up (and compile)
            times: dict[str, list[float]] = {name: [] for name in timed}
            for _ in range(args.repeats):  # interleaved, so a slow spell of the machine hits every system
                for name, run in timed.items():
                    if isinstance(run, CT2System):
                        run.load(texts[:50], beam)  # untimed, with a warm-up
                    else:  # a CT2System with intra_threads=1 before must not leave PyTorch on one thread
                        assert torch.get_num_threads() == threads, (name, torch.get_num_threads())
                    start = time.perf_counter()
                    outputs[(name, mode)] = run(texts, beam)
                    times[name].append(time.perf_counter() - start)
                    if isinstance(run, CT2System):
                        run.unload()
            for name in timed:
                seconds = statistics.median(times[name])
                scores = evaluate(outputs[(name, mode)], refs)
                figures.setdefault(mode, {})[name] = {
                    "sentences_per_s": round(len(texts) / seconds, 1), "median_s": round(seconds, 2),
                    "times_s": [round(t, 2) for t in times[name]], "bleu": round(scores["bleu"].score, 2),
                    "bleu_lc": round(scores["bleu_lc"].score, 2)}
                print(mode, name, figures[mode][name], flush=True)
    for mode, row in figures.items():
        row["ratios"] = ratios(row, outputs, mode, len(texts))
    if ("hf_generate", "greedy") in outputs and ("xattn", "greedy") in outputs:
        same = sum(a == b for a, b in zip(outputs[("xattn", "greedy")], outputs[("hf_generate", "greedy")]))
        figures["greedy_identical_to_hf"] = round(same / len(texts), 4)
    figures["settings"] = {"threads": threads, "sentences": len(texts), "repeats": args.repeats,
                           "model": model_fingerprint(args.model), "shortlist": shortlist_settings(Path(args.model))}
    name = args.out or ("decode_speed_compile" if args.compile else "decode_speed")
    print("->", write_result(name, figures))


if __name__ == "__main__":
    main()
