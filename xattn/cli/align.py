"""`xattn align MODEL`: word alignment of given sentence pairs from the model's cross-attention."""
from __future__ import annotations

from xattn.analysis.alignment import SYMMETRISATIONS
from xattn.cli.common import (add_alignment_flags, add_verb, alignment_settings, device_of, lines_of, output_arg,
                              path_arg, read_sentence_pairs, settle_loaded, write_output_lines)
from xattn.errors import XattnError


def register(sub) -> None:
    p = add_verb(sub, "align", "Align the words of given sentence pairs, teacher-forced, from the cross-attention. "
                 "Input: words separated by spaces or tabs; output: one line of Pharaoh links i-j per pair, 0-based, "
                 "i indexing the first side (--src, or the left of --pairs), j the second.",
                 "xattn align runs/multi30k-fr-en --pairs test.en-fr --reverse --backward runs/multi30k-en-fr "
                 "--sym grow-diag-final > links.txt", run)
    p.add_argument("model", type=path_arg, help="model directory")
    p.add_argument("--src", type=path_arg, help="source-language file, one sentence per line (the model reads it)")
    p.add_argument("--tgt", type=path_arg, help="target-language file, line-aligned with --src")
    p.add_argument("--pairs", type=path_arg, help="file of `first ||| second` lines instead of --src/--tgt")
    p.add_argument("--reverse", action="store_true",
                   help="with --pairs: the first side is the model's target language (links still index it first)")
    p.add_argument("--backward", type=path_arg, metavar="MODEL2",
                   help="a model of the opposite direction, to symmetrise with (needs --sym)")
    p.add_argument("--sym", choices=SYMMETRISATIONS, help="how to combine both directions' links")
    p.add_argument("--output", "-o", type=output_arg, help="output file, written atomically (default: stdout)")
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:N (default: cuda if available)")
    p.add_argument("--max-tokens", type=int, default=4096, help="token budget of one batch")
    add_alignment_flags(p)


def read_pairs(args) -> tuple[list[str], list[str]]:
    """(first sides, second sides) from --pairs or --src/--tgt; errors name the file and line."""
    if args.reverse and not args.pairs:
        raise XattnError("--reverse applies to --pairs; with --src/--tgt, --src is the model's source language")
    return read_sentence_pairs(args.pairs, args.src, args.tgt)


def check_reverse(args, forward, backward) -> None:
    """--backward must translate the other way: its languages (DataConfig) are the model's, swapped."""
    if (backward.src_lang, backward.tgt_lang) != (forward.tgt_lang, forward.src_lang):
        raise XattnError(f"--backward {args.backward}: translates {backward.src_lang}->{backward.tgt_lang}, but the "
                         f"reverse of {args.model} ({forward.src_lang}->{forward.tgt_lang}) is "
                         f"{forward.tgt_lang}->{forward.src_lang} (the languages are data.src_lang and data.tgt_lang "
                         "in each config.yaml)")


def run(args) -> int:
    from xattn.analysis.alignment import align_pairs, flip, format_links, symmetrise
    from xattn.translator import Translator
    from xattn.words import split_words

    if bool(args.backward) != bool(args.sym):
        raise XattnError("--backward and --sym go together: a model of the opposite direction and how to combine")
    if args.max_tokens < 1:
        raise XattnError(f"--max-tokens: must be >= 1, got {args.max_tokens}")
    first, second = read_pairs(args)
    src, tgt = (second, first) if args.reverse else (first, second)
    device = device_of(args)
    forward = Translator.from_dir(args.model, device=device)
    settings = alignment_settings(args, args.model, forward.model.cfg)
    if args.backward:
        backward = Translator.from_dir(args.backward, device=device)
        check_reverse(args, forward.config.data, backward.config.data)
        back_settings = alignment_settings(args, args.backward, backward.model.cfg)
    settle_loaded()
    with lines_of(args, args.pairs or f"{args.src}, {args.tgt}", items=("sources", "targets")):  # one pair's line
        links = align_pairs(forward, src, tgt, settings, args.max_tokens, f"aligning with {args.model}")
        if args.backward:
            back = [flip(x) for x in align_pairs(backward, tgt, src, back_settings, args.max_tokens,
                                                 f"aligning with {args.backward}")]
    if args.backward:
        links = [symmetrise(f, b, args.sym, len(split_words(s)), len(split_words(t)))
                 for f, b, s, t in zip(links, back, src, tgt)]
    if args.reverse:
        links = [flip(x) for x in links]
    write_output_lines(args.output, [format_links(x) for x in links])
    return 0
