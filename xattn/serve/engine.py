"""The engine: the one thread that runs the model for the batcher (serve/batcher.py), one decoder step at a time.

It runs translate calls (`Engine.run`: a call's decoding.Steps, dropped between two steps once every client of
it has gone) and continuous batches of streamed requests (`Engine.submit`: plain greedy search, Translator.stream)
in fair turns: the next step is always one of the work that has had the least engine time per request so far.
Streamed sentences join their continuous batch between two decoder steps (those that arrived during a step in one
encoder pass), up to `max_rows` sentences at a time, and each request is answered as soon as its last sentence
ends, so a long sentence never holds up the others' answers and nobody waits for a batch to fill. A request
whose client gave up leaves the batch at the next step.
"""
from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable, Protocol

from xattn.decoding import Steps
from xattn.serve.metrics import BatchMetrics


class Dropped(Exception):
    """A call stopped between two steps: every request in it had gone."""


class Crowded(Exception):
    """A long call refused: MAX_LONG long calls take turns already."""


@dataclass
class Job:
    texts: list[str]
    settings: Hashable                # requests with equal settings may share a call
    mergeable: bool
    future: asyncio.Future = field(repr=False)
    work: int = 0                     # decoding work (work.check_work): over `long_work`, others run beside it
    long: bool = False                # its work is over the batcher's long_work: see MAX_LONG
    source: int = 0                   # hypotheses x source tokens (api.Settings.source): what it will likely step
    least: int = 0                    # the rows its min_len makes it step at least (api.Settings.least)
    deadline: float | None = None     # its timeout, on its event loop's clock (backlog.Backlog.shed)
    call: Call | None = field(default=None, repr=False)  # the call it is in, once in one (Engine.run)
    rows: int = 0                     # the rows its sentences stepped in a continuous batch (a call's: Call.rows)
    ended: bool = False               # its translation ended: its answer is on its way to the event loop
    results: list | None = field(default=None, repr=False)  # a streamed job's, as its sentences end
    passed: int = 0                   # sentences streamed ahead of it while it waited for room (Engine._admit)


class Streams(Protocol):
    """What the batcher needs to stream requests: which settings can be, and a stream for them."""

    def streamable(self, settings: Hashable) -> bool: ...

    def open_stream(self, settings: Hashable) -> Any: ...  # add(texts, tags), step() -> [(tag, result)], cancel(tag)


@dataclass
class Call:
    """A translate call on the engine: `start()` makes its Steps there; dropped once all `jobs` are done."""
    start: Callable[[], Steps[list]]
    jobs: list[Job]
    future: Future
    steps: Steps[list] | None = None
    used: float = 0.0                 # engine seconds spent on it per request (Engine's fair share)
    since: float = 0.0                # the Engine's clock when it became active
    own: float = 0.0                  # the engine thread's CPU seconds on its steps (see LONG_S)
    turned: int = 0                   # when it turned long, counted among long calls (0: not yet; MAX_LONG)
    rows: int = 0                     # the rows its steps ran so far (backlog.work_left)
    paced: tuple[int, int, float] = (0, 0, 0.0)  # its steps but the first (which encodes), their rows and seconds

    @property
    def long(self) -> bool:
        """Long by its work (Job.long), or by the CPU time its steps took: over LONG_S per request it serves."""
        return any(job.long for job in self.jobs) or self.own > LONG_S * len(self.jobs)

    @property
    def gone(self) -> bool:
        """Every client of it gave up."""
        return all(job.future.done() for job in self.jobs)

    @property
    def weight(self) -> int:
        """The requests it serves: those whose clients are still there (at least 1)."""
        return max(1, sum(not job.future.done() for job in self.jobs))

    def advance(self) -> tuple[bool, int]:
        """One step (the first makes the Steps): whether the call is over (its future then set, unless the batcher
        cancelled it, stopping: set then, it would end the engine's thread with InvalidStateError), and the rows
        the step ran (as far as its Steps say)."""
        if self.future.cancelled() or self.gone:  # every client gave up: stop here
            self.stop(Dropped())
            return True, 0
        try:
            if self.steps is None:
                self.steps = self.start()
            rows = next(self.steps) or 0
            self.rows += rows
            return False, rows
        except StopIteration as end:
            for job in self.jobs:
                job.ended = True
            outcome = (self.future.set_result, end.value)
        except Exception as e:  # noqa: BLE001 - the caller's to handle
            outcome = (self.future.set_exception, e)
        if self.future.set_running_or_notify_cancel():  # (False: cancelled meanwhile, from the event loop)
            outcome[0](outcome[1])
        return True, 0

    def stop(self, error: Exception) -> None:
        """End it before its end: its Steps closed, its future failed with `error` (unless cancelled)."""
        if self.steps is not None:
            self.steps.close()
        if self.future.set_running_or_notify_cancel():
            self.future.set_exception(error)


MAX_LONG = 4
"""Long calls (Call.long) that may take turns at once; one more is refused (Crowded: the server answers 429, retry
later): the one that turned long last, on arrival by its work or while it runs by its time, never one counted
before it. Otherwise, under overload, every long call would run in turns until each timed out; and holding it back
would leave it to time out all the same, waiting. A call short by both counts, and the continuous batch, is never
refused for this."""

LONG_S = 1.0
"""CPU seconds of the engine's thread on a call's own steps, per request it serves, after which the call is long
whatever its work (which counts rows and steps, not their cost: 8 samples of 512 tokens run for seconds). Ordinary
requests take well under it, and less per request in a call for many. The time a call waits for its turns does not
count, nor the time its steps wait for the GIL, which the event loop holds between PyTorch operations
(time.thread_time), so that the server's own load does not make a call long: by the batcher's clock, many clients
sending one-sentence beam-5 requests got 429 busy. Other work on the same cores still inflates it (the engine's
thread also spins at the barriers of PyTorch's own threads while one of them waits for a core). The figures:
benchmarks/README.md, Serving under load, session 24 ("The defect")."""

CREDIT = 0.25
"""Seconds of engine time that newly arrived work may run ahead of the work already running (Engine): a budget
that arrivals share, which refills as the running work catches up."""

timer: Callable[[], float] = time.perf_counter
"""The clock that the engine's time is read from: the shares that turns follow, the pace of a call's steps and the
seconds the engine was busy. The tests of turns put a clock run by their steps in its place, so that the turns
they count follow from the steps' lengths, not from how a loaded machine stretched them."""


@dataclass
class Streaming:
    """An open continuous batch on the engine: its stream and the rows of the streamed jobs in it."""
    stream: Any
    rows: dict = field(default_factory=dict)  # tag -> (job, index of its text)
    used: float = 0.0                         # engine seconds spent on it per request (Engine's fair share)
    since: float = 0.0                        # the Engine's clock when it last became active
    broken: bool = False                      # a step failed: its requests were answered with the error

    def __len__(self) -> int:
        return len(self.stream)

    @property
    def weight(self) -> int:
        """The requests it serves (at least 1)."""
        return max(1, len({id(job) for job, _ in self.rows.values()}))

    def admit(self, jobs: list[Job]) -> None:
        """`jobs` join the stream together: their sentences are encoded in one pass (one sentence at a time
        would run the encoder at a fraction of its speed). A failure is tried again job by job, so that it goes
        to the request that caused it alone."""
        rows = {(id(job), i): (job, i) for job in jobs for i in range(len(job.texts))}  # tag -> (job, text index)
        try:
            self.stream.add([text for job in jobs for text in job.texts], list(rows))
        except Exception as e:  # noqa: BLE001 - handed to the request that caused it
            if len(jobs) > 1:
                for job in jobs:
                    self.admit([job])
            else:
                resolve(jobs[0], e)
            return
        for job in jobs:
            job.results = [None] * len(job.texts)
        self.rows.update(rows)

    def drop_gone(self) -> int:
        """Drop the rows whose client gave up; how many requests that stopped."""
        gone = [tag for tag, (job, _) in self.rows.items() if job.future.done()]
        jobs = {id(self.rows[tag][0]) for tag in gone}
        for tag in gone:
            del self.rows[tag]
            self.stream.cancel(tag)
        return len(jobs)

    def advance(self) -> None:
        """One decoder step; the requests whose last sentence ended are answered."""
        for job, _ in self.rows.values():
            job.rows += 1
        try:
            ended = self.stream.step()
        except Exception as e:  # noqa: BLE001 - a bug: fail the stream's requests, not the server
            for job, _ in self.rows.values():
                resolve(job, e)
            self.rows.clear()
            self.broken = True
            return
        for tag, result in ended:
            job, i = self.rows.pop(tag)
            job.results[i] = result
            if all(r is not None for r in job.results):
                resolve(job, job.results)


class Engine:
    """The thread that runs the model: translate calls (`run`) and the continuous batches of streamed jobs
    (`submit`), one decoder step at a time, in fair turns per request: a step of work that serves n requests
    counts a n-th of its time towards that work's share (`used`), and the next step is always one of the work
    with the least share. So one client's request gets as much of the engine as another's, whether it runs
    alone or in a batch of many.

    Work that arrives starts CREDIT seconds below `clock` (the least share the running work has reached), so a
    small request sent beside a large one runs to its end at once, after the step in progress. The credit is
    a budget that arrivals share, not one each: arrivals never start below `floor`, the share at which work
    that went idle beside other work had ended, as far as it had run ahead of the clock it arrived at. Without
    that, a client sending one request after another would start ahead each time and hold up everything
    already running for as long as it kept sending (on a fresh server, a batch of 31 clients' beam requests
    waited behind the 32nd client's one-sentence calls)."""

    def __init__(self, streams: Streams | None, max_rows: int, metrics: BatchMetrics):
        self.streams, self.max_rows, self.metrics = streams, max_rows, metrics
        self.inbox: queue.SimpleQueue = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._run, name="xattn-translate", daemon=True)
        self.waiting = 0                # streamed jobs submitted and not yet in a stream
        self.clock = 0.0                # the least share the running work has reached, never decreasing (an
        #                                 arrival within its lead sits below it)
        self.floor = float("-inf")      # how far ahead arrivals have run: see the class docstring
        self.long_calls = 0             # calls that have turned long so far (Call.turned)
        self.busy = 0.0                 # seconds spent admitting and stepping work, and
        self.rows = 0                   # the rows of the decoder steps taken (backlog.Backlog's rate)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        if self.thread.is_alive():
            self.inbox.put(None)
            self.thread.join()

    def run(self, start: Callable[[], Steps[list]], jobs: list[Job]) -> Future:
        """The result of the Steps that `start()` makes, run here in turns with the rest; Dropped once every
        one of `jobs` is done (its clients gave up)."""
        call = Call(start, jobs, Future())
        for job in jobs:
            job.call = call
        self.inbox.put(call)
        return call.future

    def submit(self, job: Job) -> None:
        self.waiting += 1
        self.inbox.put(job)

    def _run(self) -> None:
        open_: dict[Hashable, Streaming] = {}  # settings -> its continuous batch
        held: deque[Job] = deque()             # streamed jobs waiting for room
        calls: list[Call] = []                 # running translate calls
        while True:
            active = [*calls, *(s for s in open_.values() if len(s))]
            items = self._take(block=not (active or held))
            awake = timer()
            if None in items:
                for call in calls:
                    call.future.cancel()
                return
            if active:
                self.clock = max(self.clock, min(work.used for work in active))
            for item in items:
                if isinstance(item, Job):
                    held.append(item)
                else:
                    item.used, item.since = self.start_share(), self.clock
                    calls.append(item)
            for streaming in open_.values():
                if stopped := streaming.drop_gone():
                    self.metrics.stop(stopped)
                    if not len(streaming) and len(active) > 1:  # emptied by its clients leaving
                        self.went_idle(streaming)
            self._admit(held, open_)
            self._refuse_crowded(calls)
            active = [*calls, *(s for s in open_.values() if len(s))]
            if not active:
                continue
            pick = min(active, key=lambda work: work.used)
            weight, began, cpu = pick.weight, timer(), time.thread_time()
            paced = isinstance(pick, Call) and pick.steps is not None  # (a call's first step encodes its texts)
            if isinstance(pick, Call):
                over, rows = pick.advance()
                pick.own += time.thread_time() - cpu
                if over:
                    calls.remove(pick)
            else:
                rows = len(pick)
                self.metrics.step(rows)
                pick.advance()
                over = not len(pick)
            ended = timer()
            if paced and rows:  # (backlog.Backlog.shed: the pace of its own steps)
                steps, stepped, seconds = pick.paced
                pick.paced = (steps + 1, stepped + rows, seconds + ended - began)
            pick.used += (ended - began) / weight
            self.busy += ended - awake
            self.rows += rows
            if over and len(active) > 1:
                self.went_idle(pick)
            for settings in [k for k, s in open_.items() if s.broken]:
                del open_[settings]

    def _refuse_crowded(self, calls: list[Call]) -> None:
        """Beyond MAX_LONG long calls whose clients are still there, those that turned long last are refused
        (Crowded) and leave `calls`."""
        for call in calls:  # (those turning long together: in arrival order)
            if not call.turned and call.long:
                self.long_calls += 1
                call.turned = self.long_calls
        counted = [call for call in calls if call.turned and not call.gone]  # (the gone stop at their next turn)
        for call in sorted(counted, key=lambda call: call.turned)[MAX_LONG:]:
            call.stop(Crowded())
            calls.remove(call)

    def start_share(self) -> float:
        """The share that work becoming active starts with: CREDIT below the clock, but not below `floor`
        (unless that is above the clock)."""
        return max(self.clock - CREDIT, min(self.floor, self.clock))

    def went_idle(self, work) -> None:
        """`work` ended beside other work: the lead it took (how far below the clock it had arrived at its share
        ended) is spent for the arrivals after it."""
        self.floor = max(self.floor, min(work.used, work.since))

    def _take(self, block: bool) -> list:
        """What the inbox holds (waiting for something when `block`)."""
        items = []
        try:
            items.append(self.inbox.get(block=block))
            while True:
                items.append(self.inbox.get_nowait())
        except queue.Empty:
            pass
        return items

    def _admit(self, held: deque[Job], open_: dict[Hashable, Streaming]) -> None:
        """Streamed jobs into their continuous batches while there is room (`max_rows` sentences in all; one
        larger alone), in arrival order, but that a job that fits may pass the first one that does not, until as
        many sentences as that one holds have passed it (then the batches drain for it): in strict order, a request
        of a full batch's sentences held every one behind it, a sentence included, until the batches had emptied.
        A batch that was empty starts at `start_share`."""
        rows = sum(len(s.rows) for s in open_.values())
        joining: dict[Hashable, list[Job]] = {}
        blocked, kept = None, deque()  # the first job that does not fit; the jobs left waiting, in order
        while held:
            job = held.popleft()
            if job.future.done():
                self.waiting -= 1
                continue
            if blocked is not None and (blocked.passed >= len(blocked.texts) or rows >= self.max_rows):
                kept.append(job)
                break
            if rows and rows + len(job.texts) > self.max_rows:
                blocked = blocked or job
                kept.append(job)
                continue
            self.waiting -= 1
            if job.settings not in open_:
                try:
                    open_[job.settings] = Streaming(self.streams.open_stream(job.settings))
                except Exception as e:  # noqa: BLE001 - handed to the request that caused it
                    resolve(job, e)
                    continue
            joining.setdefault(job.settings, []).append(job)
            rows += len(job.texts)
            if blocked is not None:
                blocked.passed += len(job.texts)
        held.extendleft(reversed(kept))
        for settings, jobs in joining.items():
            streaming = open_[settings]
            if not len(streaming):
                streaming.used, streaming.since = self.start_share(), self.clock
            streaming.admit(jobs)


def resolve(job: Job, outcome: Any) -> None:
    """Answer `job` on its event loop's thread (a result list, or an exception to raise)."""
    job.ended = True
    def settle() -> None:
        if job.future.done():
            return
        if isinstance(outcome, BaseException):
            job.future.set_exception(outcome)
        else:
            job.future.set_result(outcome)
    job.future.get_loop().call_soon_threadsafe(settle)
