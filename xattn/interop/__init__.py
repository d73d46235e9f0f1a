"""Interoperability: Hugging Face Marian import/export (`marian`), CTranslate2 export (`ct2`).

`transformers` and `ctranslate2` are optional (`pip install xattn[interop]`); they are imported only
when a conversion runs, and a missing one is a one-line XattnError.
"""
from __future__ import annotations

import importlib
from types import ModuleType

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
