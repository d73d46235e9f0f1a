"""`xattn train CONFIG [section.key=value ...]`: train (or resume) a model directory."""
from __future__ import annotations

from pathlib import Path

from xattn.cli.common import add_verb
from xattn.config import load_config


def register(sub) -> None:
    p = add_verb(sub, "train", "Train a model from a YAML config; running it again resumes where it stopped.",
                 "xattn train configs/multi30k-de-en.yaml train.max_minutes=30 --out runs/de-en\n"
                 "  torchrun --nproc_per_node 2 -m xattn train configs/multi30k-de-en.yaml train.device=cpu",
                 run)
    p.add_argument("config", help="YAML file with sections model, data, train, decode")
    p.add_argument("overrides", nargs="*", metavar="section.key=value", help="override config keys")
    p.add_argument("--out", help="model directory (default: runs/CONFIG-NAME)")
    p.add_argument("--data-dir", help="local Multi30k folder (same as data.data_dir=...)")
    p.add_argument("--quiet", action="store_true", help="no progress bar or messages")


def run(args) -> int:
    from xattn.training import train

    overrides = list(args.overrides) + ([f"data.data_dir={args.data_dir}"] if args.data_dir else [])
    cfg = load_config(args.config, overrides)
    out = Path(args.out or Path("runs") / Path(args.config).stem)
    progress = train(cfg, out, quiet=args.quiet)
    return 130 if progress.stop_reason == "interrupted" else 0
