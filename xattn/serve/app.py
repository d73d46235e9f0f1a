"""The FastAPI app of `xattn serve`: POST /translate (LibreTranslate-compatible, plus xattn's settings and the
cross-attention), GET /languages, /health, /info, /openapi.json, and the page at / (static/, no network).

The model loads in the background: /health answers 503 until it is ready, so do the other model routes.
Every error is a JSON body {"error", "error_type"} with its status (api.ApiError); a client mistake is never
a 500 and never an error with status 200.
"""
from __future__ import annotations

import asyncio
import dataclasses
import hmac
import logging
import json
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Callable
from urllib.parse import parse_qsl

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import FileResponse, JSONResponse, Response
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect

from xattn.errors import ParameterError, XattnError
from xattn.io import json_text
from xattn.serve.api import TranslateRequest, parse_request, plan, response, with_alternatives
from xattn.serve.limits import ApiError, Limits
from xattn.serve.batcher import Batcher, QueueFull
from xattn.serve.metrics import Metrics, Observed

STATIC = Path(__file__).parent / "static"
LOG = logging.getLogger("xattn.serve")
PAGE_FILES = {"app.js": "text/javascript", "app.css": "text/css", "heatmap.js": "text/javascript",
              "heatmap.css": "text/css", "favicon.svg": "image/svg+xml"}
CSP = "default-src 'self'; style-src 'self'; script-src 'self'; img-src 'self' data:; connect-src 'self'"
LANGUAGE_NAMES = {"en": "English", "de": "German", "fr": "French", "cs": "Czech", "es": "Spanish", "it": "Italian",
                  "pt": "Portuguese", "nl": "Dutch", "ro": "Romanian", "ru": "Russian", "zh": "Chinese",
                  "ja": "Japanese", "digits": "Digits"}


class Model:
    """The translator and what the routes need of it, once loaded."""

    def __init__(self, model_dir: str, device: str, limits: Limits, metrics: Metrics | None = None):
        from xattn.analysis.choice import settings_for
        from xattn.translator import Translator

        self.translator = Translator.from_dir(model_dir, device=device)
        cfg = self.translator.model.cfg
        self.name, self.data = Path(model_dir).name, self.translator.config.data
        self.languages = (self.data.src_lang, self.data.tgt_lang)
        self.maps = sum(cfg.heads_per_layer("cross"))
        self.alignment = settings_for(model_dir, cfg) if self.maps else None  # None: every cross head pruned
        self.max_positions = cfg.max_positions if cfg.positions == "learned" else None
        self.batcher = Batcher(self.translate, limits.max_batch, limits.batch_wait_ms / 1000, limits.queue_size, self,
                               metrics or Metrics())

    def streamable(self, settings) -> bool:
        """Whether requests with `settings` join the continuous batch (plain greedy, no attention or alternatives)."""
        from xattn.decoding.stream import streamable

        return not settings.attention and settings.wider is None and streamable(settings.decode, self.translator.model)

    def open_stream(self, settings):
        return self.translator.stream(settings.decode)

    def translate(self, texts, settings):
        first = self.translator.translate(texts, settings.decode, return_attention=settings.attention,
                                          attention_from="rescore")
        if settings.wider is None:
            return first
        wider = self.translator.translate(texts, settings.wider)
        return with_alternatives(first, wider, settings.wider.n_best - 1)

    def token_counts(self, texts: list[str]) -> list[int]:
        return [len(ids) for ids in self.translator.tokenizers.src.encode_batch(texts)]

    def links(self, translation, text: str):
        from xattn.analysis.alignment import attention_links
        from xattn.analysis.maps import PairAttention

        pair = PairAttention.from_translation(translation, text, None, self.translator.tokenizers.src)
        return attention_links(pair, self.alignment)


def create_app(model_dir: str, limits: Limits = Limits(), api_key: str | None = None, cors_origin: str | None = None,
               device: str = "cpu", on_load_error: Callable[[str], None] | None = None) -> FastAPI:
    """The app; it loads the model in the background once started (app.state.xattn: {"model", "error"}). When
    loading fails, /health says why with 503, and `on_load_error(reason)` is called (xattn serve stops then)."""
    state: dict = {"model": None, "error": None, "metrics": None}

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        async def load() -> None:
            try:
                model = await asyncio.to_thread(Model, model_dir, device, limits, state["metrics"])
            except Exception as e:  # noqa: BLE001 - answered by /health, and reported by `xattn serve`
                state["error"] = " ".join(str(e).split()) or type(e).__name__
                if on_load_error is not None:
                    on_load_error(state["error"])
                return
            model.batcher.start()
            state["model"] = model
        loader = asyncio.get_running_loop().create_task(load())
        yield
        loader.cancel()
        if state["model"] is not None:
            await state["model"].batcher.stop()

    app = FastAPI(title="xattn", description="Translation with the cross-attention to see. LibreTranslate-compatible "
                  "POST /translate.", docs_url=None, redoc_url=None, lifespan=lifespan)
    app.state.xattn = state
    metrics = state["metrics"] = Metrics()
    app.add_middleware(Observed, metrics=metrics)
    if cors_origin:
        app.add_middleware(CORSMiddleware, allow_origins=[cors_origin], allow_methods=["GET", "POST"],
                           allow_headers=["Authorization", "Content-Type"])

    def ready() -> Model:
        if state["model"] is None:
            message = f"the model failed to load: {state['error']}" if state["error"] else "the model is loading"
            raise ApiError(503, message, "unavailable", {"Retry-After": "1"})
        return state["model"]

    add_error_handlers(app)
    add_page(app)
    add_model_routes(app, ready, limits, api_key)
    return app


def add_error_handlers(app: FastAPI) -> None:
    """Every error as {"error", "error_type"} with its status."""
    @app.exception_handler(ApiError)
    async def api_error(request: Request, e: ApiError):
        return JSONResponse(e.body(), e.status, headers=e.headers)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, e: HTTPException):
        names = {404: "not_found", 405: "method_not_allowed"}
        return JSONResponse({"error": str(e.detail), "error_type": names.get(e.status_code, "http_error")},
                            e.status_code, headers=getattr(e, "headers", None))

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, e: RequestValidationError):
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        return JSONResponse({"error": f"{where}: {first['msg']}", "error_type": "invalid_request"}, 422)

    @app.exception_handler(Exception)
    async def internal_error(request: Request, e: Exception):  # a bug of the server, never a client's mistake
        return JSONResponse({"error": f"internal error ({type(e).__name__})", "error_type": "internal"}, 500)


def add_page(app: FastAPI) -> None:
    @app.get("/", include_in_schema=False)
    async def page():
        return FileResponse(STATIC / "index.html", media_type="text/html", headers={"Content-Security-Policy": CSP})

    @app.get("/static/{name}", include_in_schema=False)
    async def static(name: str):
        if name not in PAGE_FILES:
            raise ApiError(404, f"/static/{name}: no such file", "not_found")
        return FileResponse(STATIC / name, media_type=PAGE_FILES[name], headers={"Content-Security-Policy": CSP})


def add_model_routes(app: FastAPI, ready, limits: Limits, api_key: str | None) -> None:
    @app.get("/health")
    async def health():
        ready()
        return {"status": "ok"}

    @app.get("/metrics", include_in_schema=False)
    async def metrics():
        model = app.state.xattn["model"]
        return Response(app.state.xattn["metrics"].exposition(model.batcher.depth if model else 0),
                        media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/languages")
    async def languages():
        src, tgt = ready().languages
        return [{"code": src, "name": LANGUAGE_NAMES.get(src, src), "targets": [tgt]},
                {"code": tgt, "name": LANGUAGE_NAMES.get(tgt, tgt), "targets": []}]

    @app.get("/info")
    async def info():
        model = ready()
        cfg = model.translator.model.cfg
        return {"model": model.name, "source": model.languages[0], "target": model.languages[1],
                "layers": cfg.n_decoder_layers, "heads": cfg.heads_per_layer("cross"),
                "alignment": model.alignment and {"layer": model.alignment.choice.layer,
                                                  "method": model.alignment.method},
                "decode": dataclasses.asdict(model.translator.decode_config), "limits": dataclasses.asdict(limits),
                "api_key_required": api_key is not None}

    schema = TranslateRequest.model_json_schema()

    @app.post("/translate", openapi_extra={"requestBody": {"required": True, "content": {
        "application/json": {"schema": schema}, "application/x-www-form-urlencoded": {"schema": schema}}}})
    async def translate(request: Request):
        model = ready()
        req = parse_request(*await read_request(request, limits))
        check_key(api_key, req.api_key, request.headers.get("authorization", ""))
        try:
            texts, settings = plan(req, model.translator.decode_config, limits, model.languages, model.token_counts,
                                   model.maps, model.max_positions)
        except XattnError as e:  # text the tokenizer cannot take (a lone surrogate)
            raise ApiError(422, f"q: {e}", "invalid_request") from None
        record = request.scope.setdefault("xattn", {})
        record.update(texts=len(texts), characters=sum(map(len, texts)),
                      batch="stream" if model.streamable(settings) else "call")
        try:
            done = await asyncio.wait_for(model.batcher.submit(texts, settings, not settings.decode.sampling),
                                          limits.timeout_s)
        except QueueFull:
            raise ApiError(429, f"the server is busy ({limits.queue_size} requests waiting); retry later",
                           "busy", {"Retry-After": "1"}) from None
        except asyncio.TimeoutError:
            raise ApiError(504, f"no translation within {limits.timeout_s:g} s", "timeout") from None
        except ParameterError as e:  # a decoding setting this model cannot honour (shortlist: it has none)
            raise ApiError(422, str(e), "invalid_request") from None
        except XattnError as e:  # what the model cannot take (checked before where it can be)
            raise ApiError(422, f"q: {e}", "invalid_request") from None
        record["output_tokens"] = sum(len(t.tgt_tokens) - 1 for t in done)  # without </s>
        try:  # alignment and attention take time: off the event loop; a plain answer is quicker built here
            heavy = req.alignment or req.attention != "none"
            args = (req, texts, done, model.links, model.languages[0])
            body = await asyncio.to_thread(response, *args) if heavy else response(*args)
        except XattnError as e:  # words the alignment cannot place
            raise ApiError(422, f"q: {e}", "invalid_request") from None
        return Response(json_text(body, ensure_ascii=False, separators=(",", ":")),  # plain JSON types already
                        media_type="application/json")


def check_key(expected: str | None, in_body: str | None, authorization: str) -> None:
    """With a key set, the body's api_key or an `Authorization: Bearer KEY` header must give it."""
    if expected is None:
        return
    scheme, _, token = authorization.partition(" ")
    given = in_body or (token.strip() if scheme.lower() == "bearer" else "") or None
    if given is None:
        raise ApiError(403, "an API key is required (api_key, or an Authorization: Bearer header)", "unauthorized")
    if not hmac.compare_digest(given.encode(), expected.encode()):
        raise ApiError(403, "invalid API key", "unauthorized")


async def read_request(request: Request, limits: Limits) -> tuple[dict, bool]:
    """The request's fields, and whether they came as text (a form or the query string): the body's, and the
    query string's, as LibreTranslate reads both (deep-translator sends every field in the query string of a
    POST with no body; other clients put `api_key` there). A field in both is an error: one would silently win.
    A client that hangs up mid-body gets one short log line, not a traceback."""
    try:
        body, form = await read_body(request, limits)
    except ClientDisconnect:
        LOG.info("%s %s: the client went away before its body arrived", request.method, request.url.path)
        raise ApiError(400, "the client went away before its body arrived", "client_gone") from None
    query = form_fields(query_fields(request.scope.get("query_string") or b"", "query string"))
    if not query:
        return body, form
    if body is None:
        return query, True
    if isinstance(body, dict) and (both := sorted(set(body) & set(query))):
        raise ApiError(422, f"{both[0]}: given in both the query string and the body (only one would count)",
                       "invalid_request")
    return ({**query, **body} if isinstance(body, dict) else body), form


async def read_body(request: Request, limits: Limits) -> tuple[dict, bool]:
    """The body as a dict (JSON, or a form whose repeated `q` is a list), read at most up to a size cap, and
    whether it was a form."""
    cap = 8 * limits.max_chars + 65536  # UTF-8 and JSON escapes of max_chars characters, and the other fields
    if int(request.headers.get("content-length") or 0) > cap:
        raise ApiError(413, f"the body is over {cap} bytes", "too_large")
    kind = request.headers.get("content-type", "application/json").split(";")[0].strip().lower()
    if kind == "multipart/form-data":  # fields only, each within the cap
        try:
            form = await request.form(max_files=0, max_fields=64, max_part_size=cap)
        except HTTPException as e:
            raise ApiError(413 if "size" in str(e.detail).lower() else 422, f"body: {e.detail}", "invalid_request") \
                from None
        return form_fields({k: form.getlist(k) for k in form.keys()}), True
    raw = bytearray()
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > cap:
            raise ApiError(413, f"the body is over {cap} bytes", "too_large")
    if kind == "application/x-www-form-urlencoded":
        return form_fields(query_fields(raw, "body")), True
    try:
        return json.loads(bytes(raw) or b"null", object_pairs_hook=unique_keys, parse_constant=not_json), False
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ApiError(422, f"body: not valid JSON ({e})", "invalid_request") from None
    except RecursionError:
        raise ApiError(422, "body: nested too deeply; a request is one object of fields", "invalid_request") from None
    except TwiceError as e:
        raise ApiError(422, f"{e}: given twice in the body (only one would count)", "invalid_request") from None
    except ValueError as e:
        raise ApiError(422, f"body: {e}", "invalid_request") from None


class TwiceError(ValueError):
    """A JSON object with a key given twice (the key)."""


def unique_keys(pairs: list[tuple[str, object]]) -> dict:
    out = {}
    for key, value in pairs:
        if key in out:
            raise TwiceError(key)
        out[key] = value
    return out


def not_json(name: str):
    raise ValueError(f"{name} is not JSON (numbers must be finite)")


def query_fields(raw: bytes, where: str) -> dict[str, list[str]]:
    """The fields of a query string or form body, each value strictly UTF-8 once percent-decoded (a `%FF` is
    a 422 naming the field, not a replacement character)."""
    fields: dict[str, list[str]] = {}
    for key, value in parse_qsl(bytes(raw).decode("latin-1"), keep_blank_values=True, encoding="latin-1"):
        name = fix_utf8(key, where, "a field name")
        fields.setdefault(name, []).append(fix_utf8(value, where, name))
    return fields


def fix_utf8(text: str, where: str, field: str) -> str:
    """A percent-decoded form value (decoded as latin-1, one character per byte) read as UTF-8 strictly."""
    try:
        return text.encode("latin-1").decode("utf-8")
    except UnicodeDecodeError:
        raise ApiError(422, f"{field}: not UTF-8 once percent-decoded ({where})", "invalid_request") from None


def form_fields(fields: dict[str, list]) -> dict:
    """A form's fields, each given once; `q` may repeat (a list of texts, as LibreTranslate takes it)."""
    if twice := next((k for k, v in fields.items() if k != "q" and len(v) > 1), None):
        raise ApiError(422, f"{twice}: given {len(fields[twice])} times in the form", "invalid_request")
    return {k: (v if k == "q" and len(v) > 1 else v[0]) for k, v in fields.items()}
