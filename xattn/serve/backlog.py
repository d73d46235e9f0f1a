"""Admission by time: a request is refused at once (429) when the work admitted before it would keep it from being
answered within `limit_s` seconds, rather than admitted to time out later.

Counting requests (the batcher's queue_size) cannot tell that: a request may hold 1 sentence or 32, greedy or beam
16. Without this, requests arriving faster than the engine translates them were all admitted, took turns, and
most of them reached the timeout (504) having used the engine's time for nothing: at twice the engine's rate,
118 of 150 sixteen-sentence beam-5 requests got 504 after 30 s and the server answered a quarter of what it can.

The estimate: the engine gives every request an equal share of its time (serve/engine.py's fair turns), so while a
request of work w (api.check_work: rows x maximum output tokens, an upper bound known up front) runs, every request
admitted before it runs at most w of its own work too; it ends after at most sum(min(w_j, w)) + w units of work.
The engine's rate in those units is measured over its last WINDOW_S seconds of busy time, two ways, and the larger
taken: the work of the requests answered, per second; and the rows its decoder steps ran, per second (a row-step
is a unit of work, but a search ends before its maximum length, so this one under-counts, by 1.5-2x on Multi30k;
it is there from the first step, when under a sudden overload nothing is answered for a while, every request
sharing the engine). So the estimate errs on the side of refusing. Nothing is refused by time before the engine
has been busy for MIN_BUSY_S.
"""
from __future__ import annotations

import math
from collections import deque
from typing import Callable

WINDOW_S = 10.0
"""Seconds of the engine's busy time over which its rate is measured."""

MIN_BUSY_S = 0.5
"""Seconds of the engine's busy time before its rate counts."""


class Overloaded(Exception):
    """Refused: the requests admitted before this one would keep it from being answered in time."""

    def __init__(self, estimate_s: float, limit_s: float):
        super().__init__(f"about {estimate_s:.0f} s of translation ahead, over {limit_s:g} s")
        self.estimate_s, self.limit_s = estimate_s, limit_s

    @property
    def retry_after(self) -> int:
        """Whole seconds until enough of the work ahead is done (at least 1)."""
        return max(1, math.ceil(self.estimate_s - self.limit_s))


class Backlog:
    """The work of the requests admitted and not yet ended, and the engine's rate; `admit` refuses a request that
    would not end within `limit_s` seconds. `progress()` gives the engine's busy seconds and decoder rows so far
    (Engine.busy, Engine.rows)."""

    def __init__(self, limit_s: float, progress: Callable[[], tuple[float, int]]):
        self.limit_s, self.progress = limit_s, progress
        self.admitted: dict[int, int] = {}       # id(job) -> its work, from admission to its end
        self.done = 0                             # work of the requests answered so far
        self.samples: deque[tuple[float, int, int]] = deque([(0.0, 0, 0)])  # (busy, rows, done), at each event

    def _sample(self) -> None:
        busy, rows = self.progress()
        self.samples.append((busy, rows, self.done))
        while len(self.samples) > 2 and self.samples[1][0] <= busy - WINDOW_S:  # the first: the window's start
            self.samples.popleft()

    def rate(self) -> float | None:
        """Work per second of the engine's busy time, over the window (None before MIN_BUSY_S of it)."""
        (busy0, rows0, done0), (busy, rows, done) = self.samples[0], self.samples[-1]
        if busy - busy0 < MIN_BUSY_S:
            return None
        return max(rows - rows0, done - done0) / (busy - busy0)

    def estimate(self, work: int) -> float | None:
        """Seconds until a request of `work` would end, with what is admitted (None: no rate yet)."""
        rate = self.rate()
        if not rate:
            return None
        return (sum(min(w, work) for w in self.admitted.values()) + work) / rate

    def admit(self, job_id: int, work: int) -> None:
        """Count the request in, or raise Overloaded. A request with nothing admitted before it is never refused
        (the limits on one request bound it), nor one of no work."""
        self._sample()
        if work and self.admitted:
            estimate = self.estimate(work)
            if estimate is not None and estimate > self.limit_s:
                raise Overloaded(estimate, self.limit_s)
        self.admitted[job_id] = work

    def leave(self, job_id: int, answered: bool) -> None:
        """The request ended; `answered`: with its translations (its work then counts towards the rate)."""
        work = self.admitted.pop(job_id, 0)
        if answered:
            self.done += work
        self._sample()
