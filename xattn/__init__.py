"""xattn: encoder-decoder Transformers built around cross-attention."""
from xattn.config import DataConfig, DecodeConfig, ModelConfig, RunConfig, TrainConfig
from xattn.errors import XattnError
from xattn.model import DecoderOutput, EncoderOutput, Transformer
from xattn.translator import Translation, Translator, load

__version__ = "0.1.0"

SUBPACKAGES = ("analysis", "interop", "serve", "transfer")
"""Reached as attributes after `import xattn` (xattn.analysis.figure), imported on first use: matplotlib,
transformers and FastAPI load only for those who use them."""


def __getattr__(name: str):
    if name in SUBPACKAGES:
        import importlib

        return importlib.import_module(f"xattn.{name}")
    raise AttributeError(f"module 'xattn' has no attribute {name!r}")

__all__ = ["DataConfig", "DecodeConfig", "DecoderOutput", "EncoderOutput", "ModelConfig", "RunConfig",
           "TrainConfig", "Transformer", "Translation", "Translator", "XattnError", "load", "__version__"]
