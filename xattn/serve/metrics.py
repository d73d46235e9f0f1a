"""What `xattn serve` reports about itself: one structured log line per request, and Prometheus metrics at
GET /metrics (the text exposition format, written here: no client library needed).

Metrics: requests by route and status, request latency (a histogram per route); per model (a `model` label, the
model's pair such as de-en): sentences per translate call and in the continuous batch, the queue depth, whether it
has loaded, requests stopped before their end (clients gone), and output tokens (their rate is tokens per second);
and the connections the guards closed or refused that no request's access line tells of (serve/connections.py).
"""
from __future__ import annotations

import json
import logging
import threading
import time
from collections import defaultdict
from typing import Callable

ACCESS = logging.getLogger("xattn.serve.access")


def log_line(log: logging.Logger, fields: dict) -> None:
    """One JSON line of the server's log, with the time it was written (`at`, UTC): the access lines and the
    connection guards' (serve/connections.py) alike."""
    if log.isEnabledFor(logging.INFO):
        at = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime())
        log.info(json.dumps({"at": at, **fields}, ensure_ascii=False))
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)
CLOSED_REASONS = ("connection_limit", "made_room", "head_too_large", "bad_request", "read_timeout", "write_timeout")


class Histogram:
    def __init__(self, buckets: tuple):
        self.buckets, self.counts, self.sum, self.count = buckets, [0] * len(buckets), 0.0, 0

    def observe(self, value: float) -> None:
        for i, bound in enumerate(self.buckets):
            if value <= bound:
                self.counts[i] += 1
        self.sum += value
        self.count += 1

    def lines(self, name: str, labels: str = "") -> list[str]:
        sep = "," if labels else ""
        out = [f'{name}_bucket{{{labels}{sep}le="{b:g}"}} {c}' for b, c in zip(self.buckets, self.counts)]
        return out + [f'{name}_bucket{{{labels}{sep}le="+Inf"}} {self.count}',
                      f"{name}_sum{{{labels}}} {self.sum:.6f}" if labels else f"{name}_sum {self.sum:.6f}",
                      f"{name}_count{{{labels}}} {self.count}" if labels else f"{name}_count {self.count}"]


class BatchMetrics:
    """One model's batches, reported by its batcher and engine thread: sentences per translate call and in the
    continuous batch per decoder step, and the requests whose decoding stopped before its end (their clients had
    gone, or timed out)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.batch = Histogram(BATCH_BUCKETS)
        self.stream_rows = Histogram(BATCH_BUCKETS)
        self.stopped = 0

    def stop(self, requests: int) -> None:
        with self.lock:
            self.stopped += requests

    def call(self, sentences: int) -> None:
        with self.lock:
            self.batch.observe(sentences)

    def step(self, rows: int) -> None:
        with self.lock:
            self.stream_rows.observe(rows)


class Metrics:
    """Counters and histograms of the server, updated from the event loop; each model's batches in its
    BatchMetrics (`model(label)`), updated from its engine thread too."""

    def __init__(self):
        self.lock = threading.Lock()
        self.requests: dict[tuple[str, int], int] = defaultdict(int)
        self.latency: dict[str, Histogram] = {}
        self.models: dict[str, BatchMetrics] = {}
        self.tokens: dict[str, int] = defaultdict(int)  # output tokens translated, by model
        self.texts: dict[str, int] = defaultdict(int)  # texts and characters translated (answered 200), by model
        self.characters: dict[str, int] = defaultdict(int)
        self.closed: dict[str, int] = dict.fromkeys(CLOSED_REASONS, 0)  # connections, by reason
        self.next_id = 0

    def model(self, label: str) -> BatchMetrics:
        with self.lock:
            return self.models.setdefault(label, BatchMetrics())

    def request_id(self) -> int:
        with self.lock:
            self.next_id += 1
            return self.next_id

    def connection_closed(self, reason: str) -> None:
        """A connection closed or refused by the connection guards before any request of it reached the app."""
        with self.lock:
            self.closed[reason] += 1

    def finished(self, route: str, status: int, seconds: float, record: dict) -> None:
        with self.lock:
            self.requests[(route, status)] += 1
            self.latency.setdefault(route, Histogram(LATENCY_BUCKETS)).observe(seconds)
            if "model" in record:
                self.tokens[record["model"]] += record.get("output_tokens", 0)
                if status == 200:
                    self.texts[record["model"]] += record.get("texts", 0)
                    self.characters[record["model"]] += record.get("characters", 0)
        log_line(ACCESS, {"route": route, "status": status, "ms": round(1000 * seconds, 1), **record})

    def exposition(self, models: dict[str, tuple[bool, int]]) -> str:
        """The text format; `models`: for each model's label, whether it has loaded and its queue depth."""
        with self.lock:
            lines = ["# HELP xattn_requests_total Requests answered, by route and status.",
                     "# TYPE xattn_requests_total counter"]
            lines += [f'xattn_requests_total{{route="{r}",status="{s}"}} {n}' for (r, s), n in sorted(self.requests.items())]
            lines += ["# HELP xattn_request_seconds Time from a request's arrival to its answer.",
                      "# TYPE xattn_request_seconds histogram"]
            for route, hist in sorted(self.latency.items()):
                lines += hist.lines("xattn_request_seconds", f'route="{route}"')
            labels = {name: f'model="{escaped(name)}"' for name in models}
            batches = {name: self.models.get(name) or BatchMetrics() for name in models}
            for metric, help, field in (("xattn_batch_sentences", "Sentences per translate call.", "batch"),
                                        ("xattn_stream_sentences", "Sentences in the continuous batch, per decoder "
                                         "step.", "stream_rows")):
                lines += [f"# HELP {metric} {help}", f"# TYPE {metric} histogram"]
                for name, batch in batches.items():
                    with batch.lock:
                        lines += getattr(batch, field).lines(metric, labels[name])
            lines += ["# HELP xattn_queue_depth Requests waiting for the model.", "# TYPE xattn_queue_depth gauge",
                      *[f"xattn_queue_depth{{{labels[name]}}} {depth}" for name, (_, depth) in models.items()],
                      "# HELP xattn_model_ready 1 once the model has loaded, else 0 (loading, or failed to).",
                      "# TYPE xattn_model_ready gauge",
                      *[f"xattn_model_ready{{{labels[name]}}} {int(ready)}" for name, (ready, _) in models.items()],
                      "# HELP xattn_stopped_total Decoding jobs stopped before their end, their clients gone or timed "
                      "out (a request's job; a file's is one).", "# TYPE xattn_stopped_total counter",
                      *[f"xattn_stopped_total{{{labels[name]}}} {batches[name].stopped}" for name in models],
                      "# HELP xattn_output_tokens_total Tokens of the translations answered (rate: tokens per second).",
                      "# TYPE xattn_output_tokens_total counter",
                      *[f"xattn_output_tokens_total{{{labels[name]}}} {self.tokens[name]}" for name in models],
                      "# HELP xattn_texts_total Texts translated (a file's lines that are not blank), in answers of "
                      "status 200.", "# TYPE xattn_texts_total counter",
                      *[f"xattn_texts_total{{{labels[name]}}} {self.texts[name]}" for name in models],
                      "# HELP xattn_characters_total Characters of the texts translated (a file's, blank lines "
                      "included), in answers of status 200.", "# TYPE xattn_characters_total counter",
                      *[f"xattn_characters_total{{{labels[name]}}} {self.characters[name]}" for name in models],
                      "# HELP xattn_connections_closed_total Connections closed or refused that no request's "
                      "access line tells of: over --max-connections (503), an idle one to make room for a new one, a "
                      "head over the limit (431), not HTTP (400), no whole request within --read-timeout, answers not "
                      "taken in within --write-timeout.", "# TYPE xattn_connections_closed_total counter",
                      *[f'xattn_connections_closed_total{{reason="{r}"}} {n}' for r, n in self.closed.items()],
                      "# HELP xattn_uptime_seconds Seconds since the server started.", "# TYPE xattn_uptime_seconds gauge",
                      f"xattn_uptime_seconds {time.monotonic() - START:.1f}"]
        return "\n".join(lines) + "\n"


def escaped(value: str) -> str:
    """A label value as the text format writes it (a language code is the operator's to choose)."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


START = time.monotonic()


class Observed:
    """ASGI middleware: times every HTTP request, and on its answer logs one line and counts it (route: the
    matched route's path, `other` for none, so unknown paths add no labels); a handler adds fields to
    `scope["xattn"]` (the model that answered, texts, characters, output tokens, how it was batched)."""

    def __init__(self, app, metrics: Metrics, routes: Callable[[], list] = list):
        self.app, self.metrics, self.routes = app, metrics, routes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        start, status = time.perf_counter(), [500]
        scope["xattn"] = {"id": self.metrics.request_id()}

        async def sending(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)
        try:
            await self.app(scope, receive, sending)
        finally:
            route = getattr(scope.get("route"), "path", None) or self.route_of(scope)
            if scope.get("xattn.bad_request"):  # the connection's guard answered 400 to its broken body
                status[0], scope["xattn"]["error"] = 400, "bad_request"
            self.metrics.finished(route, status[0], time.perf_counter() - start, scope["xattn"])

    def route_of(self, scope) -> str:
        """The path of the route `scope` is for, where the router did not say (a route of Starlette's own, such as
        /openapi.json; a CORS preflight answered before routing); `other` for none."""
        from starlette.routing import Match

        return next((route.path for route in self.routes() if route.matches(scope)[0] != Match.NONE), "other")
