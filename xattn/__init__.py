"""xattn: encoder-decoder Transformers built around cross-attention."""
from xattn.config import DataConfig, DecodeConfig, ModelConfig, RunConfig, TrainConfig
from xattn.errors import XattnError
from xattn.model import DecoderOutput, EncoderOutput, Transformer
from xattn.translator import Translation, Translator, load

__version__ = "0.1.0"

__all__ = ["DataConfig", "DecodeConfig", "DecoderOutput", "EncoderOutput", "ModelConfig", "RunConfig",
           "TrainConfig", "Transformer", "Translation", "Translator", "XattnError", "load", "__version__"]
