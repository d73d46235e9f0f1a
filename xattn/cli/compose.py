"""`xattn compose [BASE] [--encoder M] [--decoder M] [--src-embeddings M] [--tgt-embeddings M] --out DIR`."""
from __future__ import annotations

from xattn.cli.common import add_verb, path_arg


def register(sub) -> None:
    p = add_verb(sub, "compose", "Build a model from parts of models that descend from one model (children made "
                 "by xattn finetune, their parent, children of children): the encoder side (source embeddings and "
                 "tokenizer, encoder) of one and the decoder side (cross-attention, decoder, target embeddings "
                 "and tokenizer) of another, or a BASE model with another's source or target embeddings plugged "
                 "in. Gheini et al. (2021) use it for zero-shot pairs and to test forgetting. Parts of models "
                 "with no common ancestor are refused.",
                 "xattn compose runs/fr-cs-xattn --src-embeddings runs/de-en-xattn --out runs/de-cs-zero-shot",
                 run)
    p.add_argument("base", nargs="?", type=path_arg, help="the model that gives every part the flags do not name")
    p.add_argument("--encoder", type=path_arg, metavar="MODEL", help="take the source embeddings, source "
                   "tokenizer and encoder from MODEL")
    p.add_argument("--decoder", type=path_arg, metavar="MODEL", help="take the cross-attention, decoder, target "
                   "embeddings and target tokenizer from MODEL")
    p.add_argument("--src-embeddings", type=path_arg, metavar="MODEL", help="take the source embeddings and "
                   "tokenizer from MODEL (after --encoder)")
    p.add_argument("--tgt-embeddings", type=path_arg, metavar="MODEL", help="take the target embeddings and "
                   "tokenizer from MODEL (after --decoder)")
    p.add_argument("--out", type=path_arg, required=True, help="a new model directory")
    p.set_defaults(flags={"out_dir": "--out"})  # the library names it out_dir
    p.add_argument("--full", action="store_true", help="store the whole weights (a standalone model) instead of "
                   "what differs from the shared parent")


def run(args) -> int:
    from xattn.progress import echo
    from xattn.transfer import compose

    cfg = compose(args.out, args.full, base=args.base, encoder=args.encoder, decoder=args.decoder,
                  src_embeddings=args.src_embeddings, tgt_embeddings=args.tgt_embeddings)
    stored = f"what differs from the parent {cfg.parent.path}" if cfg.parent.delta else "the whole weights"
    echo(f"{args.out}: {cfg.data.src_lang}->{cfg.data.tgt_lang}, stores {stored}")
    return 0
