"""Train de->en and en->de on Multi30k, translate test_2016_flickr with beam 5, score with sacreBLEU.

usage: python benchmarks/train_multi30k.py [--pairs de-en en-de] [--minutes 55] [--out runs/bench]
Writes benchmarks/results/train_multi30k_PAIR.json. The training budget (train.max_minutes) counts
wall time including validation; train_wall_s is that wall time, added up across resumes, plus
nothing else (tokenizer training and the final test translation are reported apart).
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

from common import data_dir, write_result

from xattn.config import DecodeConfig, load_config

from xattn.presets import resolve_config
from xattn.datasets import multi30k
from xattn.evaluation import evaluate
from xattn.devices import resolve_device
from xattn.training import train
from xattn.translator import Translator


def run_pair(pair: str, minutes: float, out_root: Path, overrides: list[str]) -> dict:
    cfg = load_config(resolve_config(f"multi30k-{pair}"),
                      [f"data.data_dir={data_dir()}", f"train.max_minutes={minutes}", *overrides])
    out = out_root / f"multi30k-{pair}"
    progress = train(cfg, out)
    if progress.stop_reason == "interrupted":
        raise SystemExit(f"{pair}: training was interrupted; run again to resume (no result written)")
    translator = Translator.from_dir(out)
    pairs = multi30k(cfg.data.src_lang, cfg.data.tgt_lang, "test_2016_flickr", data_dir())
    start = time.time()
    hyps = [t.text for t in translator.translate([s for s, _ in pairs], DecodeConfig(beam_size=5))]
    translate_s = time.time() - start
    scores = evaluate(hyps, [t for _, t in pairs])
    (out / "test_2016_flickr.hyp").write_text("\n".join(hyps) + "\n")
    return {"pair": pair, "device": str(resolve_device(cfg.train.device)), "train_wall_s": round(progress.seconds, 1),
            "steps": progress.step, "epochs": progress.epoch,
            "target_tokens_seen": progress.target_tokens, "best_valid_bleu_greedy": round(progress.best_score, 2),
            "test_beam5_translate_s": round(translate_s, 1), "config": cfg.to_dict(),
            **{k: {"score": round(s.score, 2), "signature": s.signature} for k, s in scores.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", nargs="+", default=["de-en", "en-de"])
    parser.add_argument("--minutes", type=float, default=55.0)
    parser.add_argument("--out", default="runs/bench")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    for pair in args.pairs:
        figures = run_pair(pair, args.minutes, Path(args.out), args.overrides)
        path = write_result(f"train_multi30k_{pair.replace('-', '_')}", figures)
        print(f"{pair}: BLEU {figures['bleu']['score']} (lowercased {figures['bleu_lc']['score']}), "
              f"chrF {figures['chrf']['score']}, {figures['train_wall_s']} s -> {path}")


if __name__ == "__main__":
    main()
