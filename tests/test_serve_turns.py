"""Translate calls in turns (xattn/serve/batcher.py): a call runs one decoder step at a time on the engine, beside
the next batches once its work is over long_work or it runs past long_after; at most engine.MAX_LONG long calls (by
their work, or by their own CPU time) at once; and a call whose clients all gave up stops between two steps."""
import asyncio
import dataclasses
import shutil
import threading
import time
from concurrent.futures import Future

import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

import xattn  # noqa: E402
from xattn.decoding import done  # noqa: E402
from xattn.serve.app import create_app  # noqa: E402
from xattn.serve import engine  # noqa: E402
from xattn.serve.batcher import Batcher, QueueFull  # noqa: E402
from xattn.serve.engine import Call, Job  # noqa: E402
from xattn.serve.metrics import BatchMetrics  # noqa: E402
from xattn.serve.limits import Limits  # noqa: E402


class Fake:
    """translate(texts, settings) for a Batcher: "long" calls step until released (counting their steps and
    noting when they were closed), the others end at once; every text comes back upper-cased."""

    def __init__(self):
        self.release, self.steps, self.closed = threading.Event(), 0, []

    def __call__(self, texts, settings):
        return self.long(texts) if settings == "long" else done([t.upper() for t in texts])

    def long(self, texts):
        try:
            while not self.release.is_set():
                self.steps += 1
                yield
            return [t.upper() for t in texts]
        finally:
            self.closed.append(self.release.is_set())


async def until(condition, seconds: float = 5.0) -> None:
    for _ in range(int(seconds / 0.005)):
        if condition():
            return
        await asyncio.sleep(0.005)
    raise AssertionError("the condition never held")


class Ticks:
    """The engine's clock (engine.timer) run by the tests' steps: `step(s)` sleeps s, as a model's step leaves the
    event loop its turns, and moves the clock on by s, however long a loaded machine made the sleep. The turns a
    test counts then follow from its steps' lengths alone (on a busy CI machine, one stretched step gave a call 17
    turns beside a request that should have had at most 11)."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def step(self, seconds: float = 0.002) -> None:
        time.sleep(seconds)
        self.now += seconds


@pytest.fixture
def ticks(monkeypatch) -> Ticks:
    clock = Ticks()
    monkeypatch.setattr(engine, "timer", clock)
    return clock


def run(test):
    fake = Fake()

    async def main():
        batcher = Batcher(fake, max_wait=0.0, long_work=100)
        batcher.start()
        try:
            await test(batcher, fake)
        finally:
            fake.release.set()
            await batcher.stop()
    asyncio.run(main())


def test_a_long_call_runs_beside_the_next_calls_which_end_first():
    async def test(batcher, fake):
        long = asyncio.ensure_future(batcher.submit(["a"], "long", work=101))
        await until(lambda: fake.steps > 0)
        assert await asyncio.wait_for(batcher.submit(["b", "c"], "short", work=100), 5) == ["B", "C"]
        assert not long.done()
        fake.release.set()
        assert await asyncio.wait_for(long, 5) == ["A"]
        assert fake.closed == [True] and batcher.dropped == 0
    run(test)


def test_a_call_within_long_work_holds_the_next_batch_so_that_it_fills():
    async def test(batcher, fake):
        batcher.long_after = 10.0
        first = asyncio.ensure_future(batcher.submit(["a"], "long", work=100))
        await until(lambda: fake.steps > 0)
        later = [asyncio.ensure_future(batcher.submit([t], "short", work=1)) for t in "bcd"]
        await asyncio.sleep(0.2)
        assert not any(task.done() for task in later)  # waiting for the first call, not run one by one
        calls = batcher.calls
        fake.release.set()
        assert await asyncio.wait_for(asyncio.gather(first, *later), 5) == [["A"], ["B"], ["C"], ["D"]]
        assert batcher.calls == calls + 2  # the first, then b, c and d in one call
    run(test)


def test_a_call_within_long_work_still_running_after_long_after_runs_beside_the_next():
    """The work counts rows and steps, not their cost: a request just under long_work took seconds and held every
    beam request sent meanwhile. Past long_after, the collector goes on."""
    async def test(batcher, fake):
        batcher.long_after = 0.05
        first = asyncio.ensure_future(batcher.submit(["a"], "long", work=100))
        await until(lambda: fake.steps > 0)
        assert await asyncio.wait_for(batcher.submit(["b"], "short", work=1), 5) == ["B"]
        assert not first.done()
        fake.release.set()
        assert await asyncio.wait_for(first, 5) == ["A"]
    run(test)


def test_a_call_for_several_requests_holds_the_next_batch_long_after_per_request():
    """A call serving many clients may hold the next batch for longer: their next requests then meet in one batch
    again, instead of splitting into small calls that run in turns (with one bound of 0.1 s for every call, 8 beam-5
    clients got about half their throughput in a scratch probe; benchmarks/README.md)."""
    async def test(batcher, fake):
        def steps(texts):  # steps that leave the event loop its turns, as a model's do
            while not fake.release.is_set():
                time.sleep(0.002)
                fake.steps += 1
                yield
            return [t.upper() for t in texts]
        batcher.translate = lambda texts, settings: steps(texts) if settings == "long" else fake(texts, settings)
        batcher.long_after, loop = 0.25, asyncio.get_running_loop()
        start = loop.time()
        two = [asyncio.ensure_future(batcher.submit([t], "long", work=40)) for t in "ab"]  # one call: 0.5 s
        await until(lambda: fake.steps > 0)
        later = asyncio.ensure_future(batcher.submit(["c"], "short", work=1))
        assert await asyncio.wait_for(later, 5) == ["C"]  # then it goes on: the call still runs
        assert loop.time() - start >= 0.5  # held 2 x 0.25 s from the call's start (by a bound per call, 0.25)
        assert not any(job.done() for job in two)
        fake.release.set()
        assert await asyncio.wait_for(asyncio.gather(*two), 5) == [["A"], ["B"]]
    run(test)


def test_stopping_the_batcher_while_a_call_ends_leaves_the_engine_thread_no_error(monkeypatch):
    """Stopping cancels the running calls' futures; a call whose last step ended meanwhile set its result on the
    cancelled future, and the engine's thread died of InvalidStateError (a traceback at every such shutdown)."""
    errors = []
    monkeypatch.setattr(threading, "excepthook", errors.append)

    async def test(batcher, fake):
        asyncio.ensure_future(batcher.submit(["a"], "long", work=101))
        await until(lambda: fake.steps > 0)
        fake.release.set()  # its last step, and the stop at once (run's own ending)
    for _ in range(5):
        run(test)
    assert errors == []


def test_a_request_over_long_work_is_neither_merged_nor_streamed():
    """It runs alone, so that no other request's answer waits for its end: one that shares its settings gets a
    call of its own, and plain greedy search goes to a call, not into the continuous batch."""
    async def test(batcher, fake):
        batcher.streams = streams = Streams(fake)
        batcher.max_wait = 0.5
        jobs = [batcher.submit(["a"], "short", work=101), batcher.submit(["b"], "short", work=1)]
        assert await asyncio.wait_for(asyncio.gather(*jobs), 5) == [["A"], ["B"]]
        assert batcher.calls == 2
        assert not batcher.streamed("greedy", True, 1, 101) and batcher.streamed("greedy", True, 1, 100)
        assert await asyncio.wait_for(batcher.submit(["c"], "greedy", work=101), 5) == ["C"]
        assert batcher.calls == 3 and streams.opened == []
    run(test)


def test_a_request_of_more_texts_than_max_batch_is_not_streamed():
    """A file of many short lines (its work small) went into the continuous batch as one job: admitted only once
    the batch had emptied, then holding more than max_batch rows while later requests waited for room."""
    async def test(batcher, fake):
        batcher.streams = streams = Streams(fake)
        texts = [f"t{i}" for i in range(batcher.max_batch + 1)]
        assert not batcher.streamed("greedy", True, len(texts), 1)
        assert await asyncio.wait_for(batcher.submit(texts, "greedy", work=1), 5) == [t.upper() for t in texts]
        assert batcher.calls == 1 and streams.opened == []
    run(test)


def test_one_long_call_more_than_max_long_is_refused_and_short_work_is_not(monkeypatch):
    """Beyond MAX_LONG, a long call is refused at once (Crowded: a 429), rather than every long call running in
    turns until each times out; a short call runs all the same (a cap in the collector held it, and everything
    else, until a long call ended: 29 s)."""
    monkeypatch.setattr(engine, "MAX_LONG", 2)

    async def test(batcher, fake):
        started = []
        batcher.translate = stepping(fake, started)
        jobs = {t: asyncio.ensure_future(batcher.submit([t], t, work=101)) for t in "abc"}  # settings apart
        with pytest.raises(engine.Crowded):
            await asyncio.wait_for(jobs["c"], 5)
        assert await asyncio.wait_for(batcher.submit(["s"], "short", work=1), 5) == ["S"]
        assert started == ["a", "b"] and not jobs["a"].done() and not jobs["b"].done()
        fake.release.set()
        assert await asyncio.wait_for(asyncio.gather(jobs["a"], jobs["b"]), 5) == [["a"], ["b"]]
        assert await asyncio.wait_for(batcher.submit(["d"], "d", work=101), 5) == ["d"]  # room again
    run(test)


def stepping(fake, started: list, step=lambda: time.sleep(0.002)):
    """translate(texts, settings) whose calls run `step` (2 ms asleep: waiting, not the engine's CPU) until
    released, noting which started; "short" calls end at once."""
    def steps(texts):
        started.append(texts[0])
        while not fake.release.is_set():
            step()
            yield
        return texts
    return lambda texts, settings: steps(texts) if settings != "short" else fake(texts, settings)


def spin(seconds: float = 0.002) -> None:
    """A step's CPU time, as a model's decoder step takes."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_a_long_call_whose_clients_left_does_not_count_towards_max_long(monkeypatch):
    """A call whose clients gave up stops at its next turn; until then it took a place among the long calls, and
    a live one arriving meanwhile was refused although there was room."""
    monkeypatch.setattr(engine, "MAX_LONG", 2)
    loop = asyncio.new_event_loop()
    try:
        def call(gone: bool):
            job = Job(["x"], "s", False, loop.create_future(), work=101, long=True)
            if gone:
                job.future.cancel()
            return Call(lambda: None, [job], Future())
        calls = [call(True), call(False), call(False)]
        eng = engine.Engine(None, 64, BatchMetrics())
        eng._refuse_crowded(calls)
        assert len(calls) == 3 and not any(c.future.done() for c in calls)
        fourth = call(False)  # now one too many: the one that turned long last is refused
        eng._refuse_crowded([*calls, fourth])
        assert isinstance(fourth.future.exception(), engine.Crowded) and not any(c.future.done() for c in calls)
    finally:
        loop.close()


def test_requests_in_calls_no_longer_waited_for_count_towards_the_queue():
    """Requests arriving faster than calls end: the collector took each into a call and went on, so the queue never
    filled, nothing was refused, and the later requests timed out in turns (a review's probe at twice the engine's
    rate: 7 of 40 answered, 33 timed out). With the queue's room taken by them, the next one is refused at once."""
    async def test(batcher, fake):
        started = []
        batcher.translate, batcher.long_after, batcher.queue_size = stepping(fake, started, spin), 0.01, 3
        running = [asyncio.ensure_future(batcher.submit([t], t, work=1)) for t in "abc"]  # settings apart
        await until(lambda: len(started) == 3)
        await asyncio.sleep(0.1)  # each call past long_after: not waited for
        with pytest.raises(QueueFull):
            await asyncio.wait_for(batcher.submit(["d"], "d", work=1), 1)
        fake.release.set()
        assert await asyncio.wait_for(asyncio.gather(*running), 5) == [["a"], ["b"], ["c"]]
        await until(lambda: batcher.beside == 0)
        assert await asyncio.wait_for(batcher.submit(["e"], "short", work=1), 5) == ["E"]  # room again
    run(test)


def test_a_call_whose_requests_together_are_over_long_work_is_not_waited_for():
    """Each request within long_work, merged over it: the collector goes on at once (waiting up to long_after per
    request, 10 s here, a request with other settings waited that long behind it)."""
    async def test(batcher, fake):
        batcher.long_after, batcher.max_wait = 5.0, 0.05
        merged = [asyncio.ensure_future(batcher.submit([t], "long", work=60)) for t in "ab"]
        await until(lambda: fake.steps > 0)
        assert await asyncio.wait_for(batcher.submit(["c"], "short", work=1), 3) == ["C"]
        assert not any(job.done() for job in merged)
        fake.release.set()
        assert await asyncio.wait_for(asyncio.gather(*merged), 5) == [["A"], ["B"]]
    run(test)


def test_calls_that_run_long_only_by_waiting_for_turns_are_never_refused(monkeypatch):
    """Load is not size: past long_after the collector goes on, and the calls then take turns, each running longer
    by the clock; they counted as long, and beyond MAX_LONG ordinary requests got 429 busy (32 clients sending
    one-sentence beam-5 requests to a default server). Four calls in turns for 400 steps of 2 ms: each has had
    about 0.2 s of its own steps, 0.8 s by the clock (more on a loaded machine, whose sleeps would run longer)."""
    monkeypatch.setattr(engine, "MAX_LONG", 2)
    monkeypatch.setattr(engine, "LONG_S", 0.35)

    async def test(batcher, fake):
        started = []
        def step():
            spin()
            fake.steps += 1
        batcher.translate, batcher.long_after = stepping(fake, started, step), 0.01
        jobs = [asyncio.ensure_future(batcher.submit([t], t, work=1)) for t in "abcd"]  # settings apart
        await until(lambda: len(started) == 4)
        await until(lambda: fake.steps >= 400, 30)
        assert not any(job.done() for job in jobs)
        fake.release.set()
        assert await asyncio.wait_for(asyncio.gather(*jobs), 5) == [["a"], ["b"], ["c"], ["d"]]
    run(test)


def test_the_time_a_step_waits_is_not_the_calls_own(monkeypatch):
    """A step's time asleep stands for its waits: for the GIL, which the event loop holds between the model's
    operations, or for a core. Under load they grow, and counted as the call's own they made ordinary calls long."""
    monkeypatch.setattr(engine, "MAX_LONG", 1)
    monkeypatch.setattr(engine, "LONG_S", 0.05)

    async def test(batcher, fake):
        started = []
        batcher.translate, batcher.long_after = stepping(fake, started, lambda: time.sleep(0.005)), 0.01
        jobs = [asyncio.ensure_future(batcher.submit([t], t, work=1)) for t in "ab"]
        await until(lambda: len(started) == 2)
        await asyncio.sleep(0.4)  # each about 0.2 s asleep in its steps
        assert not any(job.done() for job in jobs)
        fake.release.set()
        assert await asyncio.wait_for(asyncio.gather(*jobs), 5) == [["a"], ["b"]]
    run(test)


def test_a_call_long_by_its_own_engine_time_counts_towards_max_long(monkeypatch):
    """Within long_work, a call whose own steps take over LONG_S per request is long (8 samples of 512 tokens ran
    for seconds): beyond MAX_LONG such calls, one more is refused, as one over long_work is."""
    monkeypatch.setattr(engine, "MAX_LONG", 2)
    monkeypatch.setattr(engine, "LONG_S", 0.05)

    async def test(batcher, fake):
        started = []
        batcher.translate, batcher.long_after = stepping(fake, started, spin), 0.01
        jobs = [asyncio.ensure_future(batcher.submit([t], t, work=1)) for t in "abc"]
        await until(lambda: any(job.done() for job in jobs))  # (which turns long last: as their turns fall)
        assert await asyncio.wait_for(batcher.submit(["s"], "short", work=1), 5) == ["S"]
        refused = [job for job in jobs if job.done()]
        assert len(refused) == 1 and isinstance(refused[0].exception(), engine.Crowded)
        fake.release.set()
        kept = [job for job in jobs if job is not refused[0]]
        assert len(await asyncio.wait_for(asyncio.gather(*kept), 5)) == 2
    run(test)


def test_a_call_turning_long_by_its_time_never_displaces_one_counted_before_it(monkeypatch):
    """Beyond MAX_LONG, the call refused is the one that turned long last: a call that was admitted and counted
    as long (by its work) and has been decoding since is not stopped because an older call turned long later."""
    monkeypatch.setattr(engine, "MAX_LONG", 2)
    monkeypatch.setattr(engine, "LONG_S", 0.1)

    async def test(batcher, fake):
        started, counted = [], threading.Event()  # the steps take CPU time once b and c are counted as long
        batcher.translate, batcher.long_after = stepping(fake, started, lambda: spin() if counted.is_set() else
                                                         time.sleep(0.002)), 0.01
        first = asyncio.ensure_future(batcher.submit(["a"], "a", work=1))  # long only once its steps take 0.1 s
        await until(lambda: started == ["a"])
        big = [asyncio.ensure_future(batcher.submit([t], t, work=101)) for t in "bc"]  # long on arrival
        await until(lambda: len(started) == 3)  # (however late a loaded machine let them arrive)
        counted.set()
        with pytest.raises(engine.Crowded):
            await asyncio.wait_for(first, 5)
        assert not any(job.done() for job in big)
        fake.release.set()
        assert await asyncio.wait_for(asyncio.gather(*big), 5) == [["b"], ["c"]]
    run(test)


def test_a_call_whose_clients_all_gave_up_stops_between_two_steps():
    async def test(batcher, fake):
        gone = asyncio.ensure_future(batcher.submit(["a"], "long", work=101))
        await until(lambda: fake.steps > 0)
        gone.cancel()
        await until(lambda: fake.closed == [False])  # closed before its end
        steps = fake.steps
        assert await asyncio.wait_for(batcher.submit(["b"], "short"), 5) == ["B"]
        assert fake.steps == steps and batcher.dropped == 1
    run(test)


def test_a_call_goes_on_while_one_of_its_clients_remains():
    async def test(batcher, fake):
        batcher.max_wait = 0.5  # so that the two requests share a call
        jobs = [asyncio.ensure_future(batcher.submit([t], "long", work=60)) for t in "ab"]
        await until(lambda: fake.steps > 0)
        jobs[0].cancel()
        await asyncio.sleep(0.1)
        assert fake.closed == []
        fake.release.set()
        assert await asyncio.wait_for(jobs[1], 5) == ["B"]
        assert batcher.calls == 1 and batcher.dropped == 0
    run(test)


def test_a_small_call_beside_a_long_one_runs_to_its_end_after_the_step_in_progress(ticks):
    """Fair turns with a credit for new work: the short call's 20 steps all run before the long call's next."""
    async def test(batcher, fake):
        def costly(texts, settings):
            if settings != "long":
                return fake(texts, settings)

            def steps():
                while not fake.release.is_set():
                    ticks.step(0.02)  # a step of a large batch
                    fake.steps += 1
                    yield
                return texts
            return steps()

        def short(texts):
            first = fake.steps
            for _ in range(20):  # 80 ms in all, within the credit the long call has not spent
                ticks.step(0.004)
                yield
            beside.append(fake.steps - first)  # (counted on the engine's thread: not by when the test looks)
            return texts
        beside = []
        batcher.translate = lambda texts, settings: costly(texts, settings) if settings == "long" else short(texts)
        long = asyncio.ensure_future(batcher.submit(["a"], "long", work=101))
        await until(lambda: fake.steps > 5)
        assert await asyncio.wait_for(batcher.submit(["b"], "short", work=1), 5) == ["b"]
        assert beside == [0]  # after the step in progress, none: 4 taking turns
        fake.release.set()
        await asyncio.wait_for(long, 5)
    run(test)


def test_a_client_sending_one_request_after_another_does_not_hold_up_a_batch_of_others(monkeypatch, ticks):
    """Turns are fair per request, and the credit of work that arrives is a budget that arrivals share: one
    client's one-sentence calls, sent one after another, leave a call that serves four clients 4/5 of the engine
    once the budget is spent. Before, each of its calls started ahead again, and the four waited until it
    stopped (a cold server under 32 beam clients fell to 40% of its throughput that way)."""
    monkeypatch.setattr(engine, "CREDIT", 0.05)

    async def test(batcher, fake):
        def steps(texts, forever):
            for _ in range(10**9 if forever else 10):
                if fake.release.is_set():
                    break
                ticks.step()
                fake.steps += forever
                yield
            return texts
        batcher.translate = lambda texts, settings: steps(texts, settings == "batch")
        batch = [asyncio.ensure_future(batcher.submit([t], "batch", work=26)) for t in "abcd"]  # one call, long
        await until(lambda: fake.steps > 0)  # the collector wakes: one call
        before = fake.steps
        for i in range(15):  # 15 x 20 ms of one client's calls, 50 ms of them ahead of the batch
            assert await asyncio.wait_for(batcher.submit([str(i)], "one", work=1), 5) == [str(i)]
        assert fake.steps - before > 300  # about 4 x 250 ms of 2-ms steps: about 600; 150 if each call counted
        assert not any(job.done() for job in batch) and batcher.calls == 15  # alike, 15 without the shared budget
    run(test)


class Stream:
    """A continuous batch for a Batcher: each text ends after 10 steps of 2 ms (on `ticks`), upper-cased; `beside`
    counts, for each text, the steps of `other` (a Fake) taken between its joining and its end."""

    def __init__(self, other, ticks=None):
        self.rows, self.other, self.joined, self.beside, self.ticks = {}, other, {}, {}, ticks

    def __len__(self):
        return len(self.rows)

    def add(self, texts, tags):
        self.rows.update({tag: [text, 10] for tag, text in zip(tags, texts)})
        self.joined.update({text: self.other.steps for text in texts})

    def cancel(self, tag):
        self.rows.pop(tag, None)

    def step(self):
        self.ticks.step() if self.ticks else time.sleep(0.002)
        for row in self.rows.values():
            row[1] -= 1
        ended = [(tag, text.upper()) for tag, (text, left) in self.rows.items() if left == 0]
        for tag, text in ended:
            del self.rows[tag]
            self.beside[text.lower()] = self.other.steps - self.joined[text.lower()]
        return ended


class Streams:
    def __init__(self, other, ticks=None):
        self.other, self.opened, self.ticks = other, [], ticks

    def streamable(self, settings):
        return settings == "greedy"

    def open_stream(self, settings):
        self.opened.append(Stream(self.other, self.ticks))
        return self.opened[-1]


def test_a_continuous_batch_that_served_much_before_is_not_held_up_by_a_call_that_came_since(ticks):
    """Shares are kept against one clock: a continuous batch that had served 0.3 s of requests, then emptied, and
    a call that started while it was empty take turns when the batch's next request comes; before, the call
    started from nothing and that request waited until the call had caught up with 0.3 s of the batch's past."""
    fake = Fake()

    def costly(texts, settings):
        while not fake.release.is_set():
            ticks.step()
            fake.steps += 1
            yield
        return [t.upper() for t in texts]

    async def main():
        streams = Streams(fake, ticks)
        batcher = Batcher(costly, max_wait=0.0, long_work=100, streams=streams)
        batcher.start()
        try:
            for i in range(15):  # 15 x 20 ms on the continuous batch
                assert await asyncio.wait_for(batcher.submit([f"s{i}"], "greedy"), 5) == [f"S{i}"]
            long = asyncio.ensure_future(batcher.submit(["a"], "long", work=101))
            await until(lambda: fake.steps > 0)
            assert await asyncio.wait_for(batcher.submit(["t"], "greedy"), 5) == ["T"]
            assert streams.opened[0].beside["t"] <= 11  # at most turns with the call (its 10 steps); 157 before
            fake.release.set()
            assert await asyncio.wait_for(long, 5) == ["A"]
        finally:
            fake.release.set()
            await batcher.stop()
    asyncio.run(main())


def test_work_that_ended_without_a_lead_leaves_the_next_arrival_its_credit(monkeypatch, ticks):
    """Two long calls take turns; one ends; a small call sent then still runs to its end at once. Only the lead
    that ended work had taken is spent for later arrivals, not the share it reached by its fair turns."""
    monkeypatch.setattr(engine, "CREDIT", 0.05)  # a little more than the small call's 20 steps of 2 ms
    released, counted = {"one": threading.Event(), "two": threading.Event()}, {"one": 0, "two": 0}
    beside = []

    def translate(texts, settings):
        first = counted["two"]
        for _ in range(20 if settings == "small" else 10**9):
            if settings != "small" and released[settings].is_set():
                break
            ticks.step()
            if settings != "small":
                counted[settings] += 1
            yield
        if settings == "small":  # (counted on the engine's thread: not by when the test looks)
            beside.append(counted["two"] - first)
        return texts

    async def main():
        batcher = Batcher(translate, max_wait=0.0, long_work=100)
        batcher.start()
        try:
            calls = [asyncio.ensure_future(batcher.submit([name], name, work=101)) for name in ("one", "two")]
            await until(lambda: min(counted.values()) > 50, 30)  # each beyond its own lead: taking turns
            released["one"].set()
            assert await asyncio.wait_for(calls[0], 5) == ["one"]
            assert await asyncio.wait_for(batcher.submit(["s"], "small", work=1), 5) == ["s"]
            assert beside == [0]  # after the step in progress, none; about 20 taking turns
        finally:
            for event in released.values():
                event.set()
            await batcher.stop()
    asyncio.run(main())


# ------------------------------------------------------------------------------ the server, a real model

LARGE = {"q": ["drei hundert vier und zwanzig tausend"] * 32, "beam_size": 16, "max_len_a": 0, "max_len_b": 150,
         "min_len": 140}  # 32 x 16 x 150 = 76,800 steps of work, within the default max_work (100,000)


def ready(c: TestClient) -> None:
    while c.get("/health").status_code != 200:
        time.sleep(0.02)


def under_way(batcher: Batcher) -> None:
    """Until a call the collector does not wait for (over long_work) is on the engine, however slowly a loaded
    machine brought it there: a fixed sleep let the small request go first, or the file end first."""
    for _ in range(1000):  # a bound against hanging, not a timing check
        if batcher.beside:
            return
        time.sleep(0.01)
    raise AssertionError("the large request never reached the engine")


def test_a_small_beam_request_is_answered_while_the_largest_allowed_one_runs(numbers_model):
    small = {"q": "drei hundert", "beam_size": 4}
    with TestClient(create_app(str(numbers_model), dataclasses.replace(Limits(), batch_wait_ms=0))) as c:
        ready(c)
        batcher, finished = c.app.state.xattn.served[0].model.batcher, {}

        def post(name, body):
            finished[name] = (c.post("/translate", json=body), time.perf_counter())
        worker = threading.Thread(target=post, args=("large", LARGE))
        worker.start()
        under_way(batcher)
        post("small", small)
        worker.join()
    assert finished["small"][0].status_code == finished["large"][0].status_code == 200
    assert finished["small"][1] < finished["large"][1]
    translator = xattn.load(numbers_model)
    alone = translator.translate([small["q"]], dataclasses.replace(translator.decode_config, beam_size=4))[0]
    assert finished["small"][0].json()["translatedText"] == alone.text


def test_a_file_is_one_request_and_a_small_one_sent_beside_it_is_answered_first(numbers_model, tmp_path):
    """A file's lines run as one call of their own (its work is over long_work), not as parts of 32 lines queued,
    each ahead of the requests sent after them: a one-sentence request sent while a file of 130 lines is being
    translated is answered before it (its parts held beam requests for seconds)."""
    model = shutil.copytree(numbers_model, tmp_path / "model")
    config = (model / "config.yaml").read_text()  # a file is translated with the model's settings: long outputs
    (model / "config.yaml").write_text(config.replace("  min_len: 0\n", "  min_len: 100\n")
                                       .replace("  max_len_b: 10\n", "  max_len_b: 100\n"))
    small = {"q": "drei hundert", "beam_size": 4, "min_len": 0, "max_len_b": 10}  # short, as the file's are not
    with TestClient(create_app(str(model), dataclasses.replace(Limits(), batch_wait_ms=0))) as c:
        ready(c)
        batcher, finished = c.app.state.xattn.served[0].model.batcher, {}
        assert c.post("/translate", json=small).status_code == 200  # its first call's cost paid before the file

        def post(name, **kwargs):
            finished[name] = (c.post(f"/{name}", **kwargs), time.perf_counter())
        text = "drei hundert vier und zwanzig tausend\n" * 130  # 4,940 characters
        files = {"file": ("zahlen.txt", text.encode(), "text/plain")}
        calls = batcher.calls
        worker = threading.Thread(target=post, args=("translate_file",), kwargs={"files": files})
        worker.start()
        under_way(batcher)
        post("translate", json=small)
        worker.join()
        assert batcher.calls == calls + 2  # the file's and the small request's, not the file's parts
    assert finished["translate"][0].status_code == finished["translate_file"][0].status_code == 200
    assert finished["translate"][1] < finished["translate_file"][1]


def test_a_long_request_beyond_max_long_is_a_429_to_retry_later(numbers_model, monkeypatch):
    monkeypatch.setattr(engine, "MAX_LONG", 0)  # every long call is one too many
    with TestClient(create_app(str(numbers_model), dataclasses.replace(Limits(), batch_wait_ms=0))) as c:
        ready(c)
        reply = c.post("/translate", json=LARGE)
        assert reply.status_code == 429 and reply.headers["retry-after"] == "5", reply.text
        assert reply.json() == {"error": "the server is busy with 4 long requests; retry later, or send a smaller one",
                                "error_type": "busy"}
        assert c.post("/translate", json={"q": "drei", "beam_size": 2}).status_code == 200  # short work is not


def test_a_request_past_its_timeout_stops_decoding(numbers_model):
    limits = dataclasses.replace(Limits(), batch_wait_ms=0, timeout_s=0.3)
    with TestClient(create_app(str(numbers_model), limits)) as c:
        ready(c)
        batcher = c.app.state.xattn.served[0].model.batcher
        reply = c.post("/translate", json=LARGE)
        assert reply.status_code == 504, reply.text
        for _ in range(200):
            if batcher.dropped:
                break
            time.sleep(0.01)
        assert batcher.dropped == 1
        assert c.post("/translate", json={"q": "drei", "beam_size": 2}).status_code == 200
