"""`xattn prepare CONFIG [section.key=value ...] --out DIR`: the training corpus as a prepared directory."""
from __future__ import annotations

from pathlib import Path

from xattn.cli.common import add_verb, check_data_dir, path_arg, with_flags
from xattn.errors import XattnError


def register(sub) -> None:
    p = add_verb(sub, "prepare", "Stream a config's training corpus into a prepared directory: SentencePiece "
                 "trained on a sample (data.spm_sample), every pair encoded by worker processes and cleaned, the "
                 "ids in flat memory-mappable arrays with a manifest. Train on it with data.prepared=DIR (xattn train "
                 "makes one in the cache when none is named).",
                 "xattn prepare my-config.yaml data.train_src=big.de.gz data.train_tgt=big.en.gz --out data/big", run)
    p.add_argument("config", type=path_arg, help="a preset name, or a YAML file with sections model, data, train, decode")
    p.add_argument("overrides", nargs="*", metavar="section.key=value", help="override config keys")
    p.add_argument("--out", type=path_arg, required=True, help="the prepared directory to write (must not exist)")
    p.add_argument("--workers", type=int, help="encoding processes (default: one per core)")
    p.add_argument("--data-dir", type=path_arg, help="local Multi30k folder (same as data.data_dir=...)")


def run(args) -> int:
    from xattn.config import load_config
    from xattn.presets import resolve_config
    from xattn.data.prepare import prepare

    cfg = load_config(resolve_config(args.config), with_flags(args.overrides, {"--data-dir": ("data.data_dir", args.data_dir)}))
    check_data_dir(args.data_dir, cfg.data)
    if cfg.data.prepared is not None:  # (it was ignored: the corpus the config names was prepared)
        raise XattnError(f"data.prepared: {cfg.data.prepared} is a prepared corpus already; prepare reads the corpus "
                         "the config names into --out")
    if args.workers is not None and not 1 <= args.workers <= 256:
        raise XattnError(f"--workers: must be in [1, 256], got {args.workers}")
    out = Path(args.out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise XattnError(f"--out: {out} already exists; name a new directory (a prepared corpus is never overwritten)")
    manifest = prepare(cfg.data, out, args.workers)
    clean = manifest["cleaning"]
    repeated = f", {clean['duplicate']} repeating an earlier pair (data.dedup)" if cfg.data.dedup else ""
    print(f"{out}: {manifest['pairs']} pairs ({manifest['tokens']['src']} + {manifest['tokens']['tgt']} tokens); "
          f"dropped {clean['empty']} empty, {clean['too_long']} longer than data.max_len, {clean['ratio']} over "
          f"data.max_ratio{repeated}")
    return 0
