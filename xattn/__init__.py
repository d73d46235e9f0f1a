"""xattn: encoder-decoder Transformers built around cross-attention."""
from xattn.errors import XattnError

__version__ = "0.1.0"

SUBPACKAGES = ("analysis", "interop", "serve", "transfer")
"""Reached as attributes after `import xattn` (xattn.analysis.figure), imported on first use: matplotlib,
transformers and FastAPI load only for those who use them."""


LAZY = {"DecoderOutput": "model", "EncoderOutput": "model", "Transformer": "model", "Translation": "translator",
        "Translator": "translator", "load": "translator", **dict.fromkeys(
            ("DataConfig", "DecodeConfig", "ModelConfig", "RunConfig", "TrainConfig"), "config")}
"""Names imported on first use: torch's with `model` and `translator` (`import xattn.data.prepare`, the workers of
`xattn prepare`, and `xattn.config` load without it), NumPy's and YAML's with `config` (the command line starts
without them, so that a Ctrl+C as it starts is one line: cli/main.py)."""


def __getattr__(name: str):
    import importlib

    if name in SUBPACKAGES:
        return importlib.import_module(f"xattn.{name}")
    if name in LAZY:
        return getattr(importlib.import_module(f"xattn.{LAZY[name]}"), name)
    raise AttributeError(f"module 'xattn' has no attribute {name!r}")

__all__ = ["DataConfig", "DecodeConfig", "DecoderOutput", "EncoderOutput", "ModelConfig", "RunConfig",
           "TrainConfig", "Transformer", "Translation", "Translator", "XattnError", "load", "__version__"]
