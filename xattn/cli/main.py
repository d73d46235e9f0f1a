"""`xattn VERB ...`: dispatch to one module per verb; user mistakes become one line on stderr, exit 2."""
from __future__ import annotations

import argparse
import importlib
import sys

from xattn.errors import XattnError

VERBS = ("quickstart", "train", "translate", "evaluate", "export", "import")
MODULES = {"import": "import_"}  # verbs that are Python keywords


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="xattn", description="Encoder-decoder Transformers built around cross-attention.")
    sub = parser.add_subparsers(dest="verb", required=True, metavar="VERB")
    for verb in VERBS:
        importlib.import_module(f"xattn.cli.{MODULES.get(verb, verb)}").register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.run(args) or 0
    except XattnError as e:
        print(f"xattn {args.verb}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"xattn {args.verb}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
