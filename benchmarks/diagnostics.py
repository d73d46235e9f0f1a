"""Do the cross-attention flags of `xattn diagnose` pick out worse translations?

Model: Multi30k de->en trained for 20 minutes (the benchmark cache's model, see common.py). Its beam-5
translations of val 2016 (1,014 sentences) and test_2016_flickr (1,000) are diagnosed from their
cross-attention (the model directory's stored alignment choice, else the default) and scored with sentence chrF.

1. Thresholds are fixed on val only: for each flag, the threshold in its grid whose flagged sentences fall
   furthest below the unflagged ones in chrF within length bins, among thresholds that flag 2% to 30% of
   the sentences; where none flags worse sentences, the flag keeps its default threshold.
2. Then, on test: flagged against unflagged chrF within the same bins of source length (words; bin edges
   are val's quartiles), the difference averaged over bins weighted by their flagged sentences, with a
   95% bootstrap interval (sentences resampled within each bin, 2,000 times).

usage: python benchmarks/diagnostics.py [--bootstrap 2000]
"""
from __future__ import annotations

import argparse
import random
from dataclasses import replace

import numpy as np

from common import cached_model, data_dir, model_fingerprint, write_result

import xattn
from xattn.analysis.choice import settings_for
from xattn.analysis.diagnostics import Thresholds, diagnose
from xattn.analysis.maps import PairAttention
from xattn.cli.diagnose import sentence_chrf
from xattn.datasets import load_pairs

MODEL = ["train.max_minutes=20"]
GRIDS = {"under": (0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5), "over": (1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0),
         "detached": (0.1, 0.2, 0.3, 0.4, 0.5, 0.6)}
SHARE = (0.02, 0.30)


def translate(tr, split: str):
    pairs = load_pairs("multi30k", "de", "en", split, data_dir())
    sources, refs = [s for s, _ in pairs], [t for _, t in pairs]
    results = tr.translate(sources, xattn.DecodeConfig(beam_size=5), return_attention=True, attention_from="rescore")
    maps = PairAttention.from_translations(results, sources, tr.tokenizers.src, range(1, len(sources) + 1))
    return sources, maps, np.array(sentence_chrf([r.text for r in results], refs))


def bins_of(lengths: np.ndarray, edges: np.ndarray) -> np.ndarray:
    return np.searchsorted(edges, lengths, side="right")


def binned_gap(chrf: np.ndarray, flagged: np.ndarray, bins: np.ndarray) -> tuple[float | None, int]:
    """Mean over bins (weighted by flagged sentences) of chrF(flagged) - chrF(unflagged); bins lacking either
    side are left out. Returns (gap, flagged sentences counted)."""
    gaps, weights = [], []
    for b in np.unique(bins):
        inside = bins == b
        f, u = chrf[inside & flagged], chrf[inside & ~flagged]
        if len(f) and len(u):
            gaps.append(f.mean() - u.mean())
            weights.append(len(f))
    return (float(np.average(gaps, weights=weights)), int(sum(weights))) if gaps else (None, 0)


def bootstrap(chrf, flagged, bins, n: int, seed: int = 1) -> tuple[float, float]:
    rng = random.Random(seed)
    groups = [np.flatnonzero(bins == b) for b in np.unique(bins)]
    gaps = []
    for _ in range(n):
        idx = np.concatenate([np.array(rng.choices(g, k=len(g))) for g in groups])
        gap, _ = binned_gap(chrf[idx], flagged[idx], bins[idx])
        if gap is not None:
            gaps.append(gap)
    return float(np.percentile(gaps, 2.5)), float(np.percentile(gaps, 97.5))


def flags(maps, choice, thresholds: Thresholds) -> list[list[str]]:
    return [diagnose(m, choice, thresholds).flags for m in maps]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bootstrap", type=int, default=2000)
    args = parser.parse_args()
    model_dir = cached_model("multi30k-de-en", MODEL)
    tr = xattn.load(model_dir)
    choice = settings_for(model_dir, tr.model.cfg).choice
    _, val_maps, val_chrf = translate(tr, "val")
    val_len = np.array([len(m.src_words) for m in val_maps])
    edges = np.percentile(val_len, [25, 50, 75])
    val_bins = bins_of(val_len, edges)

    chosen, tuning = {}, {}
    never = Thresholds(under=-1.0, over=float("inf"), detached=1.0)
    for flag, grid in GRIDS.items():
        rows = []
        for value in grid:
            marked = np.array([flag in f for f in flags(val_maps, choice, replace(never, **{flag: value}))])
            gap, _ = binned_gap(val_chrf, marked, val_bins)
            rows.append({"threshold": value, "share": round(float(marked.mean()), 4),
                         "gap": None if gap is None else round(gap, 2)})
        tuning[flag] = rows
        usable = [r for r in rows if SHARE[0] <= r["share"] <= SHARE[1] and r["gap"] is not None and r["gap"] < 0]
        chosen[flag] = min(usable, key=lambda r: r["gap"])["threshold"] if usable else getattr(Thresholds(), flag)
    thresholds = Thresholds(**chosen)

    _, test_maps, test_chrf = translate(tr, "test")
    test_bins = bins_of(np.array([len(m.src_words) for m in test_maps]), edges)
    test_flags = flags(test_maps, choice, thresholds)
    report = {}
    for name in (*GRIDS, "any"):
        marked = np.array([bool(f) if name == "any" else name in f for f in test_flags])
        gap, counted = binned_gap(test_chrf, marked, test_bins)
        low, high = bootstrap(test_chrf, marked, test_bins, args.bootstrap) if gap is not None else (None, None)
        report[name] = {"flagged": int(marked.sum()), "share": round(float(marked.mean()), 4),
                        "chrf_flagged": round(float(test_chrf[marked].mean()), 2) if marked.any() else None,
                        "chrf_unflagged": round(float(test_chrf[~marked].mean()), 2),
                        "binned_gap": None if gap is None else round(gap, 2), "flagged_in_bins": counted,
                        "ci95": None if low is None else [round(low, 2), round(high, 2)],
                        "worse": None if high is None else high < 0}
    path = write_result("diagnostics", {
        "model": model_fingerprint(model_dir), "choice": str(choice), "length_bin_edges_words": edges.tolist(),
        "thresholds_from_val": chosen, "val_tuning": tuning, "test": report, "bootstrap": args.bootstrap,
        "device": str(tr.device)})
    print(path)
    for name, r in report.items():
        print(f"{name:9} flagged {r['flagged']:4}  chrF {r['chrf_flagged']} vs {r['chrf_unflagged']}  "
              f"binned gap {r['binned_gap']} CI {r['ci95']}")


if __name__ == "__main__":
    main()
