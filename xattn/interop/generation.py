"""The decoding settings of a Marian export's `generate` (generation_config.json), and the beam size an import takes
from one; what does not carry over is named (README: Export and import)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from xattn.config import DecodeConfig, RunConfig
from xattn.errors import XattnError
from xattn.io import read_json

MIN_POSITIONS = 512  # Marian's position table; opus-mt uses 512


def generation_config(cfg: RunConfig) -> dict[str, Any]:
    """Defaults of `generate`: xattn's special ids, never pad or BOS (xattn's rule), and the model's decoding settings
    that `generate` has: beam size and n-best (the exact stopping rule as early_stopping "never", canonical beam
    search), or sampling's; min_len, no_repeat_ngram_size; the length penalty's alpha, exact at 0 only
    (`not_carried` names what is not)."""
    m, d = cfg.model, cfg.decode
    never = [[m.pad_id]] + ([[m.bos_id]] if m.bos_id != m.pad_id else [])
    out = dict(decoder_start_token_id=m.bos_id, bos_token_id=m.bos_id, eos_token_id=m.eos_id, pad_token_id=m.pad_id,
               forced_eos_token_id=m.eos_id, bad_words_ids=never, max_length=max(MIN_POSITIONS, m.max_positions))
    if d.sampling:
        out |= dict(do_sample=True, num_beams=1, temperature=d.temperature, top_k=d.top_k, top_p=d.top_p,
                    num_return_sequences=d.num_samples)
    else:
        out |= dict(num_beams=d.beam_size, num_return_sequences=d.n_best)
        if d.beam_size > 1:
            out |= dict(length_penalty=d.length_penalty, early_stopping="never" if d.stopping == "exact" else True)
    return out | ({"min_new_tokens": d.min_len} if d.min_len else {}) | \
        ({"no_repeat_ngram_size": d.no_repeat_ngram_size} if d.no_repeat_ngram_size else {})


def not_carried(decode: DecodeConfig) -> list[str]:
    """The model's own decoding settings that a Marian directory's `generate` does not apply as xattn does."""
    d, default = decode, DecodeConfig()
    out = [f"decode.length_penalty={d.length_penalty} (generate divides by len ** alpha, xattn by GNMT's "
           "((5 + len) / 6) ** alpha)"] if not d.sampling and d.beam_size > 1 and d.length_penalty else []
    out += [f"decode.{key}={getattr(d, key)}" for key in ("coverage_penalty", "max_len_a", "max_len_b", "seed")
            if getattr(d, key) != getattr(default, key)]
    return out + (["decode.shortlist (its lists stay behind)"] if d.shortlist else [])


def beams_of(hf_dir: Path) -> int:
    """The beam size a Marian directory's generation_config.json sets (num_beams: opus-mt's 4 or 6, say), which
    `generate` and its hub page use; xattn's default without one. Its other settings are not read (README)."""
    path = hf_dir / "generation_config.json"
    settings = read_json(path) if path.is_file() else {}
    beams = settings.get("num_beams") if isinstance(settings, dict) else None
    if beams is None:
        return DecodeConfig().beam_size
    try:
        return DecodeConfig(beam_size=beams).beam_size
    except XattnError as e:
        raise XattnError(f"{path}: num_beams: {str(e).split(': ', 1)[-1]}") from None
