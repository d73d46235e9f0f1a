"""Workers: one translate call's sentences decoded in parts on threads of their own, at once (`Translator.workers`),
as CTranslate2's `inter_threads` and Marian's `--cpu-threads` use a CPU's cores.

One search on PyTorch's intra-op threads leaves much of a step serial: its small operations (softmax, layer
norm, the cache's copies, the search's bookkeeping) and its Python run on one core while the others wait, and
only the large products are shared. Parts of the batch, each on a core, keep them all busy (figures:
benchmarks/README.md, Translation speed, Session 32). PyTorch releases the GIL inside its operations, so threads
suffice.
"""
from __future__ import annotations

import threading
from typing import Callable, Sequence, TypeVar

import torch

from xattn.decoding import Steps

R = TypeVar("R")


class _Threads:
    """PyTorch's intra-op thread count. PyTorch keeps the count last set by any thread, and a thread takes it at its
    first parallel operation (or get_num_threads); after that, only the thread's own set_num_threads changes its
    count. So a part takes that first (at whatever count) and then sets its share; the first of the calls running
    parts at once saves the count, a later one gives its own thread that count, and the last to end sets it again,
    for the threads that start after. A thread whose first PyTorch work falls while parts run may take their share."""

    def __init__(self):
        self.lock, self.calls, self.saved = threading.Lock(), 0, 1

    def enter(self) -> None:
        with self.lock:
            current = torch.get_num_threads()
            if self.calls == 0:
                self.saved = current
            elif current != self.saved:  # this thread first asked while another call's parts ran
                torch.set_num_threads(self.saved)
            self.calls += 1

    def leave(self) -> None:
        with self.lock:
            self.calls -= 1
            if self.calls == 0:
                torch.set_num_threads(self.saved)

    def count(self) -> int:
        """The count before any call's parts began (for sharing out; a call's own thread may see its parts')."""
        with self.lock:
            return self.saved if self.calls else torch.get_num_threads()

    @staticmethod
    def share(n: int) -> None:
        """Set the count of a part's thread to `n`: taken first, so that it sticks."""
        torch.get_num_threads()
        torch.set_num_threads(n)


THREADS = _Threads()


def part_generators(generator: torch.Generator, n: int) -> list[torch.Generator]:
    """One generator for each of a sampling call's n parts, seeded from `generator`'s next draws."""
    seeds = torch.randint(2 ** 62, (n,), generator=generator, device=generator.device).tolist()
    return [torch.Generator(generator.device).manual_seed(seed) for seed in seeds]


def run_parts(jobs: Sequence[Callable[[], Steps[R]]], threads_each: int) -> list[R]:
    """Each job's steps run to their end on a thread of its own, all at once; their results in the jobs' order.

    PyTorch's intra-op thread count is `threads_each` while the jobs run, and back to what it was once no call's
    parts run (THREADS). A job that raises stops the others at their next step, and its error is raised here once
    all have stopped; so is an interrupt of the calling thread (Ctrl+C), which waits for them too: a thread left
    inside PyTorch as the process exits aborts it."""
    results: list = [None] * len(jobs)
    errors: list[BaseException] = []
    stop = threading.Event()
    ended = [threading.Event() for _ in jobs]

    def work(k: int) -> None:
        try:
            THREADS.share(threads_each)
            steps = jobs[k]()
            while not stop.is_set():
                try:
                    next(steps)
                except StopIteration as end:
                    results[k] = end.value
                    return
            steps.close()
        except BaseException as e:  # noqa: BLE001 - raised again by the calling thread
            errors.append(e)
            stop.set()
        finally:
            ended[k].set()

    threads = [threading.Thread(target=work, args=(k,), name=f"xattn-worker-{k}", daemon=True)
               for k in range(len(jobs))]
    THREADS.enter()
    try:
        for thread in threads:
            thread.start()
        for event in ended:
            event.wait()
    except BaseException:
        stop.set()
        for thread, event in zip(threads, ended):
            while thread.ident is not None and not event.is_set():  # (started) each part stops at its next step;
                try:                                                 # a second Ctrl+C does not cut this short
                    event.wait()
                except KeyboardInterrupt:
                    pass
        raise
    finally:
        THREADS.leave()
    if errors:
        raise errors[0]
    return results
