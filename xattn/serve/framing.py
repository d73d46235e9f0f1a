"""How `xattn serve` reads the bytes of a request: h11's server side with a bound on every head and what h11
lets through refused (`Bounded`), empty lines before a request line skipped, targets in absolute form taken, and
what h11 refuses answered with its reason and status (connections.Guarded writes the answers)."""
from __future__ import annotations

import re

import h11

MAX_PIECES = 10_000
"""Pieces (chunks, or reads) a request body may arrive in: a body in one-byte chunks holds the event loop for as many
reads (the figure: benchmarks/README.md, Serving under load, "Pieces of a body")."""


class Bounded(h11.Connection):
    """h11's server side, with a bound on every request head: h11 bounds a head only while it is incomplete, so one
    that arrives whole in a single read (or behind another, pipelined) would be taken at any size. A head over
    `max_head` bytes (request line and header lines, as sent) is a protocol error of status 431, as h11's own for an
    incomplete one; the last error is kept (`error`) for the answer, which uvicorn writes without it, and a 400 of
    the guard's own says why (`problem`). A request with both Transfer-Encoding and Content-Length is a 400 too:
    h11 goes by Transfer-Encoding, a proxy in front may go by Content-Length, and the bytes between are a request
    smuggled past it (RFC 9112, 6.3, lets a server refuse it; it must close the connection either way). A target in
    absolute form is passed on in origin form (`origin_form`). Empty lines before a request line are dropped, as RFC
    9112 (2.2) asks of a server (a client may send one after a body); h11 answered them 400 (`skip_empty_lines`)."""

    def __init__(self, max_head: int):
        super().__init__(h11.SERVER, max_incomplete_event_size=max_head)
        self.max_head, self.error, self.pieces, self.problem = max_head, None, 0, None

    def next_event(self):
        if self.their_state is h11.IDLE:
            skip_empty_lines(self)
        try:
            event = super().next_event()
            if isinstance(event, h11.Request):
                self.pieces = 0
                if head_size(event) > self.max_head:
                    raise h11.RemoteProtocolError("request head too large", error_status_hint=431)
                names = {name for name, _ in event.headers}
                if event.http_version not in (b"1.0", b"1.1"):
                    self.problem = f"HTTP/{event.http_version.decode()} is not supported; send HTTP/1.1"
                    raise h11.RemoteProtocolError(self.problem, error_status_hint=505)
                if event.http_version == b"1.0" and b"transfer-encoding" in names:  # RFC 9112, 6.1
                    self.problem = "an HTTP/1.0 request with Transfer-Encoding; send HTTP/1.1, or a Content-Length"
                    raise h11.RemoteProtocolError(self.problem, error_status_hint=400)
                if b"transfer-encoding" in names and b"content-length" in names:
                    self.problem = "the request has both Transfer-Encoding and Content-Length; send one"
                    raise h11.RemoteProtocolError(self.problem, error_status_hint=400)
                try:
                    event = origin_form(event)
                except h11.RemoteProtocolError as e:
                    self.problem = str(e)
                    raise
            elif isinstance(event, h11.Data):
                self.pieces += 1
                if self.pieces > MAX_PIECES:
                    self.problem = f"the request body arrives in more than {MAX_PIECES} pieces"
                    raise h11.RemoteProtocolError(self.problem, error_status_hint=400)
            return event
        except h11.RemoteProtocolError as e:
            self.error = e
            raise

    def received_bytes(self) -> int:
        """Bytes received and not yet read as events (a request head still arriving), where h11's buffer says."""
        return len(getattr(getattr(self, "_receive_buffer", None), "_data", b""))


def h11_reason(error: Exception | None) -> str:
    """What h11 found wrong, its quotes of the request as bytes (`illegal chunk header: b'zz\\r\\n'`), cut short."""
    text = re.sub(r"bytearray\((b(['\"]).*?\2)\)", r"\1", str(error or "unreadable"))
    return text if len(text) <= 200 else text[:199] + "…"


STATUSES = {400: "400 Bad Request", 431: "431 Request Header Fields Too Large", 501: "501 Not Implemented",
            505: "505 HTTP Version Not Supported"}
"""The answers to what h11 refuses, by the status it hints (another is a 400)."""
EMPTY_LINES = re.compile(rb"(?:\r?\n|\r\Z)*")
"""Empty lines (CRLF, or a bare LF) at the start of what has arrived, and a CR that may begin one, last."""


def skip_empty_lines(conn: h11.Connection) -> None:
    """Drops the empty lines at the start of what `conn` has received and not yet read. They sit in h11's private
    receive buffer, which h11 offers no way to skip them in (an empty line that arrives behind a request's body waits
    there with the next request); a test pins its shape, and an h11 of another shape gets them as before (a 400)."""
    buffer = getattr(conn, "_receive_buffer", None)
    data = getattr(buffer, "_data", None)
    if isinstance(data, bytearray) and hasattr(buffer, "_extract") and (skip := EMPTY_LINES.match(data).end()):
        buffer._extract(skip)


def split_target(target: bytes) -> tuple[bytes | None, bytes]:
    """(The authority of a request target in absolute form, `http://host:8000/x`, or None for one in origin form;
    its path and query, `/x`), a fragment dropped (it is no part of a request, in either form)."""
    target = target.partition(b"#")[0]
    scheme, sep, rest = target.partition(b"://")
    if not sep or scheme.lower() not in (b"http", b"https"):
        return None, target
    end = min((i for i in (rest.find(b"/"), rest.find(b"?")) if i >= 0), default=len(rest))
    authority, path = rest[:end].rpartition(b"@")[2], rest[end:]  # (user information is no part of a Host)
    return authority, path if path.startswith(b"/") else b"/" + path  # no path: http://host or http://host?x=/y


def origin_form(request: h11.Request) -> h11.Request:
    """A request whose target is in absolute form (`GET http://host/health`, as sent to a proxy), which a server
    must accept (RFC 9112, 3.2.2), as the same request in origin form: the path and query after the authority, and
    the authority as its Host (which the target's overrides, or gives where there was none: HTTP/1.0). uvicorn
    would take the whole URL for the path. A target with no host (`http:///x`) is a 400, as RFC 9112 3.2 asks; a
    fragment is dropped from a target in either form (`/health#top` was a 404)."""
    authority, target = split_target(request.target)
    if authority is None:
        return request if target == request.target else \
            h11.Request(method=request.method, target=target or b"/", headers=request.headers,
                        http_version=request.http_version)
    if not authority:
        raise h11.RemoteProtocolError("the request target names no host", error_status_hint=400)
    headers = [(name, value) for name, value in request.headers if name != b"host"] + [(b"host", authority)]
    return h11.Request(method=request.method, target=target, headers=headers, http_version=request.http_version)


def head_size(request: h11.Request) -> int:
    """Bytes of a request's head as sent: its request line and header lines (h11 keeps them apart)."""
    line = len(request.method) + len(request.target) + len(b"  HTTP/1.1\r\n")
    return line + sum(len(name) + len(value) + 4 for name, value in request.headers.raw_items()) + 2
