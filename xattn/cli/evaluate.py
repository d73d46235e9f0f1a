"""`xattn evaluate MODEL`: translate a test set and score it with sacreBLEU (BLEU cased and lowercased, chrF)."""
from __future__ import annotations

import dataclasses
from collections.abc import Iterator

from xattn.cli.common import add_verb, check_data_dir, lines_of, output_arg, path_arg, write_line_chunks
from xattn.cli.translate import add_decode_flags, decode_config, load_translator, refuse_unscored_penalty
from xattn.errors import XattnError
from xattn.io import json_text
from xattn.lines import paired_line_chunks


def register(sub) -> None:
    p = add_verb(sub, "evaluate", "Score a model on a named split of its dataset or on given files.",
                 "xattn evaluate runs/multi30k-de-en --split test --beam 5", run)
    p.add_argument("model", type=path_arg, help="model directory")
    p.add_argument("--split", help="split of the model's dataset: test (default), val, train (the pairs it "
                   "trained on: the numbers task's data.numbers_size of them)")
    p.add_argument("--src", type=path_arg, help="source file (instead of --split)")
    p.add_argument("--ref", type=path_arg, help="reference file (with --src)")
    p.add_argument("--data-dir", type=path_arg, help="local Multi30k folder")
    p.add_argument("--output", "-o", type=output_arg, help="also write the translations to this file")
    p.add_argument("--json", action="store_true", help="print the scores as JSON")
    add_decode_flags(p, one_per_input=True)


def test_pairs(args, data_cfg, split: str = "test") -> tuple[list[str], list[str]]:
    """--src and --ref, or --split (default `split`) of the model's dataset (in --data-dir), whole."""
    src, ref = [], []
    for chunk_src, chunk_ref in test_chunks(args, data_cfg, split):
        src += chunk_src
        ref += chunk_ref
    return src, ref


def test_chunks(args, data_cfg, split: str = "test") -> Iterator[tuple[list[str], list[str]]]:
    """The pairs of test_pairs CHUNK_LINES at a time: files of any length in bounded memory (their line
    counts compared first where both are files, so a mismatch is reported before anything is translated; a pipe
    or stdin as it is read: lines.paired_line_chunks)."""
    from xattn.data.splits import read_all

    if args.src or args.ref:
        if not (args.src and args.ref):
            raise XattnError("--src and --ref go together")
        for flag in ("--split", "--data-dir"):
            if getattr(args, flag[2:].replace("-", "_")) is not None:
                raise XattnError(f"{flag}: not used with --src and --ref, which give the pairs")
        read = 0
        for read, chunk in enumerate(paired_line_chunks(args.src, args.ref), 1):  # (each read once: pipes too)
            yield chunk
        if not read:
            raise XattnError(f"{args.src}: no lines to translate and score")
        return
    if data_cfg.dataset is None:
        raise XattnError("the model's config names no dataset (it was trained on its own files, or imported); "
                         "give --src and --ref")
    check_data_dir(args.data_dir, data_cfg)
    if (args.split or split) == "train" and data_cfg.train_subset:
        raise XattnError(f"--split train: the model trained on {data_cfg.train_subset} pairs drawn from it "
                         "(data.train_subset), not on all of it; give those pairs as --src and --ref")
    pairs = read_all(dataclasses.replace(data_cfg, data_dir=args.data_dir or data_cfg.data_dir), args.split or split)
    yield [s for s, _ in pairs], [t for _, t in pairs]


def run(args) -> int:
    from xattn.decoding import seeded
    from xattn.evaluation import Scorer

    if args.output == "-":  # (the translations and the scores would be one stream: no reader could part them)
        raise XattnError("--output: the scores go to standard output; write the translations to a file")
    translator = load_translator(args)
    cfg = decode_config(args, translator.decode_config)
    refuse_unscored_penalty(args, cfg, "evaluate does not report")
    scorer = Scorer()
    generator = seeded(cfg, translator.device) if cfg.sampling else None  # one for the run: chunks draw anew

    def hypotheses() -> Iterator[list[str]]:
        count = 0
        for src, refs in test_chunks(args, translator.config.data):
            with lines_of(args, args.src or f"the {args.split or 'test'} split's sources", count):
                hyps = [t.text for t in translator.translate(src, cfg, generator=generator)]
            scorer.add(hyps, refs)
            count += len(src)
            yield hyps
    if args.output:
        write_line_chunks(args.output, hypotheses())
    else:
        for _ in hypotheses():
            pass
    scores = scorer.scores()
    if args.json:
        print(json_text({k: {"score": round(s.score, 2), "signature": s.signature} for k, s in scores.items()}))
    else:
        for score in scores.values():
            print(score)
    return 0
