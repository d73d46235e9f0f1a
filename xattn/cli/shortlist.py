"""`xattn shortlist MODEL [--src FILE --tgt FILE]`: count a lexical shortlist into the model directory."""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from itertools import zip_longest

from xattn.cli.common import add_verb, check_data_dir, path_arg
from xattn.errors import XattnError


PER_SOURCE, FREQUENT = 20, 100


def register(sub) -> None:
    p = add_verb(sub, "shortlist", "Count a lexical shortlist (Marian's shortlists, CTranslate2's vocabulary map) "
                 "from parallel text into the model directory (shortlist.safetensors): for every source token the "
                 "target tokens that translate it most often, plus the most frequent ones. `translate --shortlist` "
                 "then scores only the ids a batch's sources list: faster, and may change a few translations "
                 "(benchmarks/README.md gives both).",
                 "xattn shortlist runs/multi30k-de-en --data-dir ../shared/data/multi30k\n"
                 "  xattn shortlist runs/big --src train.de.gz --tgt train.en.gz --max-pairs 2000000", run)
    p.add_argument("model", type=path_arg, help="xattn model directory")
    p.add_argument("--src", type=path_arg, help="source side of the text to count (default: the model's training "
                   "data, as its config.yaml names it)")
    p.add_argument("--tgt", type=path_arg, help="target side, line-aligned with --src")
    p.add_argument("--data-dir", type=path_arg, help="local Multi30k folder, for a model trained on Multi30k")
    p.add_argument("--per-source", type=int, help=f"target tokens listed per source token (default {PER_SOURCE}, or "
                   "the target vocabulary's size if smaller)")
    p.add_argument("--frequent", type=int, help=f"most frequent target tokens, on every list (default {FREQUENT}, or "
                   "the target vocabulary's size if smaller)")
    p.add_argument("--max-pairs", type=int, default=1_000_000, help="count at most this many sentence pairs, the "
                   "first ones (default 1,000,000)")


def run(args) -> int:
    from xattn.checkpoint import check_model_dir, read_model
    from xattn.shortlist import Counts
    from xattn.tokenizer import load_tokenizers, tokenizer_hashes

    for flag, value, lo in (("--per-source", args.per_source, 1), ("--frequent", args.frequent, 0),
                            ("--max-pairs", args.max_pairs, 1)):
        if value is not None and value < lo:
            raise XattnError(f"{flag}: must be at least {lo}, got {value}")
    if bool(args.src) != bool(args.tgt):
        raise XattnError("--src and --tgt go together: give both, or neither to count the training data")
    if args.src and args.data_dir is not None:
        raise XattnError("--data-dir: not used with --src and --tgt, which give the pairs")
    folder = check_model_dir(args.model)
    cfg, _ = read_model(folder)
    for flag, value in (("--per-source", args.per_source), ("--frequent", args.frequent)):
        if value is not None and value > cfg.model.tgt_vocab_size:  # (a list longer than the vocabulary: a table
            raise XattnError(f"{flag}: {value} is more than the model's {cfg.model.tgt_vocab_size} target tokens")
    size = cfg.model.tgt_vocab_size  # the defaults, within a small vocabulary (a model fine-tuned on few pieces)
    per_source = min(PER_SOURCE, size) if args.per_source is None else args.per_source
    frequent = min(FREQUENT, size) if args.frequent is None else args.frequent
    tokenizers = load_tokenizers(folder)
    counts = Counts(cfg.model.src_vocab_size, cfg.model.tgt_vocab_size)
    where = f"{args.src} + {args.tgt}" if args.src else "the training data"
    for src, tgt in chunks(args, cfg.data):
        counts.add(tokenizers.src.encode_batch(src), tokenizers.tgt.encode_batch(tgt))
        if counts.pairs >= args.max_pairs:
            break
    if counts.pairs == 0:
        raise XattnError(f"{where}: no sentence pairs to count")
    if not len(counts.keys):  # (blank lines only: a list of the specials alone would replace the model's shortlist)
        raise XattnError(f"{where}: no sentence pair has text on both sides; nothing to count")
    shortlist = counts.shortlist(per_source, frequent, [cfg.model.eos_id, tokenizers.tgt.unk_id])
    path = shortlist.save(folder, {"per_source": per_source, "frequent": frequent, "counted": where,
                                   "tokenizers": tokenizer_hashes(folder)})
    print(f"{path}: {shortlist.per_source} target tokens per source token and {len(shortlist.frequent)} on every "
          f"list, counted on {counts.pairs} sentence pairs of {where}")
    return 0


def chunks(args, data) -> Iterator[tuple[list[str], list[str]]]:
    """(sources, targets) a chunk of lines at a time, at most --max-pairs in all: --src/--tgt, or the data the
    model was trained on (a named dataset, or the config's training files)."""
    from xattn.lines import CHUNK_LINES, read_line_chunks

    left = args.max_pairs
    if args.src:
        files = (args.src, args.tgt)
    else:
        check_data_dir(args.data_dir, data)
        if args.data_dir:
            data = replace(data, data_dir=args.data_dir)
        if data.dataset is not None or data.train_tsv or not (data.train_src and data.train_tgt):
            from xattn.data.splits import read_split

            pairs = read_split(data, "train")[:left]
            yield [s for s, _ in pairs], [t for _, t in pairs]
            return
        files = (data.train_src, data.train_tgt)
    for n, (src, tgt) in enumerate(zip_longest(read_line_chunks(files[0]), read_line_chunks(files[1]), fillvalue=[])):
        if len(src) != len(tgt):
            short = files[0] if len(src) < len(tgt) else files[1]
            raise XattnError(f"{short}: ends at line {n * CHUNK_LINES + min(len(src), len(tgt))}, before the other "
                             "side; the two files must be line-aligned")
        yield src[:left], tgt[:left]
        left -= len(src)
        if left <= 0:
            return
