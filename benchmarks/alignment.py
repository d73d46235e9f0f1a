"""Word alignment from cross-attention, scored by AER on the Hansards en-fr gold, beside eflomal; and the same
models trained again with guided alignment (issue 23).

Models: Multi30k en->fr and fr->en (presets multi30k-en-fr, multi30k-fr-en, trained by `cached_model` with
MODEL below; the fr->en one is also the transfer parent). Gold: ../shared/data/alignment/hansards-en-fr,
447 pairs, links 1-indexed with the English index first. Every system reads the same lowercased text
(eflomal_peer.normalise, which keeps the Hansards tokens as they are). Never tune on what is reported:
layer, heads, method, threshold, </s> and punctuation rules and the symmetrisation are chosen on the first
100 pairs (TUNE) and AER is reported on the other 347 (TEST). All links are (English word, French word).

Rows: naive and shift at every layer (mean of heads); the best single head; the choice `xattn heads align
--first 100` stores; the full tuned setting; both directions symmetrised (every method); eflomal in two
settings, (i) priors from Multi30k only and (ii) Multi30k + the 447 sentences, both directions and
symmetrised with xattn's own symmetrisation. Speed: `xattn align` pairs per second, and translate with
--alignment against plain translate on Multi30k test_2016_flickr (fr), beam 5, one process, model loaded once.

Guided rows (alignment_guided.py): both directions trained again with guided alignment, guided by eflomal's
links or by the baseline models' own, inductive (Multi30k only) or transductive (the 447 pairs join the
training data); their AER rows beside eflomal in the same data setting, their BLEU on test_2016_flickr against
the baseline's, and translate --alignment's time with a guided head. Every model goes through cached_model
(resumed when cut short), and eflomal's runs and the links files are kept in the benchmark cache by a hash of
their content, so running the command again after an interruption goes on where it stopped.

usage: python benchmarks/alignment.py [--repeats 3] [--workdir DIR] [--weights 0.05 ...] [--upsample 10 ...]
       python benchmarks/alignment.py --smoke DIR     # the whole pipeline on tiny budgets, all files in DIR
       python benchmarks/alignment.py --table         # the README table from results/alignment.json
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import sys
import time
from pathlib import Path

import common
from alignment_guided import (GUIDE_SYM, PRESETS, SETTINGS, UPSAMPLE, WEIGHTS, TrainingText, cli_speed, eflomal_run,
                              guided_systems, moonshot, report, test_bleu)
from alignment_scoring import THRESHOLDS, TUNE, Direction, both, describe, symmetrised, symmetrised_rows
from common import RESULTS, cached_model, data_dir, model_fingerprint, write_result
from eflomal_peer import HANSARDS, eflomal_version, load_hansards, normalise, unseen_rate

import xattn
from xattn.analysis import choice as stored_choice
from xattn.analysis.alignment import AlignSettings, align_pairs, attention_links, format_links, read_alignments
from xattn.analysis.heads import candidates, rank_alignment_heads
from xattn.analysis.maps import HeadChoice, PairAttention
from xattn.datasets import load_pairs
from xattn.lines import read_lines

MODEL = ["train.max_steps=1600", "train.max_minutes=0", "train.warmup=600", "train.eval_every=400"]
"""Both directions: 1,600 steps of 4,096 tokens (about 40 minutes each on 1 thread of the 2-core CPU)."""
SMOKE = ["train.max_steps=20", "train.max_minutes=0", "train.warmup=10", "train.eval_every=10",
         "model.d_model=32", "model.d_ff=64", "data.vocab_size=300"]
"""--smoke: every model a 20-step toy, to see the pipeline run end to end (its figures mean nothing)."""
SMOKE_PAIRS = {"train": 50, "val": 20, "test_2016_flickr": 20}
SMOKE_HANSARDS = TUNE + 50
"""--smoke: the Hansards pairs read (the first 100 tune, the next 50 are reported)."""


def direction_rows(d: Direction, gold) -> dict:
    cfg = d.translator.model.cfg
    L, counts = cfg.n_decoder_layers, cfg.heads_per_layer("cross")  # noqa: N806
    layers = {f"{m} layer {layer}": both(d.links(AlignSettings(HeadChoice(layer), m)), gold)
              for m in ("naive", "shift") for layer in range(L)}
    heads = [AlignSettings(c, m) for m in ("naive", "shift") for c in candidates(counts) if c.heads is not None]
    head, head_aer = d.best(heads, gold)
    # what `xattn heads align --first 100` stores, read back through the model directory
    src = [" ".join(p.src_words) for p in d.pairs[:TUNE]]
    tgt = [" ".join(p.tgt_words) for p in d.pairs[:TUNE]]
    ranking = rank_alignment_heads(d.translator, src, tgt, gold[:TUNE], reverse=d.flip)
    top = ranking[0]
    stored_choice.save(d.model_dir, AlignSettings(HeadChoice.parse(top["layer"], top["heads"]), top["method"]),
                       {"aer": round(top["aer"], 4), "pairs": TUNE, "gold": str(HANSARDS / "gold.talp")})
    stored = stored_choice.settings_for(d.model_dir, d.translator.model.cfg)
    full = [AlignSettings(c, m, t, e, p) for m in ("naive", "shift") for c in candidates(counts)
            for t in THRESHOLDS for e in ("drop", "keep") for p in ("free", "match")]
    tuned, tuned_aer = d.best(full, gold)
    chosen_layer = min(range(L), key=lambda layer: min(layers[f"{m} layer {layer}"]["tune"]["aer"]
                                                       for m in ("naive", "shift")))
    return {"layers": layers, "chosen_layer": chosen_layer,
            "best_single_head": {**describe(head), **head_aer},
            "stored_choice": {**describe(stored), **both(d.links(stored), gold)},
            "tuned": {**describe(tuned), **tuned_aer}, "_tuned_settings": tuned}


def eflomal_rows(runs: dict, train: TrainingText, en: list[str], fr: list[str], gold) -> dict:
    """eflomal's rows in each setting, from its runs (alignment_guided.eflomal_run); seconds: its commands'."""
    rows = {}
    for setting in ("priors", "concat"):
        run = runs[setting]
        sym = symmetrised_rows(symmetrised(run.forward, run.backward, en, fr), gold)
        rows[setting] = {"forward": both(run.forward, gold), "backward": both(run.backward, gold), **sym,
                         "chosen": sym[sym["chosen_symmetrisation"]], "seconds": run.seconds,
                         "workdir": str(run.workdir)}
    rows["unseen_rate"] = {"en": round(100 * unseen_rate(train.norm_en, en), 2),
                           "fr": round(100 * unseen_rate(train.norm_fr, fr), 2)}
    return rows


def speed(d: Direction, settings: AlignSettings, src: list[str], tgt: list[str], repeats: int) -> dict:
    """align pairs/s on the Hansards pairs; translate --alignment against translate, beam 5, on test 2016."""
    texts = [f for f, _ in load_pairs("multi30k", "fr", "en", "test", data_dir())]
    tr = d.translator
    cfg = xattn.DecodeConfig(beam_size=5)

    def plain():
        return [r.text for r in tr.translate(texts, cfg)]

    def aligned():
        results = tr.translate(texts, cfg, return_attention=True, attention_from="rescore")
        pairs = PairAttention.from_translations(results, texts, tr.tokenizers.src, range(1, len(texts) + 1))
        return [f"{r.text} ||| {format_links(attention_links(p, settings))}" for r, p in zip(results, pairs)]

    times: dict = {align_pairs: [], plain: [], aligned: []}
    outputs = {}
    tr.translate(texts[:50], cfg)  # warm up
    for k in range(repeats):
        start = time.perf_counter()
        align_pairs(tr, src, tgt, settings)
        times[align_pairs].append(time.perf_counter() - start)
        for fn in (plain, aligned) if k % 2 == 0 else (aligned, plain):
            start = time.perf_counter()
            outputs[fn] = fn()
            times[fn].append(time.perf_counter() - start)
    if [line.split(" ||| ")[0] for line in outputs[aligned]] != outputs[plain]:
        raise SystemExit("translate --alignment printed other translations than translate")
    align_times, plain_times, aligned_times = times[align_pairs], times[plain], times[aligned]
    med = {k: statistics.median(v) for k, v in (("align", align_times), ("plain", plain_times), ("aligned", aligned_times))}
    return {"align_pairs_per_s": round(len(src) / med["align"], 1), "align_seconds": [round(t, 3) for t in align_times],
            "translate_seconds": [round(t, 3) for t in plain_times],
            "translate_alignment_seconds": [round(t, 3) for t in aligned_times],
            "translate_sentences": len(texts), "alignment_over_plain": round(med["aligned"] / med["plain"], 3)}


def smoke_setup(folder: Path) -> None:
    """Point this run at `folder`: a Multi30k copy cut to SMOKE_PAIRS (en, fr), and a benchmark cache and a
    prepared-data cache of its own, so a smoke run never touches the real ones."""
    data = folder / "multi30k"
    data.mkdir(parents=True, exist_ok=True)
    for split, n in SMOKE_PAIRS.items():
        for lang in ("en", "fr"):
            lines = read_lines(Path(data_dir()) / f"{split}.{lang}.gz")[:n]
            with gzip.open(data / f"{split}.{lang}.gz", "wt", encoding="utf-8") as f:
                f.write("".join(line + "\n" for line in lines))
    os.environ["XATTN_DATA"] = str(data)
    os.environ["XDG_CACHE_HOME"] = str(folder / "xdg")
    common.use_cache(folder / "bench")


def baseline_rows(directions: dict, en: list[str], fr: list[str], gold) -> tuple[dict, dict, dict, dict]:
    """Today's rows of both directions, their tuned settings, their tuned links symmetrised (every method),
    and the symmetrised rows."""
    rows = {name: direction_rows(d, gold) for name, d in directions.items()}
    tuned = {n: rows[n].pop("_tuned_settings") for n in directions}
    sym = symmetrised(*(directions[n].links(tuned[n]) for n in ("en->fr", "fr->en")), en, fr)
    return rows, tuned, sym, symmetrised_rows(sym, gold)


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workdir", type=Path, default=None,
                        help="eflomal's runs, kept by a hash of their inputs (default: the benchmark cache)")
    parser.add_argument("--weights", type=float, nargs="+", default=list(WEIGHTS),
                        help="alignment.weight (lambda) of the guided models; more than one is a grid chosen on "
                             "the first 100 pairs")
    parser.add_argument("--upsample", type=float, nargs="+", default=list(UPSAMPLE),
                        help="copies of the 447 pairs an epoch draws in the transductive setting (a grid likewise)")
    parser.add_argument("--smoke", type=Path, metavar="DIR",
                        help="tiny budgets and data (SMOKE, SMOKE_PAIRS, SMOKE_HANSARDS), every file (caches, "
                             "result) in DIR")
    parser.add_argument("--table", action="store_true",
                        help="print the README's guided table from results/alignment.json (with --smoke, DIR's)")
    return parser.parse_args()


def hansards(smoke: bool) -> tuple[list[str], list[str], list]:
    """The Hansards pairs as every system reads them (normalised English, French) and their gold links."""
    raw_en, raw_fr = load_hansards()
    en, fr = [normalise(e, "en") for e in raw_en], [normalise(f, "fr") for f in raw_fr]
    gold = read_alignments(HANSARDS / "gold.talp", one_indexed=True,
                           lengths=[(len(e.split()), len(f.split())) for e, f in zip(en, fr)])
    return tuple(x[:SMOKE_HANSARDS] for x in (en, fr, gold)) if smoke else (en, fr, gold)


def unguided(args, baseline: dict, en: list[str], fr: list[str], gold, runs: dict, train: TrainingText) -> dict:
    """Today's figures (the baseline models' rows, eflomal's, the bars, the speed), and in "_tuned" and "_sym"
    the baseline's tuned settings and symmetrised links, which self-guidance starts from."""
    directions = {"en->fr": Direction("en->fr", baseline["en->fr"], en, fr, english_first=True),
                  "fr->en": Direction("fr->en", baseline["fr->en"], fr, en, english_first=False)}
    rows, tuned, sym, symmetrised_baseline = baseline_rows(directions, en, fr, gold)
    best = symmetrised_baseline["chosen_symmetrisation"]
    peer = eflomal_rows(runs, train, en, fr, gold)
    ours = symmetrised_baseline[best]["test"]["aer"]
    bars = {
        **{f"shift below naive at the chosen layer, {n}":
           rows[n]["layers"][f"shift layer {rows[n]['chosen_layer']}"]["test"]["aer"]
           < rows[n]["layers"][f"naive layer {rows[n]['chosen_layer']}"]["test"]["aer"] for n in directions},
        "symmetrised below either direction": ours < min(rows[n]["tuned"]["test"]["aer"] for n in directions),
        "xattn symmetrised at or below eflomal (i)": ours <= peer["priors"]["chosen"]["test"]["aer"],
        "gap to eflomal (i), AER points": round(ours - peer["priors"]["chosen"]["test"]["aer"], 2),
        "gap to eflomal (ii), AER points": round(ours - peer["concat"]["chosen"]["test"]["aer"], 2),
    }
    fr_model = directions["fr->en"]
    timing = speed(fr_model, stored_choice.settings_for(baseline["fr->en"], fr_model.translator.model.cfg), fr, en,
                   args.repeats)
    print(f"xattn symmetrised ({best}) AER {ours:.1f} on {len(en) - TUNE} pairs; eflomal (i) "
          f"{peer['priors']['chosen']['test']['aer']:.1f}, (ii) {peer['concat']['chosen']['test']['aer']:.1f}",
          file=sys.stderr)
    return {"unseen_words_percent": peer.pop("unseen_rate"), "directions": rows, "symmetrised": symmetrised_baseline,
            "eflomal": {"version": eflomal_version(), **peer}, "bars": bars, "speed": timing,
            "device": str(fr_model.translator.device), "_tuned": tuned, "_sym": sym}


def guided(args, base: list[str], baseline: dict, en: list[str], fr: list[str], gold, runs: dict,
           train: TrainingText, today: dict) -> dict:
    """The guided systems (alignment_guided), their test BLEU beside the baseline's, and translate
    --alignment's time with a guided head beside the baseline's."""
    grid = {"weights": args.weights, "upsample": args.upsample}
    tuned = today.pop("_tuned")
    systems = guided_systems(baseline, tuned, today.pop("_sym")[GUIDE_SYM], runs, train, en, fr, gold, grid, base,
                             common.CACHE / "alignment-guidance")
    chosen_dirs = {name: system.pop("_model_dirs") for name, system in systems.items()}
    timed = {"baseline fr->en": baseline["fr->en"],
             **{f"{name} fr->en": dirs["fr->en"] for name, dirs in chosen_dirs.items()}}  # every guided head
    trainings = len(PRESETS) * (1 + sum(len(system["variants"]) for system in systems.values()))
    return {"guided": {"protocol": {"guidance_symmetrisation": GUIDE_SYM, "grid": grid, "settings": SETTINGS,
                                    "alignment_section": "defaults: layer = second-to-last, heads [0]",
                                    "self_links_settings": {n: describe(t) for n, t in tuned.items()},
                                    "budget": {"overrides": base, "trainings": trainings}},
                       "systems": systems, "moonshot": moonshot(systems, today["eflomal"])},
            "bleu": test_bleu({"baseline": baseline, **chosen_dirs}),
            "speed_guided": {name: cli_speed(d, args.repeats) for name, d in timed.items()}}


def main() -> None:
    args = parse_args()
    if args.table:
        result = json.loads(((args.smoke or RESULTS) / "alignment.json").read_text())
        if "guided" not in result:
            raise SystemExit(f"{args.smoke or RESULTS}/alignment.json has no guided rows yet: run the benchmark first")
        print("\n".join(report(result)))
        return
    if args.smoke:
        smoke_setup(args.smoke)
        args.repeats = 1
    base = SMOKE if args.smoke else MODEL
    baseline = {n: cached_model(p, base) for n, p in PRESETS.items()}
    en, fr, gold = hansards(bool(args.smoke))
    train = TrainingText.multi30k()
    runs = {s: eflomal_run(train, en, fr, s, args.workdir or common.CACHE / "eflomal") for s in ("priors", "concat")}
    today = unguided(args, baseline, en, fr, gold, runs, train)
    new = guided(args, base, baseline, en, fr, gold, runs, train, today)
    path = write_result("alignment", {
        "gold": str(HANSARDS), "tune_pairs": TUNE, "test_pairs": len(en) - TUNE, "cache": str(common.CACHE),
        "models": {**{n: model_fingerprint(d) for n, d in baseline.items()}, "overrides": base}, **today, **new},
        args.smoke or RESULTS)
    print(path)
    print("\n".join(report(json.loads(path.read_text()))), file=sys.stderr)


if __name__ == "__main__":
    main()
