"""Admission by time: when the server is behind, a request is refused at once (429) if the work admitted before it
would keep it waiting more than `limit_s` seconds, rather than admitted to time out later.

Counting requests (the batcher's queue_size) cannot tell that: a request may hold 1 sentence or 32, greedy or beam
16. Without this, requests arriving faster than the engine translates them were all admitted, took turns, and most
of them reached the timeout (504) having used the engine's time for nothing (benchmarks/serve_overload.py; the
figures: benchmarks/README.md, "Admission by time").

The estimate: the engine gives every request an equal share of its time (serve/engine.py's fair turns), so while a
request of work w (work.check_work: rows x maximum output tokens, an upper bound known up front) runs, every request
admitted before it runs at most w of its own work; they delay it by sum(min(w_j, w)) units of work, its own work
aside (the limits on one request bound that). The engine's rate is the rows its decoder steps ran per second of its
busy time, over the last WINDOW_S seconds of it: the rows are counted at every step, so it does not jump when a
large request ends. A search ends before its maximum length, so the work over-counts rows, by a few times on a
translation model's usual outputs: the estimate errs on the side of refusing.

That rate is the one of the batches the engine has been running: under light traffic, or beside one long request of
small steps, several times below what it reaches with full batches. So nothing is refused unless the server is
behind: two requests admitted more than BEHIND x `limit_s` ago are still running (one alone may be a long request
that its limits let through). A burst is admitted (its requests are all new), and batched as it runs; an overload
that goes on is refused once the first two of it have waited that long.

A burst that arrives at once is admitted whole, since nothing in it has waited yet, and the batcher starts its calls
beside each other, to take turns: under fair turns they all end together, and when that is past their timeout
nothing is answered. So every CHECK_S seconds while the server is behind (`shed`), the backlog estimates when each
piece of work admitted will end: a call (Job.call) with the requests it serves, or a request in none (waiting, or
streamed). Its work left is the rows it will likely step less those it has stepped: the rows that the requests
answered lately stepped per source row (hypotheses x source tokens, whatever bound their settings gave), times its
own source rows, within its work's bound, and once it has run past that, how much further those that ran longer ran
(work_left, Lengths.beyond); before KNOWN requests have been answered, LIKELY rows per source row (as long as the
source; the bound runs several times what a search does). The engine's turns are fair per request, so work taking
s seconds of the engine for n requests ends once every other piece j has run min(s_j, n_j x s / n) of its own
(seconds_left: its rows at the engine's rate; a call that has run a few steps at the slowest of that, the rate of
the engine's latest LATEST_S and its own pace, below). Newest first, work that would end after its requests'
deadline (their timeout), SLACK times that estimate, is refused (429) then, which leaves the others more of the
engine, rather than left to time out after using it for nothing; its call stops at its next step (every client of
it gone).

The engine's turns share its time, not its rows, and a step of few rows runs fewer rows a second than the rate, which
is the engine's over all its steps: so a call that has run PACED steps after its first goes by the pace of its own
steps where that is slower than the rate (seconds_left). Pricing every piece by a model of what its steps cost,
admission included, was tried and refused more and later (benchmarks/README.md, "Tried and taken out: pricing the
backlog's work by what its decoder steps cost").

What it leaves out: the pace of work not yet in a call, or streamed, or that has run fewer steps, which goes by the
rate; the encoder's passes of calls not yet started (the rate holds them, on average); that a call's steps have
fewer rows, each dearer, as its sentences end; the requests still to arrive, which take their shares; that a call's
spread of lengths is narrower than one request's, whose lengths Lengths.beyond goes by (weighted by source rows);
and, before KNOWN requests have been answered, that a call past LIKELY still runs. It errs on either side, and
answers can still time out.
"""
from __future__ import annotations

import bisect
import math
import time
from collections import deque
from dataclasses import dataclass
from itertools import islice
from typing import Any, Callable, Iterable

WINDOW_S = 10.0
"""Seconds of the engine's busy time over which its rate is measured."""

LATEST_S = 2.0
"""Seconds of the engine's busy time of its latest rate, which the deadline check goes by for running calls where
it is the slower (Backlog.latest, seconds_left): the rate over the window is that of the work that ran then, and
when the work changes to steps of fewer rows, or the machine slows, it prices what is left at a fraction of its
cost: a burst beside one-sentence requests, once its calls were down to their tails, got 504s by the window's rate
(the figures: benchmarks/README.md, "Running calls go by the thread's latest rate")."""

BUSIEST = 0.8
"""The least share of the wall-clock time over the latest rate's span that the engine must have been busy for the
deadline check to go by it (Backlog.latest): the latest LATEST_S of busy time after an idle spell reach back to the
end of the work before it, whose steps were few rows each (a burst's tails), and would price a new burst at that."""

MIN_BUSY_S = 0.5
"""Seconds of the engine's busy time before its rate counts."""

BEHIND = 1 / 3
"""The server is behind while two requests admitted more than this share of `limit_s` ago are still running."""

ENDED = 64
"""Requests answered whose rows, against their source rows, the deadline check goes by (Backlog.lengths)."""

KNOWN = 8
"""Requests answered before the deadline check goes by their rows per source row rather than LIKELY."""

LIKELY = 1.0
"""The rows per source row that the deadline check expects before KNOWN requests have been answered (a server's
first burst): a translation as long as its source, which the SLACK leaves 25% to. Not the work's bound: that is
over twice as much (max_len_a 1.5, max_len_b 10: 32 tokens for a source of 14), by which a fresh server refused
most of a burst that it would have answered in time (the figures: benchmarks/README.md, "A fresh server's first
burst"). Output about as long as the source is what a translation model gives; a model whose outputs run longer
than SLACK x its sources is refused too little until KNOWN requests are answered."""

SLACK = 1.25
"""The deadline check's allowance for its estimate's errors: work whose estimated end, this many times as far off,
is past its deadline is refused (without it, work kept to end just in time timed out on the slightest delay)."""

CHECK_S = 0.25
"""Seconds between two checks of the work admitted against its deadline (Backlog.shed)."""


class Overloaded(Exception):
    """Refused: the requests admitted before this one would keep it waiting too long (on arrival: `limit_s` is the
    limit), or its work would end past its timeout (later, `to_timeout`: `limit_s` is the time left to it)."""

    def __init__(self, estimate_s: float, limit_s: float, to_timeout: bool = False):
        super().__init__(f"up to about {estimate_s:.1f} s of translation left for this request, over the "
                         f"{limit_s:.1f} s to its timeout" if to_timeout else
                         f"about {estimate_s:.1f} s of translation ahead of this request, over {limit_s:g} s")
        self.estimate_s, self.limit_s, self.to_timeout = estimate_s, limit_s, to_timeout

    @property
    def retry_after(self) -> int:
        """Whole seconds until enough of the work ahead is done (at least 1)."""
        return max(1, math.ceil(self.estimate_s - self.limit_s))


class Backlog:
    """The requests admitted and not yet ended, and the engine's rate; `admit` refuses a request that the others
    would keep waiting more than `limit_s` seconds while the server is behind (none with no limit), and `shed` the
    work admitted that would end after its deadline. A request is a serve.engine.Job: its `work`, `deadline`,
    `call` and `future`, which `shed` fails with Overloaded. `progress()` gives the engine's busy seconds and decoder
    rows so far (Engine.busy, Engine.rows); `clock()` the time."""

    def __init__(self, limit_s: float | None, progress: Callable[[], tuple[float, int]],
                 clock: Callable[[], float] = time.monotonic):
        self.limit_s, self.progress, self.clock = limit_s, progress, clock
        self.admitted: dict[int, tuple[Any, float]] = {}  # id(job) -> the job and when it was admitted (in order)
        self.samples: deque[tuple[float, int, float]] = deque([(0.0, 0, -math.inf)])  # (busy, rows, when), at each
        #                                                  admission, end and check
        self.ended: deque[tuple[float, int]] = deque(maxlen=ENDED)  # (rows, source rows) of requests answered

    def _sample(self) -> None:
        busy, rows = self.progress()
        if len(self.samples) > 2 and busy - self.samples[-2][0] < WINDOW_S / 64:  # (an idle server's checks: one)
            self.samples[-1] = (busy, rows, self.clock())
        else:
            self.samples.append((busy, rows, self.clock()))
        while len(self.samples) > 2 and self.samples[1][0] <= busy - WINDOW_S:  # the first: the window's start
            self.samples.popleft()

    def rate(self) -> float | None:
        """Rows per second of the engine's busy time, over the window (None before MIN_BUSY_S of it)."""
        (busy0, rows0, _), (busy, rows, _) = self.samples[0], self.samples[-1]
        if busy - busy0 < MIN_BUSY_S or rows == rows0:
            return None
        return (rows - rows0) / (busy - busy0)

    def latest(self) -> float | None:
        """Rows per second of the engine's busy time over its latest LATEST_S, if it was busy for most of that
        span (BUSIEST): not over an idle spell, back to the end of earlier work (None then, or before that much)."""
        busy, rows, now = self.samples[-1]
        for busy0, rows0, when in reversed(self.samples):
            if busy - busy0 >= LATEST_S:
                return (rows - rows0) / (busy - busy0) if rows > rows0 and busy - busy0 >= BUSIEST * (now - when) \
                    else None
        return None

    def behind(self) -> bool:
        """Whether two requests admitted more than BEHIND x limit_s ago are still running."""
        oldest = list(islice(self.admitted.values(), 2))  # (a dict keeps the order of admission)
        return len(oldest) == 2 and self.clock() - oldest[1][1] > BEHIND * self.limit_s

    def ahead(self, work: int) -> float | None:
        """Seconds the requests admitted would keep one of `work` waiting (None: no rate yet)."""
        rate = self.rate()
        return None if rate is None else sum(min(job.work, work) for job, _ in self.admitted.values()) / rate

    def admit(self, job) -> None:
        """Count the request in, or raise Overloaded (only while the server is behind; never one of no work)."""
        self._sample()
        if job.work and self.limit_s is not None and self.behind():
            ahead = self.ahead(job.work)
            if ahead is not None and ahead > self.limit_s:
                raise Overloaded(ahead, self.limit_s)
        self.admitted[id(job)] = (job, self.clock())

    def shed(self) -> int:
        """Refuse the work admitted that would end after its deadline, newest first (only while the server is
        behind): its requests' futures fail with Overloaded, and they leave. How many requests."""
        self._sample()
        if self.limit_s is None or not self.behind() or (rate := self.rate()) is None:
            return 0
        pieces: dict[int, list] = {}  # id(call), or id(job) not in one -> its requests (by the newest's admission)
        for job, _ in self.admitted.values():
            if not (job.future.done() or job.ended):  # (its client gave up, or it is answered: it leaves)
                key = id(job.call) if job.call is not None else id(job)
                pieces[key] = pieces.pop(key, []) + [job]
        lengths = self.lengths()
        # each piece's engine seconds left, and its requests
        latest = self.latest()
        left = {key: (seconds_left(jobs, lengths, rate, latest), len(jobs)) for key, jobs in pieces.items()}
        now, refused = self.clock(), 0
        for key in reversed(list(pieces)):
            seconds, n = left[key]
            deadline = min((job.deadline for job in pieces[key] if job.deadline is not None), default=math.inf)
            ends = SLACK * sum(min(s, m * seconds / n) for s, m in left.values())  # seconds from now
            if seconds and now + ends > deadline:
                for job in pieces[key]:
                    job.future.set_exception(Overloaded(ends, max(0.0, deadline - now), to_timeout=True))
                    del self.admitted[id(job)]
                refused += len(pieces[key])
                del left[key]
        return refused

    def per_source(self) -> float | None:
        """The rows that the last ENDED requests answered stepped per source row (hypotheses x source tokens): how
        long their translations ran against their sources; None before KNOWN of them."""
        return lengths.mean if (lengths := self.lengths()) is not None else None

    def lengths(self) -> Lengths | None:
        """How long the translations of the last ENDED requests answered ran against their sources (None before
        KNOWN of them)."""
        return Lengths.of(self.ended) if len(self.ended) >= KNOWN else None

    def leave(self, job) -> None:
        """The request ended (answered or not)."""
        self.admitted.pop(id(job), None)
        self._sample()
        answered = job.future.done() and not job.future.cancelled() and job.future.exception() is None
        if not answered or not job.source or job.least:  # (a length its min_len set tells nothing of the model's)
            return
        if job.call is None:  # (streamed)
            self.ended.append((job.rows, job.source))
        elif source := sum(j.source for j in job.call.jobs):
            self.ended.append((job.call.rows * job.source / source, job.source))  # (its part of its call's rows)


PACED = 8
"""Steps after its first (which encodes; with alternatives, or texts in several batches, later steps encode too)
after which a call's own pace tells how long its work left will take: not fewer, so that a few steps slowed by
something else (the event loop holding the GIL) do not set it."""


def seconds_left(jobs: list, lengths: Lengths | None, rate: float, latest: float | None = None) -> float:
    """The engine's seconds that the work left of requests sharing a call (or of one request in none) will take:
    at the engine's `rate` (rows a second over all its work, encoding included); once its call has run PACED steps,
    at the slowest of that, the engine's `latest` rate (Backlog.latest) and the pace of the call's own steps.

    A step of few rows costs several times as much a row as a wide one (benchmarks/README.md: pricing the
    backlog's work by what its decoder steps cost), so by the rate alone a call of one row a step beside wide ones
    seemed to end in time until its last half second, and held them up meanwhile. Never faster than the rate: a
    wide call's pace leaves out the encoder and its own tail of fewer, dearer rows, and would make it seem to end
    sooner than the rate does. The latest rate tells what the engine's steps cost now, once a burst's calls are
    down to their tails; not for work that has not run yet, which may be as wide as they were (a new burst
    arriving beside an old one's tails, priced at the tails' rate, was refused at once: a review's probe)."""
    work, call = work_left(jobs, lengths), jobs[0].call
    steps, rows, seconds = call.paced if call is not None else (0, 0, 0.0)
    if steps < PACED or not rows:
        return work / rate
    return work * max(1 / rate, 1 / latest if latest else 0.0, seconds / rows)


def work_left(jobs: list, lengths: Lengths | None) -> float:
    """The work left of requests that share a call (or of one request in none): the rows they will likely step,
    lengths.mean x their source rows (LIKELY with no lengths yet) within their work's bound (the bound itself for a
    request whose source rows are not known), less the rows stepped so far; and, within the bound, no less than
    how much further the translations that ran longer than they have so far ran (Lengths.beyond). So a call past
    the mean, its longest sentences still running (often to their maximum length), is not taken to have ended: one
    with 70 rows left by the mean ran 605 more, and got 504. A request's min_len sets how many rows it steps at
    least (Job.least), whatever the mean: requests of min_len 500 were taken to end in time, and all got 504."""
    call = jobs[0].call
    jobs, rows = (jobs, jobs[0].rows) if call is None else (call.jobs, call.rows)
    mean = LIKELY if lengths is None else lengths.mean
    left = sum(min(job.work, max(mean * job.source, job.least)) if job.source else job.work for job in jobs) - rows
    source = sum(job.source for job in jobs)
    if lengths is not None and source and all(job.source for job in jobs):
        left = max(left, min(source * lengths.beyond(rows / source), sum(job.work for job in jobs) - rows))
    return max(0.0, left)


@dataclass(frozen=True)
class Lengths:
    """How long the translations of the requests answered lately ran against their sources (Backlog.lengths): their
    rows per source row on the whole (`mean`), and each one's, with its source rows (`ratios`, by ratio; `above`:
    the weights and weighted ratios from each on)."""
    mean: float
    ratios: list[float]
    above: list[tuple[float, float]]

    @classmethod
    def of(cls, ended: Iterable[tuple[float, int]]) -> Lengths | None:
        """From (rows, source rows) of requests answered (None without source rows): their rows per source row on
        the whole is the mean of each one's, by its source rows."""
        pairs = sorted((rows / source, source) for rows, source in ended if source)
        above = [(0.0, 0.0)]
        for ratio, source in reversed(pairs):
            above.append((above[-1][0] + source, above[-1][1] + source * ratio))
        above.reverse()
        return cls(above[0][1] / above[0][0], [ratio for ratio, _ in pairs], above) if pairs else None

    def beyond(self, ratio: float) -> float:
        """How many rows per source row further than `ratio` a translation that has run that far will likely run:
        the mean excess over it of those that ran further, by their source rows; past all of them, the mean excess
        over the mean of those that ran past it."""
        weight, weighted = self.above[bisect.bisect_right(self.ratios, ratio)]
        if not weight:
            ratio = self.mean
            weight, weighted = self.above[bisect.bisect_right(self.ratios, ratio)]
        return weighted / weight - ratio if weight else 0.0
