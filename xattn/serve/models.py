"""The models of `xattn serve`: each model directory is one language pair, loaded once in the background with its
own batcher (and engine thread); `Models.route` picks the model for a request by its source and target.

The pairs come from each directory's config.yaml, read at startup: two models with one pair are an error then,
and /languages answers before any model has loaded. A request whose source is `auto` goes to the only model that
could take it; when several could, `Models.source_of` asks which language the texts are in (language detection,
when the server has it; without it the request must name its source).
"""
from __future__ import annotations

import asyncio
import dataclasses
import gc
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from xattn.checkpoint import CONFIG, check_model_dir
from xattn.config import load_config
from xattn.decoding import Steps
from xattn.decoding.step import positions_problem
from xattn.errors import XattnError
from xattn.serve import detect as identifier
from xattn.serve.api import detected_source, with_alternatives
from xattn.serve.batcher import Batcher
from xattn.serve.limits import ApiError, Limits
from xattn.serve.metrics import BatchMetrics, Metrics

LANGUAGE_NAMES = {"en": "English", "de": "German", "fr": "French", "cs": "Czech", "es": "Spanish", "it": "Italian",
                  "pt": "Portuguese", "nl": "Dutch", "ro": "Romanian", "ru": "Russian", "zh": "Chinese",
                  "ja": "Japanese", "digits": "Digits"}

Detect = Callable[[list[str], list[str]], list[tuple[str, float]]]
"""Language detection: texts and the candidate languages -> (language, confidence in percent) per text."""


class Model:
    """The translator and what the routes need of it, once loaded."""

    def __init__(self, model_dir: str, device: str, limits: Limits, metrics: BatchMetrics | None = None):
        from xattn.analysis.choice import settings_for
        from xattn.translator import Translator

        self.translator = Translator.from_dir(model_dir, device=device)
        cfg = self.translator.model.cfg
        self.name, self.data = directory_name(model_dir), self.translator.config.data
        self.languages = (self.data.src_lang, self.data.tgt_lang)
        self.maps = sum(cfg.heads_per_layer("cross"))
        self.alignment = settings_for(model_dir, cfg) if self.maps else None  # None: every cross head pruned
        self.max_positions = cfg.learned_positions
        self.batcher = Batcher(self.translate, limits.max_batch, limits.batch_wait_ms / 1000, limits.queue_size, self,
                               metrics, limits.long_work, limits.long_after_s, limits.backlog_s)

    def streamable(self, settings) -> bool:
        """Whether requests with `settings` join the continuous batch (plain greedy, no attention or alternatives)."""
        from xattn.decoding.stream import streamable

        return not settings.attention and settings.wider is None and streamable(settings.decode, self.translator.model)

    def open_stream(self, settings):
        return self.translator.stream(settings.decode)

    def translate(self, texts, settings) -> Steps[list]:
        first = yield from self.translator.translate_steps(texts, settings.decode, return_attention=settings.attention,
                                                           attention_from="rescore" if settings.attention else "search")
        if settings.wider is None:
            return first
        wider = yield from self.translator.translate_steps(texts, settings.wider)
        return with_alternatives(first, wider, settings.wider.hypotheses - 1)  # (a wider beam keeps n_best = beam)

    def token_counts(self, texts: list[str]) -> list[int]:
        return [len(ids) for ids in self.translator.tokenizers.src.encode_batch(texts)]

    def links(self, translations: list, texts: list[str]) -> list:
        """The word links of each translation of `texts` (its words encoded in one call)."""
        from xattn.analysis.alignment import attention_links
        from xattn.analysis.maps import PairAttention

        pairs = PairAttention.from_translations(translations, texts, self.translator.tokenizers.src)
        return [attention_links(pair, self.alignment) for pair in pairs]

    def details(self) -> dict:
        """What /info says of the loaded model besides its languages."""
        cfg = self.translator.model.cfg
        return {"layers": cfg.n_decoder_layers, "heads": cfg.heads_per_layer("cross"),
                "alignment": self.alignment and {"layer": self.alignment.choice.layer, "method": self.alignment.method},
                "decode": dataclasses.asdict(self.translator.decode_config)}


@dataclass
class Served:
    """One model directory of the server: its language pair, and once loaded its Model, or why it failed to load."""
    path: str
    source: str
    target: str
    model: Model | None = None
    error: str | None = None

    @property
    def pair(self) -> str:
        """The model's name in metrics and the access log (unique on a server; directory names need not be)."""
        return f"{self.source}-{self.target}"

    @property
    def status(self) -> str:
        return "ready" if self.model is not None else "failed" if self.error is not None else "loading"

    def problem(self) -> str:
        """Why it cannot translate yet."""
        what = f"failed to load: {self.error}" if self.error is not None else "is loading"
        return f"the {self.source}→{self.target} model {what}"

    def ready(self) -> Model:
        if self.model is None:
            raise ApiError(503, self.problem(), "unavailable", {"Retry-After": "1"})
        return self.model

    def describe(self) -> dict:
        """The model in /health (and /info, with Model.details): directory name, languages, status."""
        return {"model": directory_name(self.path), "source": self.source, "target": self.target, "status": self.status}


@dataclass(frozen=True)
class Route:
    """Where a request goes: the model, and when its source was `auto`, the language of each text with its
    confidence (LibreTranslate's detectedLanguage)."""
    served: Served
    detected: list[tuple[str, float]] | None


class Models:
    """The models of a server, at most one per language pair, in the order given."""

    def __init__(self, served: list[Served], detect: Detect | None = None):
        """`detect`: which language each text is in among candidates (default: the identifier, detect.py)."""
        pairs: dict[tuple[str, str], Served] = {}
        for one in served:
            if (twin := pairs.setdefault((one.source, one.target), one)) is not one:
                raise XattnError(f"{twin.path} and {one.path}: both translate {one.source}→{one.target}; serve one "
                                 "model per language pair (requests are routed by source and target)")
        self.served, self.detect = served, detect or identified
        self.codes = list(dict.fromkeys(code for one in served for code in (one.source, one.target)))  # in order

    @classmethod
    def read(cls, model_dirs: list[str], detect: Detect | None = None, limits: Limits | None = None) -> Models:
        """The models of `model_dirs`, their pairs read from each config.yaml (nothing loaded yet). A model whose own
        decode settings are over `limits`, or whose min_len its positions cannot hold, is an XattnError naming the
        setting: every request that left it to the model would be refused for it."""
        served = []
        for path in model_dirs:
            config = check_model_dir(path) / CONFIG
            run = load_config(config)
            if over := limits.over(run.decode) if limits is not None else []:
                name, value, limit = over[0]
                field = Limits.SEARCH_LIMITS[name]
                raise XattnError(f"{config}: decode.{name}: {value} is above the server's limit of {limit} ({field}, "
                                 f"--{field.replace('_', '-')}); raise the limit, or lower the model's setting")
            if problem := positions_problem(run.decode, run.model.learned_positions):
                raise XattnError(f"{config}: decode.{problem.name}: {problem.problem}")
            served.append(Served(str(path), run.data.src_lang, run.data.tgt_lang))
        return cls(served, detect)

    @property
    def failed(self) -> Served | None:
        return next((one for one in self.served if one.error is not None), None)

    def route(self, source: str, target: str | None, texts: list[str], names: list[str] | None = None) -> Route:
        """The model for `texts` from `source` (or `auto`) to `target` (None: the one target `source` has here);
        a pair no model serves, or a choice the request leaves open, is a 400 naming the field. `names`: how an
        error names each text (default q[0], q[1], ...)."""
        source, target = self.code(source), None if target is None else self.code(target)
        detected = None
        if source == "auto":
            options = [one for one in self.served if target in (None, one.target)]
            if not options:
                raise ApiError(400, f"target: {language(target)} is not supported; this server translates "
                               f"{self.pairs()}", "unsupported_language")
            sources = sorted({one.source for one in options})
            if len(sources) == 1:  # refused when clearly in another language (detect.as_source)
                source, detected = sources[0], detected_source(texts, sources[0], names)
            else:
                source, detected = self.source_of(texts, sources, names)
        return Route(self.pick(source, target), detected)

    def source_of(self, texts: list[str], candidates: list[str],
                  names: list[str] | None = None) -> tuple[str, list[tuple[str, float]]]:
        """Which of `candidates` (two or more source languages) `texts` are in, and each text's detected language:
        the one place where routing asks the language detection to choose. One request goes to one model, so its
        texts must all be found in one language; and as for a lone model, a text found nearest a candidate but
        clearly in another language (detect.as_source, the language identifier) is refused. Texts of at least
        detect.MIN_LETTERS letters choose, when there are any (the identifier is often unsure of a short text: `un`
        is en as much as fr), and the others go with them; when all are short, they choose together, as one text.
        Each text's confidence is the identifier's own probability of the language chosen, whichever other models
        are served (as a lone model's detectedLanguage)."""
        long = [text for text in texts if sum(ch.isalpha() for ch in text) >= identifier.MIN_LETTERS]
        found = sorted({lang for lang, _ in self.detect(long or ["\n".join(texts)], candidates)})
        if found == [identifier.UNDETERMINED]:
            raise ApiError(400, "source: no text has letters to tell its language by; give source",
                           "language_required")
        if len(found) > 1:
            raise ApiError(400, f"source: the texts were detected as {', '.join(found)}; one request is translated "
                           "by one model, so send each language apart, or give source", "language_required")
        if found[0] not in candidates:
            what = "the text was" if len(texts) == 1 else "the texts were"
            raise ApiError(400, f"source: {what} detected as {language(found[0])}, which no model here translates "
                           f"({self.pairs()}); give source", "unsupported_language")
        guesses = identifier.as_source(texts, found[0])
        for i, guess in enumerate(guesses):
            if guess.language != found[0]:
                raise ApiError(400, f"source: {names[i] if names else f'q[{i}]'} was detected as "
                               f"{language(guess.language)}, not as a source language this request could go to "
                               f"({', '.join(candidates)}); give source", "unsupported_language")
        return found[0], [(found[0], round(100 * guess.confidence, 2)) for guess in guesses]

    def code(self, given: str) -> str:
        """`given` as this server names a language: in lower case (`DE`, `Auto`), and LibreTranslate's names of
        variants (`zh-Hans`, as its /languages lists them since 1.6) as the codes of its models (`zh`); as given
        when neither is a language served, for the error to name it as the client wrote it."""
        lower = given.lower()
        return next((code for code in (lower, VARIANTS.get(lower)) if code == "auto" or code in self.codes), given)

    def pick(self, source: str, target: str | None) -> Served:
        """The model from `source` to `target` (None: the only target `source` has here)."""
        options = [one for one in self.served if one.source == source]
        if not options:
            raise ApiError(400, f"source: {language(source)} is not supported; this server translates "
                           f"{self.pairs()} (or give source auto)", "unsupported_language")
        if target is None:
            if len(options) > 1:
                raise ApiError(400, f"target: {language(source)} translates to {', '.join(o.target for o in options)}"
                               " on this server; give target", "language_required")
            return options[0]
        match = next((one for one in options if one.target == target), None)
        if match is None:
            raise ApiError(400, f"target: {language(target)} is not available as a target language from "
                           f"{language(source)}; this server translates {self.pairs()}", "unsupported_language")
        return match

    def pairs(self) -> str:
        return ", ".join(f"{one.source}→{one.target}" for one in self.served)

    def languages(self) -> list[dict]:
        """LibreTranslate's /languages: every language that is a source or a target here, once, with its targets."""
        return [{"code": code, "name": LANGUAGE_NAMES.get(code, code),
                 "targets": sorted(one.target for one in self.served if one.source == code)} for code in self.codes]

    async def load(self, device: str, limits: Limits, metrics: Metrics,
                   on_error: Callable[[str], None] | None = None) -> None:
        """Load each model in turn off the event loop; each serves as soon as it has loaded. A model that fails
        keeps its reason (`error`), and `on_error(message)` is called."""
        for one in self.served:
            try:
                model = await asyncio.to_thread(Model, one.path, device, limits, metrics.model(one.pair))
            except Exception as e:  # noqa: BLE001 - answered by /health, and reported by `xattn serve`
                one.error = " ".join(str(e).split()) or type(e).__name__
                if on_error is not None:
                    on_error(f"{one.path}: the model failed to load: {one.error}")
                continue
            model.batcher.start()
            one.model = model
            gc.freeze()  # the models are no garbage: a full collection need not walk them (benchmarks/README.md)

    async def stop(self) -> None:
        for one in self.served:
            if one.model is not None:
                await one.model.batcher.stop()
        gc.unfreeze()


def identified(texts: list[str], candidates: list[str]) -> list[tuple[str, float]]:
    """Detect with the identifier of detect.py: each text's most likely language among `candidates`, with its
    confidence in percent."""
    return [(g.language, round(100 * g.confidence, 2)) for g in identifier.identify(texts, candidates)]


def directory_name(path: str) -> str:
    """A model directory's name as the server shows it: its last part, `.` and `..` read as the directories they
    stand for (`xattn serve .` was named "")."""
    return Path(os.path.abspath(path)).name


VARIANTS = {"zh-hans": "zh", "zh-hant": "zt", "pt-br": "pb"}
"""LibreTranslate's names of language variants, read as the codes of its models (as its iso2model reads them)."""


def language(code: str) -> str:
    """A language as an error names it: German (de); or the code alone, when this server has no name for it."""
    return f"{LANGUAGE_NAMES[code]} ({code})" if code in LANGUAGE_NAMES else repr(code)
