"""Pieces shared by the verbs: help formatting, example epilogs, device choice, file I/O."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from xattn.errors import XattnError
from xattn.io import atomic_write_text


def add_verb(sub, name: str, help: str, example: str, run) -> argparse.ArgumentParser:
    parser = sub.add_parser(name, help=help, description=help, epilog=f"example:\n  {example}",
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.set_defaults(run=run)
    return parser


def read_input_lines(path: str | None) -> list[str]:
    """Lines of `path` ('-' or None: stdin), without trailing newlines."""
    if path in (None, "-"):
        return [line.rstrip("\n") for line in sys.stdin]
    file = Path(path)
    if not file.is_file():
        raise XattnError(f"{path}: no such file")
    try:
        return file.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as e:
        line = file.read_bytes()[: e.start].count(b"\n") + 1
        raise XattnError(f"{path}: line {line}: invalid UTF-8") from None


def write_output_lines(path: str | None, lines: list[str]) -> None:
    """Write lines to `path` atomically, or to stdout."""
    text = "".join(f"{line}\n" for line in lines)
    if path in (None, "-"):
        sys.stdout.write(text)
        sys.stdout.flush()
    else:
        atomic_write_text(Path(path), text)
