"""What a `Translator.translate` call returns beside its translations, and what its sampling draws from: its
arguments other than the texts and the DecodeConfig, each checked, and one the call would leave unused refused,
as DecodeConfig refuses a setting its search would ignore."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from xattn.config import DecodeConfig, ModelConfig
from xattn.decoding import Tracked
from xattn.errors import ParameterError


@dataclass(frozen=True)
class Options:
    cross: bool          # return cross-attention
    source: str          # "search" or "rescore"
    self_: bool          # return decoder self-attention
    tracked: Tracked | None = None  # keep only the mean of these heads of one layer

    @classmethod
    def of(cls, model: ModelConfig, cfg: DecodeConfig, return_attention: bool, attention_from: str,
           return_self_attention: bool, attention_heads: tuple[int, tuple[int, ...] | None] | None,
           generator: torch.Generator | None) -> Options:
        """translate's arguments of these names, checked: a flag that is not True or False (`"no"` returned the
        attention, any value that is true did), `attention_heads` or `attention_from` without return_attention,
        and a generator that is not one or that a search with nothing to draw would leave unused."""
        for name, value in (("return_attention", return_attention), ("return_self_attention", return_self_attention)):
            if not isinstance(value, bool):
                raise ParameterError(name, f"True or False, got {value!r}")
        if attention_heads is not None and not return_attention:
            raise ParameterError("attention_heads", "applies with return_attention=True (the heads of the "
                                 "cross-attention returned)")
        if attention_from not in ("search", "rescore"):
            raise ParameterError("attention_from", f"'search' or 'rescore', got {attention_from!r}")
        if attention_from != "search" and not return_attention:  # (as attention_heads: not silently unused)
            raise ParameterError("attention_from", "applies with return_attention=True (where the attention "
                                 "returned comes from)")
        if attention_heads is not None and (not isinstance(attention_heads, (tuple, list))
                                            or len(attention_heads) != 2):
            raise ParameterError("attention_heads", f"(layer, heads or None), got {attention_heads!r}")
        if generator is not None and not isinstance(generator, torch.Generator):
            raise ParameterError("generator", f"a torch.Generator, got {type(generator).__name__}")
        if generator is not None and not cfg.sampling:
            raise ParameterError("generator", "applies to sampling (cfg.sampling): this search draws nothing")
        tracked = Tracked(*attention_heads).checked(model) if attention_heads is not None else None
        return cls(return_attention, attention_from, return_self_attention, tracked)
