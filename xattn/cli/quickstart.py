"""`xattn quickstart`: train a small model, translate a few held-out sentences, draw one cross-attention map."""
from __future__ import annotations

from pathlib import Path

from xattn.cli.common import add_verb, check_data_dir, path_arg, with_flags
from xattn.errors import XattnError

PRESETS = {"numbers": "numbers-de-en", "multi30k": "multi30k-de-en"}  # --dataset -> preset in xattn/configs/


def register(sub) -> None:
    p = add_verb(sub, "quickstart", "Train a small de->en model (offline numbers task by default), "
                 "translate held-out examples and write a cross-attention heatmap.",
                 "xattn quickstart            # 2 to 4 minutes on an idle 2-core CPU, no download\n"
                 "  xattn quickstart --dataset multi30k --data-dir ../shared/data/multi30k", run)
    p.add_argument("--dataset", choices=sorted(PRESETS), default="numbers")
    p.add_argument("--out", type=path_arg, help="model directory (default: runs/quickstart-DATASET)")
    p.add_argument("--minutes", type=float, help="cap on training time: training ends at the preset's step "
                   "count or at this many minutes, whichever comes first (default: the preset's cap)")
    p.add_argument("--data-dir", type=path_arg, help="local Multi30k folder")
    p.add_argument("--examples", type=int, default=5, help="held-out translations to print")
    p.add_argument("overrides", nargs="*", metavar="section.key=value", help="override preset keys")


def run(args) -> int:
    from xattn.analysis.maps import AttentionMaps
    from xattn.analysis.plots import figure, save
    from xattn.config import load_config
    from xattn.presets import resolve_config
    from xattn.train_state import open_run_dir
    from xattn.datasets import load_pairs
    from xattn.evaluation import evaluate
    from xattn.training import train
    from xattn.translator import Translator

    if args.minutes is not None and not 0 < args.minutes < float("inf"):
        raise XattnError(f"--minutes: must be a number above 0, got {args.minutes:g} (a training budget in minutes)")
    if args.examples < 0:
        raise XattnError(f"--examples: must be >= 0, got {args.examples}")
    if any(item.partition("=")[0].strip() == "data.dataset" for item in args.overrides):
        raise XattnError("data.dataset=: the quickstart's dataset is chosen by --dataset")
    overrides = with_flags(args.overrides, {"--minutes": ("train.max_minutes", args.minutes),
                                            "--data-dir": ("data.data_dir", args.data_dir)})
    cfg = load_config(resolve_config(PRESETS[args.dataset]), overrides)
    check_data_dir(args.data_dir, cfg.data)
    out = Path(args.out or f"runs/quickstart-{args.dataset}")
    open_run_dir(out)  # (a folder training refuses is refused before the heading, not after it)
    print(f"== training {cfg.data.src_lang}->{cfg.data.tgt_lang} on {cfg.data.dataset} into {out} "
          f"({cfg.train.max_steps} steps, at most {cfg.train.max_minutes:g} min)")
    progress = train(cfg, out, flags={"train.max_minutes": "--minutes", "train.max_steps": "train.max_steps="})
    if progress.stop_reason == "interrupted":  # Ctrl+C: stop here (training said how to resume), not go on to
        return 130                             # translate with a model cut short
    if progress.stop_reason == "max_minutes":
        print(f"note: the {cfg.train.max_minutes:g}-minute cap ended training at step {progress.step} of "
              f"{cfg.train.max_steps} (a slow or busy machine), so the model below is undertrained; continue "
              f"where it stopped with: {again(args, 2 * cfg.train.max_minutes)}")

    translator = Translator.from_dir(out)
    pairs = load_pairs(cfg.data.dataset, cfg.data.src_lang, cfg.data.tgt_lang, "test", cfg.data.data_dir)
    results = translator.translate([s for s, _ in pairs], translator.decode_config, return_attention=True)
    hyps, refs = [r.text for r in results], [t for _, t in pairs]
    exact = sum(h == r for h, r in zip(hyps, refs)) / len(refs)
    scores = evaluate(hyps, refs)
    print(f"\n== held-out test set ({len(refs)} pairs, never seen in training)")
    print(f"exact match {100 * exact:.1f}%   BLEU {scores['bleu'].score:.1f}   chrF {scores['chrf'].score:.1f}")
    for (src, ref), res in list(zip(pairs, results))[: args.examples]:
        mark = "ok " if res.text == ref else "   "
        print(f"{mark} {src}\n    -> {res.text}\n       (reference: {ref})")
    pick = max(range(min(len(results), 50)), key=lambda i: len(results[i].tgt_tokens) * (hyps[i] == refs[i]))
    best = results[pick]
    maps = AttentionMaps(best.cross_attention, rows=best.tgt_tokens, cols=best.src_tokens, kind="cross")
    png = save(figure(maps), out / "attention.png")  # the last layer, mean of heads
    print(f"\n== cross-attention heatmap of \"{pairs[pick][0]}\": {png}")
    print(f"next: echo '{pairs[0][0]}' | xattn translate {out}")
    return 0


def again(args, minutes: float) -> str:
    """The command that resumes this quickstart with a cap of `minutes`."""
    import shlex

    words = ["xattn", "quickstart"] + (["--dataset", args.dataset] if args.dataset != "numbers" else [])
    words += ["--data-dir", args.data_dir] if args.data_dir else []
    words += ["--out", args.out] if args.out else []
    return shlex.join(words + ["--minutes", f"{minutes:g}", *args.overrides])
