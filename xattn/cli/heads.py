"""`xattn heads SUBCOMMAND`: per-head analysis. `heads align` ranks layers and heads by AER on gold alignments."""
from __future__ import annotations

import sys

from xattn.analysis.alignment import EOS_RULES, METHODS, PUNCT_RULES
from xattn.cli.align import read_pairs
from xattn.cli.common import add_verb, device_of, lines_of, output_arg, path_arg, write_output_lines
from xattn.cli.main import Parser
from xattn.errors import XattnError
from xattn.io import json_text
from xattn.lines import read_lines
from xattn.registry import IMPORTANCE_FILE, IMPORTANCE_METHODS
from xattn.words import split_words


def register(sub) -> None:
    p = add_verb(sub, "heads", "Analyse attention heads: `heads align` finds the layer and heads whose "
                 "cross-attention aligns best with gold word alignments; `heads importance` scores every head of "
                 "every place (Michel et al. 2019; Voita et al. 2019).",
                 "xattn heads align runs/multi30k-fr-en --pairs test.en-fr --reverse --gold gold.talp "
                 "--gold-one-indexed", None)
    subs = p.add_subparsers(dest="subcommand", metavar="SUBCOMMAND", parser_class=Parser, required=True)
    a = add_verb(subs, "align", "Rank every layer (mean of its heads) and every single head, with both the shift "
                 "and the naive method, by AER on gold pairs; store the best in the model directory "
                 "(analysis.yaml), which `xattn align` and `translate --alignment` then use by default.",
                 "xattn heads align runs/multi30k-fr-en --pairs test.en-fr --reverse --gold gold.talp "
                 "--gold-one-indexed --first 100", run_align)
    a.prog = "xattn heads align"
    a.add_argument("model", type=path_arg, help="model directory")
    a.add_argument("--src", type=path_arg, help="source-language file, one sentence per line, words separated by spaces")
    a.add_argument("--tgt", type=path_arg, help="target-language file, line-aligned with --src")
    a.add_argument("--pairs", type=path_arg, help="file of `first ||| second` lines instead of --src/--tgt")
    a.add_argument("--reverse", action="store_true", help="with --pairs: the first side is the model's target language")
    a.add_argument("--gold", type=path_arg, required=True,
                   help="gold links per pair, i-j (sure) and ipj (possible), i indexing the first side")
    a.add_argument("--gold-one-indexed", action="store_true", help="the gold file counts words from 1")
    a.add_argument("--first", type=int, help="use only the first N pairs (keep the rest for reporting)")
    a.add_argument("--method", choices=METHODS, help="rank this method only (default: both)")
    a.add_argument("--eos", choices=EOS_RULES, default="drop", help="as in xattn align; stored with the choice")
    a.add_argument("--punct", choices=PUNCT_RULES, default="free", help="as in xattn align; stored with the choice")
    a.add_argument("--max-tokens", type=int, default=4096, help="token budget of one batch")
    a.add_argument("--device", default=None, help="cpu, cuda, cuda:N (default: cuda if available)")
    a.add_argument("--table", "-o", type=output_arg, help="also write the ranking as JSON lines to this file")
    a.add_argument("--no-store", action="store_true", help="print the ranking without writing analysis.yaml")
    i = add_verb(subs, "importance", "Score every head of the encoder self-, decoder self- and cross-attention "
                 "over sentence pairs: gradient (Michel et al. 2019: the expected absolute gradient of the loss with "
                 "respect to the head's mask, normalised per layer) or confidence (Voita et al. 2019: the mean "
                 "largest attention weight). Prints the table (layer, place, head, score; 0-based), below lines "
                 "naming the method and the weights it was measured on, and saves it, by default as "
                 "head_importance.tsv in the model directory, where `xattn prune --fraction` reads it (and refuses "
                 "a table of other weights).",
                 "xattn heads importance runs/multi30k-de-en --split val --sentences 500", run_importance)
    i.prog = "xattn heads importance"
    i.set_defaults(model_output=IMPORTANCE_FILE)  # -o MODEL/head_importance.tsv: the table it writes there anyway
    i.add_argument("model", type=path_arg, help="model directory")
    i.add_argument("--method", choices=IMPORTANCE_METHODS, default="gradient", help="default: gradient")
    i.add_argument("--split", help="split of the model's dataset: val (default), test")
    i.add_argument("--src", type=path_arg, help="source file (instead of --split)")
    i.add_argument("--ref", type=path_arg, help="reference file (with --src)")
    i.add_argument("--data-dir", type=path_arg, help="local Multi30k folder")
    i.add_argument("--sentences", type=int, help="use the first N pairs only")
    i.add_argument("--max-tokens", type=int, default=2048, help="token budget of one batch (default 2048)")
    i.add_argument("--device", default=None, help="cpu, cuda, cuda:N (default: cuda if available)")
    i.add_argument("--output", "-o", type=output_arg,
                   help="where to save the table, - for stdout only (default: MODEL/head_importance.tsv)")


def run_align(args) -> int:
    from pathlib import Path

    from xattn.analysis.alignment import METHODS, AlignSettings, parse_alignments
    from xattn.analysis.choice import save
    from xattn.analysis.heads import rank_alignment_heads
    from xattn.analysis.maps import HeadChoice
    from xattn.checkpoint import weights_id
    from xattn.translator import Translator

    if args.max_tokens < 1:
        raise XattnError(f"--max-tokens: must be >= 1, got {args.max_tokens}")
    first, second = read_pairs(args)
    gold_lines = read_lines(args.gold)
    if len(gold_lines) != len(first):
        raise XattnError(f"line counts differ: {args.gold} has {len(gold_lines)} lines, the pairs {len(first)}")
    if args.first is not None:
        if args.first < 1:
            raise XattnError(f"--first: must be >= 1, got {args.first}")
        first, second, gold_lines = first[: args.first], second[: args.first], gold_lines[: args.first]
    lengths = [(len(split_words(a)), len(split_words(b))) for a, b in zip(first, second)]
    gold = parse_alignments(gold_lines, str(args.gold), one_indexed=args.gold_one_indexed, lengths=lengths)
    if not any(sure for sure, _ in gold):
        raise XattnError(f"{args.gold}: no sure links in the {len(gold)} pairs used; nothing to rank heads by")
    measured = weights_id(Path(args.model))  # the weights loaded now, whatever the file holds when the ranking ends
    translator = Translator.from_dir(args.model, device=device_of(args))
    src, tgt = (second, first) if args.reverse else (first, second)
    with lines_of(args, args.pairs or f"{args.src}, {args.tgt}", items=("sources", "targets")):  # one pair's line
        ranking = rank_alignment_heads(translator, src, tgt, gold, [args.method] if args.method else METHODS,
                                       args.reverse, eos=args.eos, punct=args.punct, max_tokens=args.max_tokens)
    lines = [f"{'AER':>6} {'P':>6} {'R':>6}  method  layer  heads"]
    lines += [f"{100 * r['aer']:6.1f} {100 * r['precision']:6.1f} {100 * r['recall']:6.1f}  {r['method']:<6}  "
              f"{r['layer']:>5}  {r['heads']}" for r in ranking]
    write_output_lines(None, lines)
    if args.table:
        write_output_lines(args.table, [json_text(r) for r in ranking])
    if not args.no_store:
        best = ranking[0]
        settings = AlignSettings(HeadChoice.parse(best["layer"], best["heads"]), best["method"], None, args.eos,
                                 args.punct)
        path = save(args.model, settings, {"aer": round(best["aer"], 4), "pairs": len(first), "gold": str(args.gold)},
                    measured)
        print(f"stored {best['method']}, layer {best['layer']}, heads {best['heads']} "
              f"(AER {100 * best['aer']:.1f}) in {path}")
    return 0


def run_importance(args) -> int:
    from pathlib import Path

    from xattn.analysis.importance import About, batches, format_table, head_importance
    from xattn.checkpoint import weights_id
    from xattn.cli.evaluate import test_pairs
    from xattn.registry import PLACES
    from xattn.translator import Translator

    if args.sentences is not None and args.sentences < 1:
        raise XattnError(f"--sentences: must be >= 1, got {args.sentences}")
    if args.max_tokens < 1:
        raise XattnError(f"--max-tokens: must be >= 1, got {args.max_tokens}")
    measured = weights_id(Path(args.model))  # the weights loaded now, whatever the file holds when the table ends
    translator = Translator.from_dir(args.model, device=device_of(args))
    if not any(sum(translator.model.cfg.heads_per_layer(place)) for place in PLACES):
        raise XattnError(f"{args.model}: every attention head of this model was pruned; there is none to rank")
    src, ref = test_pairs(args, translator.config.data, "val")
    src, ref = src[: args.sentences], ref[: args.sentences]
    split = args.split or "val"
    with lines_of(args, args.src or f"the {split} split's sources", items=("sources",)), \
            lines_of(args, args.ref or f"the {split} split's references", items=("targets",)):
        data = batches(translator, src, ref, args.max_tokens)
    rows = head_importance(translator.model, data, args.method)
    lines = format_table(rows, About(measured, args.method))
    write_output_lines(None, lines)
    output = args.output or str(Path(args.model) / IMPORTANCE_FILE)
    if output != "-":
        write_output_lines(output, lines)
    print(f"{args.method} importance of {len(rows)} heads over {len(src)} pairs"
          + (f" saved in {output}" if output != "-" else ""), file=sys.stderr)
    return 0
