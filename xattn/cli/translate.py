"""`xattn translate MODEL`: translate lines from stdin or a file, with any decoding strategy."""
from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Iterator
from pathlib import Path

from xattn.cli.common import (ALIGNMENT_FLAGS, add_alignment_flags, add_verb, alignment_settings, device_of,
                              lines_of, output_arg, path_arg, settle_loaded, write_line_chunks)
from xattn.errors import XattnError
from xattn.lines import paired_line_chunks, read_line_chunks

# flag -> (DecodeConfig field, type, help); unset flags keep the model directory's decode settings
DECODE_FLAGS = {
    "--beam": ("beam_size", int, "beam size (1: greedy)"),
    "--length-penalty": ("length_penalty", float, "GNMT length penalty alpha"),
    "--coverage-penalty": ("coverage_penalty", float, "GNMT coverage penalty beta (beam search)"),
    "--n-best": ("n_best", int, "print N hypotheses per input as: index ||| text ||| score"),
    "--min-len": ("min_len", int, "no end of sentence before this many tokens"),
    "--max-len-a": ("max_len_a", float, "max length = a * source length + b"),
    "--max-len-b": ("max_len_b", int, "max length = a * source length + b"),
    "--no-repeat-ngram": ("no_repeat_ngram_size", int, "never repeat an n-gram of this size"),
    "--temperature": ("temperature", float, "sampling temperature"),
    "--top-k": ("top_k", int, "sample from the k most probable tokens"),
    "--top-p": ("top_p", float, "sample from the smallest set with this probability mass"),
    "--num-samples": ("num_samples", int, "samples per input, printed like --n-best"),
    "--seed": ("seed", int, "random seed for sampling (the same file gives the same samples; lines piped in are "
                            "batched as they arrive, so their samples can change with how fast they come)"),
    "--stopping": ("stopping", str, "beam: exact (default: search until no active hypothesis can beat the best "
                   "finished one) or early (stop once --beam hypotheses have finished: faster, may return a worse one)"),
    "--max-tokens": ("max_tokens", int, "token budget of one translation batch"),
}


def register(sub) -> None:
    p = add_verb(sub, "translate", "Translate one sentence per line (stdin to stdout, or files).",
                 "echo 'Ein Hund rennt.' | xattn translate runs/multi30k-de-en --beam 5\n"
                 "  xattn translate runs/multi30k-de-en -i test.de --sample --top-p 0.9 --num-samples 3 --seed 1",
                 run)
    p.add_argument("model", type=path_arg, help="model directory")
    p.add_argument("--input", "-i", type=path_arg, help="input file (default: stdin)").reads_stdin = True
    p.add_argument("--output", "-o", type=output_arg, help="output file, written atomically (default: stdout)")
    p.add_argument("--prefix", type=path_arg, help="file with one target prefix per input line; translations continue it")
    p.add_argument("--scores", action="store_true", help="print text ||| score (the length-normalised "
                   "log-probability; with --shortlist, over the sentence's list only)")
    p.add_argument("--alignment", action="store_true",
                   help="print text ||| links (Pharaoh i-j, 0-based; i counts the input line's words, "
                        "j the printed translation's), from the cross-attention; with --n-best: index ||| text ||| "
                        "score ||| links")
    add_decode_flags(p)
    add_alignment_flags(p)


MANY_PER_INPUT = ("--n-best", "--num-samples")
"""Flags that ask for several translations of one input: only verbs that print them all offer them."""


def add_decode_flags(p, one_per_input: bool = False) -> None:
    """The decoding flags (DECODE_FLAGS, --sample, ...); `one_per_input`: the verb uses one translation of
    each input, so MANY_PER_INPUT are not offered."""
    for flag, (_, kind, help) in DECODE_FLAGS.items():
        if not (one_per_input and flag in MANY_PER_INPUT):
            p.add_argument(flag, type=kind, help=help)
    p.add_argument("--sample", action=argparse.BooleanOptionalAction, default=None,
                   help="sample instead of searching (--no-sample: search, where the model's decode settings sample)")
    p.add_argument("--shortlist", action=argparse.BooleanOptionalAction, default=None, help="score only the target "
                   "tokens the model's lexical shortlist (xattn shortlist) lists for each sentence's source tokens: "
                   "faster, may change a few translations (--no-shortlist: the whole vocabulary, where the model's "
                   "decode settings use the list)")
    p.add_argument("--device", default=None,
                   help="cpu, cuda, cuda:N (default: cuda if available; the CPU with --quantize int8)")
    p.add_argument("--quantize", choices=["int8"], help="dynamic int8 linear layers (CPU)")
    p.add_argument("--workers", type=int, metavar="N",
                   help="decode the input in N parts at once, each on a thread of its own with its share of PyTorch's "
                        "threads (on a CPU; default 1): faster on several cores")
    p.add_argument("--compile", action="store_true",
                   help="torch.compile the decoder step (slower than the default on CPU: see the README)")
    p.add_argument("--head-mask", type=path_arg, metavar="FILE",
                   help="scale each attention head's output by a factor in [0, 1]: a YAML file such as "
                        "`cross: [[1, 0, 1, 1], null, null]` (per place, per layer, per head; 0-based order)")


def decode_config(args, base):
    """The model directory's DecodeConfig with the command line's choices on top; errors name the flags."""
    from xattn.checks import Unused
    from xattn.config import ConfigError, DecodeConfig, build

    changes = {field: getattr(args, flag[2:].replace("-", "_"), None) for flag, (field, _, _) in DECODE_FLAGS.items()}
    changes = {k: v for k, v in changes.items() if v is not None}
    given = set(changes)  # the settings the command line names (refuse_unused names them)
    if args.sample is not None:
        changes["sampling"] = args.sample
    if args.shortlist is not None:
        changes["shortlist"] = args.shortlist
    try:
        cfg = build(DecodeConfig, base.with_choices(changes), "decode", base)
        cfg.refuse_unused(given)
        return cfg
    except ConfigError as e:
        flags = {f"decode.{field}": flag for flag, (field, _, _) in DECODE_FLAGS.items()} | {"decode.sampling": "--sample"}
        # a value is named by the flag that gave it, or else by its key (the model's own); Unused's advice by flags
        named = flags if isinstance(e, Unused) else {k: f for k, f in flags.items() if k.removeprefix("decode.") in changes}
        problem = e.problem
        for key, flag in sorted(named.items(), key=lambda item: -len(item[0])):  # decode.top_p before decode.top
            problem = problem.replace(key, flag)
        if e.key not in named:  # the model's own setting, wrong with a flag given (named in the problem) or alone
            if problem == e.problem:
                raise
            raise XattnError(f"{Path(args.model) / 'config.yaml'}: {e.key}: {problem}") from None
        if isinstance(e, Unused) and base.sampling and args.sample is None:  # a beam flag for a model that samples
            problem += "; this model's decode settings sample: --no-sample searches"
        raise XattnError(f"{flags[e.key]}: {problem}") from None


def refuse_unscored_penalty(args, cfg, unseen: str | None) -> None:
    """--length-penalty chooses among a beam's hypotheses; with greedy search or sampling it changes only the scores,
    so a command that does not show them (`unseen`: that it does not, e.g. "evaluate does not report"; None where it
    does) would ignore it: one error line."""
    if args.length_penalty is not None and (cfg.sampling or cfg.beam_size == 1) and unseen is not None:
        raise XattnError(f"--length-penalty: with greedy search or sampling it changes only the translations' scores, "
                         f"which {unseen}; it chooses among a beam's hypotheses (--beam 2 or more)")


def refuse_search_flags(args, reason: str) -> None:
    """One error line when the command line sets how translations are searched, though nothing is searched
    (`reason`: why, e.g. the translation is given)."""
    given = [flag for flag in DECODE_FLAGS if getattr(args, flag[2:].replace("-", "_"), None) is not None]
    given += [flag for flag in ("--sample", "--shortlist", "--compile", "--workers")  # --compile: the search's step
              if getattr(args, flag[2:].replace("-", "_")) not in (None, False)]
    given += ["--no-sample"] if args.sample is False else []
    if given:
        raise XattnError(f"{given[0]}: {reason}")


def load_translator(args):
    """The model directory of `args.model` on `--device`, with `--quantize`, `--compile` and `--head-mask`; the
    process's C allocator set to keep what decoding frees (xattn.allocator)."""
    from xattn.allocator import keep_freed_memory
    from xattn.translator import Translator

    keep_freed_memory()
    device = device_of(args) if args.device is not None else None  # (None: the translator's choice, the CPU for int8)
    translator = Translator.from_dir(args.model, device=device, quantize=args.quantize, compile=args.compile,
                                     workers=1 if args.workers is None else args.workers)
    if getattr(args, "head_mask", None):
        from xattn.analysis.pruning import read_head_mask

        translator.head_mask = read_head_mask(args.head_mask, translator.model.cfg)
    settle_loaded()
    return translator


def run(args) -> int:
    unused = [f"--{flag}" for flag in ALIGNMENT_FLAGS if getattr(args, flag) is not None]
    if unused and not args.alignment:
        raise XattnError(f"{', '.join(unused)}: {'applies' if len(unused) == 1 else 'apply'} to --alignment only")
    translator = load_translator(args)
    cfg = decode_config(args, translator.decode_config)
    refuse_unscored_penalty(args, cfg, None if args.scores or cfg.returned > 1 else "translate prints with --scores")
    links = alignment_of(args, translator) if args.alignment else None
    relaxed: list[int] = []
    write_line_chunks(args.output, translated(args, translator, cfg, links, relaxed))
    if relaxed:
        note_relaxed(relaxed, args.input or "stdin")
    return 0


def translated(args, translator, cfg, links, relaxed: list[int]) -> Iterator[list[str]]:
    """The output lines of each chunk of the input, in input order (a chunk is length-sorted into batches
    inside translate); the lines whose constraints were relaxed into `relaxed`. With --prefix, the line counts
    of the two inputs are compared first where both are files, so a mismatch is reported before anything is
    translated (lines.paired_line_chunks: stdin or a pipe is read once, as it arrives)."""
    from xattn.decoding import seeded

    count = 0
    generator = seeded(cfg, translator.device) if cfg.sampling else None  # one for the run: chunks draw anew
    chunks = paired_line_chunks(args.prefix, args.input, (args.prefix, f"the input ({args.input or 'stdin'})")) \
        if args.prefix else ((None, texts) for texts in input_batches(args))
    for given, texts in chunks:
        with lines_of(args, args.input or "stdin", count), lines_of(args, args.prefix, count, items=("prefixes",)):
            results = translator.translate(texts, cfg, prefixes=given, return_attention=args.alignment,
                                           attention_heads=links.heads if links else None, generator=generator)
        relaxed += [count + i + 1 for i, r in enumerate(results) if r.relaxed]
        yield output_lines(results, texts, count, args.scores, links, cfg.sampling)
        count += len(texts)


def input_batches(args) -> Iterator[list[str]]:
    """The input's lines: from a terminal or a pipe in batches as they arrive (so each line typed is
    translated at once), else (a file, or with --prefix) CHUNK_LINES at a time, in bounded memory."""
    import sys

    from xattn.lines import is_interactive, stream_lines

    if args.input in (None, "-") and args.prefix is None and is_interactive(sys.stdin):
        yield from stream_lines(sys.stdin)
    else:
        yield from read_line_chunks(args.input)


def output_lines(results, texts: list[str], offset: int, scores: bool, links, samples: bool = False) -> list[str]:
    """The printed lines of `results` (translations of `texts`, input lines offset + 1, ...): every sample, which
    may repeat (`samples`), or a beam's distinct hypotheses, two of which may read alike (▁a + b and ▁ab)."""
    from xattn.translation import distinct

    def printed(alternatives: list) -> list:
        if samples or not alternatives:
            return alternatives
        return [alternatives[0], *distinct(alternatives[0], alternatives[1:])]

    if any(r.alternatives for r in results):
        rows = [(i, alt) for i, r in enumerate(results) for alt in printed(r.alternatives)]
        aligned = links([alt for _, alt in rows], [texts[i] for i, _ in rows],
                        [offset + i + 1 for i, _ in rows]) if links else None
        return [f"{offset + i} ||| {alt.text} ||| {alt.score:.4f}" + (f" ||| {aligned[k]}" if links else "")
                for k, (i, alt) in enumerate(rows)]
    if scores or links:
        aligned = links(results, texts, [offset + i + 1 for i in range(len(results))]) if links else None
        return [" ||| ".join([r.text] + ([f"{r.score:.4f}"] if scores else []) + ([aligned[i]] if links else []))
                for i, r in enumerate(results)]
    return [r.text for r in results]


def note_relaxed(lines: list[int], where: str) -> None:
    """One line on stderr naming the inputs whose translation the constraints cut short."""
    import sys

    shown = ", ".join(map(str, lines[:10])) + (f" and {len(lines) - 10} more" if len(lines) > 10 else "")
    print(f"xattn translate: note: {where}: line{'s' if len(lines) > 1 else ''} {shown}: the decoding constraints "
          "(--min-len, --no-repeat-ngram, --prefix, over a --shortlist) left no token allowed, so the translation "
          "ends there",
          file=sys.stderr)


def alignment_of(args, translator):
    """(Translations, their input lines, their line numbers) -> their Pharaoh links, with the settings of the
    flags; `.heads`: the (layer, heads) whose attention the search is to track (translate's attention_heads),
    which the links read. They are those of a teacher-forced pass over the translation (see the README's Word
    alignment)."""
    from xattn.analysis.alignment import attention_links, format_links
    from xattn.analysis.maps import HeadChoice, PairAttention

    settings = alignment_settings(args, args.model, translator.model.cfg)
    tracked = dataclasses.replace(settings, choice=HeadChoice(0))  # the one "layer" the search kept
    where = args.input or "stdin"

    def links(translations: list, lines: list[str], numbers: list[int]) -> list[str]:
        try:
            pairs = PairAttention.from_translations(translations, lines, translator.tokenizers.src, numbers)
        except XattnError as e:
            raise XattnError(f"{where}: {e}") from None
        return [format_links(attention_links(pair, tracked)) for pair in pairs]
    links.heads = (settings.choice.layer, settings.choice.heads)
    return links
