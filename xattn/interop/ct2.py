"""CTranslate2 export: the Marian export (`marian.py`) in a temporary folder, converted by ctranslate2's
own Marian loader with three xattn-specific changes.

ctranslate2's `TransformersConverter` assumes opus-mt conventions that do not hold for xattn models:
it starts decoding from a zero vector (opus-mt's <pad> row) and so drops the last vocabulary entry, and
it gives source and target one vocabulary. Here decoding starts from xattn's BOS embedding, no row is
dropped, and each side keeps its own vocabulary. Like opus-mt in CTranslate2, the caller appends
"</s>" to the source pieces; the output directory also holds source.spm and target.spm, and, when the
model has a lexical shortlist (xattn/shortlist.py), the same lists as CTranslate2's vocabulary map
(vmap.txt: `translate_batch(..., use_vmap=True)`).
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

import torch

from xattn.checkpoint import load_model_dir
from xattn.config import ModelConfig
from xattn.errors import ParameterError
from xattn.interop import require
from xattn.interop.marian import check_exportable, write_marian
from xattn.io import atomic_dir
from xattn.tokenizer import Tokenizer

QUANTIZATIONS = ("int8", "int8_float32", "int8_float16", "int8_bfloat16", "int16", "float16", "bfloat16", "float32")


def pieces_by_id(tokenizer: Tokenizer, size: int) -> list[str]:
    """The model's vocabulary as CTranslate2 wants it: piece of id 0, 1, ..., size - 1 (placeholders for gaps)."""
    pieces = {i: piece for piece, i in tokenizer.vocab.items()}
    return [pieces.get(i, f"<xattn_unused_{i}>") for i in range(size)]


def _converter(hf_dir: Path, src: list[str], tgt: list[str], cfg: ModelConfig, unk_id: int):
    """A ctranslate2 Converter for the Marian export in `hf_dir` (classes built here: ctranslate2 is optional)."""
    ctranslate2 = require("ctranslate2")
    transformers = require("transformers")
    from ctranslate2.converters.transformers import BartLoader

    class XattnMarianLoader(BartLoader):
        """ctranslate2's Marian loading (its MarianMTLoader is this BartLoader plus opus-mt assumptions) for xattn."""

        def get_model_spec(self, model):
            model.config.normalize_before = False
            model.config.normalize_embedding = False
            return super().get_model_spec(model)

        def set_config(self, config, model, tokenizer):
            config.bos_token = config.decoder_start_token = tgt[cfg.bos_id]
            config.eos_token = tgt[cfg.eos_id]
            config.unk_token = tgt[unk_id] if unk_id >= 0 else "<unk>"

        def get_vocabulary(self, model, tokenizer):
            return src, tgt

        def set_vocabulary(self, spec, tokens):
            spec.register_source_vocabulary(tokens[0])
            spec.register_target_vocabulary(tokens[1])

    class XattnConverter(ctranslate2.converters.Converter):
        def _load(self):
            model = transformers.MarianMTModel.from_pretrained(hf_dir, dtype=torch.float32, local_files_only=True)
            spec = XattnMarianLoader()(model, None)
            for name in ("source.spm", "target.spm"):
                spec.register_file(str(hf_dir / name))
            return spec

    return XattnConverter()


def export_ct2(model_dir: str | Path, out_dir: str | Path, quantization: str | None = None) -> Path:
    """xattn model directory -> new CTranslate2 model directory (`ctranslate2.Translator(out_dir)`).

    `quantization` is one of QUANTIZATIONS (None keeps float32 weights).
    """
    if quantization is not None and quantization not in QUANTIZATIONS:
        raise ParameterError("quantization", f"{quantization!r} is not one of {', '.join(QUANTIZATIONS)}")
    require("transformers")
    require("ctranslate2")
    out = Path(os.path.realpath(out_dir) if Path(out_dir).is_symlink() else out_dir)  # as atomic_dir writes it;
    # the Hugging Face step beside it, named as its leftovers are (io.remove_leftovers)
    beside = {"dir": out.parent, "prefix": f".{out.name}.tmp-{os.getpid()}.hf."}
    with atomic_dir(out) as tmp, tempfile.TemporaryDirectory(**beside) as hf_dir:
        loaded = load_model_dir(model_dir)
        check_exportable(loaded.model)
        cfg = loaded.config.model
        if empty := [side for side in ("encoder", "decoder") if getattr(cfg, f"n_{side}_layers") == 0]:
            raise ParameterError("format", f"ct2: CTranslate2 cannot load a model without {empty[0]} layers "
                                 f"(model.n_{empty[0]}_layers=0); export it as hf instead")
        src = pieces_by_id(loaded.tokenizers.src, cfg.src_vocab_size)
        tgt = pieces_by_id(loaded.tokenizers.tgt, cfg.tgt_vocab_size)
        write_marian(loaded.model, loaded.config, loaded.tokenizers, Path(hf_dir))
        vmap = write_vmap(Path(model_dir), cfg, src, tgt, Path(hf_dir) / "vmap.txt")
        converter = _converter(Path(hf_dir), src, tgt, cfg, loaded.tokenizers.tgt.unk_id)
        converter.convert(str(tmp), vmap=vmap, quantization=quantization, force=True)  # force: tmp exists (empty)
    return Path(out_dir)


def write_vmap(model_dir: Path, cfg: ModelConfig, src: list[str], tgt: list[str], path: Path) -> str | None:
    """The model's shortlist as a CTranslate2 vocabulary map at `path` (None when it has none): a line
    `source piece TAB target pieces` per listed source id, and the frequent ones under the empty key."""
    from xattn.shortlist import FILE, Shortlist

    if not (model_dir / FILE).is_file():
        return None
    shortlist = Shortlist.load(model_dir, cfg.src_vocab_size, cfg.tgt_vocab_size)
    lines = ["\t" + " ".join(tgt[t] for t in shortlist.frequent)]
    lines += [src[s] + "\t" + " ".join(tgt[t] for t in row if t >= 0)
              for s, row in enumerate(shortlist.table.tolist()) if row[0] >= 0]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(path)
