"""Transfer by cross-attention fine-tuning (Gheini, Ren & May 2021) reproduced on Multi30k.

Parent: the fr->en model of benchmarks/alignment.py (preset multi30k-fr-en, separate vocabularies, MODEL
there), reused from the cache. Children (`xattn.transfer.child_factory`, what `xattn finetune` runs), each
kept in CACHE/transfer-SRC-TGT-STRATEGY-KEY and resumed when cut short:
- de->en (the source side changes) and fr->cs (the target side changes) on a 5,000-pair slice of the
  training data (data.train_subset=5000, seed 1: the same lines for every pair), every strategy, the same
  step budget with early stopping on validation BLEU (SLICE, BUDGET);
- de->en on all 29,000 pairs with +body and +xattn, 30 minutes each (FULL);
- de->cs from scratch on the slice and on all 29,000 pairs (30 minutes), the supervised references of the
  zero-shot test;
- then cs->en (a new source) and fr->de (a new target) on the slice, every strategy, the same way (LATER).
One learning-rate schedule for every strategy, chosen by stage `sweep` on de->en validation BLEU
(src+body and src+xattn at each peak rate of RATES, a shorter budget), stated in transfer_lr.json.

Stages (each resumes; run them in order, in the background: `nohup python benchmarks/transfer.py --stage
all > log &`): sweep -> results/transfer_lr.json; children (trains what is missing); report ->
results/transfer.json (test BLEU, significance, parameters, bytes, forgetting, zero-shot).

usage: python benchmarks/transfer.py --stage sweep|children|report|all|table [--pairs SRC-TGT ...]
(table: the markdown of the report; --pairs: train only those pairs' children)
"""
from __future__ import annotations

import argparse
import functools
import hashlib
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from alignment import MODEL
from common import (CACHE, RESULTS, cached_model, config_key, data_dir, finished, markdown_table, model_fingerprint,
                    train_noted, trained_by, write_result)

from xattn.config import load_config

from xattn.presets import resolve_config
from xattn.strategies import strategy
from xattn.transfer import child_factory

PARENT = "multi30k-fr-en"
PARENT_PAIR = ("fr", "en")
RUN = ["train.max_minutes=0", "train.eval_every=100", "train.patience=3", "train.threads=1"]
"""Every child: validation (greedy BLEU on all 1,014 pairs) every 100 steps, early stopping after 3
evaluations without a better BLEU, one thread."""
SLICE = ["data.train_subset=5000", "data.subset_seed=1", "data.vocab_size=4000"]
"""The low-resource slice; the new side's SentencePiece model has 4,000 pieces (8,000 is too many for
5,000 sentences)."""
BUDGET = 800
"""Steps of 4,096 tokens on the slice (about 40 epochs)."""
SWEEP_BUDGET = 400
RATES = ("2e-3", "1e-3", "3e-4", "1e-4")
"""Peak learning rates tried by the sweep; warmup WARMUP steps, then inverse square root decay."""
WARMUP = 100
FULL_MINUTES = 30
PAUSED_S = {"transfer-de-en-src+xattn-89604c8da4f6": 616, "transfer-de-en-src+body-3ced049beab8": 683}
"""Seconds a run was stopped with SIGSTOP (to time benchmarks/serve_load.py alone on this 2-core CPU), by
cache directory; taken out of its minutes (/work/bench_logs/pauses.txt recorded them)."""


@dataclass(frozen=True)
class Child:
    src: str
    tgt: str
    strategy: str
    lr: str
    steps: int = BUDGET
    full_data: bool = False

    @property
    def name(self) -> str:
        return f"{self.src}-{self.tgt}-{self.strategy}" + ("-full" if self.full_data else "")

    def overrides(self) -> list[str]:
        data = [] if self.full_data else SLICE
        budget = ([f"train.max_minutes={FULL_MINUTES}", "train.max_steps=100000", "train.eval_every=250"]
                  if self.full_data else [f"train.max_steps={self.steps}"])
        return [f"data.data_dir={data_dir()}", f"data.src_lang={self.src}", f"data.tgt_lang={self.tgt}", *data,
                *RUN, f"train.lr={self.lr}", f"train.warmup={WARMUP}", *budget]


def parent_dir() -> Path:
    return cached_model(PARENT, MODEL)


def child_dir(child: Child, parent: Path) -> tuple[Path, object]:
    """Where `child` trains, keyed by its config, its strategy and the parent's weights; and its config."""
    cfg = load_config(resolve_config(PARENT), child.overrides())
    parent_sha = model_fingerprint(parent)["tensors_sha256"]
    key = hashlib.sha256(f"{config_key(cfg)}|{child.strategy}|{parent_sha}".encode()).hexdigest()[:12]
    return CACHE / f"transfer-{child.name}-{key}", cfg


def train_child(child: Child, parent: Path) -> Path:
    out, cfg = child_dir(child, parent)
    print(f"[{time.strftime('%H:%M:%S')}] {child.name} lr {child.lr}, {child.steps} steps -> {out}", flush=True)
    # de->cs changes both of the fr->en parent's languages: not a child, a model of its own with the same shape
    own = child.src != PARENT_PAIR[0] and child.tgt != PARENT_PAIR[1]
    factory = None if own else child_factory(parent, strategy(child.strategy), cfg, out)
    progress = train_noted(cfg, out, factory, quiet=True)
    if progress.stop_reason == "interrupted":
        raise SystemExit(f"training {out} was interrupted; run again to resume it")
    print(f"[{time.strftime('%H:%M:%S')}] {child.name}: {progress.stop_reason} at step {progress.step}, best valid "
          f"BLEU {progress.best_score:.2f} at step {progress.best_step}, {progress.seconds / 60:.1f} min", flush=True)
    return out


def best_valid(model_dir: Path) -> dict:
    fp = model_fingerprint(model_dir)
    return {"best_valid_bleu": fp["best_valid_bleu"], "trained_steps": fp["trained_steps"]}


def sweep(parent: Path) -> str:
    """Train the sweep runs; write transfer_lr.json; return the chosen peak rate."""
    path = RESULTS / "transfer_lr.json"
    if path.is_file() and (done := json.loads(path.read_text())).get("rates") == list(RATES):
        return done["chosen_lr"]
    rows = []
    for lr in RATES:
        for strat in ("src+body", "src+xattn"):
            child = Child("de", "en", strat, lr, steps=SWEEP_BUDGET)
            rows.append({"strategy": strat, "lr": lr, **best_valid(train_child(child, parent))})
    mean = {lr: sum(r["best_valid_bleu"] for r in rows if r["lr"] == lr) / 2 for lr in RATES}
    chosen = max(RATES, key=lambda lr: mean[lr])
    write_result("transfer_lr", {
        "what": f"de->en children on the 5,000-pair slice, {SWEEP_BUDGET} steps, warmup {WARMUP}; best greedy "
                "validation BLEU per run; the chosen rate has the best mean over src+body and src+xattn",
        "parent": model_fingerprint(parent), "rates": list(RATES), "runs": rows, "mean_valid_bleu": mean,
        "chosen_lr": chosen,
        "warmup": WARMUP})
    return chosen


LATER = (("cs", "en", "src"), ("fr", "de", "tgt"))
"""The issue's second round of children on the slice, after the required ones: a new source, a new target."""


def children(lr: str) -> list[Child]:
    """Every run of the table, those the forgetting and zero-shot tests need first, the LATER pairs last."""
    first = [Child("de", "en", "src+xattn", lr), Child("de", "en", "src+body", lr), Child("fr", "cs", "tgt+xattn", lr),
             Child("fr", "cs", "tgt+body", lr), Child("de", "cs", "scratch", lr)]
    rest = [Child("de", "en", s, lr) for s in ("src", "src+randxattn", "scratch")]
    rest += [Child("fr", "cs", s, lr) for s in ("tgt", "tgt+randxattn", "scratch")]
    full = [Child("de", "en", s, lr, full_data=True) for s in ("src+body", "src+xattn")]
    required = first + rest + full + [Child("de", "cs", "scratch", lr, full_data=True)]  # the supervised baseline
    return required + [Child(src, tgt, f"{side}+{s}" if s else side, lr) for s in ("body", "xattn", "", "randxattn")
                       for src, tgt, side in LATER] + [Child(src, tgt, "scratch", lr) for src, tgt, _ in LATER]


# ---------------------------------------------------------------------------------------- report

@functools.cache
def test_pairs(src: str, tgt: str) -> tuple[list[str], list[str]]:
    from xattn.datasets import load_pairs

    pairs = load_pairs("multi30k", src, tgt, "test_2016_flickr", data_dir())
    return [s for s, _ in pairs], [t for _, t in pairs]


def hypotheses(model_dir: Path, src: str, tgt: str) -> list[str]:
    """Beam-5 translations of test_2016_flickr, kept beside the model once made, under the digest of the
    weights they came from (test.SRC-TGT.DIGEST.hyp)."""
    import xattn
    from xattn.io import atomic_write_text

    path = model_dir / f"test.{src}-{tgt}.{model_fingerprint(model_dir)['tensors_sha256'][:12]}.hyp"
    if not path.is_file():
        sources, _ = test_pairs(src, tgt)
        hyps = [t.text for t in xattn.load(model_dir).translate(sources, xattn.DecodeConfig(beam_size=5))]
        atomic_write_text(path, "".join(h + "\n" for h in hyps))  # a cut write is never read back as a result
    return path.read_text().split("\n")[:-1]


def bleu_of(model_dir: Path, src: str, tgt: str) -> dict:
    from xattn.evaluation import bleu

    hyps, (_, refs) = hypotheses(model_dir, src, tgt), test_pairs(src, tgt)
    cased, lower = bleu(hyps, refs), bleu(hyps, refs, lowercase=True)
    return {"bleu": round(cased.score, 2), "bleu_lc": round(lower.score, 2), "signature": cased.signature,
            "signature_lc": lower.signature}


def significance(model_dir: Path, baseline: Path, src: str, tgt: str) -> float:
    """p-value of sacreBLEU's paired bootstrap (1,000 resamples, its fixed seed), cased BLEU, against `baseline`."""
    from sacrebleu.metrics import BLEU
    from sacrebleu.significance import PairedTest

    _, refs = test_pairs(src, tgt)
    systems = [("baseline", hypotheses(baseline, src, tgt)), ("system", hypotheses(model_dir, src, tgt))]
    _, scores = PairedTest(systems, {"BLEU": BLEU()}, [refs], test_type="bs", n_samples=1000)()
    return round(float(scores["BLEU"][1].p_value), 4)


def run_record(child: Child, model_dir: Path) -> dict:
    """What the table reports for one run, besides BLEU: parameters, bytes, time and steps."""
    from xattn.checkpoint import load_model_dir
    from xattn.transfer import parameter_table, trainable_names

    model = load_model_dir(model_dir).model
    strat = strategy(child.strategy)
    side = strat.side or "src"
    share = parameter_table(model, trainable_names(model, strat, side))[-1]
    records = [json.loads(line) for line in (model_dir / "log.jsonl").read_text().splitlines()]
    evals = [r for r in records if "valid_bleu" in r]  # the average of the last checkpoints too, when it was kept
    kept = sorted(f for f in model_dir.iterdir() if f.is_file() and f.suffix in (".safetensors", ".model", ".json",
                                                                                   ".yaml"))
    return {"pair": f"{child.src}->{child.tgt}", "strategy": child.strategy,
            "data": "all 29,000 pairs" if child.full_data else "5,000-pair slice",
            "trained_parameters": share["trained"], "parameters": share["total"],
            "trained_share": round(share["share"], 4),
            "weights_bytes": (model_dir / "model.safetensors").stat().st_size,
            "model_dir_bytes": sum(f.stat().st_size for f in kept),
            "steps": max((r["step"] for r in records if "step" in r), default=0),
            "minutes": round((max((r.get("seconds", 0) for r in records), default=0) - PAUSED_S.get(model_dir.name, 0))
                             / 60, 1), "paused_s_taken_out": PAUSED_S.get(model_dir.name, 0),
            "best_valid_bleu": round(max(e["valid_bleu"] for e in evals), 2),
            "best_step": max(evals, key=lambda e: e["valid_bleu"])["step"], "dir": str(model_dir),
            "trained_by": trained_by(model_dir)}


def body_of(child: Child) -> Child:
    """The +body run that `child` is tested against (the parent is fr->en: the side whose language changed)."""
    side = "tgt" if child.src == "fr" else "src"
    return Child(child.src, child.tgt, f"{side}+body", child.lr, child.steps, child.full_data)


def composed(name: str, **parts: Path) -> Path:
    """A model from `xattn.transfer.compose`, kept in the cache under `name` and the parts' weights."""
    from xattn.transfer import compose

    key = hashlib.sha256("|".join(f"{k}={model_fingerprint(v)['tensors_sha256']}" for k, v in sorted(parts.items()))
                         .encode()).hexdigest()[:12]
    out = CACHE / f"transfer-{name}-{key}"
    if not (out / "model.safetensors").is_file():
        compose(out, **parts)
    return out


def report(lr: str, parent: Path) -> dict:
    runs, dirs = [], {}
    for child in children(lr):
        out, _ = child_dir(child, parent)
        if not finished(out):
            print(f"{child.name}: not trained yet", file=sys.stderr)
            continue
        dirs[child] = out
        runs.append(run_record(child, out) | bleu_of(out, child.src, child.tgt))
    for row, (child, out) in zip(runs, dirs.items()):
        if (baseline := dirs.get(body_of(child))) is not None and baseline != out:
            row["p_vs_body"] = significance(out, baseline, child.src, child.tgt)
    result = {"parent": model_fingerprint(parent) | bleu_of(parent, "fr", "en"), "runs": runs}
    get = {(c.src, c.tgt, c.strategy, c.full_data): d for c, d in dirs.items()}
    forgetting = []
    for strat in ("src+xattn", "src+body"):
        if (child := get.get(("de", "en", strat, False))) is not None:
            back = composed(f"forget-{strat}", base=child, src_embeddings=parent)
            forgetting.append({"child": strat, "fr->en": bleu_of(back, "fr", "en")})
    result["forgetting"] = forgetting
    zero_shot = []
    for strat in ("xattn", "body"):
        src_child, tgt_child = get.get(("de", "en", f"src+{strat}", False)), get.get(("fr", "cs", f"tgt+{strat}", False))
        if src_child is not None and tgt_child is not None:
            made = composed(f"zero-shot-de-cs-{strat}", base=tgt_child, src_embeddings=src_child)
            zero_shot.append({"parts": f"de->en src+{strat} source embeddings into fr->cs tgt+{strat}",
                              "de->cs": bleu_of(made, "de", "cs")})
    for full, data in ((False, "the slice"), (True, f"all 29,000 pairs, {FULL_MINUTES} minutes")):
        if (scratch := get.get(("de", "cs", "scratch", full))) is not None:
            zero_shot.append({"parts": f"de->cs trained from scratch on {data} (supervised)",
                              "de->cs": bleu_of(scratch, "de", "cs")})
    result["zero_shot"] = zero_shot
    return result


def markdown(result: dict) -> str:
    """The tables of benchmarks/README.md from results/transfer.json."""
    base = result["parent"]["bleu"]
    order = ["scratch", "src", "tgt", "src+body", "tgt+body", "src+xattn", "tgt+xattn", "src+randxattn",
             "tgt+randxattn"]
    pairs = ["de->en", "fr->cs", "de->cs", "cs->en", "fr->de"]
    runs = sorted(result["runs"], key=lambda r: (r["data"].startswith("all"), pairs.index(r["pair"]),
                                                  order.index(r["strategy"])))
    lines = markdown_table(
        ["pair", "data", "strategy", "BLEU", "BLEU (lc)", "p vs `+body`", "trained", "weights", "minutes",
         "steps (best)"],
        [[r["pair"].replace("->", "→"), "all" if r["data"].startswith("all") else "5k", f"`{r['strategy']}`",
          f"{r['bleu']:.2f}", f"{r['bleu_lc']:.2f}", "" if r.get("p_vs_body") is None else f"{r['p_vs_body']:.3f}",
          f"{100 * r['trained_share']:.1f}%", f"{r['weights_bytes'] / 1e6:.1f} MB", r["minutes"],
          f"{r['steps']} ({r['best_step']})"] for r in runs])
    lines += ["", *markdown_table(
        ["forgetting: fr→en test BLEU", "BLEU", "BLEU (lc)", f"against the parent ({base:.2f})"],
        [[f"parent's fr embeddings in the de→en `{f['child']}` child", f"{f['fr->en']['bleu']:.2f}",
          f"{f['fr->en']['bleu_lc']:.2f}", f"{f['fr->en']['bleu'] - base:+.2f}"] for f in result["forgetting"]])]
    lines += ["", *markdown_table(["de→cs test", "BLEU", "BLEU (lc)"],
                                  [[z["parts"], f"{z['de->cs']['bleu']:.2f}", f"{z['de->cs']['bleu_lc']:.2f}"]
                                   for z in result["zero_shot"]])]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--stage", choices=("sweep", "children", "report", "all", "table"), required=True)
    ap.add_argument("--pairs", nargs="+", metavar="SRC-TGT",
                    help="train only the children of these pairs (two processes may then train different pairs)")
    args = ap.parse_args()
    if args.pairs and args.stage != "children":
        ap.error("--pairs is for --stage children")
    if args.stage == "table":
        print(markdown(json.loads((RESULTS / "transfer.json").read_text())))
        return 0
    parent = parent_dir()
    lr = sweep(parent)
    if args.stage == "sweep":
        return 0
    print(f"learning rate {lr}, warmup {WARMUP}", flush=True)
    if args.stage in ("children", "all"):
        known = {f"{c.src}-{c.tgt}" for c in children(lr)}
        if unknown := set(args.pairs or ()) - known:
            ap.error(f"--pairs: no children for {', '.join(sorted(unknown))} (known: {', '.join(sorted(known))})")
        for child in children(lr):
            if not args.pairs or f"{child.src}-{child.tgt}" in args.pairs:
                train_child(child, parent)
    if args.stage in ("report", "all"):
        lr_record = json.loads((RESULTS / "transfer_lr.json").read_text())
        figures = report(lr, parent)
        write_result("transfer", {
            "what": "Gheini et al. (2021) on Multi30k: children of the fr->en parent; test_2016_flickr BLEU, beam 5",
            "schedule": {"lr": lr, "warmup": WARMUP, "decay": "inverse square root", "chosen_by": "transfer_lr.json",
                         "sweep_commit": lr_record["commit"]},
            "budget": {"slice_steps": BUDGET, "eval_every": 100, "patience": 3, "full_data_minutes": FULL_MINUTES,
                       "overrides": RUN + SLICE}, **figures})
    return 0


if __name__ == "__main__":
    sys.exit(main())
