"""Translator: text in, Translation out (tokenize, batch by token budget, search, detokenize).

Shapes: B sentences in a batch, R hypotheses, S source length, T target positions, L layers, H heads.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Hashable, Sequence

import numpy as np
import torch
from torch import Tensor

from xattn.batching import pad_batch, shares, token_batches
from xattn.checkpoint import load_model_dir
from xattn.config import DecodeConfig, RunConfig
from xattn.errors import ItemError, ParameterError
from xattn.decoding import Hypothesis, Steps, Vocab, encode_in_parts, finish, search_steps, seeded
from xattn.decoding.step import length_problem, positions_problem
from xattn.decoding.stream import Stream, stream_problem
from xattn.devices import resolve_device
from xattn.inference import InferenceModel, Speedups
from xattn.model import EncoderOutput, HeadMask, Transformer, stack_layers
from xattn.options import Options
from xattn.registry import kind_problem
from xattn.shortlist import FILE as SHORTLIST, Shortlist
from xattn.tokenizer import text_list
from xattn.translation import Translation
from xattn.workers import THREADS, part_generators, run_parts

if TYPE_CHECKING:
    from xattn.tokenizer import TokenizerPair


def copy_mask(mask: HeadMask | None) -> HeadMask | None:
    return None if mask is None else {place: [None if f is None else f.detach().clone() for f in layers]
                                      for place, layers in mask.items()}


@dataclass
class ForcedAttention:
    """The attention of a teacher-forced pass (Translator.forced_attention), one unpadded array per target r:
    cross (L, H, T_r, S_r), decoder self (L, H, T_r, T_r) and encoder self (L, H, S_r, S_r) when asked for,
    with T_r = len(targets[r]) + 1 (BOS + tokens in, tokens + EOS predicted) and S_r its source's length."""
    cross: list[np.ndarray]
    decoder_self: list[np.ndarray] | None = None
    encoder_self: list[np.ndarray] | None = None


class Translator:
    """A model and its tokenizers on one device; `translate` turns sentences into Translations.

    `model` stays the plain Transformer. With `speedups` (xattn.inference), decoding runs on a copy
    rewritten for speed, made again whenever `model`'s weights change; without, on `model` itself.
    """

    def __init__(self, model: Transformer, tokenizers: TokenizerPair, device: str | torch.device | None = None,
                 config: RunConfig | None = None, speedups: Speedups | None = None):
        self.device = resolve_device(str(device) if device is not None else "auto", "device")
        self.model = model.to(self.device).eval()
        self.tokenizers = tokenizers
        self.config = config
        self.inference = InferenceModel(self.model, speedups, self.device)
        self._head_mask: HeadMask | None = None
        self._workers = 1
        self.shortlist: Shortlist | None = None  # what decode.shortlist uses (from_dir: the model directory's)

    @property
    def workers(self) -> int:
        """How many parts `translate` splits a call's sentences into, each decoded on a thread of its own at once,
        with PyTorch's threads shared out among them (xattn.workers); 1 (the default) decodes them as one. On a CPU,
        without a compiled step (others are refused). Float32 searches find what one part does, up to the rounding
        of other batch sizes; int8 ones can differ a little (a batch's activations are quantized together); each
        part samples from a generator of its own."""
        return self._workers

    @workers.setter
    def workers(self, n: int) -> None:
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ParameterError("workers", f"a whole number >= 1, got {n!r}")
        compiled = self.inference.speedups is not None and self.inference.speedups.compile
        if n > 1 and (self.device.type != "cpu" or compiled):
            raise ParameterError("workers", "parts run on a CPU without a compiled step; this Translator decodes "
                                 + ("with one" if self.device.type == "cpu" else f"on {self.device}"))
        self._workers = n

    @property
    def head_mask(self) -> HeadMask | None:
        """Factors on the heads' outputs (Transformer.encode), from 0 (the head off) to 1 (as trained), as a
        mask file has them (`translate --head-mask`), that every search and teacher-forced pass of this
        Translator applies; None: every head as trained. A mask that does not fit is a ParameterError. A copy: change
        the mask by setting it again, which checks it."""
        return copy_mask(self._head_mask)

    @head_mask.setter
    def head_mask(self, mask: HeadMask | None) -> None:
        try:
            mask = self.model.check_head_mask(mask, unit=True)
        except ValueError as e:
            raise ParameterError("head_mask", str(e).removeprefix("head_mask: ")) from None
        self._head_mask = copy_mask(mask)  # the caller's tensors may change after the check

    @property
    def decode_config(self) -> DecodeConfig:
        """The model directory's decode settings (defaults for a Translator built in memory)."""
        return self.config.decode if self.config is not None else DecodeConfig()

    @classmethod
    def from_dir(cls, path: str | Path, device: str | torch.device | None = None, quantize: str | None = None,
                 compile: bool = False, workers: int = 1) -> Translator:
        """Load a model directory (config.yaml, model.safetensors, tokenizer files).

        Decoding runs on a copy with packed float32 linear layers (CPU); `quantize="int8"`: dynamic int8
        linear layers instead (CPU only: without a `device`, on the CPU whatever GPU there is); `compile`:
        torch.compile the decoder step. `model` stays plain. `workers`: Translator.workers.
        """
        if not isinstance(path, (str, Path)):
            raise ParameterError("path", f"a model directory (a str or Path), got {type(path).__name__}")
        if not isinstance(compile, bool):
            raise ParameterError("compile", f"True or False, got {compile!r}")
        speedups = Speedups(quantize=quantize, compile=compile)
        device = resolve_device(str(device) if device is not None else "cpu" if quantize == "int8" else "auto", "device")
        loaded = load_model_dir(path, device)
        translator = cls(loaded.model, loaded.tokenizers, device, loaded.config, speedups)
        translator.workers = workers
        if (Path(path) / SHORTLIST).is_file():
            cfg = loaded.config.model
            translator.shortlist = Shortlist.load(path, cfg.src_vocab_size, cfg.tgt_vocab_size)
        return translator

    def translate(self, texts: list[str], cfg: DecodeConfig | None = None, return_attention: bool = False,
                  attention_from: str = "search", return_self_attention: bool = False,
                  prefixes: list[str] | None = None,
                  attention_heads: tuple[int, tuple[int, ...] | None] | None = None,
                  generator: torch.Generator | None = None) -> list[Translation]:
        """Translate `texts` with `cfg` (default: the model directory's decode settings, `decode_config`, as every
        command and the server use them); results come back in input order.

        Sentences are sorted by length into batches of at most cfg.max_tokens source positions
        (hypotheses per input * sentences * longest source). An empty sentence translates to an
        empty text. `prefixes[i]` (target text, may be "") is forced as the start of translation i.
        With `return_attention` each result carries the cross-attention of its hypothesis:
        tracked along the search (`attention_from="search"`) or recomputed by one teacher-forced
        pass over the final hypotheses (`"rescore"`, cheaper under beam search); both agree. With
        `attention_heads` = (layer, heads or None for all), only the mean of those heads is kept, as a
        (1, 1, T, S) cross_attention; tracked along the search, it costs one layer's weights and a row per
        step (the links of a guided head, xattn.guidance). Sampling draws from `generator` when given (one
        torch.Generator passed to several calls, as the CLI does over a file's chunks, so that they do not draw
        alike), else from one seeded with cfg.seed for this call (decoding.seeded). With `workers` above 1 a
        search runs in that many parts at once.
        """
        ids, forced, cfg, options = self._prepared(texts, cfg, return_attention, attention_from, return_self_attention,
                                                   prefixes, attention_heads, generator)
        if self._workers > 1 and len(ids) > 1:
            return self._in_parts(ids, forced, cfg, options, generator)
        return finish(self._steps(ids, forced, cfg, options, generator))

    def translate_steps(self, texts: list[str], cfg: DecodeConfig | None = None, return_attention: bool = False,
                        attention_from: str = "search", return_self_attention: bool = False,
                        prefixes: list[str] | None = None,
                        attention_heads: tuple[int, tuple[int, ...] | None] | None = None,
                        generator: torch.Generator | None = None) -> Steps[list[Translation]]:
        """`translate` one decoder step per `next()` (decoding.Steps), for a caller that runs several in turns
        (the server); the arguments are checked and the texts tokenized at the call."""
        return self._steps(*self._prepared(texts, cfg, return_attention, attention_from, return_self_attention,
                                           prefixes, attention_heads, generator), generator)

    def _prepared(self, texts: list[str], cfg: DecodeConfig | None, return_attention: bool, attention_from: str,
                  return_self_attention: bool, prefixes: list[str] | None,
                  attention_heads: tuple[int, tuple[int, ...] | None] | None, generator: torch.Generator | None
                  ) -> tuple[list[list[int]], list[list[int]] | None, DecodeConfig, Options]:
        """translate's arguments checked, and its texts (and prefixes) as ids."""
        texts = text_list("texts", texts, "a list of sentences, got one string; pass [text]")
        cfg = self.decode_config if cfg is None else cfg
        if not isinstance(cfg, DecodeConfig):
            raise ParameterError("cfg", f"a DecodeConfig, got {type(cfg).__name__} (DecodeConfig(**settings) makes one)")
        cfg.refuse_unused(cfg.set_besides(self.decode_config))  # a setting this search would ignore, named
        options = Options.of(self.model.cfg, cfg, return_attention, attention_from, return_self_attention,
                             attention_heads, generator)
        if prefixes is not None:
            prefixes = text_list("prefixes", prefixes, "a list of one prefix per text (\"\" for none), got one string")
        if prefixes is not None and len(prefixes) != len(texts):
            raise ParameterError("prefixes", f"{len(prefixes)} prefixes for {len(texts)} texts; give one per text")
        forced = self.tokenizers.tgt.encode_batch(prefixes, "prefixes") if prefixes is not None else None
        if forced is not None and (long := self.model.cfg.beyond_positions([[0, *p] for p in forced])) is not None:
            raise ItemError("prefixes", long, f"{len(forced[long])} tokens (and BOS) do not fit the model's "
                            f"{self.model.cfg.max_positions} positions (learned); shorten it")  # (beam: an IndexError)
        return self._source_ids(texts, cfg, forced), forced, cfg, options

    def _source_ids(self, texts: list[str], cfg: DecodeConfig, forced: list[list[int]] | None = None
                    ) -> list[list[int]]:
        """`texts` as ids, </s> added, each checked here rather than in a batch of the search, where its error would
        name no text: one too long for learned positions (an ItemError), and one whose length a setting of `cfg`
        cannot meet with its forced prefix (a ParameterError naming the setting and the text)."""
        mc = self.model.cfg
        ids = [s + [mc.eos_id] for s in self.tokenizers.src.encode_batch(texts)]
        if (long := mc.beyond_positions(ids)) is not None:
            raise ItemError("texts", long, f"{len(ids[long])} tokens (</s> included) do not fit the model's "
                            f"{mc.max_positions} positions (learned); shorten it or split it")
        if any(len(s) > 1 for s in ids) and (problem := positions_problem(cfg, mc.learned_positions)):
            raise problem  # (whatever the text: the setting's, named alone)
        for i, source in enumerate(ids):
            if problem := length_problem(cfg, len(source), len(forced[i]) if forced is not None else 0):
                raise ParameterError(problem.name, problem.problem, item=("texts", i))
        return ids

    def _in_parts(self, ids: list[list[int]], forced: list[list[int]] | None, cfg: DecodeConfig, options: Options,
                  generator: torch.Generator | None) -> list[Translation]:
        """`_steps` over `workers` shares of the sentences at once (xattn.workers), results in input order. Sampling:
        each share draws from a generator of its own, seeded from the call's."""
        self.inference.current()  # the decoding copy made here, not by two workers at once
        parts = shares([len(s) for s in ids], self._workers)
        gens = [None] * len(parts) if not cfg.sampling else part_generators(generator or seeded(cfg, self.device),
                                                                            len(parts))
        done = run_parts([lambda part=part, gen=gen: self._steps([ids[i] for i in part], None if forced is None else
                                                                 [forced[i] for i in part], cfg, options, gen)
                          for part, gen in zip(parts, gens)], max(1, THREADS.count() // len(parts)))
        by_index = {i: t for part, translations in zip(parts, done) for i, t in zip(part, translations)}
        return [by_index[i] for i in range(len(ids))]

    def _steps(self, ids: list[list[int]], forced: list[list[int]] | None, cfg: DecodeConfig, options: Options,
               generator: torch.Generator | None) -> Steps[list[Translation]]:
        model = self.inference.current()
        results: list[Translation | None] = [None] * len(ids)
        if cfg.sampling and generator is None:  # one a call at least: its batches never draw alike
            generator = seeded(cfg, self.device)
        mc = self.model.cfg  # a position's attention tracked along the search (float32): half a token's (int64) per value
        values = (0 if not (options.cross and options.source == "search") else 1 if options.tracked is not None
                  else mc.n_decoder_layers * max(mc.heads_per_layer("cross")))
        for batch in token_batches([len(s) for s in ids], cfg.max_tokens, cfg.hypotheses,
                                   lambda n: (cfg.max_output_tokens(n) + 1) * (1 + values * n // 2)):  # (+ EOS)
            batch_prefix = [forced[i] for i in batch] if forced is not None else None
            translations = yield from self._translate_batch(model, [ids[i] for i in batch], cfg, options, batch_prefix,
                                                            generator)
            for i, translation in zip(batch, translations):
                results[i] = translation
        return results  # type: ignore[return-value]

    def stream(self, cfg: DecodeConfig) -> TranslationStream:
        """A TranslationStream under `cfg` (plain greedy search: decoding.stream.streamable)."""
        return TranslationStream(self, cfg)

    def forced_attention(self, src: Tensor, targets: Sequence[Sequence[int]], rows: Sequence[int] | None = None,
                         kinds: Sequence[str] = ("cross",), enc: EncoderOutput | None = None) -> ForcedAttention:
        """The attention of one teacher-forced pass: the decoder reads BOS + targets[r] (ids, EOS excluded) as
        the translation of source row rows[r] (default r) of src (B, S), EOS-ended and pad-padded. `kinds`:
        of "cross" (always computed), "decoder-self", "encoder-self". `enc`: src's encoding when the caller
        has it (a search's), made here otherwise. Every verb that reads the attention of a given or found
        translation (rescoring, attention, align, diagnose, the server) goes through this pass."""
        if problem := next(filter(None, map(kind_problem, kinds)), None):
            raise ParameterError("kinds", problem)
        model, cfg = self.inference.current(), self.model.cfg
        rows = list(range(len(targets))) if rows is None else list(rows)
        if len(rows) != len(targets):
            raise ParameterError("rows", f"{len(rows)} rows for {len(targets)} targets; give one per target")
        if not isinstance(src, Tensor) or src.dim() != 2 or src.dtype not in (torch.int64, torch.int32):
            got = f"{tuple(src.shape)} of {src.dtype}" if isinstance(src, Tensor) else type(src).__name__
            raise ParameterError("src", f"a (batch, length) tensor of token ids, got {got}")
        if src.numel() and not 0 <= int(src.min()) <= int(src.max()) < cfg.src_vocab_size:
            raise ParameterError("src", f"an id outside the source vocabulary (0 to {cfg.src_vocab_size - 1})")
        if (bad := next((i for i, t in enumerate(targets) if isinstance(t, (str, bytes)) or not all(
                type(x) is int for x in t)), None)) is not None:
            raise ItemError("targets", bad, "expected a list of int token ids")
        if (bad := next((i for i, r in enumerate(rows) if not 0 <= r < src.shape[0]), None)) is not None:
            raise ItemError("rows", bad, f"{rows[bad]} is not a row of src, which has {src.shape[0]}")
        if (bad := next((i for i, t in enumerate(targets) if t and not 0 <= min(t) <= max(t) < cfg.tgt_vocab_size),
                        None)) is not None:  # (an IndexError from the embedding named nothing)
            raise ItemError("targets", bad, f"an id outside the target vocabulary (0 to {cfg.tgt_vocab_size - 1})")
        with torch.inference_mode():
            if enc is None or ("encoder-self" in kinds and enc.self_attn is None):
                enc = model.encode(src, need_weights="encoder-self" in kinds, head_mask=self._head_mask)
            if rows != list(range(src.shape[0])):
                index = torch.tensor(rows, device=src.device)
                enc = EncoderOutput(enc.states.index_select(0, index), enc.mask.index_select(0, index),
                                    tuple(w.index_select(0, index) for w in enc.self_attn) if enc.self_attn else None)
            tgt = pad_batch([[cfg.bos_id, *t] for t in targets], cfg.pad_id, src.device)  # (R, T)
            out = model.decode_states(tgt, enc, need_weights=True, head_mask=self._head_mask)
        S, T = enc.mask.sum(dim=1).tolist(), [len(t) + 1 for t in targets]

        def unpadded(weights, rows_of: list[int], cols_of: list[int]) -> list[np.ndarray]:
            stacked = stack_layers(weights).float().cpu().numpy()  # (R, L, H, rows, cols)
            return [stacked[r, :, :, :rows_of[r], :cols_of[r]].copy() for r in range(len(targets))]
        return ForcedAttention(unpadded(out.cross_attn, T, S),
                               unpadded(out.self_attn, T, T) if "decoder-self" in kinds else None,
                               unpadded(enc.self_attn, S, S) if "encoder-self" in kinds else None)

    def _translate_batch(self, model: Transformer, ids: list[list[int]], cfg: DecodeConfig, options: Options,
                         prefix: list[list[int]] | None,
                         generator: torch.Generator | None = None) -> Steps[list[Translation]]:
        pad = self.model.cfg.pad_id
        src = pad_batch(ids, pad, self.device)  # (B, S)
        forced = pad_batch([p or [pad] for p in prefix], pad, self.device) if prefix is not None else None  # (B, P)
        in_search = options.cross and options.source == "search"
        rescore = (options.cross and not in_search) or options.self_
        with torch.inference_mode():
            enc = encode_in_parts(model, src, self._head_mask) if rescore else None  # the search and rescoring share it
        nbest = yield from search_steps(model, src, cfg, forced, need_attention=in_search, enc=enc,
                                        head_mask=self._head_mask, track=options.tracked, generator=generator,
                                        vocab=self._vocab(src, forced) if cfg.shortlist else None)
        flat = [h for hyps in nbest for h in hyps]
        rows = [b for b, hyps in enumerate(nbest) for _ in hyps]
        cross, selfw = [None] * len(flat), [None] * len(flat)
        if rescore:
            forced = self.forced_attention(src, [h.tokens for h in flat], rows,
                                           ("cross", "decoder-self") if options.self_ else ("cross",), enc)
            cross = forced.cross if options.cross and not in_search else cross
            if options.cross and not in_search and options.tracked is not None:
                layer = options.tracked.layer  # (H, T, S) -> (T, H, S) -> (T, 1, 1, S) -> (1, 1, T, S)
                cross = [options.tracked.mean(torch.from_numpy(c[layer]).movedim(0, -2)).movedim(0, -2).numpy().copy()
                         for c in cross]  # a copy: one head's mean is a view, which would keep the whole pass
            selfw = forced.decoder_self if options.self_ else selfw
        if in_search:
            src_len = src.ne(pad).sum(dim=1).tolist()
            cross = [h.cross_attention[..., : src_len[r]].numpy() for h, r in zip(flat, rows)]
        out, r = [], 0
        many = cfg.returned > 1
        for source, hyps in zip(ids, nbest):
            src_tokens = self.tokenizers.src.pieces(source)
            options_ = [self._translation(h, src_tokens, cross[r + i], selfw[r + i]) for i, h in enumerate(hyps)]
            r += len(hyps)
            out.append(replace(options_[0], alternatives=options_ if many else []))
        return out

    def _vocab(self, src: Tensor, forced: Tensor | None) -> Vocab:
        """The target ids the shortlist allows each sentence of this batch, with EOS and its forced prefix's."""
        if self.shortlist is None:
            raise ParameterError("shortlist", "this model has no shortlist; build one with `xattn shortlist "
                                 "MODEL_DIR`")
        cfg = self.model.cfg
        return self.shortlist.candidates(src, [cfg.eos_id], forced, cfg.pad_id)

    def _translation(self, hyp: Hypothesis, src_tokens: list[str], cross: np.ndarray | None,
                     selfw: np.ndarray | None) -> Translation:
        tgt = self.tokenizers.tgt
        return Translation(tgt.decode(hyp.tokens), hyp.score, list(src_tokens),
                           tgt.pieces(hyp.tokens + [self.model.cfg.eos_id]), cross, selfw, hyp.relaxed)


class TranslationStream:
    """Texts in, Translations out as each one ends: greedy search with sentences joining between steps
    (decoding/stream.py), for a server that keeps its batch full (xattn/serve/engine.py). `Translator.stream`."""

    def __init__(self, translator: Translator, cfg: DecodeConfig):
        if not isinstance(cfg, DecodeConfig):
            raise ParameterError("cfg", f"a DecodeConfig, got {type(cfg).__name__}")
        if problem := stream_problem(cfg, translator.model):
            raise ParameterError("cfg", problem)
        self.translator, self.cfg = translator, cfg
        self.stream = Stream(translator.inference.current(), cfg, translator._head_mask)
        self.sources: dict = {}  # tag -> source ids

    def __len__(self) -> int:
        return len(self.stream)

    def add(self, texts: list[str], tags: list) -> None:
        """Let `texts` join the stream, each under its tag in `tags` (one each, none of them in the stream already:
        step() gives each translation with its tag)."""
        texts = text_list("texts", texts, "a list of sentences, got one string; pass [text]")
        if not isinstance(tags, (list, tuple)):
            raise ParameterError("tags", f"a list of tags, one per text, got {type(tags).__name__}")
        if (bad := next((i for i, tag in enumerate(tags) if not isinstance(tag, Hashable)), None)) is not None:
            raise ItemError("tags", bad, f"a tag must be hashable (a str, a number, a tuple), got "
                            f"{type(tags[bad]).__name__}")
        if len(tags) != len(texts):
            raise ParameterError("tags", f"{len(tags)} tags for {len(texts)} texts; give one per text")
        if len(set(tags)) != len(tags) or not self.sources.keys().isdisjoint(tags):
            raise ParameterError("tags", "a tag given twice, or one of a sentence still in the stream; give each "
                                 "sentence a tag of its own")
        if not texts:
            return
        t = self.translator
        ids = t._source_ids(texts, self.cfg)  # (each text named: texts[i])
        self.stream.add(pad_batch(ids, t.model.cfg.pad_id, t.device), tags)
        self.sources.update(zip(tags, ids))

    def step(self) -> list[tuple[object, Translation]]:
        """One decoder pass; the translations that ended, as (tag, Translation)."""
        src = self.translator.tokenizers.src
        return [(tag, self.translator._translation(hyp, src.pieces(self.sources.pop(tag)), None, None))
                for tag, hyp in self.stream.step()]

    def cancel(self, tag) -> bool:
        self.sources.pop(tag, None)
        return self.stream.cancel(tag)


def load(path: str | Path, device: str | torch.device | None = None, quantize: str | None = None,
         compile: bool = False, workers: int = 1) -> Translator:
    """A Translator for the model directory at `path` (exported as `xattn.load`): Translator.from_dir."""
    return Translator.from_dir(path, device, quantize, compile, workers)
