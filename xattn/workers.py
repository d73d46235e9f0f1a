"""Workers: one translate call's sentences decoded in parts on threads of their own, at once (`Translator.workers`),
as CTranslate2's `inter_threads` and Marian's `--cpu-threads` use a CPU's cores.

One search on PyTorch's intra-op threads leaves most of a step serial: its small operations (softmax, layer
norm, the cache's copies, the search's bookkeeping) and its Python run on one core while the others wait, and
only the large products are shared. Two parts of the batch, each on one core, keep both busy: on the 2-core
benchmark machine, 1.14x greedy and 1.12x beam 5 (float32; benchmarks/README.md, Session 32). PyTorch releases
the GIL inside its operations, so threads suffice.
"""
from __future__ import annotations

import threading
from typing import Callable, Sequence, TypeVar

import torch

from xattn.decoding import Steps

R = TypeVar("R")


def run_parts(jobs: Sequence[Callable[[], Steps[R]]], threads_each: int) -> list[R]:
    """Each job's steps run to their end on a thread of its own, all at once; their results in the jobs' order.

    PyTorch's intra-op thread count is process-wide: it is `threads_each` while the jobs run, and back to what it
    was when they end. A job that raises stops the others at their next step, and its error is raised here once
    all have stopped; so is an interrupt of the calling thread (Ctrl+C)."""
    results: list = [None] * len(jobs)
    errors: list[BaseException] = []
    stop = threading.Event()

    def work(k: int) -> None:
        try:
            torch.set_num_threads(threads_each)
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

    before = torch.get_num_threads()
    threads = [threading.Thread(target=work, args=(k,), name=f"xattn-worker-{k}", daemon=True)
               for k in range(len(jobs))]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    except BaseException:
        stop.set()
        for thread in threads:
            if thread.is_alive():
                thread.join()
        raise
    finally:
        torch.set_num_threads(before)
    if errors:
        raise errors[0]
    return results
