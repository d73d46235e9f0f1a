"""What `POST /translate`, `/detect` and `/translate_file` accept and answer: the requests (LibreTranslate's fields
plus xattn's decoding settings), the limits, the errors (a JSON body {"error", "error_type"} with the right status)
and the responses.
"""
from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass
from typing import Collection, Literal, Sequence, get_args, get_origin

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model, field_validator

from xattn.analysis.maps import head_mean
from xattn.checks import hints
from xattn.config import DecodeConfig
from xattn.errors import XattnError
from xattn.serve import detect
from xattn.serve.detect import Guess
from xattn.serve.limits import ApiError, Limits, shown
from xattn.serve.work import check_work
from xattn.serve.sentences import Joined, Split
from xattn.translation import distinct


DECODE_FIELDS = tuple(f.name for f in dataclasses.fields(DecodeConfig) if f.name != "max_tokens")
"""The decoding settings a request may give (all of DecodeConfig but the server's batch budget)."""
DETECT_TOP = 5
"""/detect answers the best language and the next ones of at least DETECT_FLOOR, at most DETECT_TOP in all."""
DETECT_FLOOR = 0.01


class KeyFields(BaseModel):
    """What every route that translates or detects takes besides its own fields."""
    model_config = ConfigDict(extra="forbid")

    api_key: str | None = Field(None, description="the API key, when the server has one (or a Bearer header)")
    secret: str | None = Field(None, description="LibreTranslate's page secret: accepted and not used")


class DetectRequest(KeyFields):
    """The body of POST /detect (JSON or form-encoded)."""
    q: str | list[str] = Field(description="the text, or a list of texts (detected together, as LibreTranslate does)")


class FileRequest(KeyFields):
    """The fields of POST /translate_file besides `file` (a multipart form)."""
    source: str = Field("auto", description="the source language, or auto (the one model that can take the texts)")
    target: str | None = Field(None, description="the target language (default: the only one the source has here)")


class RequestFields(FileRequest):
    """LibreTranslate's fields and xattn's own; TranslateRequest adds every decoding setting (DECODE_FIELDS)."""
    q: str | list[str] = Field(description="the text, or a list of texts")
    format: str = Field("text", description="text, or html: the text of HTML translated, its markup kept and placed "
                        "by the word alignment (serve/markup.py); no alternatives, attention or alignment with it")
    alternatives: int = Field(0, ge=0, description="alternative translations per text (LibreTranslate)")
    attention: Literal["none", "mean", "full"] = Field(
        "none", description="cross-attention per result: mean (per layer, over the heads it has: L x T x S) or full "
        "(L x H x T x S); null where a pruned layer has no heads (mean) or fewer heads than H (full)")
    alignment: bool = Field(False, description="word alignment links [source word, target word], 0-based")

    @field_validator("alternatives", mode="before")
    @classmethod
    def _count_as_text(cls, value):  # LibreTranslate reads int(alternatives): "3" is 3, and so is 3.0
        if isinstance(value, float) and value.is_integer():
            return int(value)
        return from_text(value, int, "alternatives") if isinstance(value, str) else value

    @field_validator("format", mode="before")
    @classmethod
    def _empty_format(cls, value):  # LibreTranslate treats an empty format as text
        return "text" if value == "" else value


TranslateRequest = create_model(
    "TranslateRequest", __base__=RequestFields, __doc__="The body of POST /translate (JSON or form-encoded).",
    **{name: (hint | None, Field(None, description=f"decoding: DecodeConfig.{name} (default: the model's)"))
       for name, hint in hints(DecodeConfig).items() if name in DECODE_FIELDS})


def openapi_body(kind: type[BaseModel]) -> dict:
    """A route's request body for /openapi.json: JSON or a form of `kind`'s fields; FileRequest's is a
    multipart form with the file."""
    schema = kind.model_json_schema()
    if kind is not FileRequest:
        return {"requestBody": {"required": True, "content": {
            "application/json": {"schema": schema}, "application/x-www-form-urlencoded": {"schema": schema}}}}
    schema["properties"]["file"] = {"type": "string", "format": "binary", "description": "a .txt file, UTF-8"}
    schema["required"] = ["file"]
    return {"requestBody": {"required": True, "content": {"multipart/form-data": {"schema": schema}}}}


def parse_request(data: dict, text: Collection[str] = (), kind: type[BaseModel] = TranslateRequest):
    """A request of `kind` (TranslateRequest, DetectRequest, FileRequest) from its fields (reading.read_request); a
    malformed one is 422 naming the field. JSON values are read strictly (`"beam_size": "3"` or `true` is an error);
    the fields named in `text` came as text (a form, the query string) and are converted to their types first.
    A JSON null is an optional field left out, whichever it is (it was for the decoding settings, target and
    api_key, and a 422 for source, format, alternatives, attention and alignment)."""
    fields = kind.model_fields
    data = {k: from_text(v, fields[k].annotation, k) if k in text and k in fields else v for k, v in data.items()
            if not (v is None and k in fields and not fields[k].is_required())}
    try:
        return kind.model_validate(data, strict=True)
    except ValidationError as e:
        first = max(e.errors(), key=lambda error: len(error["loc"]))  # of a union (q), the branch gone furthest
        if first["loc"] == ("q", "str"):  # neither branch: "a valid string" hid that a list is taken too
            first = {**first, "msg": f"expected a text or a list of texts, got {type(data['q']).__name__}"}
        raise ApiError(422, f"{field_path(first['loc'])}: {first['msg']}", "invalid_request") from None


def field_path(loc: tuple) -> str:
    """pydantic's error location as the request names it: q[1], not q.list[str].1 (a union's branch is a type)."""
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif part == "":  # a field named "" (`{"": 5}`, `=5` in a form): named, not taken for the body
            path += '.""' if path else '""'
        elif not re.fullmatch(r"(str|int|float|bool|list\[.*\]|dict\[.*\])", part):
            part = shown(part)
            path += f".{part}" if path else part
    return path or "body"


NUMBER = {int: re.compile(r"[+-]?[0-9]{1,30}(\.0*)?"),  # 5.0 is 5, as pydantic reads it
          float: re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?")}
TRUTH = {**dict.fromkeys(("true", "t", "yes", "y", "on", "1"), True),
         **dict.fromkeys(("false", "f", "no", "n", "off", "0"), False)}


def from_text(value, hint, name: str):
    """A field given as text (`value`, a string or, for a repeated `q`, a list) as the type `hint` of its field
    asks: a number written in ASCII digits (not "1_0", "³" or "inf"), a truth value (true/false, 1/0, yes/no,
    on/off, t/f, y/n: pydantic's words); text fields as they are. Anything else is a 422 naming the field."""
    kinds = set(get_args(hint)) or {hint}
    if not isinstance(value, str) or str in kinds or get_origin(hint) is Literal:
        return value
    if bool in kinds:
        if value.strip().lower() not in TRUTH:
            raise ApiError(422, f"{name}: {value!r} is not true or false", "invalid_request")
        return TRUTH[value.strip().lower()]
    for kind in (int, float):
        if kind in kinds:
            if not NUMBER[kind].fullmatch(value.strip()):
                raise ApiError(422, f"{name}: {value!r} is not {'a whole number' if kind is int else 'a number'}",
                               "invalid_request")
            if not math.isfinite(number := float(value)):
                raise ApiError(422, f"{name}: {value!r} is too large a number", "invalid_request")
            return number if kind is float else int(value.strip().split(".")[0])
    return value


def request_texts(q: str | list[str], limits: Limits) -> list[str]:
    """The texts of a request's `q`, within the limits on items and characters."""
    texts = [q] if isinstance(q, str) else list(q)
    if not texts:
        raise ApiError(422, "q: an empty list; send at least one text", "invalid_request")
    if len(texts) > limits.max_items:
        raise ApiError(413, f"q: {len(texts)} texts, over the limit of {limits.max_items}", "too_many_items")
    chars = sum(len(t) for t in texts)
    if chars > limits.max_chars:
        raise ApiError(413, f"q: {chars} characters, over the limit of {limits.max_chars}", "too_many_characters")
    if (binary := next((i for i, t in enumerate(texts) if "\0" in t), None)) is not None:
        raise ApiError(422, f"q[{binary}]: holds a NUL character; send text, not binary data", "invalid_request")
    return texts


def percent(guess: Guess) -> dict:
    """LibreTranslate's {"language", "confidence"}, the confidence from 0 to 100."""
    return {"language": guess.language, "confidence": round(100 * guess.confidence, 2)}


def detection(texts: list[str]) -> list[dict]:
    """/detect's answer: the languages of the texts taken together, the most likely first (the best one, then
    those of at least DETECT_FLOOR, at most DETECT_TOP), over every language the identifier knows."""
    ranked = detect.ranking("\n".join(texts))
    kept = ranked[:1] + [g for g in ranked[1:DETECT_TOP] if g.confidence >= DETECT_FLOOR]
    return [percent(g) for g in kept] or [percent(Guess(detect.UNDETERMINED, 0.0))]


def detected_source(texts: Sequence[str], source: str, names: Sequence[str] | None = None) -> list[tuple[str, float]]:
    """detectedLanguage of each text of a `source: auto` request to a model that reads `source`; a text clearly
    in another language (detect.as_source) is a 400 naming `source` and that language. `names`: how the error
    names each text (default q[0], q[1], ...)."""
    guesses = detect.as_source(texts, source)
    for i, guess in enumerate(guesses):
        if guess.language != source:
            where = names[i] if names else f"q[{i}]"
            raise ApiError(400, f"source: auto, and {where} reads as {guess.language} (confidence "
                           f"{percent(guess)['confidence']:g}), not as this model's source language {source}; give "
                           f"the source language explicitly (source={source} translates it as {source} anyway)",
                           "unsupported_language")
    return [(g.language, percent(g)["confidence"]) for g in guesses]


@dataclass(frozen=True)
class Settings:
    """What a translate call needs besides the texts; equal settings may share a call."""
    decode: DecodeConfig
    attention: bool                    # carry the cross-attention (for attention or alignment)
    wider: DecodeConfig | None = None  # a search wide enough for the alternatives asked, when `decode` is not:
    #   the first translation still comes from `decode`, so asking for alternatives never changes it
    work: int = dataclasses.field(default=0, compare=False)  # the request's decoding work (check_work), not a setting
    source: int = dataclasses.field(default=0, compare=False)  # hypotheses x source tokens (check_work; backlog.py)
    least: int = dataclasses.field(default=0, compare=False)  # the rows it steps at least, by min_len (check_work)


def plan(req: TranslateRequest, base: DecodeConfig, limits: Limits, token_counts, maps: int,
         max_positions: int | None = None, language: str = "en", layers: int = 1) -> tuple[Split, Settings]:
    """The sentences (serve/sentences.py) and settings of a request for the model it was routed to
    (models.Models.route), checked against the limits. `base`: the model's decoding settings; `token_counts(texts)`:
    source tokens of each text; `maps`: attention maps per sentence (layers x heads); `max_positions`: the positions
    a model with learned positions has (None: any length); `language`: the model's source language, whose rules cut
    the texts into sentences; `layers`: its decoder layers (the maps of mean attention)."""
    if req.format != "text":
        raise ApiError(400, f"format: {req.format!r} is not supported; send text or html", "unsupported_format")
    split = Split.of(request_texts(req.q, limits), language)
    counts = token_counts(split.sentences)
    if (longest := max(counts)) > limits.max_source_tokens:
        name = split.names[counts.index(longest)]
        raise ApiError(413, f"{name}: {longest} source tokens, over the limit of {limits.max_source_tokens}",
                       "too_many_tokens")
    if max_positions is not None and longest + 1 > max_positions:
        name = split.names[counts.index(longest)]
        raise ApiError(413, f"{name}: {longest} source tokens and </s> do not fit the model's {max_positions} "
                       "positions", "too_many_tokens")
    check_alternatives(req, base, limits)
    decode, wider = decode_config(req, base)
    asked = {k for k in DECODE_FIELDS if getattr(req, k) is not None}
    check_decode(wider or decode, limits, asked)
    work, source, least = check_work(counts, wider or decode, limits, first=decode if wider is not None else None,
                                     names=split.names, asked=asked, max_positions=max_positions)
    if maps == 0 and (asked := [name for name, on in (("attention", req.attention != "none"), ("alignment", req.alignment),
                                                      ("coverage_penalty", decode.coverage_penalty > 0)) if on]):
        raise ApiError(422, f"{asked[0]}: every cross-attention head of this model was pruned; there is no "
                       "attention to read", "invalid_request")
    if req.attention != "none":  # a text's sentences' maps make one (their target positions x their source's)
        rows, columns = [0] * len(split.gaps), [0] * len(split.gaps)
        for i, n in zip(split.owner, counts):
            rows[i] += decode.max_output_tokens(n + 1) + 1 if n else 1  # target positions, </s> included
            columns[i] += n + 1
        per_map = sum(r * c for r, c in zip(rows, columns))  # (its square in the sentences: a text of many)
        values = per_map * (maps if req.attention == "full" else layers)
        if values > limits.max_attention_values:
            raise ApiError(413, f"attention: {req.attention} attention could hold up to {values:.0f} values, over "
                           f"the limit of {limits.max_attention_values}; "
                           + ("ask for mean, or " if req.attention == "full" else "send ") + "fewer or shorter texts "
                           "(a text's sentences make one map, their positions by theirs)", "too_large")
    return split, Settings(decode, req.attention != "none" or req.alignment, wider, work, source, least)


def decode_config(req: TranslateRequest, base: DecodeConfig) -> tuple[DecodeConfig, DecodeConfig | None]:
    """The model's decoding settings with the request's, and the wider search of Settings.wider when the
    `alternatives` asked for need more hypotheses than its beam holds, or more samples than it draws."""
    given = {k: getattr(req, k) for k in DECODE_FIELDS if getattr(req, k) is not None}
    asked = set(given) - {"sampling"}
    sampling, wanted, widen = given.get("sampling", base.sampling), req.alternatives + 1, {}
    if req.alternatives:
        for key in ("num_samples",) if sampling else ("n_best", "beam_size"):
            if given.get(key, wanted) < wanted:  # set by the request too low: a contradiction, not a default
                raise ApiError(422, f"{key}: {given[key]} is too few for {req.alternatives} alternatives (needs "
                               f"{wanted} or more; or leave it out)", "invalid_request")
        if sampling:  # more samples would change the draws, and so the best of them: a second call draws more
            if given.get("num_samples", base.num_samples) < wanted:
                widen = {"num_samples": wanted}
        elif given.get("beam_size", base.beam_size) >= wanted:
            given["n_best"] = max(given.get("n_best", 1), wanted)
        else:
            widen = {"beam_size": wanted, "n_best": wanted}
    try:
        decode = dataclasses.replace(base, **base.with_choices(given))
        wider = dataclasses.replace(decode, **widen) if widen else None
        (wider or decode).refuse_unused(asked)
        if wider is not None:  # the first search leaves what only the wider one uses (a greedy one, the beam's)
            decode = decode.only_used(base)
        return decode, wider
    except XattnError as e:  # a ConfigError "decode.beam_size: must be ..." (field names are the request's)
        raise ApiError(422, str(e).replace("decode.", ""), "invalid_request") from None


def with_alternatives(first: list, wider: list, count: int) -> list:
    """Each translation of `first` with, as its alternatives, itself and then the `count` best of the wider
    search's translations (`wider`, same texts) that are `distinct`: fewer when the wider search found fewer."""
    return [dataclasses.replace(f, alternatives=[f, *distinct(f, w.alternatives)[:count]])
            for f, w in zip(first, wider)]


def check_alternatives(req: TranslateRequest, base: DecodeConfig, limits: Limits) -> None:
    sampling = req.sampling if req.sampling is not None else base.sampling
    limit = limits.max_samples if sampling else min(limits.max_n_best, limits.max_beam)
    if req.alternatives + 1 > limit:
        raise ApiError(422, f"alternatives: {req.alternatives}, over the limit of {limit - 1}", "limit_exceeded")


def check_decode(cfg: DecodeConfig, limits: Limits, asked: set[str]) -> None:
    """The settings of cfg's kind of search (the beam and its n-best, or the samples) within the limits; one the
    request did not set (`asked`: the fields it set) is the model's own, which the request can lower."""
    if over := limits.over(cfg):
        name, value, limit = over[0]
        whose = "" if name in asked else " (the model's own setting; send a smaller one)"
        raise ApiError(422, f"{name}: {value}, over the limit of {limit}{whose}", "limit_exceeded")


def rounded(a: np.ndarray, digits: int = 4) -> list:
    """Nested lists of `a` rounded; NaN (a head a pruned layer lacks) becomes null."""
    values = np.round(np.asarray(a, dtype=np.float64), digits)
    missing = np.isnan(values)
    if not missing.any():
        return values.tolist()
    values = values.astype(object)
    values[missing] = None
    return values.tolist()


def result_of(joined: Joined, req: TranslateRequest) -> dict:
    """One item of `results`: score, tokens and words of both sides, attention and alignment (the word links, when
    asked)."""
    translation = joined.translation
    out = {"translatedText": translation.text, "score": round(float(translation.score), 4),
           "source_tokens": translation.src_tokens, "target_tokens": translation.tgt_tokens,
           "source_words": joined.source_words, "target_words": joined.target_words}
    if translation.relaxed:  # the decoding constraints left nothing but end of sentence: it ends early
        out["relaxed"] = True
    if req.attention != "none":
        weights = translation.cross_attention  # (L, H, T, S)
        if req.attention == "mean":
            weights = head_mean(weights)  # over the heads each layer has
        out["attention"] = rounded(weights)
    if req.alignment:
        out["alignment"] = sorted([int(i), int(j)] for i, j in joined.links)
    if translation.alternatives:
        out["alternatives"] = [{"translatedText": a.text, "score": round(float(a.score), 4)}
                               for a in distinct(translation, translation.alternatives)]
    return out


def response(req: TranslateRequest, joined: list[Joined], detected: list[tuple[str, float]] | None = None) -> dict:
    """The answer to `req`: LibreTranslate's fields and xattn's `results` (body_of)."""
    results = [result_of(j, req) for j in joined]
    alts = [[a["translatedText"] for a in r.get("alternatives", [])][: req.alternatives] for r in results] \
        if req.alternatives else None
    return body_of(isinstance(req.q, str), results, detected, alts)


def body_of(single: bool, results: list[dict], detected: list[tuple[str, float]] | None = None,
           alternatives: list[list[str]] | None = None) -> dict:
    """LibreTranslate's fields (translatedText of each of `results`, `alternatives`, detectedLanguage: `detected`,
    each text's language and confidence when the source was auto), then xattn's `results`; for `q` a string
    (`single`), each field holds the one text's rather than a list."""
    texts = [r["translatedText"] for r in results]
    body: dict = {"translatedText": texts[0] if single else texts}
    if alternatives is not None:
        body["alternatives"] = alternatives[0] if single else alternatives
    if detected is not None:
        found = [{"language": language, "confidence": confidence} for language, confidence in detected]
        body["detectedLanguage"] = found[0] if single else found
    body["results"] = results
    return body
