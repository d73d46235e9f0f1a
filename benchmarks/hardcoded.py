"""Hard-coded Gaussian attention (You, Sun & Iyyer 2020) on Multi30k de->en, four ways, the same number of steps.

(a) all learned: the model of benchmarks/heads.py (preset multi30k-de-en-8heads, heads.MODEL: 40 minutes);
(b) hard-coded encoder and decoder self-attention, learned cross-attention;
(c) everything hard-coded, cross-attention too;
(d) hard-coded self-attention and one learned cross-attention head in the whole model, in the last decoder
    layer, the other decoder layers without cross-attention (0 heads: only the output bias is left), as in
    the authors' code (fallcat/stupidNMT: --enc-dec-attn-layer 0 0 0 0 1 --enc-dec-attn-num-heads 0 0 0 0 1).
(b), (c) and (d) train for the steps (a) reached, each kept in the benchmark cache and resumed when cut short;
`--runs` trains only the runs named (after (a) has finished), so that two can train at once, one thread each.
Per run: test_2016_flickr BLEU (beam 5, cased and lowercased), training tokens/s (median of the logged rates),
peak memory of MEMORY_STEPS training steps on the largest batches (in a fresh process per run: the peak
resident set, and how much the steps added to it; CPU only, so no allocator statistics), and decoding speed
(greedy and beam 5, side by side, REPEATS alternating repetitions).

usage: python benchmarks/hardcoded.py [--stage train|report|all|table] [--runs NAME ...] [--repeats 3]
"""
from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

from common import (RESULTS, ROOT, cached_model, data_dir, interleaved_speed, markdown_table, model_fingerprint,
                    write_result)
from heads import MODEL as LEARNED, PRESET

RUNS = {
    "a_learned": [],
    "b_hardcoded_self": ["model.attention={enc_self: gaussian, dec_self: gaussian}"],
    "c_hardcoded_all": ["model.attention={enc_self: gaussian, dec_self: gaussian, cross: gaussian}"],
    "d_hardcoded_self_one_cross_head": ["model.attention={enc_self: gaussian, dec_self: gaussian}",
                                        "model.heads={cross: [0, 0, 1]}"],
}
MEMORY_STEPS = 10


def steps_of(model_dir: Path) -> int:
    """The step a run stopped at (its last record: the final validation)."""
    records = [json.loads(line) for line in (model_dir / "log.jsonl").read_text().splitlines()]
    return max(r["step"] for r in records if "step" in r)


def overrides(name: str, steps: int | None) -> list[str]:
    if name == "a_learned":
        return LEARNED
    return [*LEARNED, *RUNS[name], f"train.max_steps={steps}", "train.max_minutes=0"]


def train_all(names=tuple(RUNS)) -> dict[str, Path]:
    dirs = {"a_learned": cached_model(PRESET, LEARNED)}
    steps = steps_of(dirs["a_learned"])
    for name in names:
        if name != "a_learned":
            print(f"[{time.strftime('%H:%M:%S')}] {name}: {steps} steps", flush=True)
            dirs[name] = cached_model(PRESET, overrides(name, steps))
    return dirs


def memory_worker(model_dir: str) -> None:
    """Run MEMORY_STEPS training steps of the model in `model_dir` (its config, tokenizers and data) on the
    largest batches; print the peak resident set (MiB) and how much the steps added to it."""
    import torch

    from xattn.checkpoint import load_model_dir
    from xattn.corpus import prepare_corpus
    from xattn.data import TokenBatchSampler
    from xattn.losses import label_smoothed_loss

    torch.set_num_threads(1)
    loaded = load_model_dir(model_dir)
    corpus = prepare_corpus(loaded.config.data, Path(model_dir), new_tokenizers=False)  # reads, writes nothing
    model = loaded.model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-7)
    train, lengths = corpus.train, corpus.train.src_lengths()
    sampler = TokenBatchSampler(lengths, train.tgt_lengths(), loaded.config.train.max_tokens, shuffle=False)
    largest = sorted(sampler.batches(), key=lambda b: -len(b) * max(lengths[i] for i in b))[:MEMORY_STEPS]
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start, tokens = time.perf_counter(), 0
    for indices in largest:
        batch = train.collate(indices)
        loss, _ = label_smoothed_loss(model(batch.src, batch.tgt_in).logits, batch.tgt_out, 0, 0.1)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        tokens += batch.n_tgt_tokens
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"peak_rss_mib": round(peak / 1024, 1), "rss_growth_mib": round((peak - before) / 1024, 1),
                      "tokens_per_s_largest_batches": round(tokens / seconds, 1)}))


def memory(model_dir: Path) -> dict:
    out = subprocess.run([sys.executable, __file__, "--memory-worker", str(model_dir)],
                         capture_output=True, text=True, cwd=ROOT / "benchmarks",
                         env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)})
    if out.returncode:
        raise SystemExit(f"memory worker {model_dir} failed: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def report(dirs: dict[str, Path], repeats: int) -> dict:
    import xattn
    from xattn.datasets import load_pairs
    from xattn.evaluation import bleu

    test = load_pairs("multi30k", "de", "en", "test_2016_flickr", data_dir())
    sources, refs = [s for s, _ in test], [t for _, t in test]
    steps = steps_of(dirs["a_learned"])
    runs, models = {}, {name: xattn.load(d) for name, d in dirs.items()}
    for name, d in dirs.items():
        hyps = [t.text for t in models[name].translate(sources, xattn.DecodeConfig(beam_size=5))]
        records = [json.loads(line) for line in (d / "log.jsonl").read_text().splitlines()]
        rates = [r["tokens_per_s"] for r in records if "tokens_per_s" in r]
        cfg = models[name].config.model
        runs[name] = {"overrides": overrides(name, steps), "bleu": round(bleu(hyps, refs).score, 2),
                      "bleu_lc": round(bleu(hyps, refs, lowercase=True).score, 2),
                      "train_tokens_per_s_median": round(statistics.median(rates), 1), "steps": steps_of(d),
                      "train_minutes": round(max(r.get("seconds", 0) for r in records) / 60, 1),
                      "length_ratio": cfg.length_ratio, "memory": memory(d),
                      "model": model_fingerprint(d)}
        print(f"{name}: BLEU {runs[name]['bleu']}", flush=True)
    return {"runs": runs, "decoding": interleaved_speed(models, sources, repeats, "a_learned")}


def markdown(result: dict) -> str:
    """The table of benchmarks/README.md from results/hardcoded.json."""
    names = {"a_learned": "(a) all learned", "b_hardcoded_self": "(b) hard-coded self-attention",
             "c_hardcoded_all": "(c) everything hard-coded",
             "d_hardcoded_self_one_cross_head": "(d) (b) with one learned cross-attention head"}
    speed = result["decoding"]
    lines = markdown_table(
        ["run", "BLEU", "BLEU (lc)", "steps", "train tokens/s (alone, largest batches)", "peak memory (MiB)",
         "greedy sentences/s", "beam 5 sentences/s"],
        [[names[name], f"{run['bleu']:.2f}", f"{run['bleu_lc']:.2f}", run["steps"],
          f"{run['memory']['tokens_per_s_largest_batches']:.0f}",
          f"{run['memory']['peak_rss_mib']:.0f} (+{run['memory']['rss_growth_mib']:.0f})",
          *(f"{speed[m][name]['sentences_per_s']} ({speed[m][name]['speed_over_a_learned']:.2f}x)"
            for m in ("greedy", "beam5"))] for name, run in result["runs"].items()])
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--stage", choices=("train", "report", "all", "table"), default="all")
    ap.add_argument("--runs", nargs="+", choices=tuple(RUNS), default=tuple(RUNS),
                    help="train only these runs (the report needs all)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--memory-worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.memory_worker:
        memory_worker(args.memory_worker)
        return 0
    if args.stage == "table":
        print(markdown(json.loads((RESULTS / "hardcoded.json").read_text())))
        return 0
    if args.stage != "train" and tuple(args.runs) != tuple(RUNS):
        ap.error("--runs is for --stage train: the report needs all the runs")
    dirs = train_all(args.runs)
    if args.stage in ("report", "all"):
        write_result("hardcoded", {
            "what": "You et al. (2020) on Multi30k de->en: learned, hard-coded self-attention, everything hard-coded, "
                    "hard-coded self-attention with one learned cross-attention head; the same steps",
            "decoding": "beam 5 for BLEU (sacreBLEU 13a, test_2016_flickr); speed greedy and beam 5, 1 thread",
            **report(dirs, args.repeats)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
