"""Head importance and pruning on Multi30k de->en (Michel, Levy & Neubig 2019, "Are Sixteen Heads Really Better
than One?"), and the decoding speed of a pruned model.

Model: preset multi30k-de-en-8heads (8 heads in each of the 3 + 3 + 3 attention layers), trained by
`cached_model` with MODEL (one thread, 40 minutes: the preset's 55 cut so that this model and the three
hard-coded runs of benchmarks/hardcoded.py, which train for its steps, fit one session of the 2-core CPU); it is
also run (a) of benchmarks/hardcoded.py.
1. Importance: `xattn heads importance` (gradient, per-layer L2 normalised) over all of Multi30k val.
2. Pruning curves, for each place separately (encoder self, decoder self, cross): test_2016_flickr BLEU
   (beam 5, sacreBLEU) with 0, 10, ..., 90% of that place's heads masked to 0, least important first
   (ranked together across the place's layers, as Michel et al. do), and in RANDOM_ORDERS random orders as a
   control. Masking a head is exactly removing it (tests/test_heads.py), and cheaper to switch.
3. One head per layer: each layer of each place reduced to a single head, one layer at a time, to its best head
   by BLEU on val (an oracle, like Michel et al.'s Table 2, chosen on val and reported on test) and to its most
   important head.
4. Speed: the model with half of all its heads physically pruned (`xattn prune --fraction 0.5`) against the
   whole model, greedy and beam 5 on test, side by side (common.interleaved_speed), medians.
Writes results/heads.json and results/heads_pruning.png.

usage: python benchmarks/heads.py [--model DIR] [--sentences N] [--repeats 3] [--table]
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

from common import RESULTS, cached_model, data_dir, interleaved_speed, markdown_table, model_fingerprint, write_result

import xattn
from xattn.analysis.importance import batches, head_importance
from xattn.analysis.pruning import least_important, mask_of_removal, prune_dir
from xattn.datasets import load_pairs
from xattn.evaluation import bleu
from xattn.registry import PLACES

PRESET = "multi30k-de-en-8heads"
MODEL = ["train.threads=1", "train.max_minutes=40"]
FRACTIONS = [round(0.1 * k, 1) for k in range(10)]
RANDOM_ORDERS = 3
BEAM = xattn.DecodeConfig(beam_size=5)


def pairs(split: str, n: int | None) -> tuple[list[str], list[str]]:
    data = load_pairs("multi30k", "de", "en", split, data_dir())[:n]
    return [s for s, _ in data], [t for _, t in data]


def score(translator, mask, sources, refs) -> dict:
    translator.head_mask = mask
    try:
        hyps = [t.text for t in translator.translate(sources, BEAM)]
    finally:
        translator.head_mask = None
    return {"bleu": round(bleu(hyps, refs).score, 2), "bleu_lc": round(bleu(hyps, refs, lowercase=True).score, 2)}


def removal_of(cfg, heads: list[tuple[str, int, int]]) -> dict:
    removal = {p: [[] for _ in range(cfg.layers_of(p))] for p in PLACES}
    for place, layer, head in heads:
        removal[place][layer].append(head)
    return removal


def curves(translator, table, sources, refs) -> dict:
    cfg = translator.model.cfg
    out = {}
    for place in PLACES:
        ranked = [(r["place"], r["layer"], r["head"]) for r in sorted(table, key=lambda r: r["score"])
                  if r["place"] == place]
        orders = {"importance": ranked}
        for seed in range(1, RANDOM_ORDERS + 1):
            shuffled = list(ranked)
            random.Random(seed).shuffle(shuffled)
            orders[f"random{seed}"] = shuffled
        out[place] = {}
        for name, order in orders.items():
            out[place][name] = []
            for fraction in FRACTIONS:
                k = round(fraction * len(order))
                figures = score(translator, mask_of_removal(cfg, removal_of(cfg, order[:k])), sources, refs)
                out[place][name].append({"fraction": fraction, "pruned": k, **figures})
                print(f"{place} {name} {fraction:.1f}: BLEU {figures['bleu']}", flush=True)
    return out


def single_heads(translator, table, val, test) -> list[dict]:
    cfg = translator.model.cfg
    rows = []
    for place in PLACES:
        for layer in range(cfg.layers_of(place)):
            n = cfg.heads_of(place, layer)

            def only(head: int) -> dict:
                return mask_of_removal(cfg, removal_of(cfg, [(place, layer, h) for h in range(n) if h != head]))

            on_val = [score(translator, only(h), *val)["bleu"] for h in range(n)]
            best = max(range(n), key=lambda h: on_val[h])
            important = max((r for r in table if r["place"] == place and r["layer"] == layer), key=lambda r: r["score"])
            rows.append({"place": place, "layer": layer, "val_bleu_per_head": on_val,
                         "best_head_by_val": best, "best_head_test": score(translator, only(best), *test),
                         "most_important_head": important["head"],
                         "most_important_head_test": score(translator, only(important["head"]), *test)})
            print(f"{place} layer {layer}: best head {best} ({rows[-1]['best_head_test']['bleu']}), most "
                  f"important {important['head']} ({rows[-1]['most_important_head_test']['bleu']})", flush=True)
    return rows


def plot(figures: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=100)
    names = {"enc_self": "encoder self-attention", "dec_self": "decoder self-attention", "cross": "cross-attention"}
    for (place, curves_of), color in zip(figures.items(), ("tab:blue", "tab:green", "tab:red")):
        x = [100 * p["fraction"] for p in curves_of["importance"]]
        ax.plot(x, [p["bleu"] for p in curves_of["importance"]], color=color, marker="o", label=names[place])
        randoms = [k for k in curves_of if k.startswith("random")]
        mean = [statistics.mean(curves_of[k][i]["bleu"] for k in randoms) for i in range(len(x))]
        ax.plot(x, mean, color=color, linestyle="--", alpha=0.6, label=f"{names[place]}, random order")
    ax.set_xlabel("heads of that place pruned (%)")
    ax.set_ylabel("BLEU, test_2016_flickr de-en (beam 5)")
    ax.set_title("Pruning heads least important first (Michel et al. 2019)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)


def markdown(result: dict) -> str:
    """The tables of benchmarks/README.md from results/heads.json."""
    names = {"enc_self": "encoder self", "dec_self": "decoder self", "cross": "cross"}
    whole = result["whole"]["bleu"]
    curves_of = result["pruning"]

    def cell(orders: dict, i: int) -> str:
        randoms = [orders[k][i]["bleu"] for k in orders if k.startswith("random")]
        return f"{orders['importance'][i]['bleu']:.2f} ({statistics.mean(randoms):.2f})"

    lines = markdown_table(["heads pruned", *(f"{names[p]} (random)" for p in curves_of)],
                           [[f"{100 * fraction:.0f}%", *(cell(orders, i) for orders in curves_of.values())]
                            for i, fraction in enumerate(FRACTIONS)])
    rows = []
    for row in result["single_head_layers"]:
        best, important = row["best_head_test"]["bleu"], row["most_important_head_test"]["bleu"]
        rows.append([f"{names[row['place']]} {row['layer']}", f"head {row['best_head_by_val']}: {best:.2f} "
                     f"({best - whole:+.2f})", f"head {row['most_important_head']}: {important:.2f} "
                     f"({important - whole:+.2f})"])
    lines += ["", *markdown_table(["layer reduced to one head", "best head on val: test BLEU (change)",
                                   "most important head: test BLEU (change)"], rows)]
    half, speed = result["half_pruned"], result["half_pruned"]["speed"]
    left = ", ".join(f"{names[p]} {heads}" for p, heads in half["heads_left"].items())
    lines += ["", *markdown_table(
        ["model", "heads left per layer", "test BLEU", "greedy sentences/s", "beam 5 sentences/s"],
        [["whole", "all", f"{whole:.2f}", *(speed[m]["whole"]["sentences_per_s"] for m in ("greedy", "beam5"))],
         ["half of the heads pruned", left, f"{half['test']['bleu']:.2f}",
          *(f"{speed[m]['pruned']['sentences_per_s']} ({speed[m]['pruned']['speed_over_whole']:.2f}x)"
            for m in ("greedy", "beam5"))]])]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", type=Path, help="a model directory (default: the cached multi30k-de-en-8heads model)")
    ap.add_argument("--sentences", type=int, help="use the first N sentences of val and test (a quick check)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--result", default="heads", help="result name (results/NAME.json, NAME_pruning.png)")
    ap.add_argument("--table", action="store_true", help="print the README tables of results/NAME.json and stop")
    args = ap.parse_args()
    if args.table:
        print(markdown(json.loads((RESULTS / f"{args.result}.json").read_text())))
        return 0
    model_dir = args.model or cached_model(PRESET, MODEL)
    fingerprint = model_fingerprint(model_dir) | {"overrides": MODEL}
    translator = xattn.load(model_dir)
    val, test = pairs("val", args.sentences), pairs("test_2016_flickr", args.sentences)
    start = time.time()
    table = head_importance(translator.model, batches(translator, *val, max_tokens=2048), "gradient")
    importance_s = round(time.time() - start, 1)
    whole = score(translator, None, *test)
    print(f"whole model: BLEU {whole['bleu']}; importance in {importance_s} s", flush=True)
    pruning = curves(translator, table, *test)
    single = single_heads(translator, table, val, test)
    with tempfile.TemporaryDirectory() as tmp:
        removal = least_important(translator.model.cfg, table, list(PLACES), 0.5, "importance")
        pruned = prune_dir(model_dir, removal, Path(tmp) / "pruned")
        half = {"heads_left": pruned.cfg.heads, "test": score(xattn.load(Path(tmp) / "pruned"), None, *test),
                "speed": interleaved_speed({"whole": translator, "pruned": xattn.load(Path(tmp) / "pruned")}, test[0],
                                           args.repeats, "whole")}
    png = RESULTS / f"{args.result}_pruning.png"
    plot(pruning, png)
    cross_drop = {p: pruning[p]["importance"][-1]["bleu"] for p in PLACES}
    write_result(args.result, {
        "what": "Michel et al. (2019) on Multi30k de->en: BLEU against the share of one place's heads pruned, "
                "least important first and in random orders; each layer reduced to one head; speed of a model "
                "with half its heads pruned", "model": fingerprint,
        "decoding": "beam 5, sacreBLEU 13a, test_2016_flickr (val for choosing the oracle head)",
        "sentences": {"val": len(val[0]), "test": len(test[0])}, "importance_seconds": importance_s,
        "importance": table, "whole": whole, "pruning": pruning, "single_head_layers": single,
        "half_pruned": half, "bleu_at_90_percent": cross_drop, "plot": str(png.relative_to(RESULTS.parent.parent))})
    return 0


if __name__ == "__main__":
    sys.exit(main())
