"""`xattn export MODEL OUT`: write a model directory as a Hugging Face Marian or a CTranslate2 model."""
from __future__ import annotations

import sys

from xattn.cli.common import add_verb, path_arg
from xattn.errors import XattnError

FORMATS = ("hf", "ct2")


def register(sub) -> None:
    p = add_verb(sub, "export", "Export a post-LN, sinusoidal, scaled-dot model to Hugging Face Marian "
                 "(MarianMTModel + MarianTokenizer) or CTranslate2 (needs: pip install transformers [ctranslate2]).",
                 "xattn export runs/multi30k-de-en exported/hf --format hf\n"
                 "  xattn export runs/multi30k-de-en exported/ct2 --format ct2 --quantization int8", run)
    p.add_argument("model", type=path_arg, help="xattn model directory")
    p.add_argument("out", type=path_arg, help="new output directory (must not exist, or be empty)")
    p.add_argument("--format", choices=FORMATS, default="hf",
                   help="hf: MarianMTModel + MarianTokenizer directory; ct2: CTranslate2 model (default: hf)")
    p.add_argument("--quantization", help="ct2 only: int8, int8_float32, int16, float16, bfloat16, ... "
                   "(default: float32 weights)")


def run(args) -> int:
    from xattn.interop import quiet_transformers

    quiet_transformers()
    if args.format == "hf":
        if args.quantization:
            raise XattnError("--quantization applies to --format ct2 only")
        from xattn.config import load_config
        from xattn.interop.generation import not_carried
        from xattn.interop.marian import XATTN_CONFIG, export_marian

        out = export_marian(args.model, args.out)
        if dropped := not_carried(load_config(out / XATTN_CONFIG).decode):  # (the model's own, as written)
            print(f"xattn export: note: generate() does not apply {'; '.join(dropped)}; xattn_config.yaml keeps "
                  "them, for an import back", file=sys.stderr)
    else:
        from xattn.interop.ct2 import export_ct2
        out = export_ct2(args.model, args.out, args.quantization)
    print(f"exported {args.model} -> {out} ({args.format})")
    return 0
