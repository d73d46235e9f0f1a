"""`xattn finetune --parent MODEL --strategy S CONFIG`: adapt a trained model to a new language (Gheini et al. 2021)."""
from __future__ import annotations

from pathlib import Path

from xattn.cli.common import add_verb, check_data_dir, path_arg, with_flags
from xattn.errors import XattnError


def register(sub) -> None:
    from xattn.strategies import STRATEGIES

    p = add_verb(sub, "finetune", "Fine-tune a parent model for a pair where one language changes: the changed "
                 "side gets a new vocabulary and fresh embeddings, the other keeps the parent's. Strategies "
                 "(Gheini et al. 2021): scratch (no parent weights); src / tgt (the new embeddings only); "
                 "src+body / tgt+body (and encoder, decoder, cross-attention); src+xattn / tgt+xattn (and the "
                 "cross-attention only); src+randxattn / tgt+randxattn (the same, cross-attention re-initialised). "
                 "Running it again resumes.",
                 "xattn finetune --parent runs/fr-en --strategy src+xattn multi30k-de-en train.max_steps=2000 "
                 "--out runs/de-en-xattn", run)
    p.add_argument("config", type=path_arg, help="the child's preset or YAML file (its data, train and decode "
                   "sections; the model's shape is the parent's)")
    p.add_argument("overrides", nargs="*", metavar="section.key=value", help="override config keys")
    p.add_argument("--parent", type=path_arg, required=True, help="the parent model directory")
    p.add_argument("--strategy", required=True, choices=list(STRATEGIES), metavar="STRATEGY",
                   help=f"one of {', '.join(STRATEGIES)}")
    p.add_argument("--out", type=path_arg, required=True, help="the child's model directory")
    p.set_defaults(flags={"out_dir": "--out"})  # the library names it out_dir
    p.add_argument("--full", action="store_true", help="store the child's whole weights (a standalone model) "
                   "instead of what differs from the parent")
    p.add_argument("--data-dir", type=path_arg, help="local Multi30k folder (same as data.data_dir=...)")
    p.add_argument("--quiet", action="store_true", help="no progress bar, progress lines or messages")


def run(args) -> int:
    from xattn import distributed as dist
    from xattn.config import load_config
    from xattn.presets import resolve_config
    from xattn.progress import echo
    from xattn.training import Trainer
    from xattn.strategies import strategy
    from xattn.transfer import check_child_file, check_overrides, child_factory, format_parameter_table, parameter_table

    check_overrides(args.overrides)
    if args.full and args.strategy == "scratch":
        raise XattnError("--full: a scratch child always stores its whole weights (it names no parent)")
    overrides = with_flags(args.overrides, {"--data-dir": ("data.data_dir", args.data_dir)})
    check_child_file(config := resolve_config(args.config))
    cfg = load_config(config, overrides)
    check_data_dir(args.data_dir, cfg.data)
    out = Path(args.out)
    try:  # (a refusal while the trainer is built leaves the process group too)
        trainer = Trainer(cfg, out, args.quiet, child_factory(args.parent, strategy(args.strategy), cfg, out, args.full))
        if not args.quiet and trainer.ctx.rank == 0:
            trainable = frozenset(n for n, p in trainer.model.named_parameters() if p.requires_grad)
            echo(f"{args.strategy}: parameters trained, per group")
            for line in format_parameter_table(parameter_table(trainer.model, trainable)):
                echo(line)
        progress = trainer.fit()
    finally:
        dist.teardown()
    return 130 if progress.stop_reason == "interrupted" else 0
