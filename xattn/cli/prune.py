"""`xattn prune MODEL --fraction F | --heads FILE --out DIR`: remove attention heads for good (Michel et al. 2019)."""
from __future__ import annotations

import sys
from pathlib import Path

from xattn.cli.common import add_verb, path_arg
from xattn.errors import XattnError


def register(sub) -> None:
    p = add_verb(sub, "prune", "Remove attention heads and write a smaller model directory whose config describes "
                 "it (model.heads): the query, key, value and output projections and the score function's "
                 "per-head parameters shrink. It translates as the original does with those heads masked to 0, "
                 "and faster. --fraction removes the least important share of the heads of --places, ranked "
                 "together by the table `xattn heads importance` saved (per-layer normalised scores); --heads "
                 "removes the heads a mask file sets to 0.",
                 "xattn heads importance runs/multi30k-de-en && xattn prune runs/multi30k-de-en --fraction 0.5 "
                 "--places cross --out runs/de-en-half-cross", run)
    p.add_argument("model", type=path_arg, help="model directory")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--fraction", type=float, help="share of the heads of --places to remove, in [0, 1]")
    what.add_argument("--heads", type=path_arg, metavar="FILE", help="a head mask file (as --head-mask of "
                      "xattn translate) with 0 on the heads to remove and 1 on those to keep")
    p.add_argument("--places", help="with --fraction: the places to prune, comma-separated (default: all three: "
                   "enc_self,dec_self,cross)")
    p.add_argument("--importance", type=path_arg, metavar="FILE",
                   help="with --fraction: the table to rank by (default: MODEL/head_importance.tsv)")
    p.add_argument("--out", type=path_arg, required=True, help="a new model directory")
    p.set_defaults(flags={"out_dir": "--out"})  # the library names it out_dir


def run(args) -> int:
    from xattn.analysis.importance import IMPORTANCE_FILE, read_table
    from xattn.analysis.pruning import least_important, prune_dir, read_head_mask, removal_of_mask
    from xattn.checkpoint import weights_id
    from xattn.config import load_config
    from xattn.registry import PLACES, place_problem

    cfg = load_config(Path(args.model) / "config.yaml").model if (Path(args.model) / "config.yaml").is_file() else None
    if cfg is None:
        raise XattnError(f"{args.model}: not a model directory (no config.yaml)")
    if args.heads:
        for flag, value in (("--places", args.places), ("--importance", args.importance)):
            if value is not None:
                raise XattnError(f"{flag}: only with --fraction; with --heads the mask file names the heads")
        removal = removal_of_mask(read_head_mask(args.heads, cfg), args.heads)
    else:
        if not 0 <= args.fraction <= 1:
            raise XattnError(f"--fraction: must be in [0, 1], got {args.fraction}")
        places = [p.strip() for p in (args.places if args.places is not None else ",".join(PLACES)).split(",")
                  if p.strip()]
        if not places:
            raise XattnError(f"--places: names no place; one or more of {', '.join(PLACES)}")
        if problems := [problem for p in places if (problem := place_problem(p))]:
            raise XattnError(f"--places: {problems[0]}")
        if twice := next((p for i, p in enumerate(places) if p in places[:i]), None):  # as --heads 0,0 is
            raise XattnError(f"--places: {twice} is given twice")
        table = Path(args.importance or Path(args.model) / IMPORTANCE_FILE)
        if not table.is_file():
            raise XattnError(f"{table}: no importance table; run `xattn heads importance {args.model}` first, "
                             "or name one with --importance")
        removal = least_important(cfg, read_table(table, weights_id(Path(args.model))), places, args.fraction,
                                  str(table))
    pruned = prune_dir(args.model, removal, args.out)
    removed = sum(len(h) for layers in removal.values() for h in layers)
    print(f"{args.out}: removed {removed} heads; heads left per layer: "
          + "; ".join(f"{p} {pruned.cfg.heads_per_layer(p)}" for p in PLACES),
          file=sys.stderr)
    return 0
