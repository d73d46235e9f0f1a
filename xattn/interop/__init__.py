"""Interoperability: Hugging Face Marian import/export (`marian`), CTranslate2 export (`ct2`).

`transformers` and `ctranslate2` are optional (`pip install xattn[interop]`); they are imported only
when a conversion runs, and a missing one is a one-line XattnError.
"""
from __future__ import annotations

import importlib
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Iterator

from xattn.errors import XattnError


def require(package: str) -> ModuleType:
    """Import an optional package, or fail with the pip command that installs it."""
    try:
        module = importlib.import_module(package)
    except ImportError:
        raise XattnError(f"this needs the optional package {package}: pip install {package}") from None
    return module


def quiet_transformers() -> None:
    """Silence transformers' progress bars and advice (for the CLI, whose output is one line); no-op if missing."""
    try:
        import transformers
    except ImportError:
        return
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()


@contextmanager
def staged_dir(out_dir: str | Path) -> Iterator[Path]:
    """A fresh folder beside `out_dir` that becomes `out_dir` in one rename once the block succeeds.

    `out_dir` must not exist or be empty, so a conversion never mixes its files with older ones.
    """
    out_dir = Path(out_dir)
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise XattnError(f"{out_dir}: already exists and is not an empty directory")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", suffix=".tmp", dir=out_dir.parent))
    umask = os.umask(0)
    os.umask(umask)
    tmp.chmod(0o777 & ~umask)  # mkdtemp's 0o700 would outlive the rename
    try:
        yield tmp
        if out_dir.exists():
            out_dir.rmdir()
        tmp.rename(out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
