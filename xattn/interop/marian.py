"""Hugging Face Marian (`MarianMTModel`, `MarianTokenizer`) <-> xattn model directories.

Marian is the post-LN Transformer of Vaswani et al. (2017) with sinusoidal positions (sines in the
first half of D, positions from 0), embeddings scaled by sqrt(D), q.k / sqrt(Dh) attention and no final
encoder/decoder LayerNorm; so is an xattn model with norm=post, positions=sinusoidal, score=scaled_dot,
and one converts into the other by renaming parameters (`name_map`). The generator bias is Marian's
`final_logits_bias` (1, V); xattn's BOS is Marian's decoder start token.

An export directory holds config.json, generation_config.json, model.safetensors, source.spm,
target.spm, vocab.json (piece -> id; target_vocab.json too with separate vocabularies),
tokenizer_config.json, and xattn_config.yaml (the run config, so that an import restores it).
Helsinki-NLP opus-mt directories number pieces apart from their SentencePiece models (eos 0,
pad = V - 1 = decoder start); an import keeps their ids and stores the table next to the tokenizer.
"""
from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from torch import Tensor

from xattn.attention import MultiHeadAttention, ScaledDotScore
from xattn.checkpoint import load_model_dir, non_finite, save_model_dir, weights_of
from xattn.config import DataConfig, DecodeConfig, ModelConfig, ParentConfig, RunConfig, load_config, save_config
from xattn.errors import XattnError
from xattn.registry import ACTIVATIONS
from xattn.interop import require
from xattn.interop.generation import MIN_POSITIONS, beams_of, generation_config
from xattn.io import atomic_dir, json_text, read_json
from xattn.model import Transformer
from xattn.tokenizer import JOINT_MODEL, SRC_MODEL, TGT_MODEL, Tokenizer, TokenizerPair, load_tokenizers, \
    read_vocab, vocab_file

XATTN_CONFIG = "xattn_config.yaml"
ATTENTION = {f"{ours}.{proj}": f"{theirs}.{proj}"
             for ours, theirs in (("self_attn", "self_attn"), ("cross_attn", "encoder_attn"))
             for proj in ("q_proj", "k_proj", "v_proj", "out_proj")}
LAYER = {"self_attn_norm": "self_attn_layer_norm", "cross_attn_norm": "encoder_attn_layer_norm",
         "ffn.fc1": "fc1", "ffn.fc2": "fc2", "ffn_norm": "final_layer_norm"} | ATTENTION
"""xattn layer module -> Marian layer module; the cross_attn entries exist in decoder layers only."""
POSITIONS = ("model.encoder.embed_positions.weight", "model.decoder.embed_positions.weight")


# ----------------------------------------------------------------------------------- names and configs

def name_map(cfg: ModelConfig) -> dict[str, str]:
    """Every xattn parameter name (tied aliases included) -> its Marian name."""
    out = {"src_embed.weight": "model.encoder.embed_tokens.weight",
           "tgt_embed.weight": "model.decoder.embed_tokens.weight",
           "generator.weight": "lm_head.weight", "generator.bias": "final_logits_bias"}
    for side, n_layers in (("encoder", cfg.n_encoder_layers), ("decoder", cfg.n_decoder_layers)):
        modules = {ours: theirs for ours, theirs in LAYER.items() if side == "decoder" or "cross" not in ours}
        for i in range(n_layers):
            for ours, theirs in modules.items():
                for kind in ("weight", "bias"):
                    out[f"{side}.layers.{i}.{ours}.{kind}"] = f"model.{side}.layers.{i}.{theirs}.{kind}"
    return out


def check_exportable(model: Transformer) -> None:
    """Raise an XattnError naming the first setting Marian cannot represent."""
    cfg = model.cfg
    for key, want in (("norm", "post"), ("positions", "sinusoidal"), ("score", "scaled_dot")):
        if getattr(cfg, key) != want:
            raise XattnError(f"model.{key}={getattr(cfg, key)!r} cannot be exported to Marian, "
                             f"which needs model.{key}={want!r}")
    for key, what in (("attention", "attention other than learned"), ("heads", "a pruned head count")):
        if getattr(cfg, key):
            raise XattnError(f"model.{key}={getattr(cfg, key)} ({what}) cannot be exported to Marian, which has "
                             f"learned attention with model.n_heads={cfg.n_heads} heads everywhere")
    for name, module in model.named_modules():
        if name.endswith(("self_attn", "cross_attn")) and not (
                isinstance(module, MultiHeadAttention) and isinstance(module.score, ScaledDotScore)):
            raise XattnError(f"{name} is {type(module).__name__}, not learned scaled-dot attention; "
                             "Marian cannot hold it")


def marian_config(cfg: ModelConfig) -> dict[str, Any]:
    """MarianConfig keyword arguments for an exportable xattn model."""
    return dict(
        vocab_size=cfg.src_vocab_size, decoder_vocab_size=cfg.tgt_vocab_size, d_model=cfg.d_model,
        encoder_layers=cfg.n_encoder_layers, decoder_layers=cfg.n_decoder_layers,
        encoder_attention_heads=cfg.n_heads, decoder_attention_heads=cfg.n_heads,
        encoder_ffn_dim=cfg.d_ff, decoder_ffn_dim=cfg.d_ff, activation_function=cfg.activation,
        dropout=cfg.dropout, attention_dropout=cfg.attention_dropout, activation_dropout=cfg.activation_dropout,
        max_position_embeddings=max(MIN_POSITIONS, cfg.max_positions), scale_embedding=True,
        pad_token_id=cfg.pad_id, eos_token_id=cfg.eos_id, forced_eos_token_id=cfg.eos_id,
        bos_token_id=cfg.bos_id, decoder_start_token_id=cfg.bos_id,
        share_encoder_decoder_embeddings=cfg.share_embeddings, tie_word_embeddings=cfg.tie_output,
    )


UNSUPPORTED = (  # (key, value when absent, predicate for "fine", why)
    ("model_type", "marian", lambda v: v == "marian", "not a Marian model"),
    ("normalize_before", False, lambda v: not v, "pre-LN; xattn imports post-LN Marian models"),
    ("normalize_embedding", False, lambda v: not v, "a LayerNorm on the embeddings"),
    ("add_final_layer_norm", False, lambda v: not v, "a final LayerNorm"),
    ("scale_embedding", False, lambda v: bool(v), "xattn scales embeddings by sqrt(d_model)"),
    ("static_position_embeddings", True, lambda v: bool(v), "learned positions"),
    ("activation_function", "gelu", lambda v: activation_of(v) is not None,
     f"model.activation is one of {', '.join(ACTIVATIONS)}"),
)

WHOLE = (*((key, 1) for key in ("d_model", "encoder_attention_heads", "decoder_attention_heads", "decoder_layers",
                                  "encoder_ffn_dim", "decoder_ffn_dim", "max_position_embeddings")),
         *((key, 0) for key in ("encoder_layers", "pad_token_id", "decoder_start_token_id", "eos_token_id")),
         ("vocab_size", 1),
         ("decoder_vocab_size", 1))
"""The whole-number Marian settings the import reads, and the least each may be (transformers writes others, such
as bos_token_id, as null; decoder_vocab_size null means vocab_size's)."""
FLAGS = ("scale_embedding", "normalize_before", "normalize_embedding", "add_final_layer_norm",
         "static_position_embeddings", "share_encoder_decoder_embeddings", "tie_word_embeddings")
RATES = ("dropout", "attention_dropout", "activation_dropout")
"""Marian settings the import reads that must be true or false, and numbers: transformers' config class refuses
other JSON types with an error of its own, which came out as a traceback."""

HF_ACTIVATIONS = {"silu": "swish"}
"""Hugging Face's names of activations that xattn names otherwise."""


def activation_of(name: object) -> str | None:
    """xattn's name of a Hugging Face activation_function (None: one xattn lacks)."""
    name = HF_ACTIVATIONS.get(name, name) if isinstance(name, str) else None
    return name if name in ACTIVATIONS else None


def check_importable(hf: dict[str, Any], where: str) -> None:
    """Raise an XattnError naming the first Marian setting xattn cannot represent."""
    if "model_type" not in hf:  # (transformers writes it in every config.json; read as marian, a CTranslate2
        #                          model's was refused for scale_embedding, which it does not name either)
        raise XattnError(f"{where}: names no model_type, so it is no Hugging Face model's config (a CTranslate2 "
                         "model directory's, say); import reads a Hugging Face Marian directory")
    if key := next((k for k in FLAGS if k in hf and type(hf[k]) is not bool), None):  # (UNSUPPORTED reads them)
        raise XattnError(f"{where}: {key} must be true or false, got {json_text(hf[key])}")
    if key := next((k for k in RATES if k in hf and type(hf[k]) not in (int, float)), None):
        raise XattnError(f"{where}: {key} must be a number, got {json_text(hf[key])}")
    for key, default, fine, why in UNSUPPORTED:
        if not fine(hf.get(key, default)):
            raise XattnError(f"{where}: {key}={hf.get(key, default)!r} is not supported ({why})")
    for a, b in (("encoder_attention_heads", "decoder_attention_heads"), ("encoder_ffn_dim", "decoder_ffn_dim")):
        if hf.get(a) != hf.get(b):
            raise XattnError(f"{where}: {a}={hf.get(a)} differs from {b}={hf.get(b)}; xattn needs them equal")
    if isinstance(hf.get("eos_token_id"), list):
        raise XattnError(f"{where}: eos_token_id={hf['eos_token_id']} is a list; xattn needs one EOS id")
    for key, least in WHOLE:  # (a string here was the hub's traceback; -1 a negative tensor size, unnamed)
        if key in hf and not (key == "decoder_vocab_size" and hf[key] is None) and \
                (type(hf[key]) is not int or hf[key] < least):
            raise XattnError(f"{where}: {key} must be a whole number >= {least}, got {json_text(hf[key])}")


def model_config(hf: dict[str, Any], state: dict[str, Tensor]) -> ModelConfig:
    """The xattn ModelConfig of a Marian config and its weights (the weights tell which embeddings are shared)."""
    enc, dec = state["model.encoder.embed_tokens.weight"], state["model.decoder.embed_tokens.weight"]
    share = bool(hf.get("share_encoder_decoder_embeddings", True)) and enc.shape == dec.shape and torch.equal(enc, dec)
    tie = bool(hf.get("tie_word_embeddings", True)) and torch.equal(state["lm_head.weight"], dec)
    return ModelConfig(
        src_vocab_size=enc.shape[0], tgt_vocab_size=dec.shape[0], d_model=hf["d_model"],
        n_heads=hf["encoder_attention_heads"], n_encoder_layers=hf["encoder_layers"],
        n_decoder_layers=hf["decoder_layers"], d_ff=hf["encoder_ffn_dim"], dropout=hf.get("dropout", 0.1),
        attention_dropout=hf.get("attention_dropout", 0.0), activation_dropout=hf.get("activation_dropout", 0.0),
        activation=activation_of(hf.get("activation_function", "gelu")), norm="post", positions="sinusoidal",
        score="scaled_dot",
        max_positions=hf.get("max_position_embeddings", 1024),
        share_embeddings=share, tie_output=tie, pad_id=hf["pad_token_id"], bos_id=hf["decoder_start_token_id"],
        eos_id=hf["eos_token_id"],
    )


# ------------------------------------------------------------------------------------------- weights

def to_marian_state(model: Transformer) -> dict[str, Tensor]:
    """Marian state dict (position tables excluded: Marian builds them) of an exportable xattn model."""
    ours = model.state_dict()
    out = {theirs: ours[name].detach().cpu() for name, theirs in name_map(model.cfg).items()}
    out["final_logits_bias"] = out["final_logits_bias"].unsqueeze(0)  # (1, V)
    if model.cfg.share_embeddings:
        out["model.shared.weight"] = out["model.encoder.embed_tokens.weight"]
    return out


def from_marian_state(state: dict[str, Tensor], cfg: ModelConfig) -> Transformer:
    """An xattn Transformer holding the weights of a Marian state dict; every parameter must arrive."""
    ours = {name: state[theirs].float() for name, theirs in name_map(cfg).items()}
    ours["generator.bias"] = ours["generator.bias"].reshape(-1)  # (V,)
    model = Transformer(cfg)
    model.load_state_dict(ours, strict=True)
    return model.eval()


def to_hf_model(model: Transformer, cfg: RunConfig):
    """A `MarianMTModel` computing what `model` computes, with generation defaults from `cfg`."""
    transformers = require("transformers")
    check_exportable(model)
    hf = transformers.MarianMTModel(transformers.MarianConfig(**marian_config(model.cfg)))
    if hf.model.decoder.embed_tokens.num_embeddings != model.cfg.tgt_vocab_size:  # transformers 4.x
        raise XattnError(f"transformers {transformers.__version__} gives Marian's decoder the source vocabulary size; "
                         "source and target vocabularies of different sizes need transformers>=5")
    result = hf.load_state_dict(to_marian_state(model), strict=False)
    if set(result.missing_keys) - set(POSITIONS) or result.unexpected_keys:
        raise RuntimeError(f"Marian weights did not load cleanly: {result}")
    hf.generation_config = transformers.GenerationConfig(**generation_config(cfg))
    return hf.eval()


def from_hf_model(hf, where: str) -> Transformer:
    """An xattn Transformer equal to a loaded `MarianMTModel`."""
    config = hf.config.to_dict()
    check_importable(config, where)
    state = hf.state_dict()
    return from_marian_state(state, model_config(config, state))


# ----------------------------------------------------------------------------------------- tokenizers

def _write_json(path: Path, value: Any) -> None:
    path.write_text(json_text(value, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")


def _read_json(path: Path) -> dict[str, Any]:
    value = read_json(path)
    if not isinstance(value, dict):
        raise XattnError(f"{path}: expected a JSON object")
    return value


def write_marian_tokenizer(tokenizers: TokenizerPair, cfg: RunConfig, out: Path) -> None:
    """source.spm, target.spm, vocab.json (+ target_vocab.json) and tokenizer_config.json for MarianTokenizer."""
    src, tgt = tokenizers.src.vocab, tokenizers.tgt.vocab
    for side, vocab, size in (("source", src, cfg.model.src_vocab_size), ("target", tgt, cfg.model.tgt_vocab_size)):
        if max(vocab.values()) >= size:
            raise XattnError(f"the {side} tokenizer has ids up to {max(vocab.values())}, beyond the model's {size}")
    pieces = {i: piece for piece, i in tgt.items()}
    specials = {}
    ids = {"eos_token": cfg.model.eos_id, "pad_token": cfg.model.pad_id, "unk_token": tokenizers.tgt.unk_id}
    for key, i in ids.items():
        if i not in pieces or src.get(pieces[i]) != i:
            raise XattnError(f"{key} (id {i}) is not the same piece in both vocabularies; MarianTokenizer needs that")
        specials[key] = pieces[i]
    shutil.copyfile(tokenizers.src.path, out / "source.spm")
    shutil.copyfile(tokenizers.tgt.path, out / "target.spm")
    _write_json(out / "vocab.json", src)
    if src != tgt:
        _write_json(out / "target_vocab.json", tgt)
    _write_json(out / "tokenizer_config.json", dict(
        tokenizer_class="MarianTokenizer", source_lang=cfg.data.src_lang, target_lang=cfg.data.tgt_lang,
        separate_vocabs=src != tgt, model_max_length=max(MIN_POSITIONS, cfg.model.max_positions), **specials))


def _tokenizer_options(hf_dir: Path) -> dict[str, Any]:
    path = hf_dir / "tokenizer_config.json"
    return _read_json(path) if path.is_file() else {}


def _place_spm(spm_file: Path, dest: Path, vocab: dict[str, int]) -> None:
    """Copy a SentencePiece model into the model directory, with its id table where ids differ from its own."""
    own = Tokenizer.load(spm_file).vocab  # (read where it is: a damaged one was named by its temporary copy)
    shutil.copyfile(spm_file, dest)
    if own != vocab:
        _write_json(vocab_file(dest), vocab)


def read_marian_tokenizer(hf_dir: Path, out: Path) -> TokenizerPair:
    """Write xattn tokenizer files for a MarianTokenizer directory into `out`; one spm.model when both sides agree."""
    for name in ("source.spm", "target.spm", "vocab.json"):
        if not (hf_dir / name).is_file():
            raise XattnError(f"{hf_dir}: no {name} (not a MarianTokenizer directory)")
    options = _tokenizer_options(hf_dir)
    src = read_vocab(hf_dir / "vocab.json")
    tgt = read_vocab(hf_dir / "target_vocab.json") if options.get("separate_vocabs") else src
    source, target = hf_dir / "source.spm", hf_dir / "target.spm"
    if src == tgt and source.read_bytes() == target.read_bytes():
        _place_spm(source, out / JOINT_MODEL, src)
    else:
        _place_spm(source, out / SRC_MODEL, src)
        _place_spm(target, out / TGT_MODEL, tgt)
    return load_tokenizers(out)


def import_run_config(hf_dir: Path, model: ModelConfig, tokenizers: TokenizerPair) -> RunConfig:
    """The run config of an import: xattn_config.yaml if the export wrote one, else defaults with the languages and
    no dataset (what the model was trained on is not known: `evaluate` asks for files)."""
    if (hf_dir / XATTN_CONFIG).is_file():
        saved = load_config(hf_dir / XATTN_CONFIG)  # (a parent it names is not this import's: its weights are whole;
        #   an export carries no shortlist, so one that kept decode.shortlist had every translation refused)
        return replace(saved, model=replace(model, max_positions=saved.model.max_positions), parent=ParentConfig(),
                       decode=replace(saved.decode, shortlist=False))
    options = _tokenizer_options(hf_dir)
    langs = {k: options[h] for k, h in (("src_lang", "source_lang"), ("tgt_lang", "target_lang")) if options.get(h)}
    data = DataConfig(dataset=None, vocab_size=tokenizers.tgt.vocab_size, joint_vocab=tokenizers.joint, **langs)
    return RunConfig(model=model, data=data, decode=DecodeConfig(beam_size=beams_of(hf_dir)))


# ------------------------------------------------------------------------------------- directories

def write_marian(model: Transformer, cfg: RunConfig, tokenizers: TokenizerPair, out: Path) -> None:
    """Write a MarianMTModel + MarianTokenizer directory for `model` into the existing folder `out`."""
    to_hf_model(model, cfg).save_pretrained(out)
    write_marian_tokenizer(tokenizers, cfg, out)
    save_config(replace(cfg, parent=ParentConfig(), decode=replace(cfg.decode, shortlist=False)),  # whole weights: a
                out / XATTN_CONFIG)  # child's are its own now; no shortlist.safetensors goes with them


def export_marian(model_dir: str | Path, out_dir: str | Path) -> Path:
    """xattn model directory -> new directory that `MarianMTModel` / `MarianTokenizer.from_pretrained` load."""
    require("transformers")
    with atomic_dir(out_dir) as tmp:
        loaded = load_model_dir(model_dir)
        check_exportable(loaded.model)
        write_marian(loaded.model, loaded.config, loaded.tokenizers, tmp)
    return Path(out_dir)


def load_hf(hf_dir: str | Path):
    """`MarianMTModel.from_pretrained(hf_dir)` in float32, offline, with user mistakes as XattnErrors."""
    transformers = require("transformers")
    hf_dir = Path(hf_dir)
    if not (hf_dir / "config.json").is_file():
        raise XattnError(f"{hf_dir}: no config.json (not a Hugging Face model directory)")
    check_importable(_read_json(hf_dir / "config.json"), str(hf_dir / "config.json"))
    try:  # float32 at load: opus-mt weights are float16, and so would be the position tables transformers builds
        model, info = transformers.MarianMTModel.from_pretrained(hf_dir, dtype=torch.float32, local_files_only=True,
                                                                 output_loading_info=True, ignore_mismatched_sizes=True)
    except SafetensorError as e:  # a download cut short, say
        raise XattnError(f"{hf_dir}: the weights file is damaged or incomplete ({str(e).splitlines()[0]})") from None
    except (OSError, ValueError, RuntimeError) as e:
        raise XattnError(f"{hf_dir}: cannot load the Marian model ({str(e).splitlines()[0]})") from None
    if mismatched := sorted(info.get("mismatched_keys", []), key=str):  # (reported here, not by transformers' log)
        key, *shapes = mismatched[0] if isinstance(mismatched[0], tuple) else (mismatched[0],)
        sizes = f" is {tuple(shapes[0])} in the weights file, {tuple(shapes[1])} by config.json" if len(shapes) == 2 else ""
        raise XattnError(f"{hf_dir}: config.json does not fit the weights: {key}{sizes}")
    # transformers fills a tensor the file lacks with random numbers (and builds the sinusoidal position tables)
    if missing := sorted(k for k in info.get("missing_keys", []) if not k.endswith("embed_positions.weight")):
        raise XattnError(f"{hf_dir}: the weights file lacks {len(missing)} tensor(s) the model needs, e.g. {missing[0]} "
                         "(transformers would fill them with random numbers)")
    if unexpected := sorted(k for k in info.get("unexpected_keys", []) if not k.endswith("embed_positions.weight")):
        raise XattnError(f"{hf_dir}: config.json does not fit the weights: the weights file holds {len(unexpected)} "
                         f"tensor(s) the config has no place for, e.g. {unexpected[0]} (transformers would drop them)")
    return model.eval()


def import_marian(hf_dir: str | Path, out_dir: str | Path) -> Path:
    """Marian directory (an xattn export or a Helsinki-NLP opus-mt model) -> new xattn model directory."""
    hf_dir = Path(hf_dir)
    with atomic_dir(out_dir) as tmp:
        model = from_hf_model(load_hf(hf_dir), str(hf_dir / "config.json"))
        tokenizers = read_marian_tokenizer(hf_dir, tmp)
        if tokenizers.src.eos_id != model.cfg.eos_id or tokenizers.tgt.eos_id != model.cfg.eos_id:
            raise XattnError(f"{hf_dir}: the tokenizer's </s> id {tokenizers.src.eos_id} differs from the model's "
                             f"eos_token_id {model.cfg.eos_id}")
        for side, tok, rows in (("source", tokenizers.src, model.cfg.src_vocab_size),  # (what loading the model
                                ("target", tokenizers.tgt, model.cfg.tgt_vocab_size)):  # written would refuse)
            if tok.vocab_size != rows:
                raise XattnError(f"{hf_dir / 'vocab.json'}: has {tok.vocab_size} ids for the {side}, but the weights' "
                                 f"{side} embedding has {rows} rows; the tokenizer and the weights do not belong together")
        if (bad := non_finite(weights_of(model))) is not None:
            raise XattnError(f"{hf_dir}: the weights hold NaN or infinite values (in {bad}, as imported)")
        save_model_dir(tmp, model, import_run_config(hf_dir, model.cfg, tokenizers))
    return Path(out_dir)
