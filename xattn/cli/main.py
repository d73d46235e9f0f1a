"""`xattn VERB ...`: dispatch to one module per verb; user mistakes become one line on stderr, exit 2."""
from __future__ import annotations

import argparse
import errno
import gc
import importlib
import signal
import sys
import threading
import traceback

from xattn.errors import ParameterError, XattnError

VERBS = ("quickstart", "prepare", "train", "translate", "evaluate", "export", "import", "attention", "align", "aer", "heads",
         "diagnose", "finetune", "compose", "prune", "shortlist", "serve")
MODULES = {"import": "import_"}  # verbs that are Python keywords


FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
"""Errors of a write that found no room: one line, whatever was being written."""


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP (what `timeout`, systemd, `docker stop` and a closed terminal send): unwinds as Ctrl+C does,
    so what was half-written is removed; then the process ends by the same signal, as its sender expects (the
    shell's 128 + its number)."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


_TERMINATED: list[int] = []
"""The signals _terminate raised as Terminated: one raised while a __del__ ran was lost (Python prints "Exception
ignored" and goes on), and the command went on to exit 0; main stops by it at the end all the same."""


def _terminate(signum: int, frame) -> None:
    _TERMINATED.append(signum)
    raise Terminated(signum)


class ClosedStream(XattnError, AttributeError):
    """The use of a closed standard stream: one error line from main; an AttributeError too, which is what
    argparse's own printing (--help) quietly gives up on, as it did on a missing stream."""


class Closed:
    """A standard stream the caller closed (`<&-`, `>&-`): its use is one clear error, not an AttributeError (or,
    from print(), silence)."""

    def __init__(self, name: str, instead: str):
        self.name, self.instead = name, instead

    def __getattr__(self, attr: str):
        raise ClosedStream(f"{self.name} is closed; {self.instead}")

    def flush(self) -> None:  # what the interpreter does at exit: nothing to flush
        pass


class Parser(argparse.ArgumentParser):
    """argparse with its errors as one line ("xattn VERB: error: ... (see --help)") and exit code 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")

    def _print_message(self, message: str, file=None) -> None:
        """A message to a closed stream is dropped, as newer argparse drops it; Debian's Python 3.11.2 raised
        (`--help` with stdout closed was a traceback)."""
        try:
            super()._print_message(message, file)
        except (AttributeError, OSError):
            pass


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="xattn", description="Encoder-decoder Transformers built around cross-attention.")
    sub = parser.add_subparsers(dest="verb", required=True, metavar="VERB", parser_class=Parser)
    for verb in VERBS:
        importlib.import_module(f"xattn.cli.{MODULES.get(verb, verb)}").register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    if sys.stdin is None:
        sys.stdin = Closed("stdin", "give the input as a file (-i FILE, or --src)")
    if sys.stdout is None:
        sys.stdout = Closed("stdout", "write the output to a file (-o FILE)")
    try:  # (each verb's module is imported here, NumPy's and YAML's with them: a tenth of a second or more)
        args, extras = build_parser().parse_known_args(argv)
    except KeyboardInterrupt:  # a Ctrl+C as the command starts: as later (below), not a traceback of an import
        print("xattn: interrupted", file=sys.stderr)
        return 130
    if extras:  # argparse stops filling `overrides` at the first option; section.key=value may come after it
        if not hasattr(args, "overrides") or any("=" not in e or e.startswith("-") for e in extras):
            return _fail(_verb(args), f"unrecognized arguments: {' '.join(extras)} (see xattn {_verb(args)} --help)")
        args.overrides = [*args.overrides, *extras]
    stops = (signal.SIGTERM, signal.SIGHUP) if threading.current_thread() is threading.main_thread() else ()
    _TERMINATED.clear()
    previous = {s: signal.signal(s, _terminate) for s in stops}  # training sets its own while it runs
    try:
        from xattn.cli.common import overwritten, stdin_twice

        if problem := overwritten(args) or stdin_twice(args):  # (an output that is an input would replace it)
            return _fail(_verb(args), problem)
        code = args.run(args) or 0
        if _TERMINATED:  # (raised where it was lost)
            raise Terminated(_TERMINATED[-1])
        return code
    except ParameterError as e:  # named as the command line gives it: by its flag, say (a verb that knows the line
        from xattn.cli.common import problem_of  # of a text says so itself: common.lines_of)

        return _fail(_verb(args), problem_of(args, e))
    except XattnError as e:
        return _fail(_verb(args), str(e))
    except BrokenPipeError:  # the reader went away (`| head`)
        return 0
    except OSError as e:
        if e.filename is None and e.errno in FULL:  # stdout, most likely: no file named
            return _fail(_verb(args), f"writing the output: {e.strerror}")
        if e.filename is None:  # not about a file the user named: a bug to show in full
            raise
        written = e.filename2 if e.errno in FULL and e.filename2 else e.filename  # (a copy's source, else)
        return _fail(_verb(args), f"{written}: {e.strerror or e}")
    except KeyboardInterrupt as e:
        if isinstance(e, Terminated):
            print(f"xattn {_verb(args)}: stopped by {signal.Signals(e.signum).name}", file=sys.stderr)
            for stream in (sys.stdout, sys.stderr):
                stream.flush()
            traceback.clear_frames(e.__traceback__)  # what the stopped work held is let go before the end by the
            gc.collect()                              # signal (a pool's semaphores: the resource tracker's warning)
            signal.signal(e.signum, signal.SIG_DFL)
            signal.raise_signal(e.signum)
        print(f"xattn {_verb(args)}: interrupted", file=sys.stderr)
        return 130
    finally:  # what settle_loaded froze is collectable again, for a caller that goes on (a test, a script)
        for s, handler in previous.items():
            signal.signal(s, handler)
        gc.unfreeze()


def _verb(args) -> str:
    """The verb as its usage names it: `heads align`, not `heads`."""
    return f"{args.verb} {args.subcommand}" if getattr(args, "subcommand", None) else args.verb


def _fail(verb: str, message: str) -> int:
    # one write, so that the lines of torchrun's processes, which share a stderr, do not run into each other
    print(f"xattn {verb}: error: {' '.join(message.split())}\n", end="", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
