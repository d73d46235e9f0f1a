"""Pieces shared by the verbs: help formatting, example epilogs, device choice, file I/O."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from xattn.io import atomic_write_text, one_line


def add_verb(sub, name: str, help: str, example: str, run) -> argparse.ArgumentParser:
    parser = sub.add_parser(name, help=help, description=help, epilog=f"example:\n  {example}",
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.set_defaults(run=run)
    return parser


def path_arg(value: str) -> str:
    """argparse type of a file or folder argument: an empty one would silently mean the current folder."""
    if not value.strip():
        raise argparse.ArgumentTypeError("an empty path")
    return value


def write_output_lines(path: str | None, lines: list[str]) -> None:
    """Write lines to `path` atomically, or to stdout."""
    text = "".join(f"{one_line(line)}\n" for line in lines)
    if path in (None, "-"):
        sys.stdout.write(text)
        sys.stdout.flush()
    else:
        atomic_write_text(Path(path), text)
