"""The FastAPI app of `xattn serve`: POST /translate (LibreTranslate-compatible, plus xattn's settings and the
cross-attention), /detect, /translate_file (and GET /download_file/NAME), GET /languages, /health, /info, /metrics,
/openapi.json, and the page at / (static/, no network). Requests are read by reading.py.

The models (models.py: one per language pair, each request routed by its source and target) load in the
background: /health and /info answer 503 until every one is ready, /translate until its model is; /languages
answers at once.
Every error is a JSON body {"error", "error_type"} with its status (api.ApiError); a client mistake is never
a 500 and never an error with status 200.
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import traceback
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Callable

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import FileResponse, JSONResponse, Response
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException

from xattn.errors import ParameterError, XattnError
from xattn.io import json_text
from xattn.serve import detect as identifier
from xattn.serve import markup
from xattn.serve.api import (DetectRequest, FileRequest, TranslateRequest, body_of, detection, openapi_body,
                             parse_request, plan, request_texts, response)
from xattn.serve.backlog import Overloaded
from xattn.serve.batcher import QueueFull
from xattn.serve.engine import MAX_LONG, Crowded
from xattn.serve.files import KEEP_FILES, KEEP_SECONDS, Document, Store, Upload, attachment, download_name, \
    file_text, named_lines
from xattn.serve.limits import ApiError, Limits
from xattn.serve.metrics import Metrics, Observed, log_line
from xattn.serve.models import Detect, Model, Models
from xattn.serve.reading import check_key, given_key, noted, read_request, while_connected

STATIC = Path(__file__).parent / "static"
PAGE_FILES = {"app.js": "text/javascript", "app.css": "text/css", "heatmap.js": "text/javascript",
              "heatmap.css": "text/css", "favicon.svg": "image/svg+xml"}
CSP = "default-src 'self'; style-src 'self'; script-src 'self'; img-src 'self' data:; connect-src 'self'"


def create_app(model_dirs: str | Path | list, limits: Limits = Limits(), api_key: str | None = None,
               cors_origin: str | None = None, device: str = "cpu", on_load_error: Callable[[str], None] | None = None,
               detect: Detect | None = None) -> FastAPI:
    """The app of one model directory or several (one per language pair; two with one pair are an XattnError).
    Once started it loads them in the background (app.state.xattn: the Models). When one fails to load,
    /health says why with 503, and `on_load_error(message)` is called (xattn serve stops then). `detect`:
    language detection, for `source: auto` when several models could take a request (Models.source_of)."""
    models = Models.read([model_dirs] if isinstance(model_dirs, (str, Path)) else list(model_dirs), detect, limits)
    metrics = Metrics()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        async def load() -> None:
            await asyncio.to_thread(identifier.load)  # the language identifier first: the quicker
            await models.load(device, limits, metrics, on_load_error)
        loader = asyncio.get_running_loop().create_task(load())
        yield
        loader.cancel()
        await models.stop()

    app = FastAPI(title="xattn", description="Translation with the cross-attention to see. LibreTranslate-compatible "
                  "POST /translate.", docs_url=None, redoc_url=None, lifespan=lifespan,
                  redirect_slashes=False)  # /translate/ is a JSON 404, not an empty 307
    app.state.xattn, app.state.metrics = models, metrics
    app.add_middleware(Internal)  # (added first: inside the CORS headers and the access line)
    if cors_origin:  # inside Observed (added last, so outermost): preflights are logged and counted too
        app.add_middleware(JsonCors, routes=lambda: app.routes, allow_origins=[cors_origin],
                           allow_methods=["GET", "POST"], allow_headers=["Authorization", "Content-Type"])
    app.add_middleware(Observed, metrics=metrics, routes=lambda: app.routes)
    add_error_handlers(app)
    add_page(app)
    add_model_routes(app, models, limits, api_key)
    add_file_routes(app, models, limits, api_key)
    for route in [r for r in app.routes if isinstance(r, APIRoute) and "GET" in r.methods]:  # HEAD wherever GET
        app.add_api_route(route.path, route.endpoint, methods=["HEAD"], include_in_schema=False)
    return app


class JsonCors(CORSMiddleware):
    """Starlette's CORS, whose refusal of a preflight ("Disallowed CORS origin", plain text) is a JSON error too,
    noted in the access line (`cors_refused`); a preflight to a path that no route serves is the app's 404."""

    def __init__(self, app, routes: Callable[[], list], **options):
        super().__init__(app, **options)
        self.routes = routes

    async def __call__(self, scope, receive, send) -> None:
        from starlette.datastructures import Headers
        from starlette.routing import Match

        headers = Headers(scope=scope) if scope["type"] == "http" and scope["method"] == "OPTIONS" else {}
        if "origin" in headers and "access-control-request-method" in headers:  # a preflight, as Starlette tells it
            if not any(route.matches(scope)[0] != Match.NONE for route in self.routes()):
                return await self.app(scope, receive, send)
            answer = self.preflight_response(request_headers=headers)
            if answer.status_code >= 400 and "xattn" in scope:
                scope["xattn"]["error"] = "cors_refused"
            return await answer(scope, receive, send)
        await super().__call__(scope, receive, send)

    def preflight_response(self, request_headers) -> Response:
        answer = super().preflight_response(request_headers)
        if answer.status_code < 400:
            return answer
        headers = {k: v for k, v in answer.headers.items() if k not in ("content-type", "content-length")}
        return JSONResponse({"error": f"CORS preflight refused: {answer.body.decode()}", "error_type": "cors_refused"},
                            answer.status_code, headers=headers)


class Internal:
    """ASGI middleware: a server bug (an exception no handler answers) is the JSON 500 of every error, inside the
    CORS headers and the access line (its `error`: internal) like any other answer, and its traceback is one JSON
    line of the log (`event`: internal_error, with the request's id). Starlette's handler of last resort answered
    outside both, and its traceback came as some 85 lines of plain text among the JSON lines."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = False

        async def sending(message):
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)
        try:
            await self.app(scope, receive, sending)
        except Exception as e:
            if started:  # (nothing else can be said to the client: the connection ends, as it would have)
                raise
            record = scope.setdefault("xattn", {})
            record["error"] = "internal"
            log_line(logging.getLogger("xattn.serve"), {"event": "internal_error", "id": record.get("id"),
                                                        "path": scope.get("path"), "traceback": traceback.format_exc()})
            await JSONResponse(internal_error_body(e), 500)(scope, receive, send)


def internal_error_body(e: Exception) -> dict:
    """The answer to a bug of the server (never a client's mistake): its exception's type, nothing more."""
    return {"error": f"internal error ({type(e).__name__})", "error_type": "internal"}


def add_error_handlers(app: FastAPI) -> None:
    """Every error as {"error", "error_type"} with its status."""
    def answer(request: Request, body: dict, status: int, headers: dict | None = None) -> JSONResponse:
        if "xattn" in request.scope:  # the access line's (metrics.Observed): a client gone is `client_gone` there,
            request.scope["xattn"].setdefault("error", body["error_type"])  # one cut off `write_timeout` already
        return JSONResponse(body, status, headers=headers)

    @app.exception_handler(ApiError)
    async def api_error(request: Request, e: ApiError):
        return answer(request, e.body(), e.status, e.headers)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, e: HTTPException):
        names = {404: "not_found", 405: "method_not_allowed"}
        headers = dict(getattr(e, "headers", None) or {})
        if "GET" in (allow := headers.get("Allow", "").split(", ")) and "HEAD" not in allow:
            headers["Allow"] = ", ".join([*allow, "HEAD"])  # (HEAD is a route of its own beside each GET one)
        return answer(request, {"error": str(e.detail), "error_type": names.get(e.status_code, "http_error")},
                      e.status_code, headers)

    @app.exception_handler(Exception)  # Starlette's last resort, for a bug in a middleware outside Internal
    async def internal_error(request: Request, e: Exception):
        return answer(request, internal_error_body(e), 500)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, e: RequestValidationError):
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        return answer(request, {"error": f"{where}: {first['msg']}", "error_type": "invalid_request"}, 422)


def add_page(app: FastAPI) -> None:
    @app.get("/", include_in_schema=False)
    async def page(request: Request):
        return page_file(request, STATIC / "index.html", "text/html")

    @app.get("/static/{name}", include_in_schema=False)
    async def static(request: Request, name: str):
        if name not in PAGE_FILES:
            raise ApiError(404, f"/static/{name}: no such file", "not_found")
        return page_file(request, STATIC / name, PAGE_FILES[name])


def page_file(request: Request, path: Path, media_type: str) -> Response:
    """A file of the page, with its CSP; a browser revalidates it on every use (no-cache: a new xattn's page never
    runs against an old script) and gets a 304 with no body while its ETag still matches; nosniff keeps a browser
    from reading it as another type than the one given."""
    answer = FileResponse(path, media_type=media_type, stat_result=path.stat(),
                          headers={"Content-Security-Policy": CSP, "Cache-Control": "no-cache",
                                   "X-Content-Type-Options": "nosniff"})
    etag, asked = answer.headers["etag"], request.headers.get("if-none-match", "")
    if asked.strip() == "*" or etag in [tag.strip().removeprefix("W/") for tag in asked.split(",")]:
        return Response(status_code=304, headers={k: answer.headers[k] for k in (
            "etag", "last-modified", "cache-control", "content-security-policy", "x-content-type-options")})
    return answer


def add_model_routes(app: FastAPI, models: Models, limits: Limits, api_key: str | None) -> None:
    @app.get("/health")
    async def health(request: Request):
        """200 once every model has loaded; 503 with Retry-After while one loads (or failed to), naming it."""
        body = {"models": [one.describe() for one in models.served]}
        if waiting := [one.problem() for one in models.served if one.model is None]:
            request.scope.setdefault("xattn", {})["error"] = "unavailable"  # the access line's, as an ApiError's
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
        limits_ = dataclasses.asdict(limits) | {"max_backlog_s": limits.backlog_s}  # (its default: the value in force)
        return alone | {"models": each, "limits": limits_, "api_key_required": api_key is not None}

    @app.post("/translate", openapi_extra=openapi_body(TranslateRequest))
    async def translate(request: Request):
        fields, text = await read_request(request, limits)
        record = noted(request, fields.get("q"))  # before the fields are checked: a refused request's line has it
        check_key(api_key, given_key(fields), request.headers.getlist("authorization"))  # before any field: as
        req = parse_request(fields, text)  # LibreTranslate, a client without the key learns nothing of the rest
        texts = request_texts(req.q, limits)
        pages = markup.pages_of(req, texts) if req.format == "html" else None
        route = models.route(req.source, req.target, texts if pages is None else [markup.plain(p) for p in pages])
        record["model"] = route.served.pair
        work = translated(route.served.ready(), req, limits, record, route.detected) if pages is None else \
            translated_html(route.served.ready(), req, pages, limits, record, route.detected)
        body = await while_connected(request, work)
        encode = partial(json_text, body, ensure_ascii=False, separators=(",", ":"))  # plain JSON types already
        # an answer with attention runs to megabytes, long to encode: off the event loop, as its making
        return Response(await asyncio.to_thread(encode) if heavy(req) else encode(), media_type="application/json")

    @app.post("/detect", openapi_extra=openapi_body(DetectRequest))
    async def detect_language(request: Request):
        fields, text = await read_request(request, limits)
        noted(request, fields.get("q"))
        check_key(api_key, given_key(fields), request.headers.getlist("authorization"))
        req = parse_request(fields, text, kind=DetectRequest)
        return detection(request_texts(req.q, limits))


async def translated(model: Model, req: TranslateRequest, limits: Limits, record: dict,
                     detected: list[tuple[str, float]] | None) -> dict:
    """The answer to a /translate request (or to a file's lines) by `model`; adds its figures to `record` (the
    access log's fields). `detected`: detectedLanguage of each text, when the source was auto."""
    source, target = model.languages
    try:
        split, settings = plan(req, model.translator.decode_config, limits, model.token_counts, model.maps,
                               model.max_positions, source, model.translator.model.cfg.n_decoder_layers)
    except XattnError as e:  # text the tokenizer cannot take (a lone surrogate)
        raise ApiError(422, f"q: {e}", "invalid_request") from None
    texts = split.sentences
    mergeable = not settings.decode.sampling
    record["batch"] = "stream" if model.batcher.streamed(settings, mergeable, len(texts), settings.work) else "call"
    try:
        done = await model.batcher.submit(texts, settings, mergeable, work=settings.work, source=settings.source,
                                          least=settings.least, timeout=limits.timeout_s)
    except (QueueFull, Crowded, Overloaded) as e:
        if isinstance(e, QueueFull) or isinstance(e, Overloaded) and not e.to_timeout:  # refused on arrival: it
            del record["batch"]                                                             # joined none
        raise busy(e, limits) from None
    except asyncio.TimeoutError:
        raise ApiError(504, f"no translation within {limits.timeout_s:g} s", "timeout") from None
    except ParameterError as e:  # a decoding setting this model cannot honour (shortlist: it has none)
        raise ApiError(422, split.rename(str(e)), "invalid_request") from None
    except XattnError as e:  # what the model cannot take (checked before where it can be)
        raise ApiError(422, f"q: {split.rename(str(e))}", "invalid_request") from None
    record["output_tokens"] = record.get("output_tokens", 0) + sum(len(t.tgt_tokens) - 1 for t in done)  # no </s>
    if len(texts) > len(split.gaps):
        record["sentences"] = record.get("sentences", 0) + len(texts)

    def answer() -> dict:
        links = model.links(done, texts) if req.alignment else None
        return response(req, split.join(done, target, links, attention=req.attention), detected)
    try:  # alignment and attention take time: off the event loop; a plain answer is quicker built here
        return await asyncio.to_thread(answer) if heavy(req) else answer()
    except XattnError as e:  # words the alignment cannot place
        raise ApiError(422, f"q: {split.rename(str(e))}", "invalid_request") from None


async def translated_html(model: Model, req: TranslateRequest, pages: list[markup.Page], limits: Limits,
                          record: dict, detected: list[tuple[str, float]] | None) -> dict:
    """The answer to a `format: html` request: its pages' blocks translated as the texts of one request (within
    its characters, not its items), with their word links, and each page's markup placed on its translation."""
    if model.maps == 0:
        raise ApiError(422, "format: html places the markup by the word alignment, and every cross-attention head "
                       "of this model was pruned; send format text", "invalid_request")
    blocks = [block.text.strip(" ") for page in pages for block in page.blocks]
    inner = req.model_copy(update={"q": blocks or [""], "format": "text", "alignment": True})  # (a page of no
    with markup.named_blocks(pages):  # text is checked as any request, its one empty text translated empty)
        body = await translated(model, inner, dataclasses.replace(limits, max_items=max(1, len(blocks))), record, None)
    found, results = iter(body["results"]), []
    for page in pages:
        blocks = [next(found) for _ in page.blocks]
        html = page.render([markup.Translated(r["translatedText"], r["source_words"], r["target_words"],
                                              [tuple(link) for link in r["alignment"]]) for r in blocks])
        results.append({"translatedText": html, "score": round(sum(r["score"] for r in blocks), 4)})
    return body_of(isinstance(req.q, str), results, detected)


def busy(refusal: Exception, limits: Limits) -> ApiError:
    """The 429 of a request the batcher refused: its queue full, long calls crowding, or the backlog too long."""
    if isinstance(refusal, QueueFull):
        return ApiError(429, f"the server is busy ({limits.queue_size} requests waiting or in turns); retry later",
                        "busy", {"Retry-After": "1"})
    if isinstance(refusal, Crowded):
        return ApiError(429, f"the server is busy with {MAX_LONG} long requests; retry later, or send a smaller one",
                        "busy", {"Retry-After": "5"})
    return ApiError(429, f"the server is busy: {refusal} (--max-backlog); retry later", "busy",
                    {"Retry-After": str(refusal.retry_after)})


def heavy(req: TranslateRequest) -> bool:
    """Whether the answer to `req` carries alignment or attention (long to build and to encode)."""
    return req.alignment or req.attention != "none"


def add_file_routes(app: FastAPI, models: Models, limits: Limits, api_key: str | None) -> None:
    """POST /translate_file (a .txt file, LibreTranslate's multipart form) and GET /download_file/{name}."""
    store = Store()

    @app.post("/translate_file", openapi_extra=openapi_body(FileRequest))
    async def translate_file(request: Request):
        fields, text = await read_request(request, limits, files=1)
        if isinstance(upload := fields.get("file"), Upload):  # its size on its line, a refused one's too
            sent = upload.data.decode("utf-8", "replace").removeprefix("\ufeff")
            # (its lines by Document's rule: a line ends at \n alone; splitlines also broke at \x0c and \u2028)
            record = noted(request, [line for line in sent.split("\n") if line.strip()], len(sent))
        else:
            record = request.scope.setdefault("xattn", {})
        check_key(api_key, given_key(fields), request.headers.getlist("authorization"))
        req = parse_request({k: v for k, v in fields.items() if k != "file"}, text, kind=FileRequest)
        filename, content = file_text(upload, limits)
        document = Document.parse(content)
        lines, numbers = document.texts()  # (a file of blank lines is refused as such, before any routing)
        # auto: the whole text (more to go on than a line) with each line, as the texts of a list are routed; off the
        # event loop, since a file may have thousands of lines to identify (a tenth of a second and more)
        route_of = partial(models.route, req.source, req.target, [content, *lines],
                           ["file", *(f"file: line {n}" for n in numbers)])
        route = await asyncio.to_thread(route_of) if models.code(req.source) == "auto" else route_of()
        record["model"] = route.served.pair
        asked = TranslateRequest(q=lines, source=route.served.source, target=route.served.target)
        # one request, its lines its texts: a file is within a request's characters (file_text), not its items
        with named_lines(numbers):
            done = await while_connected(request, translated(
                route.served.ready(), asked, dataclasses.replace(limits, max_items=len(lines)), record, None))
        translation = document.rebuild(done["translatedText"])
        name = store.put(download_name(filename, route.served.target), translation.encode())
        return {"translatedFileUrl": str(request.url_for("download_file", name=name))}

    @app.get("/download_file/{name}")
    async def download_file(name: str):
        kept = store.get(name)
        if kept is None:
            raise ApiError(404, f"/download_file/{name}: no such file (files are kept {KEEP_SECONDS / 60:g} minutes "
                           f"and the last {KEEP_FILES} at most)", "not_found")
        filename, data = kept
        return Response(data, media_type="text/plain; charset=utf-8",
                        headers={"Content-Disposition": attachment(filename)})
