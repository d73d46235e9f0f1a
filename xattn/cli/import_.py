"""`xattn import DIR OUT`: a Hugging Face Marian directory (an xattn export, an opus-mt model) -> model directory."""
from __future__ import annotations

from xattn.cli.common import add_verb, path_arg


def register(sub) -> None:
    p = add_verb(sub, "import", "Import a Hugging Face Marian directory (MarianMTModel + MarianTokenizer files: "
                 "an xattn export or a local opus-mt copy) as an xattn model directory. "
                 "Needs: pip install transformers.",
                 "xattn import exported/hf runs/from-hf && echo 'Ein Hund rennt.' | xattn translate runs/from-hf", run)
    p.add_argument("hf_dir", metavar="DIR", type=path_arg, help="config.json, weights, source.spm, target.spm, vocab.json")
    p.add_argument("out", type=path_arg, help="new xattn model directory (must not exist, or be empty)")


def run(args) -> int:
    from xattn.interop import quiet_transformers
    from xattn.interop.marian import import_marian

    quiet_transformers()
    out = import_marian(args.hf_dir, args.out)
    print(f"imported {args.hf_dir} -> {out}")
    return 0
