"""`xattn translate MODEL`: translate lines from stdin or a file."""
from __future__ import annotations


from xattn.cli.common import add_verb, read_input_lines, write_output_lines


def register(sub) -> None:
    p = add_verb(sub, "translate", "Translate one sentence per line (stdin to stdout, or files).",
                 "echo 'Ein Hund rennt.' | xattn translate runs/multi30k-de-en --beam 5", run)
    p.add_argument("model", help="model directory")
    p.add_argument("--input", "-i", help="input file (default: stdin)")
    p.add_argument("--output", "-o", help="output file, written atomically (default: stdout)")
    add_decode_flags(p)
    p.add_argument("--n-best", type=int, default=1, help="print N hypotheses per input: index ||| text ||| score")
    p.add_argument("--scores", action="store_true", help="print text ||| score")


def add_decode_flags(p) -> None:
    p.add_argument("--beam", type=int, help="beam size (1: greedy; default: the model's decode.beam_size)")
    p.add_argument("--length-penalty", type=float, help="GNMT length penalty alpha")
    p.add_argument("--max-tokens", type=int, help="token budget of one translation batch")
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:N (default: cuda if available)")


def decode_config(args, base):
    """The model directory's DecodeConfig with the command line's choices on top."""
    changes = {"beam_size": args.beam, "length_penalty": args.length_penalty, "max_tokens": args.max_tokens,
               "n_best": getattr(args, "n_best", None)}
    changes = {k: v for k, v in changes.items() if v is not None}
    if changes.get("n_best", 1) > changes.get("beam_size", base.beam_size):
        changes["beam_size"] = changes["n_best"]
    from xattn.config import DecodeConfig, build
    return build(DecodeConfig, changes, "decode", base)


def run(args) -> int:
    from xattn.translator import Translator

    translator = Translator.from_dir(args.model, device=args.device)
    cfg = decode_config(args, translator.decode_config)
    results = translator.translate(read_input_lines(args.input), cfg)
    if args.n_best > 1:
        lines = [f"{i} ||| {alt.text} ||| {alt.score:.4f}" for i, r in enumerate(results) for alt in r.alternatives]
    elif args.scores:
        lines = [f"{r.text} ||| {r.score:.4f}" for r in results]
    else:
        lines = [r.text for r in results]
    write_output_lines(args.output, lines)
    return 0
