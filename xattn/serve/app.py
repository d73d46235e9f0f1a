"""The FastAPI app of `xattn serve`: POST /translate (LibreTranslate-compatible, plus xattn's settings and the
cross-attention), GET /languages, /health, /info, /metrics, /openapi.json, and the page at / (static/, no network).

The models (models.py: one per language pair, each request routed by its source and target) load in the
background: /health and /info answer 503 until every one is ready, /translate until its model is; /languages
answers at once.
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
from xattn.serve.api import TranslateRequest, parse_request, plan, response, texts_of
from xattn.serve.limits import ApiError, Limits
from xattn.serve.batcher import QueueFull
from xattn.serve.metrics import Metrics, Observed
from xattn.serve.models import Detect, Models

STATIC = Path(__file__).parent / "static"
LOG = logging.getLogger("xattn.serve")
PAGE_FILES = {"app.js": "text/javascript", "app.css": "text/css"}
CSP = "default-src 'self'; style-src 'self'; script-src 'self'; img-src 'self' data:; connect-src 'self'"


def create_app(model_dirs: str | Path | list, limits: Limits = Limits(), api_key: str | None = None,
               cors_origin: str | None = None, device: str = "cpu", on_load_error: Callable[[str], None] | None = None,
               detect: Detect | None = None) -> FastAPI:
    """The app of one model directory or several (one per language pair; two with one pair are an XattnError).
    Once started it loads them in the background (app.state.xattn: the Models). When one fails to load,
    /health says why with 503, and `on_load_error(message)` is called (xattn serve stops then). `detect`:
    language detection, for `source: auto` when several models could take a request (Models.source_of)."""
    models = Models.read([model_dirs] if isinstance(model_dirs, (str, Path)) else list(model_dirs), detect)
    metrics = Metrics()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        loader = asyncio.get_running_loop().create_task(models.load(device, limits, metrics, on_load_error))
        yield
        loader.cancel()
        await models.stop()

    app = FastAPI(title="xattn", description="Translation with the cross-attention to see. LibreTranslate-compatible "
                  "POST /translate.", docs_url=None, redoc_url=None, lifespan=lifespan)
    app.state.xattn, app.state.metrics = models, metrics
    app.add_middleware(Observed, metrics=metrics)
    if cors_origin:
        app.add_middleware(CORSMiddleware, allow_origins=[cors_origin], allow_methods=["GET", "POST"],
                           allow_headers=["Authorization", "Content-Type"])
    add_error_handlers(app)
    add_page(app)
    add_model_routes(app, models, limits, api_key)
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


def add_model_routes(app: FastAPI, models: Models, limits: Limits, api_key: str | None) -> None:
    @app.get("/health")
    async def health():
        """200 once every model has loaded; 503 with Retry-After while one loads (or failed to), naming it."""
        body = {"models": [one.describe() for one in models.served]}
        if waiting := [one.problem() for one in models.served if one.model is None]:
            return JSONResponse({"error": "; ".join(waiting), "error_type": "unavailable", **body}, 503,
                                headers={"Retry-After": "1"})
        return {"status": "ok", **body}

    @app.get("/metrics", include_in_schema=False)
    async def metrics():
        state = {one.pair: (one.model is not None, one.model.batcher.depth if one.model else 0)
                 for one in models.served}
        return Response(app.state.metrics.exposition(state), media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/languages")
    async def languages():
        return models.languages()

    @app.get("/info")
    async def info():
        """Every model (with one model, its fields at the top level too), the limits, whether a key is needed."""
        each = [one.describe() | one.ready().details() for one in models.served]  # 503 while one loads, as /health
        alone = each[0] if len(each) == 1 else {}
        return alone | {"models": each, "limits": dataclasses.asdict(limits), "api_key_required": api_key is not None}

    schema = TranslateRequest.model_json_schema()

    @app.post("/translate", openapi_extra={"requestBody": {"required": True, "content": {
        "application/json": {"schema": schema}, "application/x-www-form-urlencoded": {"schema": schema}}}})
    async def translate(request: Request):
        req = parse_request(*await read_request(request, limits))
        check_key(api_key, req.api_key, request.headers.get("authorization", ""))
        route = models.route(req.source, req.target, texts_of(req))
        record = request.scope.setdefault("xattn", {})
        record["model"] = route.served.pair
        model = route.served.ready()
        try:
            texts, settings = plan(req, model.translator.decode_config, limits, model.token_counts, model.maps,
                                   model.max_positions)
        except XattnError as e:  # text the tokenizer cannot take (a lone surrogate)
            raise ApiError(422, f"q: {e}", "invalid_request") from None
        record.update(texts=len(texts), characters=sum(map(len, texts)),
                      batch="stream" if model.streamable(settings) else "call")
        try:
            done = await asyncio.wait_for(model.batcher.submit(texts, settings, not settings.decode.sampling,
                                                               settings.work), limits.timeout_s)
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
            args = (req, texts, done, model.links, route.detected)
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
