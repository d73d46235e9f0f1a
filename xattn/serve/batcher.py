"""Cross-request batching: requests with the same decoding settings share one `Translator.translate` call.

Requests wait in a bounded queue. One collector task takes the first, then whatever else is queued, up to
`max_batch` sentences (a request that would go over starts the next batch; one larger than `max_batch`
runs alone), groups them by settings and runs one translate call per group on a dedicated
thread, so the event loop never blocks and concurrent clients share batches. Under load (the last batch
merged several requests) it also waits up to `max_wait` seconds for as many requests as last time: the
clients of a batch send their next requests just after its answers go out, and would otherwise be split
over several small batches; a lone client never waits. A
sampling request is never merged with another: its random draws would then depend on its neighbours.
A request whose client gave up (timeout, disconnect) before its batch started is dropped.
"""
from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable


class QueueFull(Exception):
    """The queue holds `queue_size` requests already."""


@dataclass
class Job:
    texts: list[str]
    settings: Hashable                # requests with equal settings may share a call
    mergeable: bool
    future: asyncio.Future = field(repr=False)


class Batcher:
    """Runs `translate(texts, settings) -> results` (one per text) for queued requests, batched."""

    def __init__(self, translate: Callable[[list[str], Any], list], max_batch: int = 64, max_wait: float = 0.005,
                 queue_size: int = 256):
        self.translate, self.max_batch, self.max_wait = translate, max_batch, max_wait
        self.queue: asyncio.Queue[Job] = asyncio.Queue(queue_size)
        self.executor = ThreadPoolExecutor(1, thread_name_prefix="xattn-translate")
        self.calls = 0                  # translate calls made (tests compare it with requests)
        self._task: asyncio.Task | None = None
        self._held: Job | None = None   # taken from the queue, but over max_batch: it starts the next batch

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        self.executor.shutdown(wait=True, cancel_futures=True)

    async def submit(self, texts: list[str], settings: Hashable, mergeable: bool = True) -> list:
        """The results for `texts`; raises QueueFull at once when the queue is full."""
        job = Job(texts, settings, mergeable, asyncio.get_running_loop().create_future())
        try:
            self.queue.put_nowait(job)
        except asyncio.QueueFull:
            raise QueueFull from None
        return await job.future

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
        texts = [t for job in group for t in job.texts]
        try:
            results = await loop.run_in_executor(self.executor, self.translate, texts, group[0].settings)
        except Exception as e:  # noqa: BLE001 - handed to the request that caused it
            if len(group) > 1:  # one request's text must not fail the others: each alone
                for job in group:
                    await self._call(loop, [job])
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
