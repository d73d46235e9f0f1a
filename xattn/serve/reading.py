"""How `xattn serve` reads a request: its fields from a JSON body, a form (urlencoded or multipart, with files
where the route takes them) and the query string, each read strictly, and its API key.

A field given twice, JSON nested too deeply, NaN, percent-escapes that are not UTF-8: each is a 422 naming the field,
never a 500 or a silent choice. A client that hangs up mid-body is one short log line, not a traceback.
"""
from __future__ import annotations

import asyncio
import hmac
import json
import math
import re
import sys
from typing import Awaitable, TypeVar
from urllib.parse import parse_qsl, unquote_plus

from fastapi import Request
from starlette.requests import ClientDisconnect

from xattn.serve.files import multipart
from xattn.serve.limits import ApiError, Limits, shown

T = TypeVar("T")
MAX_DIGITS = 30
"""Digits a JSON integer may have: more fits no field, and Python refuses to read over 4,300."""


def check_key(expected: str | None, in_body: str | None, authorization: list[str]) -> None:
    """With a key set, the body's api_key or an `Authorization: Bearer KEY` header (of the `authorization` headers
    given) must give it."""
    if expected is None:
        return
    tokens = [token.strip() for scheme, _, token in (header.partition(" ") for header in authorization)
              if scheme.lower() == "bearer"]
    if not in_body and not any(tokens):
        raise ApiError(403, "an API key is required (api_key, or an Authorization: Bearer header)", "unauthorized")
    # a header's bytes come decoded as Latin-1: a key beyond ASCII is those bytes when the client sent UTF-8 (curl),
    # the text itself when it sent Latin-1 (requests)
    given = [in_body.encode()] if in_body else []
    given += [form for token in tokens if token for form in (token.encode("latin-1"), token.encode())]
    # any may hold it: a proxy in front may send a Bearer token of its own beside the body's key, or a header
    if not any([hmac.compare_digest(key, expected.encode()) for key in given]):
        raise ApiError(403, "invalid API key", "unauthorized")


def given_key(fields: dict) -> str | None:
    """The api_key field of a request's fields as read (before they are checked), if it is text."""
    key = fields.get("api_key")
    return key if isinstance(key, str) else None


async def read_request(request: Request, limits: Limits, files: int = 0) -> tuple[dict, frozenset[str]]:
    """The request's fields, and the names of those that came as text (from a form or the query string, to be
    converted to their types; JSON values are typed already): the body's, and the query string's, as LibreTranslate
    reads both (deep-translator sends every field in the query string of a POST with no body; other clients put
    `api_key` there). A field in both is an error: one would silently win. A body that is not an object of fields
    is a 422. A client that hangs up mid-body is a 499 (in the access line), not a traceback. `files`: how many file
    fields a multipart body may have (files.Upload values)."""
    try:
        return await read_fields(request, limits, files)
    except ApiError:  # its texts on its access line all the same, read leniently from what arrived (if it did)
        if "xattn.sent" in request.scope:
            noted(request, sent_texts(*request.scope["xattn.sent"], request.scope.get("query_string") or b""))
        raise


async def read_fields(request: Request, limits: Limits, files: int) -> tuple[dict, frozenset[str]]:
    """read_request's fields, read strictly."""
    try:
        body, form = await read_body(request, limits, files)
    except ClientDisconnect:  # 499 in the access line and metrics, or 408 when the read deadline closed it
        if request.scope.get("xattn.read_timeout"):  # (connections.py)
            raise ApiError(408, "the request did not arrive within the server's read timeout", "timeout") from None
        if problem := request.scope.get("xattn.bad_request"):  # its body broke the protocol (connections.py)
            raise ApiError(400, problem, "bad_request") from None
        raise ApiError(499, "the client went away before its body arrived", "client_gone") from None
    if not isinstance(body, dict):  # (no body at all is no fields: the query string's, or none, which the route names)
        kind = {type(None): "null", list: "array", str: "string", bool: "boolean"}.get(type(body), "number")
        raise ApiError(422, f"body: must be a JSON object of fields (or a form), not a JSON {kind}", "invalid_request")
    query = form_fields(query_fields(request.scope.get("query_string") or b"", "query string"), "the query string")
    if both := sorted(set(body) & set(query)):
        raise ApiError(422, f"{both[0]}: given in both the query string and the body (only one would count)",
                       "invalid_request")
    return {**query, **body}, frozenset(query) | (frozenset(body) if form else frozenset())


async def while_connected(request: Request, work: Awaitable[T]) -> T:
    """What `work` gives, unless the client hangs up first: `work` is then cancelled (a translation it waits for
    leaves the engine at its next step, serve/engine.py), and the request ends as 499 (its access line says
    client_gone), so nothing is decoded for nobody. Call it once the body has been read: from then on the server's next message
    is http.disconnect, whenever the connection closes."""
    handler = asyncio.current_task()
    gone = False

    async def watch() -> None:
        nonlocal gone
        while (await request.receive())["type"] != "http.disconnect":
            pass
        gone = True
        handler.cancel()
    watcher = asyncio.get_running_loop().create_task(watch())
    try:
        return await work
    except asyncio.CancelledError:
        if not gone:
            raise
        if sys.version_info >= (3, 11):  # (3.10 keeps no count of cancellations to undo)
            handler.uncancel()
        raise ApiError(499, "the client went away before its answer was ready", "client_gone") from None
    finally:
        watcher.cancel()


async def read_body(request: Request, limits: Limits, files: int = 0) -> tuple[dict, bool]:
    """The body as a dict (JSON, or a form whose repeated `q` is a list), read at most up to a size cap, and
    whether it was a form."""
    cap = 8 * limits.max_chars + 65536  # UTF-8 and JSON escapes of max_chars characters, and the other fields
    too_large = ApiError(413, f"the body is over {cap} bytes", "too_large", {"Connection": "close"})  # (unread)
    if int(request.headers.get("content-length") or 0) > cap:
        raise too_large
    if len(kinds := request.headers.getlist("content-type")) > 1:  # (the first would silently win)
        raise ApiError(422, f"Content-Type: given {len(kinds)} times; send one", "invalid_request")
    kind = request.headers.get("content-type", "application/json").split(";")[0].strip().lower()
    codings = [c.strip().lower() for line in request.headers.getlist("content-encoding") for c in line.split(",")]
    if coding := next((c for c in codings if c not in ("", "identity")), None):
        raise ApiError(415, f"Content-Encoding: {coding} is not supported; send the body uncompressed",
                       "unsupported_media")
    raw = bytearray()
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > cap:
            raise too_large
    request.scope["xattn.sent"] = kind, bytes(raw)  # (what arrived: read_request notes its texts if it is refused)
    if kind == "multipart/form-data":
        return form_fields(await multipart(request.headers, bytes(raw), files, cap), "the form"), True
    if kind == "application/x-www-form-urlencoded":
        if raw.lstrip()[:1] in (b"{", b"["):  # else "q: Field required", the JSON read as one odd field name
            raise ApiError(422, "body: JSON, sent as a form (Content-Type: application/x-www-form-urlencoded); send "
                           "it with Content-Type: application/json", "invalid_request")
        return form_fields(query_fields(raw, "body"), "the form"), True
    if not raw:  # no body: no fields (a JSON null is a body, and not an object of fields)
        return {}, False
    try:
        data = json.loads(bytes(raw), object_pairs_hook=unique_keys, parse_constant=not_json, parse_int=whole)
        return checked(data, "body"), False
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ApiError(422, f"body: not valid JSON ({e})", "invalid_request") from None
    except RecursionError:
        raise ApiError(422, "body: nested too deeply; a request is one object of fields", "invalid_request") from None
    except ValueError as e:
        raise ApiError(422, f"body: {e}", "invalid_request") from None


def noted(request: Request, q: object, characters: int | None = None) -> dict:
    """The access log's fields of a request (metrics.Observed writes them), with the texts and characters of its
    `q` as sent, before any other field is checked (`characters`: a file's, blank lines and all): on its line
    whatever its answer, a 413 for too many characters or a 422 for a malformed setting too. A `q` that is not
    text (or a list of texts) adds neither."""
    record = request.scope.setdefault("xattn", {})
    texts = [q] if isinstance(q, str) else q if isinstance(q, list) and all(isinstance(t, str) for t in q) else None
    if texts is not None:
        record["texts"] = len(texts)
        record["characters"] = sum(len(t) for t in texts) if characters is None else characters
    return record


def sent_texts(kind: str, raw: bytes, query: bytes) -> object:
    """The `q` of a request that strict reading refused (a field given twice, a number too large, a bad escape in
    the query string...), read leniently for its access line only: from a JSON or form body, else the query
    string; None where none can be read (a multipart body, JSON that does not parse)."""
    def from_pairs(text: bytes) -> object:
        texts = [v for k, v in parse_qsl(text.decode("utf-8", "replace"), keep_blank_values=True) if k == "q"]
        return None if not texts else texts[0] if len(texts) == 1 else texts
    q = None
    try:
        if kind == "application/x-www-form-urlencoded":
            q = from_pairs(raw)
        elif kind not in ("multipart/form-data",) and raw:
            data = json.loads(raw)
            q = data.get("q") if isinstance(data, dict) else None
    except (ValueError, RecursionError):
        pass
    return q if q is not None else from_pairs(query)


class Twice(dict):
    """A JSON object with a key given twice (`key`), refused by `checked`, which knows where the object is (JSON
    objects are read innermost first: the hook does not)."""

    def __init__(self, pairs: list[tuple[str, object]], key: str):
        super().__init__(pairs)
        self.key = key


def unique_keys(pairs: list[tuple[str, object]]) -> dict:
    out = {}
    for key, value in pairs:
        if key in out:
            return Twice(pairs, key)
        out[key] = value
    return out


def not_json(name: str):
    raise ValueError(f"{name} is not JSON (numbers must be finite)")


def whole(text: str) -> int | float:
    """A JSON integer; one of more than MAX_DIGITS digits is infinite (`checked` refuses it naming the field)."""
    return int(text) if len(text.lstrip("-")) <= MAX_DIGITS else math.inf


def checked(value, where: str):
    """`value` (JSON read), unless it holds a number too large (1e400 reads as infinite) or a string with a lone
    surrogate (JSON's "\\ud800" escapes: no text can, and it would fail later far from the field, as a 500 or
    silently). 422 naming the field."""
    if isinstance(value, Twice):
        twice = shown(value.key) if where == "body" else f"{where}: {shown(value.key)!r}"
        raise ApiError(422, f"{twice}: given twice in the body (only one would count)", "invalid_request")
    if isinstance(value, dict):
        for key, item in value.items():
            checked(key, f"{where}: a field name")
            checked(item, shown(key) if where == "body" else f"{where}.{shown(key)}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            checked(item, f"{where}[{i}]")
    elif isinstance(value, float) and not math.isfinite(value):
        raise ApiError(422, f"{where}: too large a number", "invalid_request")
    elif isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as e:
            raise ApiError(422, f"{where}: holds a lone surrogate ({value[e.start]!a}), which is not text",
                           "invalid_request") from None
    return value


def query_fields(raw: bytes, where: str) -> dict[str, list[str]]:
    """The fields of a query string or form body, each `name=value`, each value strictly UTF-8 once percent-decoded
    (a `%FF` is a 422 naming the field, not a replacement character). A field without `=` (`?q=a&q`, which
    would be one more, empty text) and a `%` not followed by two hex digits are 422s naming the field too: read
    leniently, they change the request silently."""
    fields: dict[str, list[str]] = {}
    for pair in bytes(raw).decode("latin-1").split("&"):
        if not pair:  # (`a=1&&b=2`, a trailing `&`: nothing)
            continue
        if "=" not in pair:
            name = fix_utf8(unquote_plus(pair, encoding="latin-1"), where, "a field name")
            raise ApiError(422, f"{shown(name)}: given without `=` and a value ({where})", "invalid_request")
        ((key, value),) = parse_qsl(pair, keep_blank_values=True, encoding="latin-1")
        name = fix_utf8(key, where, "a field name")
        if bad := BAD_ESCAPE.search(pair):
            raise ApiError(422, f"{shown(name)}: a malformed percent escape {bad.group()!r} ({where})",
                           "invalid_request")
        fields.setdefault(name, []).append(fix_utf8(value, where, name))
    return fields


BAD_ESCAPE = re.compile(r"%(?![0-9A-Fa-f]{2}).{0,2}", re.S)
"""A `%` that does not start an escape of two hex digits (and what follows it, to show)."""


def fix_utf8(text: str, where: str, field: str) -> str:
    """A percent-decoded form value (decoded as latin-1, one character per byte) read as UTF-8 strictly."""
    try:
        return text.encode("latin-1").decode("utf-8")
    except UnicodeDecodeError:
        raise ApiError(422, f"{shown(field)}: not UTF-8 once percent-decoded ({where})", "invalid_request") from None


def form_fields(fields: dict[str, list], where: str) -> dict:
    """The fields of a form (or of a query string: `where` names it), each given once; `q` may repeat (a list of
    texts, as LibreTranslate takes it)."""
    if twice := next((k for k, v in fields.items() if k != "q" and len(v) > 1), None):
        raise ApiError(422, f"{shown(twice)}: given {len(fields[twice])} times in {where}", "invalid_request")
    return {k: (v if k == "q" and len(v) > 1 else v[0]) for k, v in fields.items()}
