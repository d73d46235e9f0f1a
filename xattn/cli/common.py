"""Pieces shared by the verbs: help formatting, example epilogs, device choice, file I/O."""
from __future__ import annotations

import argparse
import gc
import os
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from xattn.errors import ItemError, ParameterError, XattnError
from xattn.io import atomic_write, atomic_write_text, one_line


def settle_loaded() -> None:
    """Call once the models a command runs on are loaded: everything alive now (models, tokenizers, imported
    modules) leaves the cyclic garbage collector's care (gc.freeze), since none of it is garbage. A full
    collection would otherwise walk all of it every few batches (translate --alignment, whose links make many
    small objects; the figures: benchmarks/README.md, Guided alignment). `main` unfreezes them when the command
    ends."""
    gc.freeze()


def add_verb(sub, name: str, help: str, example: str, run) -> argparse.ArgumentParser:
    parser = sub.add_parser(name, help=help, description=help, epilog=f"example:\n  {example}",
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.set_defaults(run=run, flags={}, parser=parser)
    return parser


def flag_of(args, name: str) -> str | None:
    """The flag of the verb that `args` were parsed for whose value is the library parameter `name`, when the
    command line gave it: a value from elsewhere (the model's own decode settings) is not the flag's to answer
    for (`--min-len: 500 is above ...` was said of a model's config.yaml with no --min-len given)."""
    flag = args.flags.get(name) or (f"--{name.replace('_', '-')}" if hasattr(args, name) else None)
    if flag is None or not flag.startswith("--"):  # (a positional argument, SENTENCE: always given)
        return flag
    value = getattr(args, flag[2:].replace("-", "_"), None)
    return flag if value is not None and value is not False else None  # (0 is a value given: not `in (None, False)`)


def setting_of(args, name: str) -> str | None:
    """Where a setting `name` that no flag gave comes from: a decoding or data setting of the model directory's
    config.yaml (`MODEL/config.yaml: decode.min_len`), or of the config a run is made from: its YAML file
    (`my.yaml: data.data_dir`), or an override or a preset (`data.data_dir`)."""
    from xattn.config import DataConfig, DecodeConfig

    section = "decode" if name in DecodeConfig.__dataclass_fields__ else "data" \
        if name in DataConfig.__dataclass_fields__ else None
    if section is None:
        return None
    if isinstance(model := getattr(args, "model", None), str):
        return f"{model.rstrip('/')}/config.yaml: {section}.{name}"
    given = any(item.partition("=")[0].strip() == f"{section}.{name}" for item in getattr(args, "overrides", []))
    if not given and isinstance(config := getattr(args, "config", None), str) and Path(config).is_file():
        return f"{config}: {section}.{name}"  # (a run's own YAML file, not a preset's name or an override)
    return f"{section}.{name}"


def problem_of(args, e: ParameterError, item: bool = True) -> str:
    """A library error as the command line says it: the flag that set its parameter, or the model's setting that
    did; an item of a list as the flag or argument that gave that one text (SENTENCE, --reference), else by the
    library's name for it (`texts[3]`), which a caller that names its file and line leaves out (`item`)."""
    if isinstance(e, ItemError):
        if e.name in args.flags:
            return f"{args.flags[e.name]}: {e.problem}"
        return f"{e.name}[{e.index}]: {e.problem}" if item else e.problem
    said = f"{flag_of(args, e.name) or setting_of(args, e.name) or e.name}: {e.problem}"
    if not item or e.item is None:
        return said
    return f"{args.flags.get(e.item[0]) or f'{e.item[0]}[{e.item[1]}]'}: {said}"


@contextmanager
def lines_of(args, source: str, offset: int = 0, items: tuple[str, ...] = ("texts",)) -> Iterator[None]:
    """Inside, an error about one of `items` of a call whose texts are the lines offset + 1, ... of `source` (a file,
    or stdin) is one line naming the file and line: a text the library refused, or a setting it cannot meet."""
    try:
        yield
    except ParameterError as e:
        if e.item is None or e.item[0] not in items:
            raise
        raise XattnError(f"{source}: line {offset + e.item[1] + 1}: {problem_of(args, e, item=False)}") from None


def device_of(args):
    """The torch device of `--device` (auto when not given; an empty one is an error, not auto)."""
    from xattn.devices import resolve_device

    return resolve_device("auto" if args.device is None else args.device, "--device")


def path_arg(value: str) -> str:
    """argparse type of a file or folder argument: an empty one would silently mean the current folder."""
    if not value.strip():
        raise argparse.ArgumentTypeError("an empty path")
    return value


def with_flags(overrides: list[str], flags: dict[str, tuple[str, object]]) -> list[str]:
    """`overrides` and, for each flag given ({flag: (section.key, value or None)}), its `section.key=value`;
    a flag and an override of the same key is an error (one of them would silently win)."""
    keys = {item.partition("=")[0].strip() for item in overrides}
    out = list(overrides)
    for flag, (key, value) in flags.items():
        if value is not None:
            if key in keys:
                raise XattnError(f"{flag} and {key}= are both given; keep one")
            out.append(f"{key}={value}")
    return out


def check_data_dir(data_dir: str | None, data) -> None:
    """--data-dir names a local Multi30k folder: refused for a run whose data (DataConfig) is not Multi30k."""
    if data_dir is not None and data.dataset != "multi30k":
        raise XattnError(f"--data-dir: only Multi30k is read from a folder; this data is "
                         f"{data.dataset or 'the files the config names'}")


STDOUT_NAMES = ("/dev/stdout", "/dev/fd/1", "/proc/self/fd/1")
"""Names of this process's standard output: written to as `-` is, not replaced by a file (they may lead to one)."""


def output_arg(value: str) -> str:
    """argparse type of an output file: refused at once if it names a folder, not after the work is done; a name
    of standard output is `-`."""
    value = path_arg(value)
    if value in STDOUT_NAMES:
        return "-"
    if value != "-" and Path(value).is_dir():
        raise argparse.ArgumentTypeError(f"{value} is a directory; name a file")
    if value.endswith(("/", os.sep)):  # (pathlib drops it: `-o out/` wrote a file named out)
        raise argparse.ArgumentTypeError(f"{value} names a directory (it ends in /); name a file")
    return value


def overwritten(args) -> str | None:
    """What is wrong when an output file of the verb `args` were parsed for is one of its input files: it would be
    replaced by what was made from it (`translate -i corpus.de -o corpus.de`, or `-o corpus.de < corpus.de`: the
    corpus was lost, exit 0); None when none is. Inputs are the arguments of files (`path_arg`), and stdin where one
    of them reads it (`-`, or left out where that means stdin: `reads_stdin` on its action)."""
    actions = args.parser._actions if hasattr(args, "parser") else []  # (argparse keeps a parser's arguments there)
    for out_action in (a for a in actions if a.type is output_arg):
        out = getattr(args, out_action.dest, None)
        if not isinstance(out, str) or out == "-" or not os.path.isfile(out):
            continue
        for action in (a for a in actions if a.type is path_arg):
            value, stdin = getattr(args, action.dest, None), reads_stdin(args, action)
            if isinstance(value, str) and os.path.isdir(value) and model_file(value, out) and \
                    Path(out).name != getattr(args, "model_output", None):  # (a verb's own file there: its table)
                return f"{'/'.join(out_action.option_strings)} {out}: is a file of the model directory {value}; the " \
                    "output would replace it: write it elsewhere"
            if (stdin and is_stdin(out)) or (isinstance(value, str) and not stdin and os.path.isfile(value)
                                             and os.path.samefile(value, out)):
                name = "/".join(action.option_strings) or action.metavar or action.dest.upper()
                return f"{'/'.join(out_action.option_strings)} {out}: is the input {name}" + \
                    (" (read from stdin)" if stdin else "") + \
                    " too; the output would replace what it is made from: write it elsewhere"
    return None


MODEL_SUFFIXES = (".safetensors", ".model", ".yaml", ".json", ".jsonl", ".tsv")
"""What a model directory's own files end in (weights, tokenizers, config, analysis choice, vocabularies, log, head
importance). A verb that writes one of them there on purpose names it as its `model_output` (heads importance)."""


def model_file(directory: str, out: str) -> bool:
    """Whether the existing file `out` is one of a model directory's own (`translate -o MODEL/config.yaml` replaced
    it, exit 0): in `directory` (a model's: it holds config.yaml) or its train_state/, by what it ends in."""
    folder = Path(out).resolve().parent
    model = Path(directory).resolve()
    return (model / "config.yaml").is_file() and folder in (model, model / "train_state") \
        and out.endswith(MODEL_SUFFIXES)


def stdin_twice(args) -> str | None:
    """What is wrong when two of the inputs of the verb `args` were parsed for read stdin (`--gold - --hyp -`: the
    second read nothing, and the error was about line counts); None when at most one does."""
    actions = args.parser._actions if hasattr(args, "parser") else []
    names = ["/".join(a.option_strings) for a in actions if a.type is path_arg and a.option_strings
             and reads_stdin(args, a)]
    return f"{' and '.join(names)}: both read stdin (-); give one of them as a file" if len(names) > 1 else None


def reads_stdin(args, action) -> bool:
    """Whether the file argument `action` reads stdin: given as `-`, or left out where that means stdin
    (`reads_stdin` on the action)."""
    value = getattr(args, action.dest, None)
    return value == "-" or (value is None and getattr(action, "reads_stdin", False))


def is_stdin(path: str) -> bool:
    """Whether standard input is the file `path` (`< path`)."""
    try:
        return os.path.samestat(os.fstat(sys.stdin.fileno()), os.stat(path))
    except (OSError, ValueError, AttributeError):  # no descriptor (a test's stream, a closed stdin)
        return False


def write_output_lines(path: str | None, lines: list[str]) -> None:
    """Write lines to `path` atomically, or to stdout."""
    text = "".join(f"{one_line(line)}\n" for line in lines)
    if path in (None, "-"):
        sys.stdout.write(text)
        sys.stdout.flush()
    else:
        atomic_write_text(Path(path), text)


def write_line_chunks(path: str | None, chunks: Iterable[list[str]]) -> None:
    """Write each chunk of lines as it comes: to stdout at once, or into a temporary file renamed to `path`
    when the last is in (an error on the way leaves `path` as it was); one chunk in memory at a time."""
    if path in (None, "-"):
        for lines in chunks:
            write_output_lines(None, lines)
        return

    def write(tmp: Path) -> None:
        with open(tmp, "w", encoding="utf-8", newline="\n") as f:
            for lines in chunks:
                f.write("".join(f"{one_line(line)}\n" for line in lines))
    atomic_write(Path(path), write)


def add_head_flags(p, what: str = "read (decoder)") -> None:
    """--layer N and --heads 0,3,5 | mean: one way to name layers and heads in every verb (0-based)."""
    p.add_argument("--layer", type=int, help=f"layer to {what}, 0-based")
    p.add_argument("--heads", help="heads of that layer to average, 0-based, e.g. 0,3,5; or mean (all heads)")


def add_alignment_flags(p) -> None:
    """The flags that turn cross-attention into word links (xattn.analysis.alignment.AlignSettings)."""
    add_head_flags(p)
    from xattn.analysis.alignment import EOS_RULES, METHODS, PUNCT_RULES

    p.add_argument("--method", choices=METHODS,
                   help="shift: read a target word where it is the decoder input (Chen et al. 2020); naive: where "
                        "it is predicted (default: the stored choice of `xattn heads align`, else naive)")
    p.add_argument("--threshold", type=float, help="link every source word with at least this attention "
                   "(default: the stored choice, else the argmax per target word)")
    p.add_argument("--eos", choices=EOS_RULES, help="drop: leave </s> out and renormalise (default); keep: a word "
                   "looking most at </s> stays unaligned")
    p.add_argument("--punct", choices=PUNCT_RULES, help="match: punctuation links only to punctuation (a sink for "
                   "other words); free: like any word (default)")


ALIGNMENT_FLAGS = ("layer", "heads", "method", "threshold", "eos", "punct")


def alignment_settings(args, model_dir, cfg):
    """AlignSettings from the flags, then the model directory's stored choice, then the defaults."""
    from xattn.analysis.choice import settings_for

    return settings_for(model_dir, cfg,
                        **{flag: getattr(args, flag, None) for flag in ALIGNMENT_FLAGS})


def read_sentence_pairs(pairs: str | None, src: str | None, tgt: str | None) -> tuple[list[str], list[str]]:
    """(first sides, second sides) from --pairs (`first ||| second` lines) or the line-aligned --src/--tgt."""
    from xattn.errors import XattnError
    from xattn.lines import read_lines
    from xattn.words import strip_separators

    if pairs and (src or tgt):
        raise XattnError("give --pairs or --src and --tgt, not both")
    if pairs:
        first, second = [], []
        for n, line in enumerate(read_lines(pairs), 1):
            sides = line.split("|||")
            if len(sides) != 2:
                raise XattnError(f"{pairs}: line {n}: expected 'source ||| target', found {len(sides) - 1} "
                                 "'|||' separators")
            first.append(strip_separators(sides[0]))
            second.append(strip_separators(sides[1]))
        return first, second
    if not (src and tgt):
        raise XattnError("give the sentence pairs: --src FILE --tgt FILE, or --pairs FILE")
    first, second = read_lines(src), read_lines(tgt)
    if len(first) != len(second):
        raise XattnError(f"line counts differ: {src} has {len(first)} lines, {tgt} has {len(second)}")
    return first, second
