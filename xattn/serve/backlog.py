"""Admission by time: when the server is behind, a request is refused at once (429) if the work admitted before it
would keep it waiting more than `limit_s` seconds, rather than admitted to time out later.

Counting requests (the batcher's queue_size) cannot tell that: a request may hold 1 sentence or 32, greedy or beam
16. Without this, requests arriving faster than the engine translates them were all admitted, took turns, and most
of them reached the timeout (504) having used the engine's time for nothing: in benchmarks/serve_overload.py, at
about twice the engine's rate, 114 and 125 of 150 sixteen-sentence beam-5 requests got 504 after 30 s.

The estimate: the engine gives every request an equal share of its time (serve/engine.py's fair turns), so while a
request of work w (api.check_work: rows x maximum output tokens, an upper bound known up front) runs, every request
admitted before it runs for at most as long as w takes; they delay it by the sum of those times, its own aside (the
limits on one request bound that). What work takes is in the engine's time, not its rows: a decoder step of r rows
takes about 4 ms and 0.18 ms a row on the benchmarks' 2-core machine with one thread (StepCost: the median step of
each width the engine ran lately), so work of few rows a step, such as one sentence, takes several times as long a
row as a batch of many. The rows a step of a request runs (`widths`) are its call's (for admission, which counts its
whole bound, those it started with); for a request not yet in one, those of the requests it will likely be merged
with. A search ends before its maximum length, so the work over-counts rows, by 1.5-2x on Multi30k: the estimate
errs on the side of refusing.

Taken from the batches the engine has been running, under light traffic or beside one long request of small steps,
the cost of wider steps is a guess (as much a row as the widest it ran). So nothing is refused unless the server is
behind: two requests admitted more than BEHIND x `limit_s` ago are still running (one alone may be a long request
that its limits let through). A burst is admitted (its requests are all new), and batched as it runs; an overload
that goes on is refused once the first two of it have waited that long.

A burst that arrives at once is admitted whole, since nothing in it has waited yet, and the batcher starts its calls
beside each other, to take turns: under fair turns they all end together, and when that is past their timeout
nothing is answered. So every CHECK_S seconds while the server is behind (`shed`), the backlog estimates when each
piece of work admitted will end: a call (Job.call) with the requests it serves, or a request in none (waiting, or
streamed). Its work left is the rows it will likely step less those it has stepped: the rows that the requests
answered lately stepped per source row (hypotheses x source tokens, whatever bound their settings gave), times its
own source rows, within its work's bound; before KNOWN requests have been answered, the bound itself (1.5-2x what a
search runs). In seconds, at the cost of its steps' rows: a piece with s seconds left for n requests ends once every
other piece j has run min(s_j, n_j x s / n) of its own. Newest first, work that would end after its requests'
deadline (their timeout), SLACK times that estimate, is refused (429) then, which leaves the others more of the
engine, rather than left to time out after using it for nothing; its call stops at its next step (every client of it
gone).

What it leaves out: the encoder's passes; that a step's cost grows with the positions it attends over (longer
sentences, later steps); that a call's steps have fewer rows as its sentences end (the rows of its latest step count
for all it has left); that requests merged will end at their longest sentence; and that one piece's sentences run
longer than the average. It errs on either side, and answers can still time out.
"""
from __future__ import annotations

import bisect
import math
import statistics
import time
from collections import deque
from dataclasses import dataclass
from itertools import islice
from typing import Any, Callable

MIN_BUSY_S = 0.5
"""Seconds of the engine's decoder steps before what they cost counts."""

BEHIND = 1 / 3
"""The server is behind while two requests admitted more than this share of `limit_s` ago are still running."""

ENDED = 64
"""Requests answered whose rows, against their source rows, the deadline check goes by (Backlog.per_source)."""

KNOWN = 8
"""Requests answered before the deadline check goes by their rows per source row rather than the work's bound."""

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
        self.estimate_s, self.limit_s = estimate_s, limit_s

    @property
    def retry_after(self) -> int:
        """Whole seconds until enough of the work ahead is done (at least 1)."""
        return max(1, math.ceil(self.estimate_s - self.limit_s))


@dataclass(frozen=True)
class StepCost:
    """Seconds of a decoder step of the engine, by its rows: from the median step of each width that the
    engine ran lately (Engine.step_costs, widths by powers of two), interpolated between them; a step narrower than
    any costs as much as the narrowest, one wider than any as much a row as the widest (either way it errs on the
    side of refusing). Medians and interpolation rather than one line fitted to all: steps of very many rows, or
    noisy ones of few, then cannot make a step of one row look nearly free. The encoder's passes are left out: they
    are the engine's steps of no rows, about a decoder step's time per sentence (and it would be wrong to spread
    their time over the steps left, as a first form did: early in a burst, most of the engine's time had gone to
    encoding, and the rest of the burst was taken to cost 2.5 times what it did)."""
    points: tuple[tuple[float, float], ...]  # (rows, seconds) of each width's median step, by rows

    @classmethod
    def fitted(cls, costs: list[tuple[int, float]]) -> StepCost:
        widths: dict[int, list[tuple[int, float]]] = {}
        for rows, seconds in costs:
            widths.setdefault(rows.bit_length(), []).append((rows, seconds))
        return cls(tuple(sorted((statistics.median(r for r, _ in steps), statistics.median(t for _, t in steps))
                                for steps in widths.values())))

    def step(self, width: float) -> float:
        """Seconds of a step of `width` rows."""
        (narrowest, least), (widest, most) = self.points[0], self.points[-1]
        if width <= narrowest:
            return least
        if width >= widest:
            return most * width / widest
        i = bisect.bisect_left(self.points, (width,))
        (r0, t0), (r1, t1) = self.points[i - 1], self.points[i]
        return t0 + (t1 - t0) * (width - r0) / (r1 - r0)

    def seconds(self, rows: float, width: float) -> float:
        """Busy seconds for `rows` rows stepped `width` rows a step."""
        width = max(1.0, width)
        return rows * self.step(width) / width


class Backlog:
    """The requests admitted and not yet ended, and what the engine's steps cost; `admit` refuses a request that
    the others would keep waiting more than `limit_s` seconds while the server is behind (none with no limit), and
    `shed` the work admitted that would end after its deadline. A request is a serve.engine.Job: its `work`,
    `width`, `deadline`, `call`, `settings`, `mergeable`, `texts` and `future`, which `shed` fails with Overloaded.
    `engine`: the seconds of its decoder steps so far (`stepping`) and its latest steps' `step_costs()`
    (serve.engine.Engine);
    `max_batch`: the most sentences the batcher merges into one call or continuous batch; `clock()` the time."""

    def __init__(self, limit_s: float | None, engine: Any, clock: Callable[[], float] = time.monotonic,
                 max_batch: int = 64):
        self.limit_s, self.engine, self.clock, self.max_batch = limit_s, engine, clock, max_batch
        self.admitted: dict[int, tuple[Any, float]] = {}  # id(job) -> the job and when it was admitted (in order)
        self.ended: deque[tuple[float, int]] = deque(maxlen=ENDED)  # (rows, source rows) of requests answered

    def cost(self) -> StepCost | None:
        """What the engine's steps cost (None before MIN_BUSY_S seconds of them)."""
        costs = self.engine.step_costs()
        return StepCost.fitted(costs) if costs and self.engine.stepping >= MIN_BUSY_S else None

    def widths(self, jobs: list, started: bool = False) -> dict[int, float]:
        """id(job) -> the rows a step of its work runs: its call's latest step (`started`: its first, the requests'
        widths); for a request in no call, those of the requests it will likely share one with, as the batcher
        merges them (in order of admission, up to max_batch sentences, those of equal settings), or its continuous
        batch's (the streamed requests of its settings, up to max_batch sentences)."""
        widths: dict[int, float] = {}
        calls: dict[Any, list] = {}    # the queued requests likely to share a call
        streams: dict[Any, list] = {}  # settings -> the streamed requests
        batch, texts = 0, 0            # the batcher's batch (max_batch sentences) each queued request will be in
        for job in jobs:
            if job.call is not None:
                widths[id(job)] = (not started and job.call.width) or sum(j.width for j in job.call.jobs)
            elif job.streamed:
                streams.setdefault(job.settings, []).append(job)
            else:
                if texts and texts + len(job.texts) > self.max_batch:
                    batch, texts = batch + 1, 0
                texts += len(job.texts)
                calls.setdefault((batch, job.settings) if job.mergeable else id(job), []).append(job)
        for group, most in [*((g, math.inf) for g in calls.values()), *((g, self.max_batch) for g in streams.values())]:
            width = min(most, sum(job.width for job in group))
            for job in group:
                widths[id(job)] = width
        return widths

    def behind(self) -> bool:
        """Whether two requests admitted more than BEHIND x limit_s ago are still running."""
        oldest = list(islice(self.admitted.values(), 2))  # (a dict keeps the order of admission)
        return len(oldest) == 2 and self.clock() - oldest[1][1] > BEHIND * self.limit_s

    def ahead(self, job) -> float | None:
        """Seconds the requests admitted would keep `job` waiting (None: no cost model yet): each runs beside it as
        much of its work's bound as `job` runs of its own."""
        if (cost := self.cost()) is None:
            return None
        others = [other for other, _ in self.admitted.values()]
        widths = self.widths([*others, job], started=True)  # (their work's bound, at the rows they start with)
        own = cost.seconds(job.work, widths[id(job)])
        return sum(min(cost.seconds(other.work, widths[id(other)]), own) for other in others)

    def admit(self, job) -> None:
        """Count the request in, or raise Overloaded (only while the server is behind; never one of no work)."""
        if job.work and self.limit_s is not None and self.behind():
            ahead = self.ahead(job)
            if ahead is not None and ahead > self.limit_s:
                raise Overloaded(ahead, self.limit_s)
        self.admitted[id(job)] = (job, self.clock())

    def shed(self) -> int:
        """Refuse the work admitted that would end after its deadline, newest first (only while the server is
        behind): its requests' futures fail with Overloaded, and they leave. How many requests."""
        if self.limit_s is None or not self.behind() or (cost := self.cost()) is None:
            return 0
        live = [job for job, _ in self.admitted.values() if not (job.future.done() or job.ended)]  # (the others: it
        widths = self.widths(live)                                    # gave up, or is answered: it leaves)
        pieces: dict[int, list] = {}  # id(call), or id(job) not in one -> its requests (by the newest's admission)
        for job in live:
            key = id(job.call) if job.call is not None else id(job)
            pieces[key] = pieces.pop(key, []) + [job]
        per_source = self.per_source()
        left = {key: (cost.seconds(work_left(jobs, per_source), widths[id(jobs[0])]), len(jobs))
                for key, jobs in pieces.items()}  # the engine's seconds left, requests
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
        source = sum(n for _, n in self.ended)
        return sum(rows for rows, _ in self.ended) / source if len(self.ended) >= KNOWN and source else None

    def leave(self, job) -> None:
        """The request ended (answered or not)."""
        self.admitted.pop(id(job), None)
        answered = job.future.done() and not job.future.cancelled() and job.future.exception() is None
        if not answered or not job.source:
            return
        if job.call is None:  # (streamed)
            self.ended.append((job.rows, job.source))
        elif source := sum(j.source for j in job.call.jobs):
            self.ended.append((job.call.rows * job.source / source, job.source))  # (its part of its call's rows)


def work_left(jobs: list, per_source: float | None) -> float:
    """The work left of requests that share a call (or of one request in none): the rows they will likely step,
    per_source x their source rows within their work's bound (the bound itself with per_source None), less the rows
    stepped so far."""
    call = jobs[0].call
    jobs, rows = (jobs, jobs[0].rows) if call is None else (call.jobs, call.rows)
    likely = sum(job.work if per_source is None else min(job.work, per_source * job.source) for job in jobs)
    return max(0.0, likely - rows)
