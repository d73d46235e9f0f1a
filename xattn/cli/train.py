"""`xattn train CONFIG [section.key=value ...]`: train (or resume) a model directory."""
from __future__ import annotations

from pathlib import Path

from xattn.cli.common import add_verb, check_data_dir, path_arg, with_flags
from xattn.config import load_config
from xattn.presets import PRESET_DIR, presets, resolve_config


def register(sub) -> None:
    p = add_verb(sub, "train", "Train a model from a YAML config or a preset; running it again resumes where it "
                 f"stopped. Presets: {', '.join(presets())} (in {PRESET_DIR}).",
                 "xattn train multi30k-de-en train.max_minutes=30 --out runs/de-en\n"
                 "  xattn train my-config.yaml\n"
                 "  torchrun --nproc_per_node 2 -m xattn train multi30k-de-en train.device=cpu",
                 run)
    p.add_argument("config", type=path_arg, help="a preset name, or a YAML file with sections model, data, train, decode")
    p.add_argument("overrides", nargs="*", metavar="section.key=value", help="override config keys")
    p.add_argument("--out", type=path_arg, help="model directory (default: runs/CONFIG-NAME)")
    p.add_argument("--data-dir", type=path_arg, help="local Multi30k folder (same as data.data_dir=...)")
    p.add_argument("--quiet", action="store_true", help="no progress bar, progress lines or messages")


def run(args) -> int:
    from xattn.training import train

    overrides = with_flags(args.overrides, {"--data-dir": ("data.data_dir", args.data_dir)})
    path = resolve_config(args.config)
    cfg = load_config(path, overrides)
    check_data_dir(args.data_dir, cfg.data)
    out = Path(args.out or Path("runs") / path.stem)
    progress = train(cfg, out, quiet=args.quiet)
    return 130 if progress.stop_reason == "interrupted" else 0
