"""`xattn aer --gold G --hyp H`: precision, recall and AER of Pharaoh word alignments against sure/possible gold."""
from __future__ import annotations

from xattn.cli.common import add_verb, path_arg, read_sentence_pairs
from xattn.errors import XattnError
from xattn.io import json_text
from xattn.lines import read_lines
from xattn.words import split_words

HANSARDS = "../shared/data/alignment/hansards-en-fr"


def register(sub) -> None:
    p = add_verb(sub, "aer", "Score word alignments (Pharaoh i-j, 0-based) against gold sure (i-j) and possible "
                 "(ipj) links: precision, recall and alignment error rate (Och & Ney 2003), in percent.",
                 f"xattn aer --gold {HANSARDS}/gold.talp --gold-one-indexed --hyp en-fr.align "
                 f"--pairs {HANSARDS}/test.en-fr\n"
                 f"  xattn aer --gold {HANSARDS}/gold.talp --gold-one-indexed --hyp fr-en.align --reverse", run)
    p.add_argument("--gold", type=path_arg, required=True, help="gold links, one sentence pair a line (i-j sure, "
                   "ipj possible)")
    p.add_argument("--hyp", type=path_arg, required=True, help="hypothesis links, one sentence pair a line (i-j, "
                   "0-based)")
    p.add_argument("--gold-one-indexed", action="store_true", help="the gold counts words from 1 (as the "
                   "Hansards gold.talp does)")
    p.add_argument("--reverse", action="store_true", help="the hypothesis puts the languages in the opposite order "
                   "to the gold (j-i): turn its links around before scoring")
    p.add_argument("--pairs", type=path_arg, help="the sentence pairs as 'source ||| target' lines, in the "
                   "hypothesis' order: links beyond a sentence become errors")
    p.add_argument("--src", type=path_arg, help="the hypothesis' source sentences (with --tgt; instead of --pairs)")
    p.add_argument("--tgt", type=path_arg, help="the hypothesis' target sentences (with --src)")
    p.add_argument("--json", action="store_true", help="print the scores (percent) and counts as JSON")


def run(args) -> int:
    from xattn.analysis.aer import score
    from xattn.analysis.alignment import parse_alignments

    gold_lines, hyp_lines = read_lines(args.gold), read_lines(args.hyp)
    _same_count(args.gold, len(gold_lines), args.hyp, len(hyp_lines))
    if not gold_lines:  # (scored 100% over no sentence)
        raise XattnError(f"{args.gold} and {args.hyp}: no lines to score")
    lengths = sentence_lengths(args, len(hyp_lines))
    golds = parse_alignments(gold_lines, args.gold, one_indexed=args.gold_one_indexed)
    if lengths is not None:  # a second pass, so that only a range error can get the hint
        try:
            parse_alignments(gold_lines, args.gold, one_indexed=args.gold_one_indexed,
                             lengths=[(m, n) for n, m in lengths] if args.reverse else lengths)
        except XattnError as e:
            hint = " (with --reverse, the gold's first side is the target side of the sentences)" if args.reverse else ""
            raise XattnError(f"{e}{hint}") from None
    hyps = []
    for n, (sure, possible) in enumerate(parse_alignments(hyp_lines, args.hyp, reverse=args.reverse, lengths=lengths)):
        if possible != sure:
            raise XattnError(f"{args.hyp}: line {n + 1}: a hypothesis has links i-j only (ipj is for the gold)")
        hyps.append(sure)
    result = score(hyps, golds)
    if not result.n_sure and not result.n_links:  # (by the library's conventions, a perfect score for nothing)
        raise XattnError(f"{args.gold} and {args.hyp}: no sure links (i-j) in the gold and no links in the "
                         "hypothesis: nothing to score")
    counts = {"links": result.n_links, "sure": result.n_sure, "possible": result.n_possible,
              "sentences": len(hyps)}
    percent = {"precision": 100 * result.precision if result.n_links else None,  # undefined: n/a, not the
               "recall": 100 * result.recall if result.n_sure else None,     # library's conventional 100
               "AER": 100 * result.aer}
    if args.json:
        print(json_text({k.lower(): None if v is None else round(v, 2) for k, v in percent.items()} | counts))
    else:
        cells = {k: "n/a" if v is None else f"{v:.1f}" for k, v in percent.items()} | {k: str(v) for k, v in counts.items()}
        print("  ".join(f"{k:>{max(len(k), len(v))}}" for k, v in cells.items()))
        print("  ".join(f"{v:>{max(len(k), len(v))}}" for k, v in cells.items()))
    return 0


def sentence_lengths(args, n_lines: int) -> list[tuple[int, int]] | None:
    """(source words, target words) of each pair from --pairs or --src/--tgt, or None without them."""
    if not (args.pairs or args.src or args.tgt):
        return None
    if bool(args.src) != bool(args.tgt) and not args.pairs:
        raise XattnError("--src and --tgt go together")
    first, second = read_sentence_pairs(args.pairs, args.src, args.tgt)
    _same_count(args.hyp, n_lines, args.pairs or args.src, len(first))
    return [(len(split_words(a)), len(split_words(b))) for a, b in zip(first, second)]


def _same_count(name_a: str, count_a: int, name_b: str, count_b: int) -> None:
    if count_a != count_b:
        raise XattnError(f"line counts differ: {name_a} has {count_a} lines, {name_b} has {count_b}")
