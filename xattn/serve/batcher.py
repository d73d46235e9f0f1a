"""Cross-request batching: requests with the same decoding settings share one translate call, and plain
greedy requests share a continuous batch.

Requests wait in a bounded queue, which also counts the requests of the calls the collector no longer waits for
(below): otherwise requests arriving faster than calls end would all be taken into calls running in turns, and the
later ones would time out instead of being refused at once. A request is refused too, while the server is behind,
when the work admitted before it would keep it waiting more than `max_backlog` seconds, and later once its call
would end past its timeout (serve/backlog.py): a count cannot tell one sentence from 32. One collector task takes
the first, then whatever else is queued, up to
`max_batch` sentences (a request that would go over starts the next batch; one larger than `max_batch` runs alone),
groups them by settings and runs one translate call per group on the engine thread (serve/engine.py), so the event
loop never blocks and concurrent clients share batches. The collector waits for a call to end before it collects
the next batch, so that the requests arriving meanwhile share it; but not for long: a call whose requests' work
(work.check_work) is over `long_work` is not waited for, nor one still running after `long_after` seconds per
request it serves (the work counts steps and rows, not their cost: a request just under `long_work` can take
seconds; a call for many requests may hold the next batch for longer, as the engine's fair turns let it hold the
engine longer, so that the clients of a busy server keep meeting in full batches rather than splitting into small
ones that run in turns). The next batches then run beside it, taking turns step by step, so that one large request
never holds up the small ones. A request over `long_work`, or of more texts than `max_batch`, is never merged with
others nor streamed: it runs alone, so that nobody's answer waits for its end, and the continuous batch never holds
more than `max_batch` sentences. Which calls are long, and how many of them may run at once, is the engine's
(engine.MAX_LONG): by their work, or by the engine's own time they take, never by how long they waited for turns
(the collector's clock runs on under load).

Under load (the last batch merged several requests) it also waits up to `max_wait` seconds for as many requests as
last time: the clients of a batch send their next requests just after its answers go out, and would otherwise be
split over several small batches; a lone client never waits. A sampling request is never merged with another: its
random draws would then depend on its neighbours.

Requests that `Streams.streamable` accepts (plain greedy search) skip the collector: they go straight to the
engine, whose continuous batch answers each as soon as its last sentence ends.
"""
from __future__ import annotations

import asyncio
from typing import Any, Callable, Hashable

from xattn.decoding import Steps
from xattn.serve.backlog import CHECK_S, Backlog
from xattn.serve.engine import Crowded, Dropped, Engine, Job, Streams
from xattn.serve.metrics import BatchMetrics


class QueueFull(Exception):
    """The queue holds `queue_size` requests already."""


class Batcher:
    """Runs `translate(texts, settings) -> Steps of results` (one per text) for queued requests, batched; with
    `streams`, the requests it can stream in continuous batches."""

    def __init__(self, translate: Callable[[list[str], Any], Steps[list]], max_batch: int = 64,
                 max_wait: float = 0.005, queue_size: int = 256, streams: Streams | None = None,
                 metrics: BatchMetrics | None = None, long_work: int = 4096, long_after: float = 0.1,
                 max_backlog: float | None = None):
        self.translate, self.max_batch, self.max_wait, self.queue_size = translate, max_batch, max_wait, queue_size
        self.long_work, self.long_after = long_work, long_after
        self.queue: asyncio.Queue[Job] = asyncio.Queue(queue_size)
        self.streams, self.metrics = streams, metrics or BatchMetrics()
        self.engine = Engine(streams, max_batch, self.metrics)
        self.backlog = Backlog(max_backlog, lambda: (self.engine.busy, self.engine.rows),
                               lambda: asyncio.get_running_loop().time())  # (the jobs' deadlines are on its clock)
        self.calls = 0                  # translate calls made (tests compare it with requests)
        self.dropped = 0                # calls stopped between two steps, their clients gone
        self._task: asyncio.Task | None = None
        self._watch: asyncio.Task | None = None  # the backlog's checks (Backlog.shed)
        self._long: dict[asyncio.Task, int] = {}  # calls the collector does not wait for -> their requests
        self._held: Job | None = None   # taken from the queue, but over max_batch: it starts the next batch

    @property
    def beside(self) -> int:
        """The requests of the calls the collector does not wait for: with the queue's, at most queue_size."""
        return sum(self._long.values())

    @property
    def depth(self) -> int:
        """Requests waiting: in the queue, and streamed ones not yet in their batch."""
        return self.queue.qsize() + self.engine.waiting

    def start(self) -> None:
        self.engine.start()
        loop = asyncio.get_running_loop()
        self._task = loop.create_task(self._run())
        if self.backlog.limit_s is not None:
            self._watch = loop.create_task(self._shed())

    async def stop(self) -> None:
        for task in [self._task, self._watch, *self._long]:
            if task is not None:
                task.cancel()
                try:
                    await task
                except asyncio.CancelledError:
                    pass
        await asyncio.to_thread(self.engine.stop)

    async def submit(self, texts: list[str], settings: Hashable, mergeable: bool = True, work: int = 0,
                     source: int = 0, least: int = 0, timeout: float | None = None) -> list:
        """The results for `texts`; raises QueueFull at once when the queue is full, backlog.Overloaded when the work
        admitted before it would keep it waiting more than `max_backlog` seconds (while the server is behind; at
        once, or later once its call would end past the timeout: Backlog.shed), asyncio.TimeoutError once `timeout`
        seconds have passed (the job is then gone: dropped between two steps, as when its client leaves). `work`:
        the request's decoding work (work.check_work), which tells a long request from the others; `source`: its
        hypotheses x source tokens, by which the backlog expects what it will run, and `least` the rows its
        min_len makes it step at least (work.check_work). The deadline is a timer on the
        job's own future, not asyncio.wait_for: that would run this in a task of its own, two more turns of the
        event loop on the way in and out."""
        loop = asyncio.get_running_loop()
        job = Job(texts, settings, mergeable and not self.alone(len(texts), work), loop.create_future(), work=work,
                  long=work > self.long_work, source=source, least=least,
                  deadline=None if timeout is None else loop.time() + timeout)
        if streamed := self.streamed(settings, mergeable, len(texts), work):
            if self.engine.waiting >= self.queue_size:
                raise QueueFull
        elif self.queue.qsize() + self.beside >= self.queue_size:  # (also: arrivals faster than calls end)
            raise QueueFull
        self.backlog.admit(job)
        if streamed:
            self.engine.submit(job)
        else:
            self.queue.put_nowait(job)
        expiry = loop.call_later(timeout, expire, job.future) if timeout is not None else None
        try:
            return await job.future
        finally:
            if expiry is not None:
                expiry.cancel()
            self.backlog.leave(job)

    async def _shed(self) -> None:
        """Every CHECK_S seconds, the backlog refuses the work admitted that would end past its deadline
        (Backlog.shed: the submit of its requests raises Overloaded)."""
        while True:
            await asyncio.sleep(CHECK_S)
            self.backlog.shed()

    def alone(self, texts: int, work: int) -> bool:
        """Whether a request of `texts` texts and `work` runs alone: neither merged nor streamed."""
        return work > self.long_work or texts > self.max_batch

    def streamed(self, settings: Hashable, mergeable: bool, texts: int, work: int) -> bool:
        """Whether a request goes to the engine's continuous batch (the others to the collector): a mergeable one
        that does not run alone, whose settings can be streamed."""
        return mergeable and not self.alone(texts, work) and self.streams is not None and \
            self.streams.streamable(settings)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        last = 1  # requests in the last batch
        while True:
            jobs, self._held = [self._held or await self.queue.get()], None
            size, deadline = len(jobs[0].texts), loop.time() + (self.max_wait if last > 1 else 0.0)
            while size < self.max_batch:
                try:
                    waiting = len(jobs) < last and loop.time() < deadline
                    job = await asyncio.wait_for(self.queue.get(), deadline - loop.time()) if waiting else \
                        self.queue.get_nowait()
                except (asyncio.QueueEmpty, asyncio.TimeoutError):
                    break
                if size + len(job.texts) > self.max_batch:  # a request is never split: it waits for the next
                    self._held = job
                    break
                jobs.append(job)
                size += len(job.texts)
            last = len(jobs)
            for group in self._groups(jobs):
                await self._call(loop, group)

    @staticmethod
    def _groups(jobs: list[Job]) -> list[list[Job]]:
        """Live jobs grouped by settings, in arrival order; unmergeable ones alone."""
        groups: dict[Hashable, list[Job]] = {}
        alone: list[list[Job]] = []
        for job in jobs:
            if job.future.done():  # its client gave up
                continue
            if job.mergeable:
                groups.setdefault(job.settings, []).append(job)
            else:
                alone.append([job])
        return list(groups.values()) + alone

    async def _call(self, loop: asyncio.AbstractEventLoop, group: list[Job]) -> None:
        """Start one call for `group`; wait for it to end unless its requests' work is over long_work, or it is
        still running after `long_after` seconds per request (which does not make it long for the engine: under
        load, every call runs that long in turns)."""
        settled = loop.create_task(self._settle(loop, group))
        if sum(job.work for job in group) <= self.long_work:
            try:
                await asyncio.wait([settled], timeout=self.long_after * len(group))
            except asyncio.CancelledError:  # stopping: asyncio.wait does not cancel what it waits for
                settled.cancel()
                raise
        if not settled.done():
            self._long[settled] = len(group)
            settled.add_done_callback(self._long.pop)

    async def _settle(self, loop: asyncio.AbstractEventLoop, group: list[Job]) -> None:
        """Run one call for `group` on the engine and answer its requests."""
        texts, settings = [t for job in group for t in job.texts], group[0].settings
        self.metrics.call(len(texts))
        try:
            results = await asyncio.wrap_future(self.engine.run(lambda: self.translate(texts, settings), group))
        except Dropped:
            self.dropped += 1
            self.metrics.stop(len(group))
            return
        except Crowded as e:  # every request of it, as the queue's being full would be
            for job in group:
                if not job.future.done():
                    job.future.set_exception(e)
            return
        except Exception as e:  # noqa: BLE001 - handed to the request that caused it
            if len(group) > 1:  # one request's text must not fail the others: each alone
                for job in group:
                    await self._settle(loop, [job])
                return
            if not group[0].future.done():
                group[0].future.set_exception(e)
            return
        finally:
            self.calls += 1
        start = 0
        for job in group:
            part, start = results[start: start + len(job.texts)], start + len(job.texts)
            if not job.future.done():
                job.future.set_result(part)


def expire(future: asyncio.Future) -> None:
    """A job's deadline: its future fails with asyncio.TimeoutError, unless answered already."""
    if not future.done():
        future.set_exception(asyncio.TimeoutError())
