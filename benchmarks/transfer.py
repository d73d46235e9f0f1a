"""Transfer by cross-attention fine-tuning (Gheini, Ren & May 2021) reproduced on Multi30k.

Parent: the fr->en model of benchmarks/alignment.py (preset multi30k-fr-en, separate vocabularies, MODEL
there), reused from the cache. Children (`xattn.transfer.child_factory`, what `xattn finetune` runs), each
kept in CACHE/transfer-SRC-TGT-STRATEGY-KEY and resumed when cut short:
- de->en (the source side changes) and fr->cs (the target side changes) on a 5,000-pair slice of the
  training data (data.train_subset=5000, seed 1: the same lines for every pair), every strategy, the same
  step budget with early stopping on validation BLEU (SLICE, BUDGET);
- de->en on all 29,000 pairs with +body and +xattn, 30 minutes each (FULL);
- de->cs from scratch on the slice, the supervised reference of the zero-shot test.
One learning-rate schedule for every strategy, chosen by stage `sweep` on de->en validation BLEU
(src+body and src+xattn at each peak rate of RATES, a shorter budget), stated in transfer_lr.json.

Stages (each resumes; run them in order, in the background: `nohup python benchmarks/transfer.py --stage
all > log &`): sweep -> results/transfer_lr.json; children (trains what is missing); report ->
results/transfer.json (test BLEU, significance, parameters, bytes, forgetting, zero-shot).

usage: python benchmarks/transfer.py --stage sweep|children|report|all
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from alignment import MODEL
from common import CACHE, RESULTS, cached_model, config_key, data_dir, model_fingerprint, write_result

from xattn.config import load_config, resolve_config
from xattn.training import train
from xattn.transfer import child_factory, strategy

PARENT = "multi30k-fr-en"
RUN = ["train.max_minutes=0", "train.eval_every=100", "train.patience=3", "train.threads=1"]
"""Every child: validation (greedy BLEU on all 1,014 pairs) every 100 steps, early stopping after 3
evaluations without a better BLEU, one thread."""
SLICE = ["data.train_subset=5000", "data.subset_seed=1", "data.vocab_size=4000"]
"""The low-resource slice; the new side's SentencePiece model has 4,000 pieces (8,000 is too many for
5,000 sentences)."""
BUDGET = 800
"""Steps of 4,096 tokens on the slice (about 40 epochs)."""
SWEEP_BUDGET = 400
RATES = ("1e-3", "3e-4", "1e-4")
"""Peak learning rates tried by the sweep; warmup WARMUP steps, then inverse square root decay."""
WARMUP = 100
FULL_MINUTES = 30


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
    progress = train(cfg, out, quiet=True, factory=child_factory(parent, strategy(child.strategy), cfg, out))
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
    if path.is_file():
        return json.loads(path.read_text())["chosen_lr"]
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
        "parent": model_fingerprint(parent), "runs": rows, "mean_valid_bleu": mean, "chosen_lr": chosen,
        "warmup": WARMUP})
    return chosen


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--stage", choices=("sweep", "children", "report", "all"), required=True)
    args = ap.parse_args()
    parent = parent_dir()
    lr = sweep(parent)
    if args.stage == "sweep":
        return 0
    print(f"learning rate {lr}, warmup {WARMUP}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
