"""`xattn diagnose MODEL --src FILE`: coverage, entropy, mass on </s> and under/over-translation flags per sentence."""
from __future__ import annotations

import sys

from xattn.cli.common import add_head_flags, add_verb, lines_of, output_arg, path_arg, write_output_lines
from xattn.cli.translate import add_decode_flags, decode_config, refuse_search_flags, refuse_unscored_penalty
from xattn.checks import ConfigError, build
from xattn.errors import XattnError
from xattn.io import json_text
from xattn.lines import read_lines


def register(sub) -> None:
    p = add_verb(sub, "diagnose", "Diagnose translations from their cross-attention: per sentence, each source "
                 "word's coverage (attention mass received), the least and most covered words, attention "
                 "entropy, mass on </s>, and flags for likely under-translation, over-translation and output "
                 "detached from the source. JSON lines per sentence; a corpus summary on stderr.",
                 "xattn diagnose runs/multi30k-de-en --src test.de --ref test.en -o diagnosis.jsonl\n"
                 "  xattn diagnose runs/multi30k-de-en --src test.de --hyp system.en", run)
    p.add_argument("model", type=path_arg, help="model directory")
    p.add_argument("--src", type=path_arg, required=True, help="source sentences, one per line")
    p.add_argument("--hyp", type=path_arg, help="translations to diagnose, read teacher-forced "
                   "(default: translate --src with the decoding flags)")
    p.add_argument("--ref", type=path_arg, help="references: adds each sentence's chrF")
    p.add_argument("--output", "-o", type=output_arg, help="JSON lines, written atomically (default: stdout)")
    add_head_flags(p, "read (default: the stored alignment choice)")
    p.add_argument("--under", type=float, help="flag a source word covered less than this (default 0.2)")
    p.add_argument("--over", type=float, help="flag a source word covered more than this (default 4.0)")
    p.add_argument("--detached", type=float,
                   help="flag when more than this share of target words look at </s> most (default 0.5)")
    add_decode_flags(p, one_per_input=True)


def run(args) -> int:
    from xattn.analysis.choice import settings_for
    from xattn.analysis.diagnostics import Thresholds, diagnose, summary
    from xattn.analysis.maps import PairAttention, teacher_forced
    from xattn.cli.translate import load_translator

    sources = read_lines(args.src)
    if not sources:  # (as evaluate, aer and heads refuse one: an empty report would read as nothing flagged)
        raise XattnError(f"{args.src}: no lines to diagnose")
    hyps = read_lines(args.hyp) if args.hyp else None
    refs = read_lines(args.ref) if args.ref else None
    for name, lines in (("--hyp", hyps), ("--ref", refs)):
        if lines is not None and len(lines) != len(sources):
            raise XattnError(f"line counts differ: {getattr(args, name[2:])} has {len(lines)} lines, "
                             f"{args.src} has {len(sources)}")
    changes = {k: getattr(args, k) for k in ("under", "over", "detached") if getattr(args, k) is not None}
    try:
        thresholds = build(Thresholds, changes, "")
    except ConfigError as e:  # the key is the flag's name
        if e.key == "under" and "under" not in changes:  # --over alone, at or below the default --under
            raise XattnError(f"--over: {changes['over']:g} is not above the under threshold ({Thresholds.under:g}, "
                             "--under); raise it, or lower --under") from None
        raise XattnError(f"--{e}") from None
    if hyps is not None:
        refuse_search_flags(args, "not used with --hyp, whose translations are read teacher-forced (nothing is "
                            "searched)")
    translator = load_translator(args)
    cfg = translator.model.cfg
    choice = settings_for(args.model, cfg, args.layer, args.heads).choice
    if hyps is None:
        decode = decode_config(args, translator.decode_config)
        refuse_unscored_penalty(args, decode, "diagnose does not report")
        with lines_of(args, args.src):
            results = translator.translate(sources, decode, return_attention=True, attention_from="rescore")
        hyps = [r.text for r in results]
        pairs = PairAttention.from_translations(results, sources, translator.tokenizers.src,
                                                range(1, len(sources) + 1))
    else:
        with lines_of(args, args.src, items=("sources",)), lines_of(args, args.hyp, items=("targets",)):
            pairs = teacher_forced(translator, sources, hyps, ("cross",))
    diagnoses = [diagnose(pair, choice, thresholds) for pair in pairs]
    chrf = sentence_chrf(hyps, refs) if refs is not None else None
    lines = []
    for n, (source, hyp, d) in enumerate(zip(sources, hyps, diagnoses)):
        record = {"line": n + 1, "source": source, "translation": hyp, **d.to_dict(),
                  "source_words": pairs[n].src_words}
        if chrf is not None:
            record["chrf"] = round(chrf[n], 2)
        lines.append(json_text(record, ensure_ascii=False))
    write_output_lines(args.output, lines)
    total = summary(diagnoses)
    if chrf is not None:
        flagged = [c for c, d in zip(chrf, diagnoses) if d.flags]
        clean = [c for c, d in zip(chrf, diagnoses) if not d.flags]
        total |= {"chrf_flagged": round(sum(flagged) / len(flagged), 2) if flagged else None,
                  "chrf_unflagged": round(sum(clean) / len(clean), 2) if clean else None}
    print(json_text({"summary": total, "choice": str(choice), "thresholds": vars(thresholds)}), file=sys.stderr)
    return 0


def sentence_chrf(hyps: list[str], refs: list[str]) -> list[float]:
    from sacrebleu.metrics import CHRF

    metric = CHRF()
    return [metric.sentence_score(h, [r]).score for h, r in zip(hyps, refs)]
