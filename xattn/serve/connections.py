"""How `xattn serve` treats connections: uvicorn's h11 protocol with the three guards uvicorn lacks.

- A read deadline: a request, its head and its body, must arrive within `read_timeout` seconds of its first
  byte (or of the connection's opening, for a client that connects and sends nothing); a client that
  trickles its headers or body is closed then, instead of holding a connection and a file forever. Between
  requests, uvicorn's keep-alive timeout closes an idle connection.
- A connection limit that makes room or refuses fast: a connection beyond `max_connections` open ones
  takes the place of the one that has been quiet longest (no request of it in progress: still arriving, or
  idle between two), if that one has been quiet for QUIET_S or more; otherwise it is held in RESERVE, where it
  may ask for /health (GET or HEAD), answered and closed, and anything else is answered 503 as soon as its request
  line shows it; the newest RESERVE such connections are held (one whose request line began to arrive within
  GRACE_S keeps its place, and so does one whose health check's line is waiting unread: a connection accepted in
  one turn of the event loop with a crowd of others has had no turn to be read), an older one is answered 503 and
  closed at once. The held ones do not count against
  the limit.
  A flood of idle or slow connections then neither uses up the process's files nor locks out everyone else,
  health checks included (uvicorn's own `limit_concurrency` answers 503 only once a request's head has arrived,
  /health too, and never closes the connections that hold the room).
- A write deadline: a client that takes in none of its answer for `write_timeout` seconds while the server holds
  more of it to send (beyond what the kernel buffers) is cut off. Without it, a client that sends requests and never
  reads holds its connection, and the megabytes of answer waiting for it, for ever, even once the connection is
  closing, where the room-making below cannot reach it.
- A bound on every request head (`Bounded`), answered 431, and on the pieces a body arrives in (framing.MAX_PIECES: each
  costs the event loop a turn); errors of the protocol answered as JSON, and one access line for a request whose
  body broke the protocol (its app's, with the 400), not a log line of its own as well.

What the guards close or refuse where no request's access line tells of it (a connection refused at the limit, or
closed to make room, by its read deadline with no request in progress, after a 431 or 400 before its request
reached the app, or cut off by the write deadline once its answers were complete) is counted in /metrics
(`xattn_connections_closed_total`, by reason) and, but for the refusal at the limit (a flood would write
thousands), one log line, JSON as the access lines (`{"event": "connection_closed", "reason": ..., "detail": ...}`).
"""
from __future__ import annotations

import asyncio
import json
import logging
import re
import socket
import time
from email.utils import formatdate
from functools import partial
from typing import Protocol

import h11
from h11._connection import DEFAULT_MAX_INCOMPLETE_EVENT_SIZE  # as uvicorn takes it
from uvicorn.protocols.http.h11_impl import H11Protocol

from xattn.serve.framing import EMPTY_LINES, STATUSES, Bounded, h11_reason, split_target
from xattn.serve.metrics import log_line

LOG = logging.getLogger("xattn.serve")
READING = (h11.IDLE, h11.SEND_BODY)  # the client's states while its request is still arriving
QUIET_S = 1.0
"""Seconds a connection must have been quiet (no request in progress) before a new one may take its place."""
RESERVE = 64
"""Connections held beyond the limit, the newest, for a /health check each (within cli/serve.FILES_SPARE)."""
GRACE_S = 0.5
"""Seconds a held connection whose request line has begun to arrive keeps its place against newer ones (a health
check's line arrives at once; after that, any held connection may be refused to make room)."""
HEALTH_LINE = re.compile(rb"(?:GET|HEAD) (\S+) ")
"""The start of a request line of GET or HEAD, up to its whole target: a health check's if that is /health."""
UNDECIDED = re.compile(rb"G(?:E(?:T(?: \S*)?)?)?|H(?:E(?:A(?:D(?: \S*)?)?)?)?")
"""A request line so far that may still be a health check's."""


def health_check(line: bytes) -> bool | None:
    """Whether the request line `line` begins is a health check's (`GET /health`, `HEAD /health?x`, or the same in
    absolute form: `GET http://host/health`); None while it cannot tell yet."""
    if start := HEALTH_LINE.match(line):
        return split_target(start[1])[1].partition(b"?")[0] == b"/health"
    return None if UNDECIDED.fullmatch(line) and len(line) <= 4096 else False


def answer(status: str, error: str, error_type: str, extra: str = "") -> bytes:
    """A whole JSON error answer that closes the connection, written before (or instead of) the app's."""
    body = json.dumps({"error": error, "error_type": error_type}).encode()
    head = (f"HTTP/1.1 {status}\r\ndate: {formatdate(usegmt=True)}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\n{extra}connection: close\r\n\r\n")  # (a Date, as RFC 9110 6.6.1 asks)
    return head.encode() + body


def refusal(max_connections: int) -> bytes:
    """The whole 503 answer to a connection over the limit."""
    return answer("503 Service Unavailable", f"the server has {max_connections} connections open; retry later",
                  "busy", "retry-after: 1\r\n")


class Counter(Protocol):
    def connection_closed(self, reason: str) -> None: ...  # metrics.Metrics


class Guarded(H11Protocol):
    """H11Protocol with a read deadline per request and a refusal beyond `max_connections` (module docstring)."""

    def __init__(self, *args, read_timeout: float, write_timeout: float, max_connections: int, metrics: Counter,
                 **kwargs):
        super().__init__(*args, **kwargs)
        self.read_timeout, self.write_timeout, self.max_connections = read_timeout, write_timeout, max_connections
        self.metrics = metrics
        self.deadline: asyncio.TimerHandle | None = None
        self.write_deadline: asyncio.TimerHandle | None = None
        self.quiet_since: float | None = None  # since when no request of it is in progress
        self.reserved: float | None = None     # when it was held in RESERVE (over the limit): a health check only
        self.line: bytes | None = b""          # what of a reserved connection's request line has arrived (None:
        #                                        a health check, read on)
        self.began: float | None = None        # when that line began to arrive
        size = self.config.h11_max_incomplete_event_size
        self.conn = Bounded(DEFAULT_MAX_INCOMPLETE_EVENT_SIZE if size is None else size)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(Lingering(transport, self))
        self.quiet_since = now = time.monotonic()
        held = [c for c in self.connections if getattr(c, "reserved", None) is not None] \
            if len(self.connections) > self.max_connections else []  # (none held under the limit: no walk)
        if len(self.connections) - len(held) > self.max_connections and not self._make_room():
            self.reserved = now
            held = sorted((c for c in held if not c.transport.is_closing()), key=lambda c: c.reserved)
            # the oldest first, but never one being answered, nor one whose request line began within GRACE_S
            others = [c for c in held if c.line is not None and not (c.line and now - c.began < GRACE_S)]
            if (over := len(held) + 1 - RESERVE) > len(others):  # every held one keeps its place: this one has none
                self._refuse()
                return
            for oldest in others:
                if over <= 0:
                    break
                if not oldest.line and oldest._asks_for_health():  # its line came with it, still unread: a
                    continue  # connection accepted in one turn with a crowd of others has had no turn to be read
                oldest._refuse()
                over -= 1
            if over > 0:
                self._refuse()
                return
        self._arm()

    def _asks_for_health(self) -> bool:
        """Whether what the client sent that the event loop has not read yet (peeked at, left in place) begins a
        health check's request line."""
        sock = self.transport.get_extra_info("socket")
        try:
            with socket.fromfd(sock.fileno(), sock.family, sock.type) as peek:
                waiting = peek.recv(4096, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        except (OSError, AttributeError):  # (nothing waiting, or no socket to peek at)
            return False
        line = waiting[EMPTY_LINES.match(waiting).end():]
        return bool(line) and health_check(line) is not False

    def _refuse(self) -> None:
        """The 503 of a connection over the limit, and close it."""
        self._disarm()
        self.line = None
        self.metrics.connection_closed("connection_limit")  # (no log line: a flood would write thousands)
        self.transport.write(refusal(self.max_connections))
        self.transport.close(linger=False)

    def data_received(self, data: bytes) -> None:
        if self.transport.lingering:  # answered and closing: what the client still sends is read and dropped
            return
        if self.reserved is not None and self.line is not None:  # over the limit: a health check, or refused
            self.line += data
            self.line = self.line[EMPTY_LINES.match(self.line).end():]  # (empty lines first: skip_empty_lines)
            self.began = self.began or (time.monotonic() if self.line else None)
            if (verdict := health_check(self.line)) is True:
                data, self.line = self.line, None
            elif verdict is False:
                self._refuse()
                return
            else:  # (a request line still arriving)
                return
        super().data_received(data)
        if self.conn.their_state in READING and not self.transport.is_closing():
            self.quiet_since = self.quiet_since or time.monotonic()
            self._arm()
        else:  # a whole request: in progress until its response is complete
            self.quiet_since = None
            self._disarm()

    def on_response_complete(self) -> None:
        if self.reserved is not None:  # its health check answered: the room goes back, and a request pipelined
            self.transport.close()     # behind it is never read (closed first, uvicorn reads no further)
            super().on_response_complete()
            return
        super().on_response_complete()
        if self.conn.their_state in READING:  # not already reading a pipelined request
            self.quiet_since = time.monotonic()
        self._watch_output()

    def pause_writing(self) -> None:
        super().pause_writing()
        self._watch_output()

    def resume_writing(self) -> None:  # the client took in some of its answer: its deadline starts again
        super().resume_writing()
        self._watch_output()

    def send_400_response(self, msg: str) -> None:
        """What h11 refused (Bounded.error), as every other error: JSON (uvicorn's is plain text), with the status
        h11 gives it: 431 for a head over the limit, else 400."""
        scope = self._in_progress()  # a request whose body was arriving (its app is reading it)
        if getattr(self.conn.error, "error_status_hint", 400) == 431:
            self._closed("head_too_large", "a request head over %d bytes; answered 431 and closed", self.conn.max_head)
            reply = answer("431 Request Header Fields Too Large", f"the request head is over {self.conn.max_head} "
                           "bytes, the server's limit", "too_large")
        else:
            problem = self.conn.problem or f"the request is not valid HTTP/1.1: {h11_reason(self.conn.error)}"
            status = STATUSES.get(getattr(self.conn.error, "error_status_hint", 400), "400 Bad Request")
            if scope is not None:  # its body broke off: the app's access line says 400 (metrics.Observed)
                scope["xattn.bad_request"] = problem
            else:
                self._closed("bad_request", "%s; answered %s and closed", problem, status[:3])
            reply = answer(status, problem, "bad_request")
        self.transport.write(reply)
        self.transport.close()

    def _make_room(self) -> bool:
        """Close the connection quiet longest, if one has been quiet for QUIET_S; whether one was."""
        now = time.monotonic()
        quiet = [c for c in self.connections if c is not self and getattr(c, "quiet_since", None) is not None
                 and getattr(c, "reserved", None) is None and now - c.quiet_since >= QUIET_S
                 and not c.transport.is_closing() and not getattr(c.transport, "lingering", False)]
        if not quiet:
            return False
        oldest = min(quiet, key=lambda c: c.quiet_since)
        self._closed("made_room", "%d connections open: closed one quiet for %.1f s to make room",
                     len(self.connections) - 1, now - oldest.quiet_since)
        oldest._disarm()
        oldest.transport.close(linger=False)  # (never answered: nothing to wait for)
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        if self.reserved is not None and self.line is not None:  # held, and gone before it asked for /health
            self.metrics.connection_closed("connection_limit")
        self._disarm()
        self._stop_watching_output()
        super().connection_lost(exc)

    def _watch_output(self) -> None:
        """(Re)start the write deadline while the transport holds output the client has not taken in."""
        self._stop_watching_output()
        if self.transport.get_write_buffer_size():
            self.write_deadline = self.loop.call_later(self.write_timeout, self._not_reading)

    def _stop_watching_output(self) -> None:
        if self.write_deadline is not None:
            self.write_deadline.cancel()
            self.write_deadline = None

    def _not_reading(self) -> None:
        self.write_deadline = None
        if held := self.transport.get_write_buffer_size():
            if (scope := self._in_progress()) is not None and "xattn" in scope:  # an answer being sent: its access
                scope["xattn"]["error"] = "write_timeout"  # line says so, the one line it gets
            else:
                self._closed("write_timeout", "a client took in none of its answer for %g s (%d bytes waiting); "
                             "cut off", self.write_timeout, held)
            self.transport.abort()

    def _closed(self, reason: str, message: str, *args) -> None:
        """A connection closed that no request's access line tells of: one log line, JSON as the access lines are
        (its `event`, `reason` and what happened), and a count by `reason`."""
        self.metrics.connection_closed(reason)
        log_line(LOG, {"event": "connection_closed", "reason": reason, "detail": message % args})

    def _in_progress(self) -> dict | None:
        """The scope of the request this connection is answering (or reading), if any."""
        cycle = getattr(self, "cycle", None)
        return cycle.scope if cycle is not None and not cycle.response_complete else None

    def _arm(self) -> None:
        if self.deadline is None:
            self.deadline = self.loop.call_later(self.read_timeout, self._too_slow)

    def _disarm(self) -> None:
        if self.deadline is not None:
            self.deadline.cancel()
            self.deadline = None

    def _too_slow(self) -> None:
        self.deadline = None
        if self.transport.lingering:  # answered already, and closing (Lingering)
            return
        if self.reserved is not None and self.line is not None:  # held, and no health check came: refused
            self._refuse()
        elif not self.transport.is_closing():
            begun = self.conn.their_state is h11.SEND_BODY or self.conn.received_bytes()
            if (scope := self._in_progress()) is not None and "xattn" in scope:  # a request whose body was arriving:
                scope["xattn.read_timeout"] = True  # its app's access line says 408, not a client gone
            else:
                self._closed("read_timeout", "a client sent no whole request within %g s; " +
                             ("answered 408 and closed" if begun else "closed"), self.read_timeout)
            if begun:  # (a connection that sent nothing is closed without a word: it may be a client's spare one)
                self.transport.write(answer("408 Request Timeout", f"the request did not arrive within "
                                            f"{self.read_timeout:g} s, the server's read timeout", "timeout"))
            self.transport.close(linger=False)


LINGER_S = 2.0
"""Seconds a connection answered before its request had arrived whole (a body over the limit, a broken head) stays
open after its answer, its further bytes read and dropped: closed with them unread, the system resets the
connection, and the client may lose the answer with it (RFC 9112, 9.6); as Apache's lingering close."""


class Lingering:
    """A connection's transport whose close(), while the client may still be sending its request (its body unread:
    an answer given before it came whole; a broken head), shuts the writing side once the answer is out and reads on,
    dropping what comes (Guarded.data_received), until the client closes or LINGER_S have passed."""

    def __init__(self, transport: asyncio.Transport, protocol: Guarded):
        self._transport, self._protocol, self.lingering = transport, protocol, False

    def __getattr__(self, name: str):
        return getattr(self._transport, name)

    def close(self, linger: bool = True) -> None:
        conn, transport = self._protocol.conn, self._transport
        unread = conn.their_state is h11.SEND_BODY or conn.their_state is h11.ERROR
        if not linger or not unread or self.lingering or transport.is_closing() or not transport.can_write_eof():
            transport.close()
            return
        self.lingering = True
        self._protocol._disarm()  # (its read deadline: the request is answered)
        transport.resume_reading()
        transport.write_eof()  # (after what is buffered: the answer goes out first)
        self._protocol.loop.call_later(LINGER_S, transport.close)


def guarded(read_timeout: float, write_timeout: float, max_connections: int, metrics: Counter) -> partial:
    """The protocol class for uvicorn.Config(http=...); `metrics` counts the connections it closes."""
    return partial(Guarded, read_timeout=read_timeout, write_timeout=write_timeout, max_connections=max_connections,
                   metrics=metrics)
